"""Long prompts in the Compare tab: an overview (A, B max-pooled; A − B by signed max-|A − B| per block,
core/analysis/compare_overview.py) and exact tiles of A, B and A − B on zoom, with the three views linked."""

from __future__ import annotations

import os

import numpy as np
import pytest
from attnscope.core.analysis.compare_overview import block_of, pooled_pair, signed_absmax_pool
from attnscope.core.analysis.pooling import block_edges, max_pool


def _direct_signed(d, out_r, out_c):
    re, ce = block_edges(d.shape[0], out_r), block_edges(d.shape[1], out_c)
    res = np.zeros((len(re) - 1, len(ce) - 1), np.float32)
    for i in range(len(re) - 1):
        for j in range(len(ce) - 1):
            blk = d[re[i] : re[i + 1], ce[j] : ce[j + 1]].ravel()
            k = int(np.argmax(np.abs(blk)))
            # ties between +x and -x keep +x
            res[i, j] = abs(blk[k]) if np.any(blk == abs(blk[k])) else blk[k]
    return res


@pytest.mark.parametrize(
    "shape,out", [((23, 17), (5, 4)), ((31, 31), (7, 7)), ((9, 13), (9, 13)), ((1, 5), (1, 2))]
)
def test_signed_absmax_pool_equals_direct(shape, out):
    rng = np.random.default_rng(sum(shape))
    d = rng.normal(size=shape).astype(np.float32)
    got = signed_absmax_pool(d, *out)
    np.testing.assert_array_equal(got, _direct_signed(d, *out))
    assert got.shape == (min(shape[0], out[0]), min(shape[1], out[1]))


def test_signed_pool_keeps_a_changed_column_and_its_sign():
    """A sink column that lost weight in B (negative A − B) and one diagonal that gained survive the
    overview; a mean (or max(A) − max(B)) would blur or cancel them."""
    n = 37
    a = np.tril(np.full((n, n), 0.01, np.float32))
    b = a.copy()
    a[:, 0] = 0.9
    b[:, 0] = 0.3  # A − B = +0.6 in column 0
    idx = np.arange(n)
    b[idx, idx] += 0.5  # A − B = -0.5 on the diagonal
    d = signed_absmax_pool(a - b, 5, 5)
    assert np.allclose(d[:, 0], 0.6, atol=1e-6)  # column 0 wins every block of the first block-column
    assert np.allclose(np.diag(d)[1:], -0.5, atol=1e-6)  # the diagonal keeps its sign elsewhere


def test_pooled_pair_in_bands_equals_pooling_whole_maps(monkeypatch):
    import attnscope.core.analysis.compare_overview as P

    rng = np.random.default_rng(3)
    n, out = 53, 8
    A = rng.random((n, n), np.float32)
    B = rng.random((n, n), np.float32)
    calls = []

    def maps(rows):
        calls.append((rows.start, rows.stop))
        return A[rows], B[rows]

    monkeypatch.setattr(P, "BAND_CELLS", n * 14)  # 2 row blocks of ~7 per band: several bands
    ov = pooled_pair(maps, n, out)
    assert len(calls) > 1 and calls[0][0] == 0 and calls[-1][1] == n
    np.testing.assert_array_equal(ov.a, max_pool(A, out, out))
    np.testing.assert_array_equal(ov.b, max_pool(B, out, out))
    np.testing.assert_array_equal(ov.d, signed_absmax_pool(A - B, out, out))
    assert block_of(ov.row_edges, 0) == 0 and block_of(ov.row_edges, n - 1) == out - 1


# -- GUI ------------------------------------------------------------------------------------------------
LONG_PROMPT = " ".join(["The cat sat on the mat while the dog slept."] * 5)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from test_compare import _perturbed_copy
    from tiny_models import save_tiny

    base = tmp_path_factory.mktemp("base")
    save_tiny("llama", base)
    other = tmp_path_factory.mktemp("other")
    _perturbed_copy(base, other, layer=1, head=2)
    return base, other


def test_compare_long_overview_exact_tiles_linked(qtbot, folders, monkeypatch):
    from attnscope.app.views import compare_jobs
    from attnscope.core.analysis.compare_run_b import held
    from gui_helpers import ran_window
    from test_compare_narrow_gui import _cut_map_items

    monkeypatch.setattr(compare_jobs, "MAX_CELLS", 24)  # the tiny prompt (~200 tokens) counts as long
    win = ran_window(qtbot, folders[0], LONG_PROMPT)
    try:
        win.show_view("compare")
        view = win.views["compare"]
        view.kind_combo.setCurrentIndex([view.kind_combo.itemData(i) for i in range(4)].index("model"))
        view.model_edit.setText(str(folders[1]))
        view.dtype_combo.setCurrentText("float32")
        view.backend_combo.setCurrentText("torch")
        assert view.run_b() is not None
        assert win.engine.wait_idle(180) and view.result is not None, view.summary.text()
        assert win.engine.wait_idle(60)
        n = view.result.alignment.n
        assert n > 24 and view.map_key == (1, 2)
        sa = win.engine.session
        sb = held(sa)
        A, B = sa.weights(1, 2)[:n, :n], sb.weights(1, 2)[:n, :n]
        ov = view.overview
        assert ov is not None and ov.n == n and ov.a.shape == (24, 24)
        np.testing.assert_allclose(ov.a, max_pool(A, 24, 24), atol=1e-6)
        np.testing.assert_allclose(ov.b, max_pool(B, 24, 24), atol=1e-6)
        np.testing.assert_allclose(ov.d, signed_absmax_pool(A - B, 24, 24), atol=1e-6)
        assert "max-pooled" in view.plots[0].titleLabel.text and "max-pooled" in view.plots[1].titleLabel.text
        assert "signed max-|A−B|" in view.plots[2].titleLabel.text
        assert not _cut_map_items(view)  # the long titles fit: A − B and its colour bar are shown whole
        assert view.maps_widget.width() <= view.width()
        lo, hi = view.images[2].levels
        assert lo == pytest.approx(-hi) and hi == pytest.approx(np.abs(A - B).max(), rel=1e-5)
        assert view.tile is None  # the whole map in view: overview only
        width = win.width()
        shots = os.environ.get("ATTNSCOPE_SHOTS")
        if shots:
            view.grab().save(os.path.join(shots, "comparelong_overview.png"))
        # zoom the B map: the three views follow (linked) and an exact tile arrives
        view.plots[1].vb.setRange(
            xRange=(n - 12, n - 4), yRange=(n - 10, n - 2), padding=0
        )  # on the diagonal
        # linked: every view shows the region about the same centre (each plot's locked aspect may
        # widen one side to its own shape, never narrow it)
        for p in view.plots:
            x0, x1, y0, y1 = np.ravel(p.vb.viewRange())
            assert x0 <= n - 12 + 1e-6 and x1 >= n - 4 - 1e-6 and y0 <= n - 10 + 1e-6 and y1 >= n - 2 - 1e-6
            assert (x0 + x1) / 2 == pytest.approx(n - 8) and (y0 + y1) / 2 == pytest.approx(n - 6)
            assert max(x1 - x0, y1 - y0) < 24  # small enough for a tile
        qtbot.waitUntil(lambda: view.tile is not None, timeout=60_000)
        assert win.engine.wait_idle(60)
        ta, tb, r0, c0 = view.tile
        nr, nc = ta.shape
        assert r0 <= n - 10 and c0 <= n - 12 and r0 + nr >= n - 2 and c0 + nc >= n - 4
        np.testing.assert_allclose(ta, A[r0 : r0 + nr, c0 : c0 + nc], atol=1e-6)
        np.testing.assert_allclose(tb, B[r0 : r0 + nr, c0 : c0 + nc], atol=1e-6)
        np.testing.assert_allclose(view.tile_images[2].image, ta - tb, atol=1e-7)
        for t in view.tile_images:  # drawn where it belongs, in token coordinates
            rect = t.mapRectToParent(t.boundingRect())
            assert (rect.x(), rect.y(), rect.width(), rect.height()) == (c0, r0, nc, nr)
        assert "exact tile" in view.plots[0].titleLabel.text
        assert win.width() == width and view.maps_widget.width() <= view.width()  # no readout widened the tab
        m = float(np.abs(ta - tb).max())  # zoomed: the tile's own symmetric range
        assert tuple(view.tile_images[2].levels) == pytest.approx((-m, m), rel=1e-5)
        assert tuple(view.images[2].levels) == pytest.approx((-m, m), rel=1e-5)
        r, c = n - 5, n - 7
        a, b, d, exact = view.values_at(r, c)
        assert (
            exact
            and a == pytest.approx(float(A[r, c]), abs=1e-6)
            and b == pytest.approx(float(B[r, c]), abs=1e-6)
        )
        assert not view.values_at(2, n - 1)[3]  # outside the tile: the overview's block values
        # hover on the exact tile reads the exact weights
        from PySide6.QtCore import QPointF

        view._on_hover(view.plots[2].vb.mapViewToScene(QPointF(c + 0.5, r + 0.5)))
        from attnscope.app.views.compare_maps import weight_readout as _weight

        assert view.hover.text().startswith(f"query {r}") and _weight(A[r, c]) in view.hover.text()
        if shots:
            view.grab().save(os.path.join(shots, "comparelong_zoomed.png"))
        # zoomed back out: the tile goes, the overview's range and titles come back
        view.plots[0].vb.setRange(xRange=(0, n), yRange=(0, n), padding=0)
        view._maybe_request_tile()
        assert view.tile is None and tuple(view.images[2].levels) == pytest.approx((-hi, hi), rel=1e-5)
        assert "max-pooled" in view.plots[0].titleLabel.text
        # another head resets to its overview
        view.request_maps(0, 1)
        assert win.engine.wait_idle(60)
        assert view.map_key == (0, 1) and view.tile is None and view.overview is not None
    finally:
        win.close()
