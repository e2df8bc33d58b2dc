"""Aggregates (mean of exact weights over heads), pooled overviews and exact tiles, colour ranges."""

from __future__ import annotations

import numpy as np
import pytest
from attnscope.core.analysis import aggregate
from attnscope.core.analysis.pooling import max_pool
from tiny_models import eager_reference, save_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from attnscope.core.session import Session

    folder = tmp_path_factory.mktemp("tiny_agg")
    model = save_tiny("llama", folder, seed=3)
    s = Session.load(str(folder))
    s.prefill("attention is all you need, they said", chat_template=False)
    s.step(2)
    _, att = eager_reference(model, s.ids)  # [layer] (H, T, T)
    return s, np.stack(att)  # (L, H, T, T)


def test_heads_in_follow_gqa_grouping(tiny):
    s, _ = tiny
    info = s.info  # 2 layers, 4 query heads, 2 KV heads: groups {0,1}, {2,3}
    assert aggregate.heads_in(info, 1, 3, "head") == [(1, 3)]
    assert aggregate.heads_in(info, 1, 3, "group") == [(1, 2), (1, 3)]
    assert aggregate.heads_in(info, 0, 1, "group") == [(0, 0), (0, 1)]
    assert aggregate.heads_in(info, 1, 0, "layer") == [(1, h) for h in range(4)]
    assert len(aggregate.heads_in(info, 0, 0, "all")) == 8
    with pytest.raises(ValueError):
        aggregate.heads_in(info, 0, 0, "median")
    with pytest.raises(IndexError):
        aggregate.heads_in(info, 2, 0, "head")
    assert "mean of KV group 1 (q2, q3)" in aggregate.describe(info, 1, 3, "group")


def test_means_equal_eager_means(tiny):
    s, att = tiny
    T = s.seq_len
    np.testing.assert_allclose(aggregate.map_at(s, 1, 2, "head"), att[1, 2], atol=2e-6)
    np.testing.assert_allclose(aggregate.map_at(s, 1, 2, "group"), att[1, 2:4].mean(0), atol=2e-6)
    np.testing.assert_allclose(aggregate.map_at(s, 0, 0, "group"), att[0, 0:2].mean(0), atol=2e-6)
    np.testing.assert_allclose(aggregate.map_at(s, 1, 0, "layer"), att[1].mean(0), atol=2e-6)
    np.testing.assert_allclose(aggregate.map_at(s, 0, 3, "all"), att.mean((0, 1)), atol=2e-6)
    # a mean of distributions is a distribution; masked cells stay 0
    m = aggregate.map_at(s, 0, 3, "all")
    np.testing.assert_allclose(m.sum(1), 1.0, atol=1e-5)
    assert np.all(m[np.triu_indices(T, 1)] == 0)
    # cropped to a step: the top-left block
    np.testing.assert_allclose(
        aggregate.map_at(s, 1, 0, "layer", n=T - 2), att[1, :, : T - 2, : T - 2].mean(0), atol=2e-6
    )
    with pytest.raises(IndexError):
        aggregate.map_at(s, 0, 0, n=T + 1)


def test_tile_is_exact_without_its_row(tiny):
    s, att = tiny
    tile = aggregate.map_tile(s, 1, 1, "group", slice(10, 20), slice(3, 9))
    np.testing.assert_allclose(tile, att[1, 0:2, 10:20, 3:9].mean(0), atol=2e-6)


@pytest.mark.parametrize("out,block_rows", [(7, 3), (16, 5), (64, 256)])
def test_pooled_map_is_block_max(tiny, out, block_rows):
    s, att = tiny
    T = s.seq_len
    pm = aggregate.pooled_map(s, 0, 1, "group", out=out, block_rows=block_rows)
    full = att[0, 0:2].mean(0)
    np.testing.assert_allclose(pm.image, max_pool(full, out, out), atol=2e-6)
    # by hand for one block
    re, ce = pm.row_edges, pm.col_edges
    assert re[0] == 0 and re[-1] == T and len(re) == min(out, T) + 1
    a, b = len(re) // 2, len(ce) // 3
    assert pm.image[a, b] == pytest.approx(full[re[a] : re[a + 1], ce[b] : ce[b + 1]].max(), abs=2e-6)
    assert pm.n == T


def test_robust_max():
    w = np.zeros((4, 4), np.float32)
    assert aggregate.robust_max(w) == 1.0
    w[0, 0] = 1.0
    w[1:, 0] = 0.1
    w[3, 1] = 0.2
    # 5 non-zero values: 1, 0.1, 0.1, 0.1, 0.2; the 50th percentile is 0.1
    assert aggregate.robust_max(w, q=50) == pytest.approx(0.1)
    assert aggregate.robust_max(w, q=100) == pytest.approx(1.0)


def test_layer_robust_max_is_max_over_heads(tiny):
    s, att = tiny
    expect = max(aggregate.robust_max(att[1, h]) for h in range(4))
    assert aggregate.layer_robust_max(s, 1) == pytest.approx(expect, rel=1e-5)


def test_cancel_between_heads(tiny):
    from attnscope.core.errors import Cancelled

    s, _ = tiny
    with pytest.raises(Cancelled):
        aggregate.map_at(s, 0, 0, "all", cancelled=lambda: True)


def test_progress_counts_heads_and_bands(tiny):
    s, att = tiny
    calls = []
    w = aggregate.map_at(s, 0, 0, "all", progress=lambda d, t: calls.append((d, t)))
    assert calls == [(i, 8) for i in range(1, 9)]
    np.testing.assert_allclose(w, att.mean(axis=(0, 1)), atol=1e-6)
    T = s.seq_len
    calls.clear()
    pm = aggregate.pooled_map(
        s, 1, 2, "group", out=4, block_rows=4, progress=lambda d, t: calls.append((d, t))
    )
    n_bands = len(calls) // 2
    assert n_bands >= 2 and calls == [(i, 2 * n_bands) for i in range(1, 2 * n_bands + 1)]
    np.testing.assert_allclose(pm.image, max_pool(att[1, 2:4].mean(axis=0), 4, 4), atol=1e-6)
    assert pm.n == T
    calls.clear()
    aggregate.thumbnails(s, size=4, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(i, 8) for i in range(1, 9)]


def test_thumbnails_at_a_step(tiny):
    s, att = tiny
    T = s.seq_len
    th = aggregate.thumbnails(s, n=T - 1, size=6)
    assert th.shape == (2, 4, 6, 6)
    for layer in range(2):
        for head in range(4):
            np.testing.assert_allclose(
                th[layer, head], max_pool(att[layer, head, : T - 1, : T - 1], 6, 6), atol=2e-6
            )
