"""The attention contract (attnscope.core.attention.reference): numpy reference vs torch (ours and F.sdpa) vs MLX.

Property tests draw shapes, GQA group sizes, L != S, every mask kind and dtype; the reference is
given the inputs already rounded to the dtype under test, so tolerances measure the
implementation (TOL in attention_cases: fp32 1e-5, fp16 2e-3, bf16 1e-2, relative to magnitude).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attention_cases import DTYPES, EXAMPLES, Case, assert_close, cases, score_max
from attnscope.core.attention import reference
from attnscope.core.attention.fused import _gqa_views, attention, math_with_lse, sdpa_with_lse
from attnscope.core.attention.masks import Mask, as_mask
from flash_reference import flash_attention
from hypothesis import given, settings
from hypothesis import strategies as st

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SETTINGS = settings(max_examples=EXAMPLES, deadline=None)


def torch_inputs(case: Case, dtype: str):
    """Case arrays as torch tensors of ``dtype`` and, for the reference, their rounded float32 values."""
    ts = [torch.from_numpy(a).to(TORCH_DTYPES[dtype]) for a in (case.q, case.k, case.v)]
    return ts, [t.float().numpy() for t in ts]


def empty_rows(ref_lse: np.ndarray) -> np.ndarray:
    return np.isneginf(ref_lse)


# ---------------------------------------------------------------- reference, by hand ----------


def test_reference_matches_hand_computed_gqa_with_causal_mask():
    # One KV head shared by two query heads, L=2 new rows over S=3 keys (bottom-right causal).
    q = np.array([[[[1.0, 0.0], [0.0, 2.0]], [[0.0, 0.0], [1.0, 1.0]]]])  # (1, 2, 2, 2)
    k = np.array([[[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]]])  # (1, 1, 3, 2)
    v = np.array([[[[1.0], [2.0], [4.0]]]])  # (1, 1, 3, 1)
    res = reference.attention(q, k, v, scale=1.0, mask="causal", return_lse=True, return_weights=True)
    # head 0 row 0 (position 1): keys 0,1 with scores 1, 0
    p = np.exp([1.0, 0.0]) / np.exp([1.0, 0.0]).sum()
    assert np.allclose(res.weights[0, 0, 0], [p[0], p[1], 0.0])
    assert np.isclose(res.out[0, 0, 0, 0], p[0] * 1 + p[1] * 2)
    assert np.isclose(res.lse[0, 0, 0], math.log(math.e + 1))
    # head 1 row 1 (position 2) sees all keys, scores 1, 1, 2 (k reads head 1 // 2 = KV head 0)
    e = np.exp([1.0, 1.0, 2.0])
    assert np.allclose(res.weights[0, 1, 1], e / e.sum())
    assert np.isclose(res.out[0, 1, 1, 0], (e @ [1.0, 2.0, 4.0]) / e.sum())
    # head 1 row 0: q = 0, so uniform over the two visible keys
    assert np.allclose(res.weights[0, 1, 0], [0.5, 0.5, 0.0])


def test_reference_default_scale_is_inverse_sqrt_head_dim():
    rng = np.random.default_rng(1)
    q, k, v = (
        rng.standard_normal((1, 1, 3, 16)),
        rng.standard_normal((1, 1, 5, 16)),
        rng.standard_normal((1, 1, 5, 16)),
    )
    default = reference.attention(q, k, v).out
    assert np.allclose(default, reference.attention(q, k, v, scale=0.25).out)
    assert not np.allclose(default, reference.attention(q, k, v, scale=1.0).out)
    assert reference.default_scale(128) == pytest.approx(
        0.0884, abs=1e-4
    )  # 1/√128 ≈ 0.088 (Vaswani et al. 2017)


def test_fully_masked_row_gives_zero_output_and_minus_inf_lse_everywhere():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)
    k = rng.standard_normal((1, 1, 4, 8)).astype(np.float32)
    v = rng.standard_normal((1, 1, 4, 8)).astype(np.float32)
    allowed = np.ones((3, 4), bool)
    allowed[1] = False
    for mask in (allowed, np.where(allowed, 0.0, -np.inf).astype(np.float32)):
        res = reference.attention(q, k, v, mask=mask, return_lse=True, return_weights=True)
        assert np.all(res.out[:, :, 1] == 0) and np.all(np.isneginf(res.lse[:, :, 1]))
        assert np.all(res.weights[:, :, 1] == 0) and not np.isnan(res.out).any()
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        for fn in (attention, flash_attention):
            got = fn(tq, tk, tv, mask=mask, return_lse=True, return_weights=True)
            assert torch.all(got.out[:, :, 1] == 0) and torch.all(torch.isneginf(got.lse[:, :, 1]))
            assert torch.all(got.weights[:, :, 1] == 0)
            assert_close(got.out.numpy(), res.out, "float32", "out")
    # causal with more queries than keys: the first L - S rows see nothing
    q5 = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    res = reference.attention(q5, k[:, :, :2], v[:, :, :2], mask="causal", return_lse=True)
    assert np.all(res.out[:, :, :3] == 0) and np.isfinite(res.lse[:, :, 3:]).all()
    got = attention(
        *(torch.from_numpy(a) for a in (q5, k[:, :, :2], v[:, :, :2])), mask="causal", return_lse=True
    )
    assert_close(got.out.numpy(), res.out, "float32", "out")
    assert_close(got.lse.numpy(), res.lse, "float32", "lse")


def test_decode_row_with_causal_mask_sees_every_cached_key():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 4, 1, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, 9, 8)).astype(np.float32)
    v = rng.standard_normal((1, 2, 9, 8)).astype(np.float32)
    causal = reference.attention(q, k, v, mask="causal", return_weights=True)
    assert np.allclose(causal.out, reference.attention(q, k, v).out)
    assert (causal.weights > 0).all()
    # the top-left mask (the decode bug of docs/tabs/experiments.md) would let it see key 0 only
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    got, _ = sdpa_with_lse(tq, tk, tv, causal=True)
    assert_close(got.numpy(), causal.out, "float32", "decode out")


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_overflow_when_qk_exceeds_float16_range(dtype):
    # q·k = 64 · 40 · 40 = 102400 > 65504 (float16 max); scale 1 keeps the scaled scores there too.
    D = 64
    rng = np.random.default_rng(4)
    q = np.full((1, 2, 3, D), 40.0, np.float32)
    k = np.full((1, 1, 4, D), 40.0, np.float32)
    k[0, 0, 1] = 39.0  # a smaller score for key 1
    v = rng.standard_normal((1, 1, 4, D)).astype(np.float32)
    (tq, tk, tv), (rq, rk, rv) = torch_inputs(Case(q, k, v, None, "none", 1.0), dtype)
    ref = reference.attention(rq, rk, rv, scale=1.0, mask="causal", return_lse=True)
    assert ref.lse.max() > 1e5
    for name, res in (
        ("attention", attention(tq, tk, tv, scale=1.0, mask="causal", return_lse=True)),
        ("flash", flash_attention(tq, tk, tv, scale=1.0, mask="causal", return_lse=True, block_k=2)),
    ):
        assert torch.isfinite(res.out).all(), name
        assert_close(res.out.float().numpy(), ref.out, dtype, f"{name} out")
        assert np.allclose(res.lse.numpy(), ref.lse, rtol=1e-6), name


def test_gqa_uses_stride_zero_views_not_copies():
    q = torch.randn(2, 6, 3, 8)
    k = torch.randn(2, 2, 5, 8)
    v = torch.randn(2, 2, 5, 8)
    qg, kg, vg = _gqa_views(q, k, v)
    assert kg.shape == (4, 3, 5, 8) and kg.stride(1) == 0 and vg.stride(1) == 0
    assert kg.data_ptr() == k.data_ptr() and vg.data_ptr() == v.data_ptr()
    # query head h reads KV head h // group_size, as repeat_interleave would give
    out, _ = sdpa_with_lse(q, k, v, causal=False)
    expect = F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1))
    assert_close(out.numpy(), expect.numpy(), "float32", "gqa head mapping")


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: reference.attention(
                np.zeros((1, 3, 2, 4)), np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4))
            ),
            "multiple",
        ),
        (
            lambda: reference.attention(
                np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 5)), np.zeros((1, 2, 2, 5))
            ),
            "head_dim",
        ),
        (
            lambda: reference.attention(np.zeros((2, 4)), np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 4))),
            "4-d",
        ),
        (
            lambda: reference.attention(
                np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 2, 4))
            ),
            "differ",
        ),
        (
            lambda: reference.attention(
                np.zeros((1, 2, 2, 4)),
                np.zeros((1, 2, 3, 4)),
                np.zeros((1, 2, 3, 4)),
                mask=np.ones((3, 3), bool),
            ),
            "broadcast",
        ),
        (
            lambda: reference.attention(
                np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4)), scale=float("nan")
            ),
            "finite",
        ),
        (lambda: as_mask(np.ones((2, 2), dtype=np.int64)), "boolean"),
        (lambda: as_mask("sliding"), "unknown mask"),
        (lambda: Mask(window=4), "causal"),
        (
            lambda: sdpa_with_lse(
                torch.zeros(1, 2, 2, 4),
                torch.zeros(1, 2, 2, 4),
                torch.zeros(1, 2, 2, 4),
                causal=False,
                sliding_window=2,
            ),
            "causal",
        ),
    ],
)
def test_contract_violations_raise_one_line_value_errors(call, message):
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


# --------------------------------------------------------------- property tests: torch -------


@SETTINGS
@given(case=cases(), dtype=st.sampled_from(DTYPES))
def test_torch_fused_path_equals_reference(case: Case, dtype: str):
    (tq, tk, tv), (rq, rk, rv) = torch_inputs(case, dtype)
    mask = case.mask
    ref = reference.attention(rq, rk, rv, scale=case.scale, mask=mask, return_lse=True, return_weights=True)
    got = attention(tq, tk, tv, scale=case.scale, mask=mask, return_lse=True, return_weights=True)
    assert got.out.dtype == TORCH_DTYPES[dtype] and got.lse.dtype == torch.float64
    # LSE and weights exp(s − lse) carry float32 rounding of the scores: ~EPS·|s| (s up to ~300 here)
    smax = score_max(rq, rk, case.scale)
    assert_close(got.out.float().numpy(), ref.out, dtype, "out")
    assert_close(got.lse.numpy(), ref.lse, dtype, "lse", score_max=smax)
    assert_close(got.weights.numpy(), ref.weights, dtype, "weights", score_max=smax)
    # the unfused float32 fallback keeps the same contract
    m = as_mask(mask)
    out, lse = math_with_lse(
        tq, tk, tv, scale=case.scale, causal=m.causal, sliding_window=m.window, mask=m.array
    )
    assert_close(out.float().numpy(), ref.out, dtype, "math out")
    assert_close(lse.numpy(), ref.lse, dtype, "math lse", score_max=smax)


def _torch_sdpa_mask(mask, L, S, dtype):
    """The contract's mask as what F.scaled_dot_product_attention takes (bool, or additive in dtype)."""
    m = as_mask(mask)
    if m.is_none:
        return None
    bias = torch.from_numpy(m.additive(L, S))
    if m.array is None or m.array_is_bool:
        return ~torch.isneginf(bias)  # True = attend
    return bias.to(dtype)


@SETTINGS
@given(case=cases(), dtype=st.sampled_from(DTYPES))
def test_reference_equals_torch_sdpa_with_enable_gqa(case: Case, dtype: str):
    (tq, tk, tv), (rq, rk, rv) = torch_inputs(case, dtype)
    L, S = rq.shape[2], rk.shape[2]
    ref = reference.attention(rq, rk, rv, scale=case.scale, mask=case.mask, return_lse=True)
    got = F.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=_torch_sdpa_mask(case.mask, L, S, tq.dtype), scale=case.scale, enable_gqa=True
    )
    live = ~empty_rows(ref.lse)  # torch leaves fully masked rows unspecified (0 or NaN)
    assert_close(got.float().numpy(), ref.out, dtype, "F.sdpa out", rows=live)


def test_fused_path_handles_chunked_prefill_and_windows():
    # L > 1 new rows over a longer cache (a prefill chunk): needs an explicit mask in the kernel.
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 9, 7, 64)).astype(np.float32)
    k = rng.standard_normal((1, 3, 20, 64)).astype(np.float32)
    v = rng.standard_normal((1, 3, 20, 64)).astype(np.float32)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    for window in (None, 5, 100):
        ref = reference.attention(q, k, v, mask=Mask(causal=True, window=window), return_lse=True)
        for dtype in DTYPES:
            out, lse = sdpa_with_lse(
                tq.to(TORCH_DTYPES[dtype]),
                tk.to(TORCH_DTYPES[dtype]),
                tv.to(TORCH_DTYPES[dtype]),
                sliding_window=window,
            )
            assert out.dtype == TORCH_DTYPES[dtype]
            tol_dtype = "float32" if dtype == "float32" else "bfloat16"  # inputs rounded here
            assert_close(out.float().numpy(), ref.out, tol_dtype, f"out w={window} {dtype}")
    # an extra array mask is ANDed with the causal one
    extra = rng.random((7, 20)) < 0.5
    ref = reference.attention(q, k, v, mask=Mask(causal=True, array=extra), return_lse=True)
    out, lse = sdpa_with_lse(tq, tk, tv, mask=extra)
    assert_close(out.numpy(), ref.out, "float32", "out")
    assert_close(lse.numpy(), ref.lse, "float32", "lse")


# ---------------------------------------------------------------- property tests: MLX --------


def _mlx():
    """mlx.core, or skip: mlx is an optional dependency (``attnscope[mlx]``)."""
    return pytest.importorskip("mlx.core")


def mlx_inputs(case: Case, dtype: str):
    mxc = _mlx()
    arrs = [mxc.array(a).astype(getattr(mxc, dtype)) for a in (case.q, case.k, case.v)]
    return arrs, [np.array(a.astype(mxc.float32)) for a in arrs]


@SETTINGS
@given(case=cases(), dtype=st.sampled_from(DTYPES))
def test_mlx_implementations_equal_reference(case: Case, dtype: str):
    mxc = _mlx()
    from attnscope.core.attention.fused_mlx import attention as mlx_attention
    from attnscope.core.attention.fused_mlx import sdpa_with_lse_mlx

    (q, k, v), (rq, rk, rv) = mlx_inputs(case, dtype)
    ref = reference.attention(
        rq, rk, rv, scale=case.scale, mask=case.mask, return_lse=True, return_weights=True
    )
    got = mlx_attention(q, k, v, scale=case.scale, mask=case.mask, return_lse=True, return_weights=True)
    assert got.out.dtype == getattr(mxc, dtype) and got.lse.dtype == mxc.float32
    assert_close(np.array(got.out.astype(mxc.float32)), ref.out, dtype, "mlx out")
    smax = score_max(rq, rk, case.scale)
    assert_close(np.array(got.lse), ref.lse, dtype, "mlx lse", score_max=smax)
    assert_close(np.array(got.weights), ref.weights, dtype, "mlx weights", score_max=smax)
    for fused in (None, True, False):
        out, lse = sdpa_with_lse_mlx(q, k, v, case.scale, case.mask, fused=fused)
        assert out.dtype == getattr(mxc, dtype) and out.shape == tuple(ref.out.shape)
        # mx.fast (fused=True) rounds the scores to the input dtype on the CPU: see attnscope.core.attention.fused_mlx
        assert_close(
            np.array(out.astype(mxc.float32)),
            ref.out,
            dtype,
            f"sdpa_with_lse_mlx out fused={fused}",
            score_max=smax if fused else None,
            score_dtype=dtype,
        )
        assert_close(np.array(lse), ref.lse, dtype, f"sdpa_with_lse_mlx lse fused={fused}", score_max=smax)


@SETTINGS
@given(case=cases(), dtype=st.sampled_from(DTYPES))
def test_reference_equals_mlx_fast_sdpa(case: Case, dtype: str):
    mxc = _mlx()
    (q, k, v), (rq, rk, rv) = mlx_inputs(case, dtype)
    L, S, D = rq.shape[2], rk.shape[2], rq.shape[3]
    ref = reference.attention(rq, rk, rv, scale=case.scale, mask=case.mask, return_lse=True)
    m = as_mask(case.mask)
    if m.is_none:
        fast_mask = None
    elif m.array is None or m.array_is_bool:
        fast_mask = mxc.array(~np.isneginf(m.additive(L, S)))
    else:
        fast_mask = mxc.array(m.additive(L, S)).astype(q.dtype)
    scale = case.scale if case.scale is not None else D**-0.5
    got = mxc.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=fast_mask)
    live = ~empty_rows(ref.lse)  # mx.fast gives NaN or a uniform row where every key is masked
    assert_close(
        np.array(got.astype(mxc.float32)),
        ref.out,
        dtype,
        "mx.fast out",
        rows=live,
        score_max=score_max(rq, rk, case.scale),
        score_dtype=dtype,
    )


def test_mlx_no_overflow_and_empty_rows():
    mxc = _mlx()
    from attnscope.core.attention.fused_mlx import attention as mlx_attention
    from attnscope.core.attention.fused_mlx import sdpa_with_lse_mlx

    D = 64
    q = mxc.full((1, 2, 3, D), 40.0, dtype=mxc.float16)
    k = mxc.full((1, 1, 4, D), 40.0, dtype=mxc.float16)
    v = mxc.array(np.random.default_rng(6).standard_normal((1, 1, 4, D)).astype(np.float32)).astype(
        mxc.float16
    )
    ref = reference.attention(*(np.array(a.astype(mxc.float32)) for a in (q, k, v)), scale=1.0, mask="causal")
    # mx.fast on its own overflows here (NaN); the wrapper must not
    assert np.isnan(
        np.array(mxc.fast.scaled_dot_product_attention(q, k, v, scale=1.0).astype(mxc.float32))
    ).any()
    for out in (
        sdpa_with_lse_mlx(q, k, v, 1.0, fused=True)[0],
        sdpa_with_lse_mlx(q, k, v, 1.0)[0],
        mlx_attention(q, k, v, scale=1.0, mask="causal").out,
    ):
        assert_close(np.array(out.astype(mxc.float32)), ref.out, "float16", "fp16 overflow")
    # a fully masked row: mx.fast gives NaN (additive) or uniform (bool); the contract gives 0
    allowed = np.ones((3, 4), bool)
    allowed[2] = False
    for mask in (mxc.array(allowed), mxc.array(np.where(allowed, 0.0, -np.inf).astype(np.float16))):
        out, lse = sdpa_with_lse_mlx(q, k, v, 0.01, mask, fused=True)
        assert np.all(np.array(out.astype(mxc.float32))[:, :, 2] == 0)
        assert np.all(np.isneginf(np.array(lse)[:, :, 2])) and np.isfinite(np.array(lse)[:, :, :2]).all()
