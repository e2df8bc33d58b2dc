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


def test_cancel_stops_the_work(sess, monkeypatch):
    """Deterministic: the callback turns true after k checks; no block is computed after that
    (every view computes its weights through ``blocked._block``, one call per band block)."""
    s = sess
    trace = s.trace
    calls = []
    original = blocked._block

    def counting(*a, **kw):
        calls.append(a[1:])
        return original(*a, **kw)

    monkeypatch.setattr(blocked, "_block", counting)
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
    # without a cancel the same views do compute blocks (the counter sees the real work)
    calls.clear()
    blocked.thumbnails(trace, s.seq_len, size=8, budget=64)
    assert len(calls) > 3


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


# Tiled computation (column tiles, rows restricted to those that see a tile, row/column segment
# reductions of every shape): a longer synthetic trace, tiles forced small, against the direct maps.


@pytest.fixture(scope="module")
def long_trace():
    from attnscope.core.bench.views import synthetic_trace

    tr = synthetic_trace(n_layers=2, n_heads=6, n_kv_heads=2, head_dim=16, T=300, seed=3)
    tr.layers[1].sliding_window = 37  # a windowed layer: keys > p − 37 only
    return tr


def _direct(tr, layer, heads, n):
    return [tr.weights(layer, h, slice(0, n), slice(0, n)) for h in heads]


@pytest.mark.parametrize("pooling", ["max", "mean"])
@pytest.mark.parametrize("out", [97, 100, 7, 300])  # mixed sizes (many / few blocks), uniform, one cell
def test_tiled_pooled_heads_equal_direct(long_trace, monkeypatch, pooling, out):
    monkeypatch.setattr(blocked, "MIN_TILE_COLS", 1)
    tr = long_trace
    ref_pool = max_pool if pooling == "max" else mean_pool
    for layer in (0, 1):
        for n, heads in ((300, range(6)), (251, [4, 1])):  # GQA-grouped heads; a subset out of order
            want = np.stack([ref_pool(w, out, out) for w in _direct(tr, layer, heads, n)])
            for tile in (blocked.TILE, 2400):  # one tile per band; tiles ~10 keys wide (6 heads × 40 rows)
                got = blocked.pooled_heads(tr, layer, heads, n, out, out, pooling, block_rows=40, tile=tile)
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("pooling", ["max", "mean"])
def test_tiled_pooled_mean_equals_direct(long_trace, monkeypatch, pooling):
    monkeypatch.setattr(blocked, "MIN_TILE_COLS", 1)
    tr = long_trace
    pairs = [(layer, h) for layer in range(2) for h in range(6)]
    n = 287
    full = np.mean([tr.weights(lyr, h, slice(0, n), slice(0, n)) for lyr, h in pairs], axis=0)
    ref = max_pool(full, 61, 50) if pooling == "max" else mean_pool(full, 61, 50)
    img, _, _ = blocked.pooled_mean(tr, pairs, n, 61, 50, pooling, block_rows=33)
    np.testing.assert_allclose(img, ref, rtol=1e-5, atol=1e-7)
    band = blocked._mean_band(
        tr, blocked._by_layer(pairs), {}, slice(100, 140), slice(0, 140), n, False, None, None, tile=200
    )
    np.testing.assert_allclose(band.numpy(), full[100:140, :140], rtol=1e-5, atol=1e-7)


def test_tiles_and_rows_cover_the_visible_keys():
    edges = np.array([0, 10, 20, 30, 40, 50])
    assert blocked.col_tiles(0, 50, 20, edges) == [(0, 20), (20, 40), (40, 50)]
    assert blocked.col_tiles(5, 50, 100, edges) == [(5, 50)]
    assert blocked.col_tiles(0, 45, 20, None) == [(0, 20), (20, 45)]  # a sliver joins the last tile
    assert blocked.tile_rows(100, 200, 150, 180, None) == (150, 200)  # rows above the tile see none of it
    assert blocked.tile_rows(100, 200, 0, 50, None) == (100, 200)
    assert blocked.tile_rows(100, 200, 60, 90, 37) == (100, 126)  # rows > 89 + 36 see no key of it
    assert blocked.snap_bands([(0, 23), (23, 46), (46, 60)], np.array([0, 20, 40, 60])) == [
        (0, 20),
        (20, 40),
        (40, 60),
    ]


def test_threads_is_an_explicit_setting(long_trace):
    import torch

    before = torch.get_num_threads()
    with blocked.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with blocked.torch_threads(None):
        assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads"):
        blocked.torch_threads(0)
    a = blocked.pooled_heads(long_trace, 0, range(6), 300, 20, threads=1)
    np.testing.assert_array_equal(a, blocked.pooled_heads(long_trace, 0, range(6), 300, 20))
    assert torch.get_num_threads() == before
    assert not hasattr(blocked, "_ThreadsForLoad")


@pytest.fixture(
    scope="module",
    params=[("torch", "bfloat16"), ("torch", "float16"), ("mlx", "float32"), ("mlx", "bfloat16")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def direct_sess(request, tmp_path_factory):
    """Sessions whose blocks go through the trace's own ``weights_block`` (LayerBlocks' direct path):
    torch at bf16 (the fast bf16 matmul) and fp16, and MLX."""
    from attnscope.core.session import Session

    backend, dtype = request.param
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    folder = tmp_path_factory.mktemp(f"blk_direct_{backend}_{dtype}")
    save_tiny("llama", folder, seed=5)
    s = Session.load(str(folder), backend=backend, dtype=dtype)
    s.prefill(PROMPT, chat_template=False)
    s.step(2)
    return s


def test_thumbnails_and_overviews_on_the_direct_path(direct_sess):
    """The Head grid's thumbnails and the long-map overview work for every trace kind (they raised
    AttributeError 'LayerBlocks' object has no attribute 'rec' for bf16 and MLX traces), and equal
    pooling the exact maps: at float32 to float32 roundoff, in half precision to the fast bf16/fp16
    matmul's error."""
    s = direct_sess
    n = s.seq_len
    tol = 1e-5 if s.info.dtype == "float32" else 2e-2
    th = blocked.thumbnails(s.trace, n, size=6)
    assert th.shape == (s.info.n_layers, s.info.n_heads, 6, 6)
    for layer in range(s.info.n_layers):
        for h in range(s.info.n_heads):
            np.testing.assert_allclose(th[layer, h], max_pool(s.weights(layer, h), 6, 6), rtol=tol, atol=tol)
    heads = list(range(s.info.n_heads))
    pooled = blocked.pooled_heads(s.trace, 1, heads, n, 5, pooling="mean")
    want = np.stack([mean_pool(s.weights(1, h), 5, 5) for h in heads])
    np.testing.assert_allclose(pooled, want, rtol=tol, atol=tol)
