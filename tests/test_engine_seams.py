"""The engine's seams (issue 10): no import cycle between loader and backend, no module-level state
in the attention hot path, declared Backend/Trace protocols, one registry instead of name branches,
one ArchConfig for the query-head -> KV-head mapping."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE = ROOT / "core"


def _imports(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports (top level or inside functions), absolute names."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_loader_does_not_import_the_torch_backend():
    """resolve.py loads with the attention function's name; it takes it from hf_attention, not from the
    backend that imports resolve (the cycle issue 10 names)."""
    backend = "attnscope.core.backends.torch_backend"
    for path in (CORE / "loading").glob("*.py"):
        assert backend not in _imports(path), path.name
    assert "attnscope.core.backends.hf_attention" in _imports(CORE / "loading" / "resolve.py")
    hf = _imports(CORE / "backends" / "hf_attention.py")
    assert not {m for m in hf if m.startswith("attnscope.core.loading") or m == backend}


def test_torch_backend_reexports_the_attention_seam():
    from attnscope.core.backends import hf_attention, torch_backend

    assert torch_backend.attnscope_attention is hf_attention.attnscope_attention
    assert torch_backend.ATTN_NAME == hf_attention.ATTN_NAME == "attnscope"


def test_fused_has_no_module_level_mutable_state():
    """The attention path keeps no cache at module level: every module-level name of fused.py is a
    function, class, constant number/string or import."""
    import attnscope.core.attention.fused as fused

    assert not hasattr(fused, "_last_exact_bias")
    for name, value in vars(fused).items():
        if name.startswith("__"):
            continue
        assert not isinstance(value, list | dict | set), name


def _wide_rows(L=6, S=6, H=4, Hkv=2, D=8):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, H, L, D, generator=g) * 40  # |lse| > 16: exact_lse redoes rows in float64
    k = torch.randn(1, Hkv, S, D, generator=g) * 40
    v = torch.randn(1, Hkv, S, D, generator=g)
    return q, k, v


def test_mask_cache_is_explicit_and_gives_the_same_results():
    from attnscope.core.attention.fused import MaskCache, sdpa_with_lse

    q, k, v = _wide_rows()
    cache = MaskCache()
    out_c, lse_cached = sdpa_with_lse(q, k, v, causal=True, mask_cache=cache)
    assert cache.key("lse") == (6, 6, 2, True, None, "cpu")  # rows with |lse| > 16 were redone
    out_p, lse_plain = sdpa_with_lse(q, k, v, causal=True)
    torch.testing.assert_close(lse_cached, lse_plain, rtol=0, atol=0)
    torch.testing.assert_close(out_c, out_p, rtol=0, atol=0)
    # a prefill chunk after cached keys (L < S) with a window: the kernel's bias is kept too
    qc = q[:, :, 4:]
    out_w, lse_w = sdpa_with_lse(qc, k, v, causal=True, sliding_window=3, mask_cache=cache)
    assert cache.key("kernel") is not None and cache.key("kernel")[:2] == (2, 6)
    kept = cache.get("kernel", cache.key("kernel"), lambda: pytest.fail("rebuilt"))
    out_w2, lse_w2 = sdpa_with_lse(qc, k, v, causal=True, sliding_window=3, mask_cache=cache)
    assert cache.get("kernel", cache.key("kernel"), lambda: None) is kept  # reused, not rebuilt
    ref_out, ref_lse = sdpa_with_lse(qc, k, v, causal=True, sliding_window=3)
    for got in (lse_w, lse_w2):
        torch.testing.assert_close(got, ref_lse, rtol=0, atol=0)
    torch.testing.assert_close(out_w, ref_out, rtol=0, atol=0)


def test_torch_trace_owns_a_mask_cache():
    from attnscope.core.attention.fused import MaskCache
    from attnscope.core.trace.torch_trace import TorchTrace

    a, b = TorchTrace(2, 4, 2, 8), TorchTrace(2, 4, 2, 8)
    assert isinstance(a.mask_cache, MaskCache) and a.mask_cache is not b.mask_cache


def test_arch_config_maps_query_heads_to_kv_heads():
    from attnscope.core.arch import ArchConfig, arch_of

    smol = ArchConfig(30, 9, 3, 64)  # SmolLM2-135M: 9 query heads over 3 KV heads
    assert smol.group_size == 3
    assert [smol.kv_head(h) for h in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert list(smol.group(1)) == [3, 4, 5]
    assert smol.kv_heads().tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for k in range(3):  # group and kv_head are inverse
        assert all(smol.kv_head(h) == k for h in smol.group(k))
    mqa, mha = ArchConfig(18, 4, 1, 256), ArchConfig(2, 4, 4, 8)  # Gemma 3 270M: MQA
    assert list(mqa.group(0)) == [0, 1, 2, 3] and mqa.kv_head(3) == 0
    assert [mha.kv_head(h) for h in range(4)] == [0, 1, 2, 3]
    with pytest.raises(IndexError):
        smol.kv_head(9)
    with pytest.raises(IndexError):
        smol.group(3)
    with pytest.raises(ValueError, match="not a multiple"):
        ArchConfig(2, 9, 2, 64)
    assert arch_of(smol) is smol


def test_model_info_and_traces_share_the_arch(tmp_path):
    from attnscope.core.arch import ArchConfig, arch_of
    from attnscope.core.loading.resolve import ModelInfo
    from attnscope.core.trace.torch_trace import TorchTrace

    info = ModelInfo("m", "src", "llama", 2, 6, 2, 16, 96, 128, 1e4, None, 100, "float32")
    assert info.arch == ArchConfig(2, 6, 2, 16) and arch_of(info) == info.arch
    assert info.group_size == 3 and info.kv_head(4) == 1 and list(info.group(1)) == [3, 4, 5]
    trace = TorchTrace(2, 6, 2, 16)
    assert trace.arch == info.arch and trace.group_size == 3 and trace.kv_head(5) == 1
    with pytest.raises(ValueError, match="not a multiple"):
        TorchTrace(2, 6, 4, 16)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
