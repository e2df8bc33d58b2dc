"""GQA head mapping, the causal mask shape and KV-cache bytes against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attnscope.core.attention.fused import _gqa_views, sdpa_with_lse
from attnscope.core.attention.masks import causal_mask
from attnscope.core.kv_formula import kv_cache_bytes


def test_causal_mask_bottom_right_aligned():
    # L=3 new queries over S=5 keys: tril(k=S-L=2)
    expected = np.array(
        [
            [1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(causal_mask(3, 5), expected)
    np.testing.assert_array_equal(causal_mask(4, 4), np.tril(np.ones((4, 4), dtype=bool)))
    assert causal_mask(1, 7).all()  # a decode step sees every cached key


def test_sliding_window_mask():
    m = causal_mask(5, 5, sliding_window=2)
    expected = np.array(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 1, 1, 0, 0],
            [0, 0, 1, 1, 0],
            [0, 0, 0, 1, 1],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(m, expected)


def test_gqa_views_share_storage_not_copies():
    q = torch.randn(1, 9, 4, 8)
    k = torch.randn(1, 3, 6, 8)
    v = torch.randn(1, 3, 6, 8)
    qg, kg, vg = _gqa_views(q, k, v)
    assert kg.data_ptr() == k.data_ptr() and vg.data_ptr() == v.data_ptr()
    assert kg.stride(1) == 0  # broadcast along the group, no copy
    # query head h = kv*G + g reads kv head h // G
    for h in range(9):
        assert torch.equal(qg[h // 3, h % 3], q[0, h])
        assert torch.equal(kg[h // 3, h % 3], k[0, h // 3])


def test_gqa_output_matches_repeat_interleave_reference():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 6, 5, 16), torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16)
    out, lse = sdpa_with_lse(q, k, v)
    kr, vr = k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1)  # head h -> kv h // 3
    s = (q @ kr.transpose(-1, -2)) / 4.0
    s = s.masked_fill(~torch.from_numpy(causal_mask(5, 5)), float("-inf"))
    torch.testing.assert_close(out, torch.softmax(s, -1) @ vr, atol=1e-5, rtol=1e-5)
    assert lse.dtype == torch.float64  # the LSE is carried in float64
    torch.testing.assert_close(lse, torch.logsumexp(s.double(), -1), atol=1e-5, rtol=1e-5)


def test_trace_kv_head_mapping(smol_ran):
    tr = smol_ran.trace
    assert tr.group_size == 3
    assert [tr.kv_head(h) for h in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    with pytest.raises(IndexError):
        tr.kv_head(9)


def test_kv_cache_bytes_hand_computed(smol_ran):
    # SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64, float32
    T = smol_ran.seq_len
    assert smol_ran.kv_cache_bytes() == 2 * 30 * 3 * 64 * T * 4 == 46_080 * T
    assert smol_ran.backend.kv_cache_bytes() == 46_080 * T  # the tensors really hold that much
    assert smol_ran.kv_cache_bytes(seq_len=8192, dtype="bf16") == 2 * 30 * 3 * 64 * 8192 * 2 == 188_743_680
    assert kv_cache_bytes(30, 3, 64, 47, "fp32") == 2_165_760


def test_default_model_geometry(smol_session):
    info = smol_session.info
    assert (info.architecture, info.n_layers, info.n_heads, info.n_kv_heads, info.head_dim) == (
        "llama",
        30,
        9,
        3,
        64,
    )
    assert info.rope_theta == 100000.0 and info.max_context == 8192 and info.group_size == 3
