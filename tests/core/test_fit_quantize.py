"""The fit estimate counts --quantize, the runtime, MLX-packed GGUFs, and matches measured RSS.

The measured figures are `attnscope bench` peak RSS on this project's 2-core CPU machine (README
"Real-size models"); the estimate must be within 15 % of each.
"""

from __future__ import annotations

import pytest
from attnscope.core.loading.fit import (
    QUANT_BYTES,
    RUNTIME_BYTES,
    embedding_params,
    estimate,
    estimate_entry,
    mlx_packed_bytes,
    weights_bytes,
)
from tiny_models import save_tiny, tiny_model, write_llama_gguf

GB = 10**9

# Published geometries (tests/make_synthetic.py CONFIGS): params, layers, heads, kv heads, head_dim,
# embedding params (vocab × hidden, × 2 when lm_head is untied).
LLAMA_1B = dict(n_params=1_235_814_400, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64)
LLAMA_1B_EMB = 128_256 * 2048  # tied
LLAMA_8B = dict(n_params=8_030_261_248, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128)
LLAMA_8B_EMB = 2 * 128_256 * 4096  # untied

# (geometry, embedding params, dtype, quantize, context, measured peak RSS of the capture prefill)
MEASURED = [
    pytest.param(LLAMA_1B, LLAMA_1B_EMB, "bfloat16", "none", 2048, 3.31 * GB, id="1B-bf16-2048"),
    pytest.param(LLAMA_1B, LLAMA_1B_EMB, "bfloat16", "int8", 512, 2.22 * GB, id="1B-int8-512"),
    pytest.param(LLAMA_8B, LLAMA_8B_EMB, "bfloat16", "none", 512, 15.8 * GB, id="8B-bf16-512"),
    pytest.param(LLAMA_8B, LLAMA_8B_EMB, "bfloat16", "int8", 512, 10.49 * GB, id="8B-int8-512"),
]


@pytest.mark.parametrize(("geo", "emb", "dtype", "quantize", "context", "measured"), MEASURED)
def test_estimate_matches_measured_peak_rss_within_15_percent(geo, emb, dtype, quantize, context, measured):
    f = estimate(
        **geo,
        context=context,
        dtype=dtype,
        quantize=quantize,
        linear_params=geo["n_params"] - emb,
        free_bytes=23 * GB,
    )
    assert abs(f.total_bytes - measured) <= 0.15 * measured, (f.total_bytes / GB, measured / GB)


def test_quantised_weight_bytes():
    # 1000 params, 800 of them in linear layers; the other 200 at the load dtype (bf16: 2 bytes)
    assert weights_bytes(1000, dtype="bfloat16") == 2000
    assert weights_bytes(1000, dtype="bfloat16", quantize="int8", linear_params=800) == 800 + 400
    assert weights_bytes(1000, dtype="bfloat16", quantize="int4", linear_params=800) == 425 + 400
    assert weights_bytes(1000, dtype="float32", quantize="int8") == 1000  # unknown split: all linear
    kw = dict(n_params=1000, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=1, context=0, dtype="bfloat16")
    q = estimate(**kw, quantize="int8", linear_params=800)  # quantised: the same runtime as float
    assert q.runtime_bytes == RUNTIME_BYTES["torch"] and q.weights_bytes == 800 + 400
    assert QUANT_BYTES["int4"] == 0.5 + 4 / 128
    with pytest.raises(ValueError, match="unknown quantisation 'int3'"):
        estimate(n_params=1, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=1, context=1, quantize="int3")


def test_runtime_is_counted_once_per_backend():
    kw = dict(n_params=1000, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=1, context=0, free_bytes=GB)
    assert estimate(**kw).total_bytes == 4000 + RUNTIME_BYTES["torch"]
    assert estimate(**kw, backend="mlx").runtime_bytes == RUNTIME_BYTES["mlx"]
    assert estimate(**kw, runtime=False).total_bytes == 4000
    assert "runtime" in estimate(**kw).summary()


def _entry(path, fmt, n_params, **kw):
    from attnscope.core.loading.catalog_entry import CatalogEntry

    base = dict(
        source="user",
        name=path.name,
        path=path,
        format=fmt,
        architecture="llama",
        n_params=n_params,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        max_context=256,
        dtype="bfloat16",
        size_bytes=1,
        supported=True,
        model_ref=str(path),
        checkpoint_dtype="bfloat16",
    )
    return CatalogEntry(**{**base, **kw})


def test_entry_with_quantize_keeps_embeddings_at_the_load_dtype(tmp_path):
    m = tiny_model("llama")  # vocab 272, hidden 64, untied
    n = sum(p.numel() for p in m.parameters())
    save_tiny("llama", tmp_path / "tiny")
    assert embedding_params(tmp_path / "tiny") == 2 * 272 * 64
    e = _entry(tmp_path / "tiny", "hf", n)
    f = estimate_entry(e, 16, dtype="bfloat16", quantize="int8", free_bytes=GB)
    assert f.quantize == "int8" and f.dtype == "bfloat16"
    assert f.weights_bytes == (n - 2 * 272 * 64) * 1 + 2 * 272 * 64 * 2
    f4 = estimate_entry(e, 16, dtype="float32", quantize="int4", free_bytes=GB)
    assert f4.dtype == "bfloat16" and "int4 runs with bfloat16" in f4.dtype_reason
    gg = write_llama_gguf(m, tmp_path / "tiny.gguf")
    assert embedding_params(gg, "gguf") == 2 * 272 * 64  # token_embd + output
    assert embedding_params(tmp_path / "nothing") is None


def test_mlx_counts_a_packed_gguf_at_its_packed_size(tmp_path):
    import gguf

    m = tiny_model("llama")
    n = sum(p.numel() for p in m.parameters())
    q4 = write_llama_gguf(m, tmp_path / "q4.gguf", gguf.GGMLQuantizationType.Q4_0)
    f32 = write_llama_gguf(m, tmp_path / "f32.gguf")
    norms = 64 * (2 * 2 + 1)  # two per layer + the final one, float
    assert mlx_packed_bytes(q4, "float32") == int((n - norms) * (0.5 + 8 / 32) + norms * 4)
    assert mlx_packed_bytes(f32, "float32") is None
    e = _entry(q4, "gguf", n, dtype="Q4_0", checkpoint_dtype="", quantised=True)
    on_mlx = estimate_entry(e, 16, backend="mlx", dtype="float32", free_bytes=GB)
    on_torch = estimate_entry(e, 16, backend="torch", dtype="float32", free_bytes=GB)
    assert on_mlx.weights_bytes == mlx_packed_bytes(q4, "float32")
    assert on_torch.weights_bytes == 4 * n  # converted to float32 for torch
