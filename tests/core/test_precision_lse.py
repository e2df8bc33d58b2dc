"""Exact weights at large |LSE|, reduced-precision LSEs, V head size != Q head
size, and the MLX fused path's rounding of bf16/fp16 scores.

Right values come from the float64 reference (attnscope.core.attention.reference) or, for a sample
at |LSE| ≈ 30000, from the closed form: W = softmax([30000, 29999, 29990]) = [0.7310343, 0.2689325, 0.0000332].
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attnscope.core.attention import reference
from attnscope.core.attention.fused import LSE_FP32_EXACT, attention, exact_lse, math_with_lse, sdpa_with_lse
from attnscope.core.trace.torch_trace import TorchTrace
from flash_reference import flash_attention

SAMPLE_W = np.array([0.7310343, 0.2689325, 0.0000332])
SAMPLE_O = 2.5709875


def _sample():
    q = torch.tensor([1.0]).reshape(1, 1, 1, 1)
    k = torch.tensor([30000.0, 29999.0, 29990.0]).reshape(1, 1, 3, 1)
    v = torch.tensor([2.0, 4.0, 1000.0]).reshape(1, 1, 3, 1)
    return q, k, v


def _exact_w(s: np.ndarray) -> np.ndarray:
    s = s.astype(np.float64)
    e = np.exp(s - s.max())
    return e / e.sum()


# ------------------------------------------------------------------ §1 the sample, torch -------


@pytest.mark.parametrize("path", ["attention", "flash", "flash-blocks-of-1"])
def test_issue_sample_weights_output_and_row_sum(path):
    q, k, v = _sample()
    if path == "attention":
        res = attention(q, k, v, scale=1.0, return_lse=True, return_weights=True)
    else:
        res = flash_attention(
            q, k, v, scale=1.0, block_k=1 if path.endswith("1") else 64, return_lse=True, return_weights=True
        )
    w = res.weights[0, 0, 0].double().numpy()
    np.testing.assert_allclose(w, SAMPLE_W, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(w, _exact_w(np.array([30000, 29999, 29990])), rtol=1e-6)
    assert abs(w.sum() - 1.0) < 1e-6
    assert abs(float(res.out) - SAMPLE_O) < 1e-5
    assert res.lse.dtype == torch.float64
    # flash combines its float32 m and ℓ in float64: ℓ's own float32 sum limits it to ~1e-7
    assert abs(float(res.lse) - (30000 + np.log1p(np.exp(-1) + np.exp(-10)))) < (
        1e-9 if path == "attention" else 1e-7
    )


def test_issue_sample_through_the_trace():
    # rows 0..2 of a causal layout; row 2 sees the sample's three keys
    q = torch.ones(1, 1, 3, 1)
    k = torch.tensor([30000.0, 29999.0, 29990.0]).reshape(1, 1, 3, 1)
    v = torch.tensor([2.0, 4.0, 1000.0]).reshape(1, 1, 3, 1)
    out, lse = sdpa_with_lse(q, k, v, scale=1.0, causal=True)
    tr = TorchTrace(1, 1, 1, 1)
    tr.record(0, q, lse, k, 1.0, None)
    w = tr.weights(0, 0).astype(np.float64)
    np.testing.assert_allclose(w[2], SAMPLE_W, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-6)
    assert abs(float(out[0, 0, 2]) - SAMPLE_O) < 1e-5
    np.testing.assert_allclose(tr.weight_on_key(0)[0, 0], w[:, 0], rtol=1e-6)
    assert tr.lse(0).dtype == np.float64


# ------------------------------------------------------------- §1 beyond the sample, torch ------


@pytest.mark.parametrize("offset", [3.0e4, -3.0e4, 1.0e3, 20.0])
@pytest.mark.parametrize("kind", ["fused", "math", "prefix-chunk", "decode"])
def test_large_scores_give_exact_weights(offset, kind):
    # integer keys on d = 4 with q = e_0 + 2 e_1: float32 scores are exact, so any error left is the LSE's
    rng = np.random.default_rng(int(abs(offset)) % 97)
    S, L = 40, {"fused": 40, "math": 40, "prefix-chunk": 7, "decode": 1}[kind]
    k = np.zeros((1, 2, S, 4), np.float32)
    k[..., 0] = offset + rng.integers(-6, 7, size=(1, 2, S))
    k[..., 1] = rng.integers(-3, 4, size=(1, 2, S))
    q = np.zeros((1, 4, L, 4), np.float32)
    q[..., 0], q[..., 1] = 1.0, 2.0
    v = rng.standard_normal((1, 2, S, 4)).astype(np.float32)
    ref = reference.attention(
        *(a.astype(np.float64) for a in (q, k, v)),
        scale=1.0,
        mask="causal",
        return_lse=True,
        return_weights=True,
    )  # float64 in: float64 LSE out
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    if kind == "math":
        out, lse = math_with_lse(tq, tk, tv, scale=1.0, causal=True)
        res = attention(tq, tk, tv, scale=1.0, mask="causal", return_weights=True)
    else:
        out, lse = sdpa_with_lse(tq, tk, tv, scale=1.0, causal=True)
        res = attention(tq, tk, tv, scale=1.0, mask="causal", return_weights=True)
    assert lse.dtype == torch.float64
    np.testing.assert_allclose(lse.numpy(), ref.lse, rtol=0, atol=1e-9 * max(1.0, abs(offset)))
    w = res.weights.double().numpy()
    live = ref.weights > 1e-30
    np.testing.assert_allclose(w[live], ref.weights[live], rtol=2e-6)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(out.numpy(), ref.out, atol=1e-5 * max(1.0, np.abs(ref.out).max()))


def test_trace_rows_sum_to_one_at_large_lse_from_prefill_chunks():
    # a trace fed in two chunks (prefill 5, then decode rows) keeps the float64 LSE of each
    rng = np.random.default_rng(3)
    T = 9
    k = torch.from_numpy((2.0e4 + rng.integers(-5, 6, size=(1, 1, T, 1))).astype(np.float32))
    q = torch.ones(1, 2, T, 1)
    v = torch.from_numpy(rng.standard_normal((1, 1, T, 1)).astype(np.float32))
    tr = TorchTrace(1, 2, 1, 1)
    for r0, r1 in ((0, 5), (5, 6), (6, 9)):
        _, lse = sdpa_with_lse(q[:, :, r0:r1], k[:, :, :r1], v[:, :, :r1], scale=1.0, causal=True)
        tr.record(0, q[:, :, r0:r1], lse, k[:, :, :r1], 1.0, None)
    ref = reference.attention(
        q.double().numpy(),
        k.double().numpy(),
        v.double().numpy(),
        scale=1.0,
        mask="causal",
        return_weights=True,
    )
    for h in range(2):
        w = tr.weights(0, h).astype(np.float64)
        np.testing.assert_allclose(w.sum(1), 1.0, atol=1e-6)
        np.testing.assert_allclose(w, ref.weights[0, h], rtol=2e-6, atol=1e-12)
        tile = tr.weights(0, h, slice(3, 9), slice(2, 6)).astype(np.float64)
        np.testing.assert_allclose(tile, ref.weights[0, h, 3:9, 2:6], rtol=2e-6, atol=1e-12)


def test_small_lse_rows_keep_the_kernel_value():
    # below LSE_FP32_EXACT nothing is recomputed: the float32 LSE is widened as it is
    rng = np.random.default_rng(0)
    q, k, v = (
        torch.from_numpy(rng.standard_normal(s).astype(np.float32))
        for s in ((1, 2, 5, 8), (1, 1, 5, 8), (1, 1, 5, 8))
    )
    from attnscope.core.attention.fused import _sdpa_kernel_lse

    _, raw = _sdpa_kernel_lse(q, k, v, scale=None, causal=True, sliding_window=None, mask=None)
    assert float(raw.abs().max()) < LSE_FP32_EXACT
    got = exact_lse(q, k, raw, causal=True)
    assert torch.equal(got, raw.double())


# ------------------------------------------------------ §1 reduced-precision kernels, torch -----


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_uniform_8192_key_rows_sum_to_one_in_reduced_precision(dtype):
    # the CPU kernel's LSE is ~5e-5 off here (rows summed to 1.00005); exact_lse recomputes it
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 1, 64, generator=g).to(dtype)
    k = torch.zeros(1, 1, 8192, 64, dtype=dtype)
    v = torch.randn(1, 1, 8192, 64, generator=g).to(dtype)
    res = attention(q, k, v, return_lse=True, return_weights=True)
    np.testing.assert_allclose(res.lse.numpy(), np.log(8192), rtol=0, atol=1e-6)  # float32 logsumexp
    np.testing.assert_allclose(res.weights.double().sum(-1).numpy(), 1.0, atol=1e-6)
    np.testing.assert_allclose(res.weights.numpy(), 1 / 8192, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("L,S", [(1, 50), (7, 30), (30, 30)])
def test_reduced_precision_weights_match_the_reference_of_the_rounded_inputs(dtype, L, S):
    g = torch.Generator().manual_seed(L * S)
    q, k, v = (torch.randn(*s, generator=g).to(dtype) for s in ((1, 4, L, 16), (1, 2, S, 16), (1, 2, S, 16)))
    ref = reference.attention(
        *(t.double().numpy() for t in (q, k, v)), mask="causal", return_lse=True, return_weights=True
    )
    out, lse = sdpa_with_lse(q, k, v, causal=True)
    np.testing.assert_allclose(lse.numpy(), ref.lse, atol=1e-6)
    w = attention(q, k, v, mask="causal", return_weights=True).weights.double().numpy()
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(w, ref.weights, rtol=1e-5, atol=1e-7)
    if L == S:  # a trace's rows are positions 0 .. T-1
        tr = TorchTrace(1, 4, 2, 16)
        tr.record(0, q, lse, k, 16**-0.5, None)
        np.testing.assert_allclose(tr.weights(0, 3).astype(np.float64).sum(1), 1.0, atol=1e-6)
        np.testing.assert_allclose(tr.weights(0, 3), ref.weights[0, 3], rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------- §2 Dv != D, torch ---------


def test_issue_sample_value_head_smaller_than_query_head():
    rng = np.random.default_rng(12)
    q, k = (
        rng.standard_normal((1, 1, 2, 4)).astype(np.float32),
        rng.standard_normal((1, 1, 2, 4)).astype(np.float32),
    )
    v = rng.standard_normal((1, 1, 2, 2)).astype(np.float32)
    ref = reference.attention(q, k, v, mask="causal", return_lse=True, return_weights=True)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    res = attention(tq, tk, tv, mask="causal", return_lse=True, return_weights=True)
    assert res.out.shape == (1, 1, 2, 2)
    np.testing.assert_allclose(res.out.numpy(), ref.out, atol=1e-6)
    np.testing.assert_allclose(res.lse.numpy(), ref.lse, atol=1e-6)
    np.testing.assert_allclose(res.weights.numpy(), ref.weights, atol=1e-6)
    out, _ = sdpa_with_lse(tq, tk, tv, causal=True)
    np.testing.assert_allclose(out.numpy(), ref.out, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("Dv", [1, 3, 16, 40])
@pytest.mark.parametrize("case", ["prefill", "chunk", "decode", "window", "mask", "no-mask"])
def test_value_head_size_differs_from_query_head_size(dtype, Dv, case):
    rng = np.random.default_rng(Dv)
    L, S = {
        "prefill": (9, 9),
        "chunk": (4, 11),
        "decode": (1, 11),
        "window": (9, 9),
        "mask": (5, 7),
        "no-mask": (5, 7),
    }[case]
    q = rng.standard_normal((2, 6, L, 8)).astype(np.float32)
    k = rng.standard_normal((2, 3, S, 8)).astype(np.float32)
    v = rng.standard_normal((2, 3, S, Dv)).astype(np.float32)
    tq, tk, tv = (torch.from_numpy(a).to(dtype) for a in (q, k, v))
    rq, rk, rv = (t.float().numpy() for t in (tq, tk, tv))
    from attnscope.core.attention.masks import Mask

    extra = rng.random((L, S)) < 0.7
    mask = {
        "window": Mask(causal=True, window=3),
        "mask": Mask(causal=True, array=extra),
        "no-mask": None,
    }.get(case, "causal")
    ref = reference.attention(rq, rk, rv, mask=mask, return_lse=True)
    got = attention(tq, tk, tv, mask=mask, return_lse=True)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert got.out.shape == (2, 6, L, Dv) and got.out.dtype == dtype
    np.testing.assert_allclose(got.out.float().numpy(), ref.out, atol=tol)
    live = np.isfinite(ref.lse)
    np.testing.assert_allclose(got.lse.numpy()[live], ref.lse[live], atol=1e-5)
    fl = flash_attention(tq, tk, tv, mask=mask, block_q=3, block_k=4)
    np.testing.assert_allclose(fl.out.float().numpy(), ref.out, atol=tol)


# --------------------------------------------------------------------------- MLX (§1, §2, §6) --

mx = pytest.importorskip("mlx.core")


def test_mlx_issue_sample_and_trace_parts():
    from attnscope.core.attention.fused_mlx import attention as mlx_attention
    from attnscope.core.attention.fused_mlx import sdpa_with_lse_mlx
    from attnscope.core.trace.mlx_trace import MlxTrace

    q = mx.array([1.0, 1.0, 1.0]).reshape(1, 1, 3, 1)
    k = mx.array([30000.0, 29999.0, 29990.0]).reshape(1, 1, 3, 1)
    v = mx.array([2.0, 4.0, 1000.0]).reshape(1, 1, 3, 1)
    ref = mlx_attention(q[:, :, 2:], k, v, scale=1.0, return_weights=True)
    np.testing.assert_allclose(np.array(ref.weights)[0, 0, 0], SAMPLE_W, rtol=2e-6, atol=1e-7)
    for fused in (None, True, False):
        out, (m, ell) = sdpa_with_lse_mlx(q, k, v, scale=1.0, mask="causal", fused=fused, parts=True)
        assert abs(float(np.array(out)[0, 0, 2, 0]) - SAMPLE_O) < 1e-4  # |v| = 1000: float32 out
        np.testing.assert_allclose(np.array(m)[0, 0], [30000, 30000, 30000])

        class Cache:  # what MlxTrace reads: the layer cache's keys and how many positions it holds
            keys = k
            offset = k.shape[2]

            @staticmethod
            def fetch_keys():
                return k[0]

        tr = MlxTrace(1, 1, 1, 1)
        tr.record(0, q, (m, ell), Cache, 1.0, None)
        w = tr.weights(0, 0).astype(np.float64)
        np.testing.assert_allclose(w[2], SAMPLE_W, rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(w.sum(1), 1.0, atol=1e-6)
        assert abs(tr.lse(0)[0, 2] - (30000 + np.log1p(np.exp(-1) + np.exp(-10)))) < 1e-3
        np.testing.assert_allclose(tr.weight_on_key(0)[0, 0], w[:, 0], rtol=1e-6)


@pytest.mark.parametrize("fused", [None, True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_mlx_value_head_size_differs(fused, dtype):
    from attnscope.core.attention.fused_mlx import attention as mlx_attention
    from attnscope.core.attention.fused_mlx import sdpa_with_lse_mlx

    rng = np.random.default_rng(2)
    arrs = [rng.standard_normal(s).astype(np.float32) for s in ((1, 1, 2, 4), (1, 1, 2, 4), (1, 1, 2, 2))]
    mq, mk, mv = (mx.array(a).astype(getattr(mx, dtype)) for a in arrs)
    rq, rk, rv = (np.array(a.astype(mx.float32)) for a in (mq, mk, mv))
    ref = reference.attention(rq, rk, rv, mask="causal", return_lse=True)
    tol = 1e-5 if dtype == "float32" else 1e-2
    out, lse = sdpa_with_lse_mlx(mq, mk, mv, mask="causal", fused=fused)
    assert out.shape == (1, 1, 2, 2)
    np.testing.assert_allclose(np.array(out.astype(mx.float32)), ref.out, atol=tol)
    np.testing.assert_allclose(np.array(lse), ref.lse, atol=1e-5)
    got = mlx_attention(mq, mk, mv, mask="causal")
    np.testing.assert_allclose(np.array(got.out.astype(mx.float32)), ref.out, atol=tol)
    # GQA, a prefill chunk after cached keys, Dv = 24 > D = 8
    arrs = [rng.standard_normal(s).astype(np.float32) for s in ((1, 4, 3, 8), (1, 2, 10, 8), (1, 2, 10, 24))]
    mq, mk, mv = (mx.array(a).astype(getattr(mx, dtype)) for a in arrs)
    rq, rk, rv = (np.array(a.astype(mx.float32)) for a in (mq, mk, mv))
    ref = reference.attention(rq, rk, rv, mask="causal")
    out, _ = sdpa_with_lse_mlx(mq, mk, mv, mask="causal", fused=fused)
    np.testing.assert_allclose(np.array(out.astype(mx.float32)), ref.out, atol=tol)


def test_mlx_fused_path_does_not_round_bf16_or_fp16_scores():
    # scores 1024 + 0.3·j and 2048 + 0.6·j: bf16 (spacing 8, 16) and fp16 (spacing 1, 2) rounding of
    # the scores flattens or steps the softmax and moves the output by far more than its own rounding
    from attnscope.core.attention.fused_mlx import fast_keeps_float32_scores, sdpa_with_lse_mlx

    assert fast_keeps_float32_scores(mx.float32)
    j = np.arange(6, dtype=np.float32)
    for dtype in (mx.bfloat16, mx.float16):
        q = mx.array(np.array([[1024.0, 1.0], [2048.0, 2.0]], np.float32).reshape(1, 1, 2, 2)).astype(dtype)
        k = mx.array(np.stack([np.ones(6, np.float32), 0.3125 * j], -1).reshape(1, 1, 6, 2)).astype(dtype)
        v = mx.array(np.stack([j, -j], -1).reshape(1, 1, 6, 2)).astype(dtype)
        ref = reference.attention(*(np.array(a.astype(mx.float32)) for a in (q, k, v)), scale=1.0)
        fast = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0)
        raw_err = np.abs(np.array(fast.astype(mx.float32)) - ref.out).max()
        verified = fast_keeps_float32_scores(dtype)
        if not verified:  # e.g. the CPU build: the kernel itself is off, far beyond output rounding
            assert raw_err > 0.05, raw_err
        for fused in (None, True, False):
            out, _ = sdpa_with_lse_mlx(q, k, v, scale=1.0, mask=None, fused=fused)
            err = np.abs(np.array(out.astype(mx.float32)) - ref.out).max()
            assert err < 2**-7 * max(1.0, np.abs(ref.out).max()), (str(dtype), fused, err)
    if mx.default_device().type == mx.DeviceType.cpu:
        assert not fast_keeps_float32_scores(mx.bfloat16) and not fast_keeps_float32_scores(mx.float16)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mlx_uniform_8192_key_rows_sum_to_one_in_reduced_precision(dtype):
    from attnscope.core.attention.fused_mlx import sdpa_with_lse_mlx
    from attnscope.core.trace.mlx_trace import MlxTrace

    rng = np.random.default_rng(1)
    S = 8192
    q = mx.array(rng.standard_normal((1, 2, S, 8)).astype(np.float32)).astype(getattr(mx, dtype))
    k = mx.zeros((1, 1, S, 8), dtype=getattr(mx, dtype))
    v = mx.array(rng.standard_normal((1, 1, S, 8)).astype(np.float32)).astype(getattr(mx, dtype))
    _, (m, ell) = sdpa_with_lse_mlx(q[:, :, -1:], k, v, mask="causal", parts=True)
    np.testing.assert_allclose(np.array(m) + np.array(ell).astype(np.float64), np.log(S), atol=1e-6)

    class Cache:
        keys = k
        offset = k.shape[2]

        @staticmethod
        def fetch_keys():
            return k[0]

    T = 1024  # the trace over a whole causal map (rows are positions 0 .. T-1)
    k, q, v = k[:, :, :T], q[:, :, :T], v[:, :, :T]
    _, parts = sdpa_with_lse_mlx(q, k, v, mask="causal", parts=True)
    tr = MlxTrace(1, 2, 1, 8)
    tr.record(0, q, parts, Cache, 8**-0.5, None)
    w = tr.weights(0, 1, rows=slice(T - 4, T)).astype(np.float64)
    np.testing.assert_allclose(w.sum(1), 1.0, atol=1e-6)
    np.testing.assert_allclose(w[-1], 1 / T, rtol=1e-6)


# ------------------------------------ §1 the model path at bf16/fp16: kernel LSE, rows rebuilt ---


@pytest.mark.parametrize("family", ["llama", "mistral"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_model_path_half_precision_maps_are_exact_for_the_stored_inputs(tmp_path, family, dtype):
    """The forward keeps the CPU kernel's half-precision LSE (no extra scores pass per layer); the
    trace rebuilds the LSE of the rows a map reads, so every map still equals the float64 softmax of
    the stored q and cached k, whole or as a tile, with a sliding window too (mistral)."""
    from attnscope.core.session import Session
    from tiny_models import save_tiny

    save_tiny(family, tmp_path / family)
    s = Session.load(str(tmp_path / family), dtype=dtype)
    s.prefill("the quick brown fox jumps over the lazy dog " * 3, chat_template=False)
    s.step(3)
    T = s.seq_len
    for layer in range(s.info.n_layers):
        rec = s.trace.layers[layer]
        for head in range(s.info.n_heads):
            q = rec.q()[head].double().numpy()  # (T, D) what the kernel saw
            k = rec.keys[s.trace.kv_head(head)].double().numpy()  # (T, D)
            sc = q @ k.T * rec.scale
            allowed = np.tril(np.ones((T, T), dtype=bool))
            if rec.sliding_window is not None:
                allowed &= ~np.tril(np.ones((T, T), dtype=bool), -rec.sliding_window)
            sc = np.where(allowed, sc, -np.inf)
            ref = np.exp(sc - sc.max(1, keepdims=True))
            ref /= ref.sum(1, keepdims=True)
            w = s.weights(layer, head)
            np.testing.assert_allclose(w.astype(np.float64).sum(1), 1.0, atol=1e-6)
            np.testing.assert_allclose(w, ref, rtol=1e-5, atol=1e-7)
            tile = s.weights(layer, head, rows=slice(T - 5, T), cols=slice(2, 9))  # a tile alone
            np.testing.assert_allclose(tile, ref[T - 5 :, 2:9], rtol=1e-5, atol=1e-7)
