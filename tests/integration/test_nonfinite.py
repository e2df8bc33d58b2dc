"""A forward that overflows is said at once (attnscope.core.trace.finite) and ``--dtype auto`` avoids
the precisions a family is known to overflow in (attnscope.core.loading.precision.OVERFLOWS).

The sample: a tiny 3-layer llama whose layer-1 MLP is scaled so that its output is about 9e5 at
float32, past float16's largest value (65504): at float16 the hidden states of layer 1 are inf,
layer 2's queries, keys, LSE and maps NaN, and the logits NaN."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from attnscope.core.trace.finite import FiniteWatch, NonFinite, describe

PROMPT = "the cat sat on the mat"
F16_MAX = 65504.0


def _overflowing_model(folder, layer: int = 1, n_layers: int = 3, family: str = "llama"):
    """Save a tiny ``family`` model whose decoder layer ``layer`` outputs ~1e6 at float32; returns
    the float32 amax of each decoder layer's output on :data:`PROMPT`."""
    from tiny_models import tiny_config, tiny_tokenizer
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(family)
    cfg.num_hidden_layers = n_layers
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        m.model.layers[layer].mlp.down_proj.weight.mul_(1e4)
        m.model.layers[layer].mlp.up_proj.weight.mul_(1e4)
    m.save_pretrained(folder)
    tok = tiny_tokenizer()
    tok.save_pretrained(folder)
    amax = []
    hooks = [
        lay.register_forward_hook(lambda _m, _a, out: amax.append(float(out.abs().amax())))
        for lay in m.model.layers
    ]
    with torch.no_grad():
        m(torch.tensor([tok(PROMPT)["input_ids"]]))
    for h in hooks:
        h.remove()
    return amax


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory):
    folder = tmp_path_factory.mktemp("overflow") / "llama3"
    amax = _overflowing_model(folder)
    return folder, amax


def test_watch_names_inf_and_nan_with_one_reduction_per_tensor():
    w = FiniteWatch()
    w.begin(4, 7, torch.float16)
    w.check(0, "queries", torch.ones(1, 2, 4, 8, dtype=torch.float16))
    bad = torch.ones(1, 4, 16)
    bad[0, 1, 3] = math.inf
    w.check(3, "hidden states", bad)
    nan = torch.zeros(2, 3)
    nan[1, 1] = math.nan
    nan[0, 0] = math.inf  # both: NaN wins (amax propagates NaN)
    w.check(None, "logits", nan)
    w.check(1, "ids", torch.tensor([1, 2]))  # not floating: ignored
    assert len(w._pending) == 3  # one 0-d reduction per floating tensor, none read yet
    assert all(v.ndim == 0 for _, _, v in w._pending)
    new = w.flush()
    assert new == [
        NonFinite(3, "hidden states", "inf", "float16", (4, 7)),
        NonFinite(None, "logits", "NaN", "float16", (4, 7)),
    ]
    assert new[0].name() == "hidden states of layer 3 reach inf at float16"
    # a later chunk with the same tensors: already said, not queued again
    w.begin(8, 8, torch.float16)
    w.check(3, "hidden states", bad)
    assert w.flush() == [] and len(w.found) == 2
    line = describe(w.found)
    assert line.startswith(
        "non-finite forward: hidden states of layer 3 reach inf at float16 (positions 4–7)"
    )
    assert "the logits" in line and "\n" not in line


@pytest.mark.slow
def test_float16_overflow_in_layer_1_is_named_and_maps_are_nan(overflowing, tmp_path):
    from attnscope.core.io import head_export, provenance
    from attnscope.core.session import Session

    folder, amax = overflowing
    assert amax[0] < F16_MAX < amax[1] < 1e7  # the sample: layer 1 passes float16's range at float32

    s = Session.load(str(folder), dtype="float16")
    s.prefill(PROMPT)
    T = s.seq_len
    notes = [str(n) for n in s.notices]
    assert len(notes) == 1
    assert notes[0].startswith(
        f"non-finite forward: hidden states of layer 1 reach inf at float16 (positions 0–{T - 1}); "
        "layer 2 and the logits follow"
    )
    found = s.backend.trace.finite.found
    assert (found[0].layer, found[0].what, found[0].kind) == (1, "hidden states", "inf")
    assert {(f.layer, f.what) for f in found} == {
        (1, "hidden states"),
        (2, "queries"),
        (2, "keys"),
        (2, "LSE"),
        (2, "hidden states"),
        (None, "logits"),
    }
    # what the notice says is what the maps are: layers 0-1 finite, layer 2 NaN on every allowed cell
    ref = Session.load(str(folder), dtype="float32")
    ref.prefill(PROMPT)
    assert ref.notices == []
    for layer in (0, 1):
        np.testing.assert_allclose(s.weights(layer, 0), ref.weights(layer, 0), atol=2e-3)
    w2 = s.weights(2, 0)
    allowed = np.tril(np.ones((T, T), dtype=bool))
    assert np.isnan(w2[allowed]).all() and (w2[~allowed] == 0).all()
    assert np.isnan(s.logits).all()
    # decoding on keeps one notice (said once)
    s.step(1)
    assert [str(n) for n in s.notices] == notes

    # the sidecar records every non-finite tensor and the map's own non-finite cells
    paths = head_export.export_head(s, 2, 0, tmp_path / "l2.npy")
    meta = json.loads(provenance.sidecar_path(paths[0]).read_text())
    assert meta["nonfinite"][0] == {
        "layer": 1,
        "what": "hidden states",
        "kind": "inf",
        "dtype": "float16",
        "positions": [0, T - 1],
    }
    assert meta["nonfinite_cells"] == int(np.tril(np.ones((T + 1, T + 1))).sum())
    ok = json.loads(
        provenance.sidecar_path(head_export.export_head(ref, 2, 0, tmp_path / "ok.npy")[0]).read_text()
    )
    assert ok["nonfinite"] == [] and ok["nonfinite_cells"] == 0


@pytest.mark.slow
def test_the_same_weights_do_not_overflow_at_bfloat16(overflowing):
    """bfloat16 shares float32's exponent range (largest ~3.4e38): ~1e6 is finite, nothing said."""
    from attnscope.core.session import Session

    s = Session.load(str(overflowing[0]), dtype="bfloat16")
    s.prefill(PROMPT)
    assert s.notices == [] and s.backend.trace.finite.found == []
    assert np.isfinite(s.weights(2, 1)).all()


@pytest.mark.slow
def test_another_layer_and_family_is_named(tmp_path):
    """Beyond the sample: qwen3 (QK-norm) overflowing in layer 0 of 2, with a prefill in chunks (the second
    chunk adds nothing new to say)."""
    from attnscope.core.backends import torch_backend
    from attnscope.core.session import Session

    folder = tmp_path / "qwen3"
    amax = _overflowing_model(folder, layer=0, n_layers=2, family="qwen3")
    assert amax[0] > F16_MAX
    s = Session.load(str(folder), dtype="float16")
    old = torch_backend.PREFILL_CHUNK
    torch_backend.PREFILL_CHUNK = 8
    try:
        s.prefill(PROMPT + " and the dog sat on the log")
    finally:
        torch_backend.PREFILL_CHUNK = old
    notes = [str(n) for n in s.notices]
    assert len(notes) == 1
    assert notes[0].startswith(
        "non-finite forward: hidden states of layer 0 reach inf at float16 (positions 0–7); layer 1"
    )


@pytest.mark.slow
def test_cli_says_it_on_one_stderr_line(overflowing, tmp_path):
    out = tmp_path / "m.png"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnscope.app.cli",
            "export",
            "--model",
            str(overflowing[0]),
            "--dtype",
            "float16",
            "--prompt",
            PROMPT,
            "--layer",
            "2",
            "--head",
            "0",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "non-finite" in ln]
    assert len(lines) == 1 and "hidden states of layer 1 reach inf at float16" in lines[0]
    assert out.exists()


# -- --dtype auto -----------------------------------------------------------------------------------------
def test_auto_never_picks_float16_for_gemma():
    from attnscope.core.loading.precision import Checkpoint, choose_dtype

    n = 268_098_176  # Gemma 3 270M
    ck = Checkpoint("float16", n, origin="GGUF F16", family="gemma3_text")
    dtype, why = choose_dtype("auto", ck, half_support=(True, "CPU flag avx512_bf16"))
    assert dtype == "bfloat16"
    assert "gemma3_text is known to overflow at float16" in why and "65504" in why
    dtype, why = choose_dtype(
        "auto", ck, free_bytes=8 * 10**9, half_support=(False, "this CPU has no avx512_bf16 flag")
    )
    assert dtype == "float32" and "known to overflow at float16" in why
    # float32 would not fit: bfloat16 (slow here, but finite), never float16
    dtype, why = choose_dtype("auto", ck, free_bytes=10**9, half_support=(False, "no bf16"))
    assert dtype == "bfloat16" and "would not fit" in why
    # other families keep their own float16
    assert (
        choose_dtype("auto", Checkpoint("float16", n, family="llama"), half_support=(True, "x"))[0]
        == "float16"
    )
    # asked for: obeyed, and the reason names the known overflow
    dtype, why = choose_dtype("float16", ck)
    assert dtype == "float16" and why.startswith("float16: asked for (--dtype float16); gemma3_text is known")


def test_a_float16_gemma3_folder_loads_at_a_safe_precision(tmp_path):
    from attnscope.core.loading.precision import decide, inspect_checkpoint
    from tiny_models import save_tiny

    folder = tmp_path / "g3"
    save_tiny("gemma3_text", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["dtype"] = "float16"
    (folder / "config.json").write_text(json.dumps(cfg))
    ck = inspect_checkpoint(folder)
    assert ck.dtype == "float16" and ck.family.startswith("gemma3")
    dtype, why = decide(folder, "auto")
    assert dtype in ("bfloat16", "float32") and "known to overflow at float16" in why
    assert "known to overflow" in decide(folder, "float16")[1]


# -- the MLX backend (attnscope.core.trace.mlx_trace.MlxFiniteWatch) ---------------------------------------
def test_mlx_watch_reads_its_reductions_at_once():
    mx = pytest.importorskip("mlx.core")
    from attnscope.core.trace.mlx_trace import MlxFiniteWatch

    w = MlxFiniteWatch()
    w.begin(0, 3, mx.float16)
    w.check(0, "queries", mx.ones((1, 2, 4, 8), dtype=mx.float16))
    w.check(1, "hidden states", mx.array([1.0, math.inf, 2.0]))
    w.check(None, "logits", mx.array([[0.0, math.nan], [math.inf, 1.0]]))
    w.check(1, "ids", mx.array([1, 2]))  # integers: ignored
    w.check(2, "hidden states", np.ones(3))  # not an MLX array: ignored
    assert len(w.pending()) == 3
    assert w.flush() == [
        NonFinite(1, "hidden states", "inf", "float16", (0, 3)),
        NonFinite(None, "logits", "NaN", "float16", (0, 3)),
    ]


@pytest.mark.slow
def test_mlx_float16_overflow_is_named_and_recorded(overflowing, tmp_path):
    """The same sample on the MLX backend: the same line, the same sidecar records."""
    pytest.importorskip("mlx.core")
    from attnscope.core.io import head_export, provenance
    from attnscope.core.session import Session

    folder, _ = overflowing
    s = Session.load(str(folder), dtype="float16", backend="mlx")
    s.prefill(PROMPT)
    T = s.seq_len
    notes = [str(n) for n in s.notices]
    assert len(notes) == 1
    assert notes[0].startswith(
        f"non-finite forward: hidden states of layer 1 reach inf at float16 (positions 0–{T - 1}); "
        "layer 2 and the logits follow"
    )
    found = s.backend.trace.finite.found
    assert {(f.layer, f.what) for f in found} == {
        (1, "hidden states"),
        (2, "queries"),
        (2, "keys"),
        (2, "LSE"),
        (2, "hidden states"),
        (None, "logits"),
    }
    assert np.isnan(s.logits).all()
    s.step(1)
    assert [str(n) for n in s.notices] == notes  # said once
    meta = json.loads(
        provenance.sidecar_path(head_export.export_head(s, 2, 0, tmp_path / "l2.npy")[0]).read_text()
    )
    assert meta["nonfinite"][0] == {
        "layer": 1,
        "what": "hidden states",
        "kind": "inf",
        "dtype": "float16",
        "positions": [0, T - 1],
    }
    assert meta["nonfinite_cells"] > 0
    # float32: nothing said, the records are an empty list (checked, all finite), not None
    ok = Session.load(str(folder), dtype="float32", backend="mlx")
    ok.prefill(PROMPT)
    assert ok.notices == []
    meta = json.loads(
        provenance.sidecar_path(head_export.export_head(ok, 2, 0, tmp_path / "ok.npy")[0]).read_text()
    )
    assert meta["nonfinite"] == [] and meta["nonfinite_cells"] == 0


# -- over a remote engine (attnscope.core.remote) ---------------------------------------------------------
@pytest.mark.slow
def test_remote_engine_carries_the_records_to_the_sidecar(overflowing, tmp_path):
    """The engine's line reaches the client's notices and its records the client's sidecar."""
    pytest.importorskip("zmq")
    from attnscope.core.io import head_export, provenance
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session
    from test_remote import TOKEN, serving

    folder, _ = overflowing
    engine = Session.load(str(folder), dtype="float16", device="cpu")
    with serving(engine) as server:
        r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN, timeout=30)
        try:
            r.prefill(PROMPT, chat_template=False)
            T = len(r.ids)
            notes = [str(n) for n in r.notices]
            assert len(notes) == 1 and notes[0].startswith(
                "non-finite forward: hidden states of layer 1 reach inf at float16"
            )
            meta = json.loads(
                provenance.sidecar_path(head_export.export_head(r, 2, 0, tmp_path / "r.npy")[0]).read_text()
            )
            assert meta["nonfinite"] == engine.backend.trace.finite.records()
            assert meta["nonfinite"][0] == {
                "layer": 1,
                "what": "hidden states",
                "kind": "inf",
                "dtype": "float16",
                "positions": [0, T - 1],
            }
            assert len(meta["nonfinite"]) == 6
            r.clear()  # a new sequence: the engine's watch forgets them, and so does the sidecar
            assert provenance.nonfinite_records(r) == []
        finally:
            r.close()
