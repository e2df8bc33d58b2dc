"""The attention kinds beyond dense GQA, exact at length: mixture-of-experts, multi-head latent attention
(MLA), and the language model of a multimodal checkpoint; and the analyses (Sinks, Compare, export,
value-weighted, KV cache) on them.

Reference: transformers eager on the whole sequence at once (tiny_models.eager_reference).
"""

from __future__ import annotations

import numpy as np
import pytest
from tiny_models import eager_reference, save_tiny

LONG = 640  # ≥ 600 tokens of prefill, in chunks, then 8 decode steps
STEPS = 8


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def _ids(n: int, seed: int = 1) -> list[int]:
    return np.random.default_rng(seed).integers(5, 260, size=n).tolist()


def _reference(ref, family):
    return ref.language_model if family == "llama4" else ref


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "qwen2_5_vl"])
def test_long_chunked_prefill_and_decode_exact(family, tmp_path, monkeypatch):
    """One per kind (MoE, MLA, multimodal): a 640-token prefill in 256-token chunks and 8 decode steps;
    every head of every layer equals eager to 1e-5, logits to 1e-4; step back 3 + the same 3 steps:
    the same weights."""
    from attnscope.core.backends import torch_backend
    from attnscope.core.session import Session

    monkeypatch.setattr(torch_backend, "PREFILL_CHUNK", 256)
    ref = _reference(save_tiny(family, tmp_path / family, max_position_embeddings=1024), family)
    ids = _ids(LONG + STEPS)
    s = Session.load(str(tmp_path / family))
    be = s.backend
    logits = [be.forward(ids[:LONG], all_logits=True)] + [
        be.forward([i], all_logits=True) for i in ids[LONG:]
    ]
    ref_logits, ref_att = eager_reference(ref, ids)
    assert np.abs(np.concatenate(logits) - ref_logits).max() < 1e-4
    for layer in range(s.info.n_layers):
        for head in range(s.info.n_heads):
            np.testing.assert_allclose(s.trace.weights(layer, head), ref_att[layer][head], atol=1e-5)
    be.truncate(len(ids) - 3)
    for i in ids[-3:]:
        be.forward([i])
    for layer in range(s.info.n_layers):
        np.testing.assert_allclose(s.trace.weights(layer, 1), ref_att[layer][1], atol=1e-5)


@pytest.fixture(scope="module", params=["olmoe", "deepseek_v2"])
def run(request, tmp_path_factory):
    """A MoE and an MLA model after a 60-token prompt: (session, eager model, ids)."""
    from attnscope.core.session import Session

    family = request.param
    folder = tmp_path_factory.mktemp(family)
    ref = save_tiny(family, folder)
    s = Session.load(str(folder))
    s.prefill("The quick brown fox jumps over the lazy dog. " * 2, chat_template=False)
    return family, s, ref, folder


def test_sinks_compare_export_run(run, tmp_path):
    from attnscope.core.analysis.compare_runs import compare_sessions
    from attnscope.core.analysis.sinks import session_sink_report
    from attnscope.core.io.head_export import export_head
    from attnscope.core.session import Session

    family, s, ref, folder = run
    ids = [t.id for t in s.tokens]
    _, ref_att = eager_reference(ref, ids)
    # Sinks: the weight every row puts on token 0, eager's
    rep = session_sink_report(s)
    for layer in range(s.info.n_layers):
        np.testing.assert_allclose(rep.per_row[layer], ref_att[layer][:, :, 0], atol=1e-5)
    # Compare: the same model and prompt in a second session differs by nothing
    s2 = Session.load(str(folder))
    s2.prefill("The quick brown fox jumps over the lazy dog. " * 2, chat_template=False)
    cmp = compare_sessions(s, s2)
    assert max(d.js_max for d in cmp.ranked()) < 1e-6
    # export: the map written as data is eager's
    (out, *_) = export_head(s, 1, 2, tmp_path / f"{family}.npy")
    np.testing.assert_allclose(np.load(out), ref_att[1][2], atol=1e-5)


def test_value_weighted_norms_are_the_models_values(run):
    """‖v_j W_O^h‖ from the backend (MLA: values rebuilt from the latent cache) equals the one from the
    values eager's own forward hands its attention function."""
    import torch
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    family, s, ref, _ = run
    ids = [t.id for t in s.tokens]
    got: dict[int, torch.Tensor] = {}

    def capture(module, query, key, value, attention_mask, **kw):
        got[module.layer_idx] = value.detach()
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)

    AttentionInterface.register("test_capture_values", capture)
    ref.set_attn_implementation("test_capture_values")
    try:
        with torch.no_grad():
            ref(torch.tensor([ids]))
    finally:
        ref.set_attn_implementation("eager")
    D = s.info.v_head_dim or s.info.head_dim
    for layer in range(s.info.n_layers):
        v = got[layer][0].float()  # (n_kv_heads, T, D_v)
        assert v.shape[-1] == D
        w = ref.model.layers[layer].self_attn.o_proj.weight.detach().float()
        direct = torch.stack(
            [
                torch.linalg.vector_norm(v[s.info.kv_head(h)] @ w[:, h * D : (h + 1) * D].T, dim=-1)
                for h in range(s.info.n_heads)
            ]
        ).numpy()
        np.testing.assert_allclose(s.backend.value_norms(layer), direct, rtol=1e-5, atol=1e-6)


def test_mla_geometry_and_latent_cache(tmp_path):
    """MLA: keys of 16 + 8 (decoupled RoPE) per head, values of 20; the cache holds the 32-wide latent
    + the 8-wide RoPE key per token and layer, which the KV figures count."""
    from attnscope.core.analysis.kv_live import kv_live
    from attnscope.core.kv_formula import mla_cache_bytes
    from attnscope.core.loading.describe_model import describe_hf_folder
    from attnscope.core.session import Session

    save_tiny("deepseek_v3", tmp_path / "m")
    s = Session.load(str(tmp_path / "m"))
    s.prefill("latent attention " * 3, chat_template=False)
    i = s.info
    assert (i.n_heads, i.n_kv_heads, i.head_dim, i.v_head_dim, i.kv_latent_dim, i.rope_head_dim) == (
        4,
        4,
        24,
        20,
        32,
        8,
    )
    live = kv_live(s)
    want = mla_cache_bytes(i.n_layers, 32, 8, s.seq_len, "float32")
    assert live.total_bytes == live.formula_bytes == want
    assert i.attention_kind == "MLA 4 heads (latent 32 + RoPE 8) · 4 experts, 2 active + 1 shared"
    e = describe_hf_folder(tmp_path / "m")
    assert (e.kv_latent_dim, e.rope_head_dim, e.n_experts, e.experts_active) == (32, 8, 4, 2)


def test_moe_fit_counts_every_expert(tmp_path):
    """The fit and the picker's size count all experts (a token runs through 2 of 4)."""
    from attnscope.core.loading.describe_model import describe_hf_folder
    from attnscope.core.loading.fit import estimate_entry

    ref = save_tiny("qwen3_moe", tmp_path / "m")
    e = describe_hf_folder(tmp_path / "m")
    total = sum(p.numel() for p in ref.parameters())
    experts = sum(p.numel() for n, p in ref.named_parameters() if ".experts." in n)
    assert experts > total / 3 and e.n_params == total
    f = estimate_entry(e, context=64, dtype="float32", free_bytes=1 << 34)
    assert f.weights_bytes == 4 * total
    # --quantize int8 makes the nn.Linear layers 1 byte; the fused experts (and embeddings) keep 4
    f8 = estimate_entry(e, context=64, dtype="float32", free_bytes=1 << 34, quantize="int8")
    emb = 2 * 272 * 64  # untied embeddings and lm_head
    assert f8.weights_bytes == (total - emb - experts) * 1 + (emb + experts) * 4
    assert e.attention_kind == "GQA 4/2 · 4 experts, 2 active"


def test_multimodal_fit_counts_the_language_model(tmp_path):
    from attnscope.core.loading.describe_model import describe_hf_folder

    ref = save_tiny("qwen2_5_vl", tmp_path / "vl")
    e = describe_hf_folder(tmp_path / "vl")
    lm = sum(p.numel() for n, p in ref.named_parameters() if "visual" not in n)
    assert e.text_only and e.n_params == lm < sum(p.numel() for p in ref.parameters())
