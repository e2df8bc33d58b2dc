"""The engine's seams: no import cycle between loader and backend, no module-level state
in the attention hot path, declared Backend/Trace protocols, one registry instead of name branches,
one ArchConfig for the query-head -> KV-head mapping."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
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
    backend that imports resolve (the cycle this test forbids)."""
    backend = "attnscope.core.backends.torch_backend"
    for path in (CORE / "loading").glob("*.py"):
        assert backend not in _imports(path), path.name
    # the torch load (core/backends/torch_load.py) takes the name from hf_attention
    assert "attnscope.core.backends.hf_attention" in _imports(CORE / "backends" / "torch_load.py")
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
    from attnscope.core.loading.model_info import ModelInfo
    from attnscope.core.trace.torch_trace import TorchTrace

    info = ModelInfo("m", "src", "llama", 2, 6, 2, 16, 96, 128, 1e4, None, 100, "float32")
    assert info.arch == ArchConfig(2, 6, 2, 16) and arch_of(info) == info.arch
    assert info.group_size == 3 and info.kv_head(4) == 1 and list(info.group(1)) == [3, 4, 5]
    trace = TorchTrace(2, 6, 2, 16)
    assert trace.arch == info.arch and trace.group_size == 3 and trace.kv_head(5) == 1
    with pytest.raises(ValueError, match="not a multiple"):
        TorchTrace(2, 6, 4, 16)


# -- declared protocols --------------------------------------------------------------------------------
def _protocol_methods(proto) -> dict:
    import inspect

    return {
        n: inspect.signature(getattr(proto, n))
        for n, v in vars(proto).items()
        if callable(v) and not n.startswith("_")
    }


def _conforms(cls, proto) -> list[str]:
    """What ``cls`` lacks of ``proto``'s methods: a method, or a parameter (by name and default; a
    positional-only protocol parameter by position)."""
    import inspect

    problems = []
    for name, want in _protocol_methods(proto).items():
        impl = getattr(cls, name, None)
        if impl is None or not callable(impl):
            problems.append(f"{cls.__name__}.{name} missing")
            continue
        got = inspect.signature(impl)
        gp = list(got.parameters.values())
        for i, p in enumerate(want.parameters.values()):
            if p.kind is p.POSITIONAL_ONLY:
                if i >= len(gp) or gp[i].kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                    problems.append(f"{cls.__name__}.{name}: no positional parameter {i} ({p.name})")
                continue
            q = got.parameters.get(p.name)
            if q is None:
                problems.append(f"{cls.__name__}.{name}: no parameter {p.name!r}")
            elif p.default is not p.empty and p.default is not Ellipsis and q.default != p.default:
                problems.append(f"{cls.__name__}.{name}({p.name}=...) default {q.default!r} != {p.default!r}")
            elif p.kind is p.KEYWORD_ONLY and q.kind not in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
                problems.append(f"{cls.__name__}.{name}: {p.name!r} not keyword")
    return problems


def _backend_classes():
    from attnscope.core.backends.torch_backend import TorchBackend

    out = [TorchBackend]
    try:
        from attnscope.core.backends.mlx_backend import MlxBackend
    except ImportError:  # pragma: no cover - MLX absent
        return out
    return out + [MlxBackend]


def _trace_classes():
    from attnscope.core.trace.torch_trace import TorchTrace

    out = [TorchTrace]
    try:
        from attnscope.core.trace.mlx_trace import MlxTrace
    except ImportError:  # pragma: no cover
        return out
    return out + [MlxTrace]


def test_backend_and_trace_classes_have_every_protocol_method_and_parameter():
    from attnscope.core.backends.base import Backend
    from attnscope.core.trace.base import Trace

    assert {"forward", "fork", "kv_layer_bytes", "layer_windows", "release_weights"} <= set(
        _protocol_methods(Backend)
    )
    assert {"weights", "row_mass", "sink_scores", "diagonal", "record"} <= set(_protocol_methods(Trace))
    assert len(_backend_classes()) == 2 and len(_trace_classes()) == 2, "MLX is part of the test environment"
    for cls in _backend_classes():
        assert _conforms(cls, Backend) == []
    for cls in _trace_classes():
        assert _conforms(cls, Trace) == []


def test_the_check_catches_a_missing_method_and_a_wrong_parameter():
    from attnscope.core.trace.base import Trace
    from attnscope.core.trace.torch_trace import TorchTrace

    class Broken(TorchTrace):
        def weights(self, layer, head, rows=None):  # cols missing
            return super().weights(layer, head, rows)

        sink_scores = None  # not callable

    problems = _conforms(Broken, Trace)
    assert "Broken.weights: no parameter 'cols'" in problems
    assert "Broken.sink_scores missing" in problems


@pytest.fixture(scope="module")
def tiny_sessions(tmp_path_factory):
    from attnscope.core.session import Session
    from tiny_models import save_tiny

    folder = tmp_path_factory.mktemp("tiny_seams")
    save_tiny("llama", folder, seed=4)
    out = {"torch": Session.load(str(folder))}
    try:
        out["mlx"] = Session.load(str(folder), backend="mlx", dtype="float32")
    except ImportError:  # pragma: no cover
        pass
    for s in out.values():
        s.prefill("one two three four five six", chat_template=False)
    return out


def test_loaded_backends_and_traces_are_instances_of_the_protocols(tiny_sessions):
    from attnscope.core.backends.base import Backend
    from attnscope.core.trace.base import Trace

    assert set(tiny_sessions) == {"torch", "mlx"}
    for name, s in tiny_sessions.items():
        assert isinstance(s.backend, Backend) and s.backend.name == name
        assert isinstance(s.trace, Trace)
        assert s.backend.kv_layer_bytes().sum() == s.kv_cache_bytes() == s.backend.kv_cache_bytes()
        assert s.backend.cache_dtype() == "float32"
        assert s.backend.layer_windows() == (None,) * s.info.n_layers


def test_shared_trace_summaries_agree_across_backends(tiny_sessions):
    """sink_scores, row_mass and diagonal are written once (TraceGeometry) over each trace's tensor
    maths; on the same weights both backends give the same numbers, equal to the summed weights."""
    t, m = tiny_sessions["torch"].trace, tiny_sessions["mlx"].trace
    for trace in (t, m):
        full = np.stack(
            [np.stack([trace.weights(lyr, h) for h in range(trace.n_heads)]) for lyr in range(trace.n_layers)]
        )  # (L, H, T, T)
        np.testing.assert_allclose(trace.row_mass([0, 2, 2]), full[..., [0, 2]].sum(-1), atol=2e-6)
        np.testing.assert_allclose(trace.sink_scores(), full[..., 1:, 0].mean(-1), atol=2e-6)
        np.testing.assert_allclose(trace.diagonal(1)[..., 1:], np.diagonal(full, -1, 2, 3), atol=2e-6)
        assert trace.row_mass([]).shape == full.shape[:3] and not trace.row_mass([]).any()
        with pytest.raises(IndexError):
            trace.row_mass([trace.seq_len])
        with pytest.raises(ValueError):
            trace.diagonal(-1)
    np.testing.assert_allclose(t.sink_scores(), m.sink_scores(), atol=1e-5)
    np.testing.assert_allclose(t.row_mass([0, 3]), m.row_mass([0, 3]), atol=1e-5)


def test_weights_block_of_both_traces(tiny_sessions):
    """The generic weights_block (MLX) and the batched torch one: the same stacked exact weights."""
    t, m = tiny_sessions["torch"].trace, tiny_sessions["mlx"].trace
    rows, cols = slice(2, 6), slice(0, 5)
    for trace in (t, m):
        want = np.stack([trace.weights(1, h, rows, cols) for h in (0, 3)])
        np.testing.assert_allclose(trace.weights_block(1, [0, 3], rows, cols).numpy(), want, atol=2e-6)
        logw = trace.weights_block(1, [0, 3], rows, cols, log=True).numpy()
        assert np.isneginf(logw[want == 0]).all()
        np.testing.assert_allclose(np.exp(logw), want, atol=2e-6)
        assert trace.weights_block(0, None).shape == (trace.n_heads, trace.seq_len, trace.seq_len)
        with pytest.raises(IndexError):
            trace.weights_block(0, [])
    np.testing.assert_allclose(t.weights_block(1, None).numpy(), m.weights_block(1, None).numpy(), atol=1e-5)


def test_fork_leaves_the_session_alone_and_mlx_refuses_overrides(tiny_sessions):
    from attnscope.core import backend_registry as registry
    from attnscope.core.errors import UnsupportedModelError

    for s in tiny_sessions.values():
        before = s.trace.weights(0, 1).copy()
        with s.backend.fork(capture=True) as b:
            assert b is not s.backend and b.seq_len == 0
            b.forward(s.ids[:3])
            assert b.trace.seq_len == 3
        np.testing.assert_array_equal(s.trace.weights(0, 1), before)
        assert (
            s.backend.supports_overrides
            == (s.backend.name == "torch")
            == registry.get(s.backend.name).overrides
        )
    with pytest.raises(UnsupportedModelError, match="torch backend"):
        with tiny_sessions["mlx"].backend.fork(overrides=object()):
            pass


# -- the registry ---------------------------------------------------------------------------------------
def test_registry_names_and_refusals(tmp_path):
    from attnscope.core import backend_registry as registry
    from attnscope.core.errors import SessionError
    from attnscope.core.session import Session

    assert registry.names() == ("torch", "mlx") and registry.DEFAULT == "torch"
    assert registry.labels() == {"torch": "torch", "mlx": "MLX"}
    backend_problem = registry.problem
    with pytest.raises(SessionError, match="unknown backend 'jax': choose torch or mlx"):
        Session.load(None, backend="jax")
    with pytest.raises(SessionError, match="--device-map is for the torch backend"):
        Session.load(str(tmp_path), backend="mlx", device_map="auto")  # refused before any loading
    assert backend_problem("gpt2", "mlx") == (
        f"the MLX backend does not run gpt2 models (it runs {', '.join(registry.MLX_FAMILIES)})"
    )
    assert backend_problem("gpt2", "torch") is None and backend_problem("", "mlx") is None
    assert backend_problem("llama", "nope") is None
    assert registry.get("torch").backend_class().__name__ == "TorchBackend"


def test_no_feature_module_branches_on_the_backend():
    """``grep -rn "backend.name ==\\|backend.model" core/`` finds only the backends."""
    import re

    pat = re.compile(r"backend\.name ==|backend\.model")
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in CORE.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pat.search(line)
    ]
    allowed = ("core/backends/", "core/remote/")  # the backends themselves (remote: its own stand-in)
    assert [h for h in hits if not h.startswith(allowed)] == []


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
