"""Why a head attends (:mod:`attnscope.core.analysis.explain`): the score split by rotary band.

References: the band parts against the trace's own scaled scores (``TorchTrace.scores(raw=True)``);
the rotated-back q and k against the pre-RoPE projections hooked in a plain eager transformers model
(``q_proj``/``k_proj`` outputs, after ``q_norm``/``k_norm`` where the family has QK-norm); the
wavelengths against ``2π / inv_freq`` of the model's rotary module; the counterfactual row against a
float64 softmax of the hooked pre-RoPE ``q·k·scale`` under the causal (+ window) mask, soft-cap and sink.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from tiny_models import save_tiny

IDS = [5, 9, 14, 20, 9, 14, 33, 41, 7, 14, 20, 9, 50, 61, 5, 9]  # 16 tokens, with repeats

LLAMA3 = dict(
    rope_parameters=dict(
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=64,
        rope_theta=10000.0,
    )
)
#: name -> (family, config overrides): llama (default and llama3 scaling), qwen3 (QK-norm), phi3
#: (partial rotary), gemma3 (local and global bases), glm4 (interleaved pairs, partial), gpt2 (no RoPE)
CASES = {
    "llama": ("llama", {}),
    "llama3": ("llama", LLAMA3),
    "qwen3": ("qwen3", {}),
    "phi3_partial": ("phi3", dict(partial_rotary_factor=0.5)),
    "gemma3": ("gemma3_text", {}),
    "glm4": ("glm4", {}),
    "gpt2": ("gpt2", {}),
}
ROPE_CASES = [c for c in CASES if c != "gpt2"]


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def _load(case, tmp_path, ids=IDS):
    from attnscope.core.session import Session

    family, over = CASES[case] if case in CASES else (case, {})
    ref = save_tiny(family, tmp_path / case, **over)
    s = Session.load(str(tmp_path / case))
    s.prefill(ids)
    return s, ref


def _layers(ref):
    m = ref.model if hasattr(ref, "model") else ref.transformer
    return m.layers if hasattr(m, "layers") else m.h


def _hooked_pre_rope(ref, layer, ids):
    """``(q (H, T, D), k (Hkv, T, D))`` float64: the layer's projections before RoPE, from eager."""
    attn = _layers(ref)[layer].self_attn
    got = {}
    D = attn.head_dim

    def keep(name):
        def hook(_m, _a, out):
            got[name] = out.detach()

        return hook

    if hasattr(attn, "qkv_proj"):  # Phi-3: one fused projection, q then k then v
        hs = [attn.qkv_proj.register_forward_hook(keep("qkv"))]
    else:
        q_mod = getattr(attn, "q_norm", None) or attn.q_proj
        k_mod = getattr(attn, "k_norm", None) or attn.k_proj
        hs = [q_mod.register_forward_hook(keep("q")), k_mod.register_forward_hook(keep("k"))]
    try:
        with torch.no_grad():
            ref(torch.tensor([ids]))
    finally:
        for h in hs:
            h.remove()
    if "qkv" in got:
        cfg = ref.config
        nq, nk = cfg.num_attention_heads * D, cfg.num_key_value_heads * D
        got["q"], got["k"] = got["qkv"][..., :nq], got["qkv"][..., nq : nq + nk]
    T = len(ids)

    def heads_first(x):  # q_norm sees (1, T, H, D) in Qwen 3, (1, H, T, D) in Gemma 3 (T != H here)
        if x.dim() == 4 and x.shape[2] == T and x.shape[1] != T:
            return x[0].double().numpy()
        return x.reshape(1, T, -1, D)[0].transpose(0, 1).double().numpy()

    return heads_first(got["q"]), heads_first(got["k"])


@pytest.mark.parametrize("case", list(CASES))
def test_band_parts_sum_to_the_stored_score(case, tmp_path):
    from attnscope.core.analysis.explain import cell_bands, explain

    s, _ = _load(case, tmp_path)
    T = s.seq_len
    checked = 0
    for layer in s.info.arch.attention_layers:
        for head in range(s.info.n_heads):
            stored = s.trace.scores(layer, head, raw=True)  # (T, T) float32, -inf where masked
            allowed = s.trace.allowed(layer)
            for i, j in [(T - 1, 0), (T - 1, T - 2), (9, 4), (5, 5), (12, 11)]:
                if not allowed[i, j]:
                    continue
                b = cell_bands(s, layer, head, i, j)
                rec = s.trace._rec(layer)
                q, k = rec.q()[head, i].double(), rec.keys[s.trace.kv_head(head), j].double()
                size = rec.scale * float((q * k).abs().sum())  # the float32 dot's rounding scale
                assert (
                    abs(b.total - stored[i, j]) <= 1e-6 * abs(stored[i, j]) or abs(stored[i, j]) < 0.1 * size
                )
                assert abs(b.total - stored[i, j]) <= 1e-6 * max(abs(stored[i, j]), size)
                e = explain(s, layer, head, i, j)
                assert e.score == pytest.approx(b.total, rel=1e-12, abs=1e-12)
                assert e.bands == b
                checked += 1
    assert checked > 10
    b = cell_bands(s, s.info.arch.attention_layers[0], 0, T - 1, 3)
    if case == "gpt2":  # no RoPE: one band, said so
        assert not b.rope and len(b.parts) == 1 and "no rotary" in b.note
    else:
        assert b.rope and len(b.parts) >= 2
        assert sorted(p for g in b.pairs for p in g) == list(range(sum(len(g) for g in b.pairs)))
        assert (b.unrotated is not None) == (case in ("phi3_partial", "glm4"))


@pytest.mark.parametrize("case", ROPE_CASES)
def test_rotated_back_q_and_k_equal_the_hooked_projections(case, tmp_path):
    from attnscope.core.analysis.explain import unrotate

    s, ref = _load(case, tmp_path)
    T = s.seq_len
    pos = np.arange(T)
    for layer in s.info.arch.attention_layers:
        q_ref, k_ref = _hooked_pre_rope(ref, layer, IDS)
        rec = s.trace._rec(layer)
        q = unrotate(s, layer, rec.q().double().numpy(), pos)  # (H, T, D)
        k = unrotate(s, layer, rec.keys.double().numpy(), pos)  # (Hkv, T, D)
        for got, want in ((q, q_ref), (k, k_ref)):
            assert np.linalg.norm(got - want) <= 1e-6 * np.linalg.norm(want)
        post = rec.q().double().numpy()
        assert np.linalg.norm(post - q_ref) > 1e-3 * np.linalg.norm(q_ref)  # the rotation did something


def test_wavelengths_are_the_models_frequencies(tmp_path):
    """llama3 scaling and Gemma 3's local (sliding) and global bases: 2π / the rotary module's inv_freq."""
    from attnscope.core.analysis.explain import rope_layout

    s, ref = _load("llama3", tmp_path)
    want = np.sort(2 * np.pi / ref.model.rotary_emb.inv_freq.double().numpy())
    assert np.allclose(rope_layout(s, 0).wavelength, want, rtol=1e-5)
    plain = 2 * np.pi / (10000.0 ** (-np.arange(0, 16, 2) / 16))
    assert not np.allclose(want, plain, rtol=1e-3)  # the scaling moved the slow pairs

    s, ref = _load("gemma3", tmp_path)
    rot = ref.model.rotary_emb
    types = s.backend.model.config.get_text_config().layer_types
    for layer, lt in enumerate(types):
        inv = getattr(rot, f"{lt}_inv_freq").double().numpy()
        assert np.allclose(rope_layout(s, layer).wavelength, np.sort(2 * np.pi / inv), rtol=1e-5)
    local, glob = rope_layout(s, 0).wavelength, rope_layout(s, 1).wavelength
    assert types[0] == "sliding_attention" and types[1] == "full_attention"
    assert glob[-1] > 10 * local[-1]  # 1M vs 10k base


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma2", "gpt_oss", "qwen3"])
def test_counterfactual_row_is_the_softmax_of_pre_rope_scores(family, tmp_path):
    """Same mask (mistral's window), soft-cap (gemma2) and learned sink (gpt_oss) as the model."""
    from attnscope.core.analysis.explain import explain

    s, ref = _load(family, tmp_path)
    layer, head, i = 0, 1, s.seq_len - 1
    e = explain(s, layer, head, i, 3)
    q, k = _hooked_pre_rope(ref, layer, IDS)
    kv = s.trace.kv_head(head)
    rec = s.trace._rec(layer)
    sc = rec.scale * (k[kv, : i + 1] @ q[head, i])
    if rec.softcap is not None:
        sc = rec.softcap * np.tanh(sc / rec.softcap)
    allowed = s.trace.allowed(layer, slice(i, i + 1), slice(0, i + 1))[0]
    assert family != "mistral" or not allowed.all()  # the window bites
    sc = np.where(allowed, sc, -np.inf)
    sink = s.trace.learned_sinks(layer)
    ex = np.exp(sc - sc.max())
    den = ex.sum() + (np.exp(sink[head] - sc.max()) if sink is not None else 0.0)
    want = ex / den
    assert np.abs(e.no_rope_row - want).max() <= 1e-6
    assert np.abs(e.row - s.weights(layer, head, slice(i, i + 1), slice(0, i + 1))[0]).max() == 0
    assert np.abs(e.no_rope_row - e.row).max() > 1e-4  # removing the rotation changes the row


def test_row_bands_are_the_weighted_cell_bands(tmp_path):
    from attnscope.core.analysis.explain import cell_bands, explain, row_bands

    s, _ = _load("phi3_partial", tmp_path)
    layer, head, i = 1, 2, 13
    w = s.weights(layer, head, slice(i, i + 1), slice(0, i + 1))[0].astype(np.float64)
    cells = [cell_bands(s, layer, head, i, j) for j in range(i + 1)]
    want = np.sum([w[j] * np.array(c.parts) for j, c in enumerate(cells)], axis=0)
    r = row_bands(s, layer, head, i)
    assert np.allclose(r.parts, want, rtol=1e-9, atol=1e-12)
    assert r.unrotated == pytest.approx(sum(w[j] * c.unrotated for j, c in enumerate(cells)), rel=1e-9)
    assert explain(s, layer, head, i, 0).row_bands == r


def test_band_names_and_positional_share_bounds(tmp_path):
    from attnscope.core.analysis.explain import cell_bands, head_positional_share, positional_share_grid

    s, _ = _load("llama", tmp_path)
    b = cell_bands(s, 0, 0, 10, 9)
    assert b.names[0] == "turns every 6 tokens"  # θ_0 = 1 rad per token: 2π tokens
    assert all(n.startswith("turns every ") for n in b.names)
    assert list(b.wavelengths) == sorted(b.wavelengths)
    assert sum(abs(x) for x in b.shares()) == pytest.approx(1.0)
    g = positional_share_grid(s, max_rows=1000)
    assert g.shape == (s.info.n_layers, s.info.n_heads) and np.all((g >= 0) & (g <= 1))
    assert head_positional_share(s, 1, 3, max_rows=1000) == pytest.approx(float(g[1, 3]), rel=1e-5)
    gpt, _ = _load("gpt2", tmp_path)
    assert np.all(positional_share_grid(gpt) == 0)


def test_bad_cells_are_one_line(tmp_path):
    from attnscope.core.analysis.explain import explain
    from attnscope.core.errors import OutOfRange, SessionError, WrongType
    from attnscope.core.session import Session

    s, _ = _load("llama", tmp_path)
    with pytest.raises(OutOfRange, match="query"):
        explain(s, 0, 0, 99, 0)
    with pytest.raises(OutOfRange, match="head"):
        explain(s, 0, 9, 1, 0)
    with pytest.raises(WrongType):
        explain(s, 0, 0, 1.5, 0)
    e = explain(s, 0, 0, 3, 7)  # a key after the query: split, but masked
    assert not e.allowed and e.weight == 0.0
    empty = Session(s.backend)
    empty.clear()
    with pytest.raises(SessionError):
        explain(empty, 0, 0, 0, 0)
    from types import SimpleNamespace

    from attnscope.core.analysis.explain import _Rotary
    from attnscope.core.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="torch backend"):  # an MLX model is no torch module
        _Rotary(SimpleNamespace(model=SimpleNamespace(modules=lambda: [])))


def test_explanation_travels_over_the_wire(tmp_path):
    """A remote engine sends the Explanation back as it is (``@remotable``)."""
    from attnscope.core.analysis.explain import Explanation, explain
    from attnscope.core.remote import wire

    s, _ = _load("phi3_partial", tmp_path)
    e = explain(s, 1, 0, 12, 5)
    head, bufs = wire.encode(e)
    back = wire.decode(head, bufs, wire.core_dataclass)
    assert isinstance(back, Explanation) and back.bands == e.bands
    assert np.array_equal(back.no_rope_row, e.no_rope_row)
    assert json.loads(json.dumps(e.to_dict()))["bands"]["total"] == pytest.approx(e.score)


def test_cli_json_equals_the_api(tmp_path, capsys):
    from attnscope.core.analysis.explain import explain, head_positional_share
    from attnscope.core.cli.main import main

    s, _ = _load("qwen3", tmp_path)
    out = tmp_path / "why.json"
    folder = str(tmp_path / "qwen3")
    prompt = "the cat sat on the mat"
    argv = ["explain", "--model", folder, "--prompt", prompt, "--no-chat-template"]
    rc = main([*argv, "--layer", "1", "--head", "2", "--query", "-1", "--key", "3", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    s.prefill(prompt, chat_template=False)
    T = s.seq_len
    e = explain(s, 1, 2, T - 1, 3)
    assert (data["layer"], data["head"], data["query"], data["key"]) == (1, 2, T - 1, 3)
    assert data["token_ids"] == s.ids and data["prompt"] == prompt and data["model"]["name"]
    assert len(data["prompt_sha256"]) == 64
    assert data["score"] == pytest.approx(e.score, rel=1e-12)
    assert [b["part"] for b in data["bands"]["bands"]] == pytest.approx(list(e.bands.parts), rel=1e-12)
    assert data["no_rope_row"] == pytest.approx(e.no_rope_row.tolist(), rel=1e-6)
    assert data["positional_share"] == pytest.approx(head_positional_share(s, 1, 2), rel=1e-6)
    text = capsys.readouterr().out
    assert "turns every" in text and "positional" in text
    rc = main([*argv, "--layer", "7", "--head", "0", "--query", "0", "--key", "0"])
    err = capsys.readouterr().err
    assert rc != 0 and err.count("\n") == 1 and "--layer 7" in err
    rc = main([*argv, "--layer", "0", "--head", "0", "--query", "99", "--key", "0"])
    assert rc != 0 and "--query 99" in capsys.readouterr().err


@pytest.mark.slow
def test_previous_token_and_induction_heads_fall_on_opposite_sides(smol_session):
    """On SmolLM2 (the default model), heads the Head roles tab calls previous-token carry most of their
    score variance in the fast bands, heads it calls induction almost none."""
    from attnscope.core.analysis.explain import positional_share_grid
    from attnscope.core.analysis.roles import role_table

    s = smol_session
    s.prefill(
        "The quick brown fox jumps over the lazy dog. Mary and John went to the store; John gave a drink "
        "to Mary. Alice was reading a book about the history of the Roman empire.",
        chat_template=False,
    )
    t = role_table(s)
    share = positional_share_grid(s)
    prev = [tuple(x) for x in np.argwhere(t.scores["previous_token"] >= 0.4)]
    ind = [tuple(x) for x in np.argwhere(t.scores["induction"] >= 0.4)]
    assert len(prev) >= 3 and len(ind) >= 3
    lo_prev = min(share[p] for p in prev)
    hi_ind = max(share[p] for p in ind)
    assert lo_prev > 0.5 > 0.1 > hi_ind, (lo_prev, hi_ind)
    assert not math.isnan(float(np.nanmedian(share)))


def test_remote_engine_gives_the_same_explanation(tmp_path):
    """``explain`` over a served engine (``@remotable``): the bands, the row and the source split are
    the local session's, bit for bit."""
    pytest.importorskip("zmq")
    from attnscope.core.analysis.explain import explain
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session
    from test_remote import TOKEN, serving

    local, _ = _load("qwen3", tmp_path)
    want = explain(local, 1, 2, 10, 4, sources=True, top=5)
    engine = Session.load(str(tmp_path / "qwen3"))
    with serving(engine) as server:
        r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN)
        try:
            r.prefill(IDS)
            got = explain(r, 1, 2, 10, 4, sources=True, top=5)
        finally:
            r.close()
    assert got.score == want.score and got.bands == want.bands and got.row_bands == want.row_bands
    np.testing.assert_array_equal(got.row, want.row)
    np.testing.assert_array_equal(got.no_rope_row, want.no_rope_row)
    assert got.sources is not None and want.sources is not None
    assert got.sources.pairs == want.sources.pairs and got.sources.rest == want.sources.rest
