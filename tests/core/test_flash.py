"""tests/flash_reference.py: the tiled online softmax (FlashAttention-2 alg. 1) equals the reference for every mask."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attention_cases import DTYPES, EXAMPLES, Case, assert_close, cases, score_max
from attnscope.core.attention import reference
from attnscope.core.attention.fused import attention
from attnscope.core.attention.masks import Mask
from flash_reference import _block_is_masked, flash_attention, online_softmax_trace
from hypothesis import given, settings
from hypothesis import strategies as st

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def inputs(case: Case, dtype: str):
    ts = [torch.from_numpy(a).to(TORCH_DTYPES[dtype]) for a in (case.q, case.k, case.v)]
    return ts, [t.float().numpy() for t in ts]


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    case=cases(max_len=12),
    dtype=st.sampled_from(DTYPES),
    block_q=st.integers(1, 7),
    block_k=st.integers(1, 7),
    skip=st.booleans(),
)
def test_flash_equals_reference_for_every_mask_and_block_size(case, dtype, block_q, block_k, skip):
    (q, k, v), (rq, rk, rv) = inputs(case, dtype)
    ref = reference.attention(
        rq, rk, rv, scale=case.scale, mask=case.mask, return_lse=True, return_weights=True
    )
    got = flash_attention(
        q,
        k,
        v,
        scale=case.scale,
        mask=case.mask,
        block_q=block_q,
        block_k=block_k,
        skip_masked_blocks=skip,
        return_lse=True,
        return_weights=True,
    )
    assert got.out.dtype == q.dtype and got.lse.dtype == torch.float64
    smax = score_max(rq, rk, case.scale)  # float32 rounding of the scores: ~EPS·|s| in LSE and weights
    assert_close(got.out.float().numpy(), ref.out, dtype, "flash out")
    assert_close(got.lse.numpy(), ref.lse, dtype, "flash lse", score_max=smax)
    assert_close(got.weights.numpy(), ref.weights, dtype, "flash weights", score_max=smax)
    # and the fused path agrees with it on the same inputs (LSE included)
    fused = attention(q, k, v, scale=case.scale, mask=case.mask, return_lse=True)
    assert_close(fused.lse.numpy(), got.lse.numpy(), dtype, "fused vs flash lse", score_max=smax)


@pytest.mark.parametrize("skip", [True, False])
def test_fully_masked_blocks_and_rows(skip):
    # Blocks of 4 keys; the window (3) leaves each late row's first blocks fully masked, and
    # the array hides all of keys 4..7 from every row plus the whole of row 2.
    rng = np.random.default_rng(0)
    L = S = 12
    q = torch.from_numpy(rng.standard_normal((1, 4, L, 8)).astype(np.float32))
    k = torch.from_numpy(rng.standard_normal((1, 2, S, 8)).astype(np.float32))
    v = torch.from_numpy(rng.standard_normal((1, 2, S, 8)).astype(np.float32))
    allowed = np.ones((L, S), bool)
    allowed[:, 4:8] = False
    allowed[2] = False
    for mask in (Mask(causal=True, window=3), Mask(causal=True, window=3, array=allowed), allowed):
        ref = reference.attention(q.numpy(), k.numpy(), v.numpy(), mask=mask, return_lse=True)
        got = flash_attention(
            q, k, v, mask=mask, block_q=4, block_k=4, skip_masked_blocks=skip, return_lse=True
        )
        assert not torch.isnan(got.out).any() and not torch.isnan(got.lse).any()
        assert_close(got.out.numpy(), ref.out, "float32", f"out {mask!r}")
        assert_close(got.lse.numpy(), ref.lse, "float32", f"lse {mask!r}")
        if isinstance(mask, Mask) and mask.array is not None:
            # row 2, and rows 6, 7 (window keys 4..6 and 5..7, all hidden) see nothing
            empty = [2, 6, 7]
            assert np.array_equal(np.where(np.isneginf(ref.lse[0, 0]))[0], empty)
            assert torch.all(got.out[:, :, empty] == 0) and torch.all(torch.isneginf(got.lse[:, :, empty]))


def test_block_skipping_follows_bottom_right_alignment():
    # L=2 new rows over S=8 keys sit at positions 6 and 7: nothing above the diagonal to skip.
    assert not any(_block_is_masked(2, 8, True, None, 0, 2, c0, c0 + 2) for c0 in range(0, 8, 2))
    # L=S=8, blocks 2x2: tile rows 0..1 x keys 2..3 is above the diagonal, its mirror is not
    assert _block_is_masked(8, 8, True, None, 0, 2, 2, 4) and not _block_is_masked(
        8, 8, True, None, 2, 4, 0, 2
    )
    # window 2: rows 6..7 (positions 6, 7) see keys 5..7, so keys 0..3 are skipped, 4..5 are not
    assert _block_is_masked(8, 8, True, 2, 6, 8, 0, 4) and not _block_is_masked(8, 8, True, 2, 6, 8, 4, 6)
    assert not _block_is_masked(8, 8, False, None, 0, 2, 6, 8)


def test_online_softmax_trace_rescales_to_the_exact_softmax():
    scores = np.array([1.0, 2.0, -np.inf, 3.0, 0.5])
    steps = online_softmax_trace(scores, block=2)
    assert [(s["start"], s["stop"]) for s in steps] == [(0, 2), (2, 4), (4, 5)]
    # after block 1 the running max is 2 and the sum is e^-1 + 1
    assert steps[0]["m"] == 2.0 and steps[0]["l"] == pytest.approx(np.exp(-1) + 1)
    # block 2 raises the max to 3: the old sum is rescaled by e^(2-3)
    assert steps[1]["alpha"] == pytest.approx(np.exp(-1.0))
    assert steps[1]["l"] == pytest.approx((np.exp(-1) + 1) * np.exp(-1) + 1)
    e = np.exp(scores - 3.0)
    assert np.allclose(steps[-1]["weights"], e / e.sum())
    assert np.allclose(steps[-1]["weights"], reference.softmax(scores))
    # a row whose first block is fully masked starts from nothing without NaN
    masked_first = online_softmax_trace([-np.inf, -np.inf, 0.0], block=2)
    assert masked_first[0]["l"] == 0.0 and np.all(masked_first[0]["weights"] == 0)
    assert np.allclose(masked_first[-1]["weights"], [0, 0, 1])


def test_flash_rejects_bad_block_sizes():
    q = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match="block sizes"):
        flash_attention(q, q, q, block_q=0)
