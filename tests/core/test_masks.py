"""attnscope.core.attention.masks: the mask vocabulary shared by every attention implementation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attnscope.core.attention.masks import (
    CAUSAL,
    NO_MASK,
    Mask,
    as_mask,
    causal_mask,
    group_heads,
    to_4d,
    top_left_causal_mask,
)


def test_causal_mask_for_four_tokens():
    # token i attends keys 0..i (docs/how-it-works.md, core/attention/masks.py)
    expect = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], bool)
    assert np.array_equal(Mask(causal=True).structural(4, 4), expect)
    assert np.array_equal(np.isneginf(CAUSAL.additive(4, 4)), ~expect)


@pytest.mark.parametrize("L, S", [(1, 1), (1, 7), (3, 7), (7, 7), (5, 2)])
def test_causal_is_bottom_right_aligned(L, S):
    got = Mask(causal=True).structural(L, S)
    assert np.array_equal(got, np.tril(np.ones((L, S), bool), k=S - L))  # bottom-right aligned: tril(k=S-L)
    if L == 1:
        assert got.all()  # a decode step sees every cached key
    if L > S:
        assert not got[: L - S].any() and got[L - S :].any()  # rows before key 0: nothing
    if L < S and L > 1:
        assert not np.array_equal(got, top_left_causal_mask(L, S))  # the top-left decode bug differs


def test_window_keeps_the_query_and_the_w_minus_1_keys_before_it():
    got = as_mask(3).structural(6, 6)
    for i in range(6):
        assert list(np.where(got[i])[0]) == list(range(max(0, i - 2), i + 1))
    # decode row at position 9 with window 4: keys 6..9
    assert list(np.where(as_mask(4).structural(1, 10)[0])[0]) == [6, 7, 8, 9]
    assert np.array_equal(as_mask(4).structural(3, 10), causal_mask(3, 10, 4))


def test_as_mask_vocabulary():
    assert as_mask(None) is NO_MASK and as_mask("none").is_none
    assert as_mask("causal").causal and as_mask("Causal").window is None
    w = as_mask(np.int64(16))
    assert w.causal and w.window == 16
    arr = np.ones((2, 3), bool)
    assert as_mask(arr).array is arr and as_mask(arr).array_is_bool
    t = torch.zeros(2, 3)
    assert as_mask(t).array is t and not as_mask(t).array_is_bool
    m = Mask(causal=True, window=2, array=arr)
    assert as_mask(m) is m
    assert repr(m) == "Mask(causal, window 2, + bool (2, 3))"
    assert NO_MASK.describe() == "none"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("sliding", "unknown mask"),
        (True, "unsupported mask"),
        ([[1, 0]], "unsupported mask"),
        (0, "positive"),
        (np.ones((2, 2), np.int32), "boolean"),
        (np.ones((2,), bool), "2 to 4 dims"),
        (np.ones((1, 1, 1, 2, 2), bool), "2 to 4 dims"),
    ],
)
def test_as_mask_rejects_with_one_line(spec, message):
    with pytest.raises(ValueError, match=message) as info:
        as_mask(spec)
    assert "\n" not in str(info.value)


def test_combination_is_and_for_bool_and_sum_for_additive():
    allowed = np.array([[True, False, True], [False, True, True], [True, True, False]])
    both = Mask(causal=True, array=allowed).additive(3, 3)[0, 0]  # (1, 1, L, S) with an array
    assert np.array_equal(np.isneginf(both), ~(allowed & np.tril(np.ones((3, 3), bool))))
    add = np.array([[0.5, -1.0, 2.0], [0.0, -np.inf, 1.0], [1.0, 1.0, 1.0]], np.float32)
    got = Mask(causal=True, array=add).additive(3, 3)[0, 0]
    expect = np.array([[0.5, -np.inf, -np.inf], [0.0, -np.inf, -np.inf], [1.0, 1.0, 1.0]])
    assert np.array_equal(got, expect)


def test_check_shape_broadcasting():
    m = Mask(array=np.ones((2, 1, 3, 5), bool))
    m.check_shape(2, 4, 3, 5)
    m.check_shape(2, 4, 3, 5)
    with pytest.raises(ValueError, match="batch"):
        m.check_shape(3, 4, 3, 5)
    Mask(array=np.ones((1, 5), bool)).check_shape(2, 4, 3, 5)  # one row for every query
    with pytest.raises(ValueError, match=r"\(S\)"):
        Mask(array=np.ones((3, 4), bool)).check_shape(1, 1, 3, 5)


def test_group_heads_maps_query_head_to_kv_head_h_div_g():
    B, Hkv, G, L, S = 2, 3, 2, 1, 1
    a = np.arange(B * Hkv * G).reshape(B, Hkv * G, L, S)  # value = b*H + h
    g = group_heads(a, Hkv)
    assert g.shape == (B, Hkv, G, L, S)
    for h in range(Hkv * G):
        assert g[1, h // G, h % G, 0, 0] == Hkv * G + h
    assert group_heads(to_4d(np.zeros((L, S))), Hkv).shape == (1, 1, 1, L, S)


def test_hidden_cells_is_the_negation_of_the_allowed_mask():
    from attnscope.core.attention.masks import causal_allowed, hidden_cells

    pos = np.arange(6)
    np.testing.assert_array_equal(hidden_cells(pos, pos), ~causal_allowed(pos, pos))
    np.testing.assert_array_equal(hidden_cells(pos, pos, 3), ~causal_allowed(pos, pos, 3))
    assert hidden_cells([5], pos, 3).tolist() == [[True, True, True, False, False, False]]
    assert hidden_cells([5], pos, 0).tolist() == [[False] * 6]  # 0: no window


def test_hidden_blocks_hold_only_hidden_cells():
    from attnscope.core.attention.masks import hidden_blocks, hidden_cells

    edges = np.array([0, 3, 6, 9])
    for window in (None, 2, 4):
        cells = hidden_cells(np.arange(9), np.arange(9), window)
        want = np.array(
            [
                [cells[a:b, c:d].all() for c, d in zip(edges[:-1], edges[1:], strict=True)]
                for a, b in zip(edges[:-1], edges[1:], strict=True)
            ]
        )
        np.testing.assert_array_equal(hidden_blocks(edges, edges, window), want)
    # window 2: block rows 6..8 see keys 5..8 only, so key block 0..2 is hidden, 3..5 is not
    assert hidden_blocks(edges, edges, 2)[2].tolist() == [True, False, False]


def test_aggregate_window_of_a_map():
    from attnscope.core.attention.masks import aggregate_window

    windows = (4, None, 4)
    assert [aggregate_window(windows, layer, "head") for layer in range(3)] == [4, None, 4]
    assert aggregate_window(windows, 0, "all") is None  # a global layer: causal only
    assert aggregate_window((4, 8), 0, "all") == 8  # hidden only where every layer hides it
    assert aggregate_window((), 0, "head") is None and aggregate_window(windows, 7, "head") is None
