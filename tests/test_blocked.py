"""Blocked aggregates (attnscope.core.analysis.blocked) equal the direct computation: every aggregate kind, max and mean
pooling, odd sizes, sliding windows; cancelling stops the work; partial results arrive coarse first."""

from __future__ import annotations

import numpy as np
import pytest
from attnscope.core.analysis import aggregate, blocked
from attnscope.core.analysis.pooling import block_edges, max_pool, mean_pool
from attnscope.core.errors import Cancelled
from tiny_models import save_tiny

PROMPT = "attention is all you need, they said, and then they said it again and again to everyone"


def _session(tmp_path_factory, family):
    from attnscope.core.session import Session

    folder = tmp_path_factory.mktemp(f"blk_{family}")
    save_tiny(family, folder, seed=5)
    s = Session.load(str(folder))
    s.prefill(PROMPT, chat_template=False)
    s.step(3)
    return s


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def sess(request, tmp_path_factory):
    """A llama (GQA, full causal) and a gemma3 (sliding window 4 on layers 0 and 2) session."""
    return _session(tmp_path_factory, request.param)


def _direct_heads(s, layer, n):
    return np.stack([s.weights(layer, h, slice(0, n), slice(0, n)) for h in range(s.info.n_heads)])


def test_sessions_have_odd_lengths_and_windows(sess):
    windows = [rec.sliding_window for rec in sess.trace.layers]
    assert sess.seq_len > 20
    assert windows in ([None, None], [4, None, 4])  # llama; gemma3: sliding, full, sliding


@pytest.mark.parametrize("pooling", ["max", "mean"])
@pytest.mark.parametrize("out,block_rows", [(7, 3), (5, None), (13, 1), (64, 256)])
def test_pooled_heads_equal_direct(sess, pooling, out, block_rows):
    s = sess
    ref_pool = max_pool if pooling == "max" else mean_pool
    for n in (s.seq_len, s.seq_len - 2):  # the whole map and a decode step earlier
        for layer in range(s.info.n_layers):
            got = blocked.pooled_heads(
                s.trace, layer, range(s.info.n_heads), n, out, out, pooling, block_rows=block_rows
            )
            direct = _direct_heads(s, layer, n)
            want = np.stack([ref_pool(w, out, out) for w in direct])
            assert got.shape == want.shape == (s.info.n_heads, min(out, n), min(out, n))
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_pooled_heads_non_square_and_subset(sess):
    s = sess
    n = s.seq_len
    got = blocked.pooled_heads(s.trace, 1, [3, 0], n, 6, 11, "max", block_rows=4)
    for i, h in enumerate([3, 0]):
        np.testing.assert_allclose(got[i], max_pool(s.weights(1, h), 6, 11), rtol=1e-5, atol=1e-7)


def test_max_pool_keeps_one_cell_features(sess):
    """A sink column and the diagonal survive max pooling: every block on the diagonal holds a cell
    of the diagonal, so its max is at least the largest diagonal weight in it."""
    s = sess
    w = s.weights(0, 0)
    got = blocked.pooled_heads(s.trace, 0, [0], s.seq_len, 5, 5, "max")[0]
    re = block_edges(s.seq_len, 5)
    for a in range(5):
        diag = np.diag(w)[re[a] : re[a + 1]].max()
        col0 = w[re[a] : re[a + 1], 0].max()
        assert got[a, a] >= diag - 1e-6
        assert got[a, 0] >= col0 - 1e-6


@pytest.mark.parametrize("mode", aggregate.MODES)
@pytest.mark.parametrize("pooling", ["max", "mean"])
def test_pooled_mean_every_kind(sess, mode, pooling):
    s = sess
    pairs = aggregate.heads_in(s.info, 1, 1, mode)
    n = s.seq_len - 1
    img, re, ce = blocked.pooled_mean(s.trace, pairs, n, 9, 8, pooling, block_rows=5)
    full = aggregate.map_at(s, 1, 1, mode, n)
    ref = max_pool(full, 9, 8) if pooling == "max" else mean_pool(full, 9, 8)
    np.testing.assert_allclose(img, ref, rtol=1e-5, atol=1e-7)
    assert re[-1] == n and ce[-1] == n and img.shape == (9, 8)


@pytest.mark.parametrize("mode", aggregate.MODES)
def test_mean_band_is_the_exact_mean(sess, mode):
    s = sess
    pairs = aggregate.heads_in(s.info, 2 if s.info.n_layers > 2 else 1, 2, mode)
    rows, cols = slice(7, 19), slice(2, 17)
    got = blocked.mean_band(s.trace, pairs, rows, cols).numpy()
    want = np.mean([s.weights(lyr, h, rows, cols) for lyr, h in pairs], axis=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_thumbnails_equal_direct(sess):
    s = sess
    n = s.seq_len
    th = blocked.thumbnails(s.trace, n, size=6)
    for layer in range(s.info.n_layers):
        for h in range(s.info.n_heads):
            np.testing.assert_allclose(
                th[layer, h], max_pool(s.weights(layer, h), 6, 6), rtol=1e-5, atol=1e-7
            )
    # the aggregate entry points go through the blocked path and keep their contracts
    np.testing.assert_allclose(aggregate.thumbnails(s, n, size=6), th, rtol=1e-6, atol=1e-8)


def test_cancel_stops_the_work(sess):
    """Deterministic: the callback turns true after k checks; no block is computed after that."""
    s = sess
    trace = s.trace
    calls = []
    original = trace.weights_block

    def counting(*a, **kw):
        calls.append(a[0])
        return original(*a, **kw)

    trace.weights_block = counting
    try:
        for k in (0, 1, 3):
            calls.clear()
            checks = []

            def cancelled(k=k, checks=checks):
                checks.append(1)
                return len(checks) > k

            with pytest.raises(Cancelled):
                blocked.thumbnails(trace, s.seq_len, size=8, cancelled=cancelled, budget=64)
            assert len(calls) == k  # exactly the blocks before the cancel
            calls.clear()
            checks.clear()
            with pytest.raises(Cancelled):
                blocked.pooled_mean(
                    trace,
                    aggregate.heads_in(s.info, 0, 0, "all"),
                    s.seq_len,
                    8,
                    block_rows=4,
                    cancelled=cancelled,
                )
            assert len(calls) == k
    finally:
        del trace.weights_block
    assert trace.weights_block == original


def test_partial_results_come_coarse_first(sess):
    s = sess
    n = s.seq_len
    seen = []
    final = blocked.pooled_heads(
        s.trace, 0, [0], n, 8, 8, "max", block_rows=3, partial=lambda img, f: seen.append((img, f))
    )
    assert len(seen) >= 3
    fractions = [f for _, f in seen]
    assert fractions == sorted(fractions) and 0 < fractions[0] < fractions[-1] < 1
    # the first partial image is already complete in shape and filled everywhere (no empty rows)
    first = seen[0][0]
    assert first.shape == final.shape
    assert np.all(first.max(axis=-1) > 0)


def test_coarse_to_fine_and_fill():
    assert blocked.coarse_to_fine(8) == [0, 4, 2, 6, 1, 5, 3, 7]
    assert sorted(blocked.coarse_to_fine(11)) == list(range(11))
    assert blocked.coarse_to_fine(11)[:3] == [0, 8, 4]
    img = np.arange(5, dtype=float)[:, None] * np.ones((5, 2))
    filled = blocked.fill_missing_rows(img, np.array([True, False, False, False, True]))
    np.testing.assert_array_equal(filled[:, 0], [0, 0, 0, 4, 4])
    assert blocked.bands(10, 1, 4) == [(0, 4), (4, 8), (8, 10)]
    assert blocked.bands(10, 2, budget=40) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]


def test_bad_pooling_is_one_clear_error(sess):
    with pytest.raises(ValueError, match="pooling"):
        blocked.pooled_heads(sess.trace, 0, [0], sess.seq_len, 4, 4, "median")
    with pytest.raises(IndexError):
        blocked.pooled_heads(sess.trace, 0, [0], sess.seq_len + 1, 4)
