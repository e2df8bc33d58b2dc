"""MLX backend: config reading, tiny random models of every family against transformers eager,
the Session API on MLX against the torch backend, and SmolLM2 parity (logits, weights, greedy).

References are independent of the MLX code: transformers' eager attention (``output_attentions``)
on the same saved weights, and the torch backend (itself checked against eager elsewhere).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

import torch  # noqa: E402
from attnscope.core.backends import mlx_backend  # noqa: E402
from attnscope.core.backends.mlx_arch import ModelArgs  # noqa: E402
from attnscope.core.backends.mlx_backend import MlxBackend  # noqa: E402
from attnscope.core.errors import Cancelled, ModelLoadError, UnsupportedModelError  # noqa: E402

VOCAB = 96


# -- tiny models ------------------------------------------------------------------------------------
def _tiny_tokenizer():
    """A word-level tokenizer "t0 t1 ..." (loads in milliseconds, unlike a real BPE vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB - 1)} | {"[UNK]": VOCAB - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.2,
)

# Every config field the MLX models read is set away from its default in at least one case.
CASES = {
    "llama": (
        "llama",
        dict(
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
            rms_norm_eps=1e-5,
            attention_bias=True,
            mlp_bias=True,
            tie_word_embeddings=True,
        ),
    ),
    "llama_llama3_rope": (
        "llama",
        dict(
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        ),
    ),
    "llama_linear_rope": (
        "llama",
        dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    ),
    "mistral_window": ("mistral", dict(sliding_window=5, num_key_value_heads=1)),
    "qwen2_window": (
        "qwen2",
        dict(
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=1,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
    ),
    "qwen3_qk_norm": ("qwen3", dict(head_dim=32, rms_norm_eps=1e-5, tie_word_embeddings=True)),
}


def _make_model(folder, family: str, **over):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(family, **(BASE | over))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # norms start at 1 and biases at 0: make every tensor matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn_like(p))
    model.save_pretrained(folder)
    _tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlx_tiny")
    return {name: _make_model(root / name, fam, **over) for name, (fam, over) in CASES.items()}


def _eager(folder, ids):
    """Logits ``(T, vocab)`` and weights ``[layer] (H, T, T)`` from transformers eager attention."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        out = m(torch.tensor([ids]), output_attentions=True)
    return out.logits[0].numpy(), [a[0].numpy() for a in out.attentions]


IDS = [5, 17, 3, 88, 42, 42, 7, 63, 11, 29, 5, 70, 2, 91]  # 14 tokens: 9 prefill + 5 decode
N_PREFILL = 9


def _run_mlx(folder, ids=IDS, n_prefill=N_PREFILL):
    """Prefill (in chunks of 4) then decode one by one; logits of every position."""
    b = MlxBackend.load(folder)
    logits = [b.forward(ids[:n_prefill], all_logits=True)]
    logits += [b.forward([t])[None] for t in ids[n_prefill:]]
    return b, np.concatenate(logits)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(mlx_backend, "PREFILL_CHUNK", 4)  # a 9-token prefill runs as 4 + 4 + 1


# -- config ---------------------------------------------------------------------------------------
# 32 heads: Qwen2/3 default to 32 KV heads and Mistral to 8 when the key is missing
MINIMAL = dict(
    hidden_size=256, num_hidden_layers=3, intermediate_size=96, num_attention_heads=32, vocab_size=100
)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_config_defaults_match_transformers(family):
    from transformers import AutoConfig

    args = ModelArgs.from_dict({"model_type": family} | MINIMAL)
    ref = AutoConfig.for_model(family, **MINIMAL)
    ref_head_dim = getattr(ref, "head_dim", None) or ref.hidden_size // ref.num_attention_heads
    assert args.head_dim == ref_head_dim  # qwen3 defaults to 128, not hidden / heads
    assert args.n_kv_heads == ref.num_key_value_heads
    assert args.rms_norm_eps == ref.rms_norm_eps
    assert args.tie_word_embeddings == ref.tie_word_embeddings
    assert args.max_position_embeddings == ref.max_position_embeddings
    assert args.rope_theta == ref.rope_parameters["rope_theta"]
    types = getattr(ref, "layer_types", None) or ["sliding_attention"] * 3
    windows = [getattr(ref, "sliding_window", None) if t == "sliding_attention" else None for t in types]
    assert [args.layer_window(i) for i in range(3)] == windows


@pytest.mark.parametrize(
    "family, cfg",
    [
        (
            "mistral",
            {"sliding_window": None},
        ),  # Mistral v0.3: explicit null = full attention, not the 4096 default
        ("mistral", {"sliding_window": 7}),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 7, "max_window_layers": 1}),
        ("qwen2", {"use_sliding_window": False, "sliding_window": 7}),
        ("llama", {"num_key_value_heads": None}),
        ("qwen3", {"num_key_value_heads": None, "head_dim": 16}),
    ],
)
def test_config_fields_read_as_transformers_reads_them(family, cfg):
    from transformers import AutoConfig

    args = ModelArgs.from_dict({"model_type": family} | MINIMAL | cfg)
    ref = AutoConfig.for_model(family, **(MINIMAL | cfg))
    assert args.n_kv_heads == ref.num_key_value_heads
    assert args.head_dim == (getattr(ref, "head_dim", None) or 8)
    types = getattr(ref, "layer_types", None) or ["sliding_attention"] * 3
    windows = [getattr(ref, "sliding_window", None) if t == "sliding_attention" else None for t in types]
    assert [args.layer_window(i) for i in range(3)] == windows


@pytest.mark.parametrize(
    "cfg, theta",
    [
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}}, 100000.0),  # transformers 5
        ({"rope_theta": 123456.0}, 123456.0),  # older configs: top level
        ({"rope_theta": 5e5, "rope_scaling": None}, 5e5),
        (
            {"rope_theta": 7.0, "rope_parameters": {"rope_theta": 9.0, "rope_type": "default"}},
            9.0,
        ),  # the dict wins
        ({}, 10000.0),
    ],
)
def test_rope_theta_read_from_either_place(cfg, theta):
    from transformers import AutoConfig

    d = {"model_type": "llama"} | MINIMAL | cfg
    assert ModelArgs.from_dict(d).rope_theta == theta
    ref = AutoConfig.for_model(**d)  # transformers reads the same value
    assert ref.rope_parameters["rope_theta"] == theta


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 100000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ],
)
def test_inv_freq_equals_transformers(rope):
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d = {"model_type": "llama"} | MINIMAL | {"rope_parameters": rope, "max_position_embeddings": 131072}
    ref = AutoConfig.for_model(**d)
    fn = ROPE_INIT_FUNCTIONS[rope["rope_type"]] if rope["rope_type"] != "default" else None
    if fn is None:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        inv_ref = LlamaRotaryEmbedding.compute_default_rope_parameters(ref)[0]
    else:
        inv_ref = fn(ref, "cpu")[0]
    np.testing.assert_allclose(ModelArgs.from_dict(d).inv_freq(), inv_ref.numpy(), rtol=2e-7, atol=0)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"model_type": "gemma2"}, "gemma2"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "yarn"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"attn_logit_softcapping": 50.0}, "softcapping"),
        ({"num_key_value_heads": 5}, "multiple"),
    ],
)
def test_unsupported_configs_are_refused(change, words):
    with pytest.raises(UnsupportedModelError, match=words):
        ModelArgs.from_dict({"model_type": "llama"} | MINIMAL | change)


# -- tiny models against transformers eager ------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES))
def test_tiny_model_matches_eager(tiny_models, case):
    folder = tiny_models[case]
    ref_logits, ref_w = _eager(folder, IDS)
    b, logits = _run_mlx(folder)
    assert b.trace.seq_len == b.seq_len == len(IDS)
    assert np.abs(logits - ref_logits).max() < 1e-4 * max(1.0, np.abs(ref_logits).max())
    for layer in range(b.info.n_layers):
        for head in range(b.info.n_heads):
            w = b.trace.weights(layer, head)
            np.testing.assert_allclose(
                w, ref_w[layer][head], atol=1e-5, err_msg=f"{case} layer {layer} head {head}"
            )
    cfg = json.loads((folder / "config.json").read_text())  # fields too small to show in logits
    layer0 = b.model.model.layers[0]
    assert b.model.model.norm.eps == layer0.input_layernorm.eps == cfg["rms_norm_eps"]
    assert ("q_norm" in layer0.self_attn) == (cfg["model_type"] == "qwen3")
    assert ("lm_head" in b.model) != cfg["tie_word_embeddings"]
    # the maps are far from uniform (1/14 on the last row), so a wrong RoPE or mask could not hide
    assert max(ref_w[-1][h][-1].max() for h in range(b.info.n_heads)) > 3 / len(IDS)


def test_sliding_window_is_applied(tiny_models):
    b, _ = _run_mlx(tiny_models["qwen2_window"])  # layer 0 full, layer 1 window of 4
    assert b.info.sliding_window == 4
    w1 = b.trace.weights(1, 0)
    assert (w1[10, :7] == 0).all() and (w1[10, 7:11] > 0).all()
    assert (b.trace.weights(0, 0)[10, :11] > 0).all()
    np.testing.assert_array_equal(
        b.trace.allowed(1), np.tril(np.ones((14, 14), bool)) & ~np.tril(np.ones((14, 14), bool), -4)
    )


def test_wrong_rope_theta_would_be_caught(tiny_models, tmp_path):
    """A silently wrong base still gives plausible text; our parity test must notice it."""
    folder = tmp_path / "llama_wrong_theta"
    shutil.copytree(tiny_models["llama"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    ref_logits, ref_w = _eager(tiny_models["llama"], IDS)
    cfg["rope_parameters"]["rope_theta"] = 10000.0  # the default instead of 500000
    (folder / "config.json").write_text(json.dumps(cfg))
    b, logits = _run_mlx(folder)
    assert np.abs(logits - ref_logits).max() > 1e-2
    assert max(np.abs(b.trace.weights(1, h) - ref_w[1][h]).max() for h in range(4)) > 1e-3
    # the same theta given the older way (top level, no rope_parameters) is read and matches
    del cfg["rope_parameters"]
    cfg["rope_theta"] = 500000.0
    (folder / "config.json").write_text(json.dumps(cfg))
    b, logits = _run_mlx(folder)
    assert b.info.rope_theta == 500000.0
    assert np.abs(logits - ref_logits).max() < 1e-4 * max(1.0, np.abs(ref_logits).max())


# -- the Session API on MLX against the torch backend -----------------------------------------------
def test_session_mlx_equals_torch(tiny_models):
    from attnscope.core.kv_formula import kv_cache_bytes
    from attnscope.core.session import Session

    folder = tiny_models["qwen3_qk_norm"]
    sm, st = Session.load(folder, backend="mlx"), Session.load(folder, backend="torch")
    assert sm.backend.name == "mlx" and sm.backend.device in ("mlx:cpu", "mlx:gpu")
    for field in (
        "name",
        "source",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "head_dim",
        "hidden_size",
        "max_context",
        "rope_theta",
        "sliding_window",
        "vocab_size",
        "n_params",
        "architecture",
        "group_size",
    ):
        assert getattr(sm.info, field) == getattr(st.info, field), field
    prompt = "t5 t17 t3 t88 t42 t42 t7"
    for s in (sm, st):
        s.prefill(prompt, chat_template=False)
        s.step(6)
    assert sm.ids == st.ids
    assert (
        sm.backend.kv_cache_bytes() == st.backend.kv_cache_bytes() == kv_cache_bytes(2, 2, 32, 13, "float32")
    )
    np.testing.assert_allclose(sm.logits, st.logits, atol=1e-4)
    np.testing.assert_allclose(sm.sink_scores(), st.sink_scores(), atol=1e-5)
    t_m, t_t = sm.trace, st.trace
    for layer in range(2):
        np.testing.assert_allclose(t_m.lse(layer), t_t.lse(layer), atol=1e-4)
        np.testing.assert_array_equal(
            t_m.allowed(layer, slice(2, 9), slice(0, 5)), t_t.allowed(layer, slice(2, 9), slice(0, 5))
        )
        np.testing.assert_allclose(t_m.scores(layer, 1), t_t.scores(layer, 1), atol=1e-4)
        np.testing.assert_allclose(
            t_m.weights(layer, 3, slice(4, 11), slice(1, 6)),
            t_t.weights(layer, 3, slice(4, 11), slice(1, 6)),
            atol=1e-5,
        )
    np.testing.assert_allclose(t_m.weight_on_key(3), t_t.weight_on_key(3), atol=1e-5)
    assert t_m.kv_head(3) == t_t.kv_head(3) == 1
    # step back: cache and trace truncated; stepping again reproduces the same tokens and rows
    ids = sm.ids
    sm.step_back(4)
    assert sm.backend.seq_len == sm.trace.seq_len == 9 and sm.trace.weights(1, 0).shape == (9, 9)
    assert sm.backend.kv_cache_bytes() == kv_cache_bytes(2, 2, 32, 9, "float32")
    sm.step(4)
    assert sm.ids == ids
    np.testing.assert_allclose(sm.trace.weights(1, 2), st.trace.weights(1, 2), atol=1e-5)


def test_trace_offers_the_torch_trace_api():
    from attnscope.core.trace.mlx_trace import MlxTrace
    from attnscope.core.trace.torch_trace import TorchTrace

    public = {n for n in dir(TorchTrace) if not n.startswith("_")}
    assert public <= {n for n in dir(MlxTrace) if not n.startswith("_")}
    t = MlxTrace(2, 4, 2, 8)
    with pytest.raises(RuntimeError, match="nothing captured"):
        t.weights(0, 0)
    with pytest.raises(IndexError):
        t.weights(2, 0)


# -- prefill chunks, cancel, errors, threads, dtypes -----------------------------------------------------
def test_chunked_prefill_progress_and_cancel(tiny_models):
    b = MlxBackend.load(tiny_models["llama"])
    full = b.forward(IDS, all_logits=True)  # 4 chunks of <= 4
    w_full = b.trace.weights(1, 3)
    b.reset()
    b.forward(IDS[:3])
    calls = []
    with pytest.raises(Cancelled):
        b.forward(IDS[3:], progress=lambda d, t: calls.append((d, t)), cancelled=lambda: len(calls) == 2)
    assert calls == [(4, 11), (8, 11)]
    assert b.seq_len == b.trace.seq_len == 3 and all(c.offset == 3 for c in b.caches)
    logits = b.forward(IDS[3:], all_logits=True)
    np.testing.assert_allclose(logits, full[3:], atol=1e-5)
    np.testing.assert_allclose(b.trace.weights(1, 3), w_full, atol=1e-6)


def test_bad_input_and_other_thread(tiny_models):
    b = MlxBackend.load(tiny_models["llama"])
    with pytest.raises(ValueError, match="out of range"):
        b.forward([VOCAB])
    with pytest.raises(ValueError, match="no token"):
        b.forward([])
    errors = []
    th = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, b.forward, [1])))
    th.start()
    th.join()
    assert "thread" in str(errors[0].value)
    assert b.seq_len == 0


def test_weights_that_do_not_fit_the_config_are_refused(tiny_models, tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(tiny_models["qwen2_window"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "llama"  # Qwen2 has q/k/v biases, a Llama config without attention_bias has none
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="unexpected .*bias"):
        MlxBackend.load(folder)
    with pytest.raises(ModelLoadError, match="unknown dtype .int8."):
        MlxBackend.load(tiny_models["llama"], dtype="int8")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision(tiny_models, dtype):
    ref_logits, ref_w = _eager(tiny_models["llama"], IDS)
    b, logits = _run_mlx(tiny_models["llama"])
    b16 = MlxBackend.load(tiny_models["llama"], dtype=dtype)
    assert b16.info.dtype == dtype and b16.caches[0].keys is None
    l16 = b16.forward(IDS, all_logits=True)
    assert l16.dtype == np.float32 and b16.kv_cache_bytes() == b.kv_cache_bytes() // 2
    assert np.abs(l16 - ref_logits).max() < 0.05 * np.abs(ref_logits).max()
    w = b16.trace.weights(1, 2)
    assert w.dtype == np.float32
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-5)  # exact softmax of the stored rows
    np.testing.assert_allclose(w, ref_w[1][2], atol=0.03)


# -- SmolLM2: the embedded default model ------------------------------------------------------------
@pytest.fixture(scope="module")
def smol_mlx():
    from attnscope.core.session import Session

    return Session.load(backend="mlx")


@pytest.mark.slow
def test_smollm2_parity_with_torch(smol_mlx, smol_session):
    """Logits within 1e-3 at the prompt's end and every one of 32 greedy steps, weights of all
    30 × 9 heads within 1e-4, and the same 32 greedy tokens."""
    from conftest import SMOL_PROMPT

    sm, st = smol_mlx, smol_session
    # every ModelInfo field, n_params and source included; MLX keeps the Q4_1 weights packed
    # (core/backends/mlx_gguf.py: at float32 they dequantise to the torch conversion's very values)
    assert sm.info.quantization_runtime.startswith("Q4_1 kept packed (mlx QuantizedLinear")
    assert dataclasses.replace(sm.info, quantization_runtime="") == st.info
    assert sm.info.rope_theta == 100000.0
    assert (sm.info.n_layers, sm.info.n_heads, sm.info.n_kv_heads, sm.info.head_dim) == (30, 9, 3, 64)
    for s in (sm, st):
        s.prefill(SMOL_PROMPT, chat_template=False)
    assert sm.ids == st.ids and sm.seq_len > 20
    diffs = [
        np.abs(sm.trace.weights(layer, h) - st.trace.weights(layer, h)).max()
        for layer in range(30)
        for h in range(9)
    ]
    assert max(diffs) < 1e-4
    for s in (sm, st):
        s.step(32)
    assert sm.ids == st.ids  # greedy continuation identical for 32 tokens
    assert max(np.abs(sm.logits_at(i) - st.logits_at(i)).max() for i in range(33)) < 1e-3
    for layer in (0, 14, 29):  # decode rows too
        for h in range(9):
            assert np.abs(sm.trace.weights(layer, h) - st.trace.weights(layer, h)).max() < 1e-4
    np.testing.assert_allclose(sm.sink_scores(), st.sink_scores(), atol=1e-5)
