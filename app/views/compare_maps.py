"""The Compare tab's three linked maps (:mod:`attnscope.app.views.compare`): A, B and A − B of the selected
head (A and B on the window's colour map, A − B on a diverging map centred on 0 with a symmetric range),
the hover readout of both weights, and the clicked query row of both runs as lines.

Maps longer than :data:`attnscope.app.views.compare_jobs.MAX_CELLS` are shown like the heatmap's long maps:
an overview (:mod:`attnscope.core.analysis.compare_overview`), and on zoom an exact tile of all three for the
visible region, computed on the engine thread (:mod:`attnscope.app.views.compare_jobs`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from attnscope.app.engine import Request
from attnscope.app.views import compare_jobs as jobs
from attnscope.app.views.heads_plots import Placeholder, show_placeholder
from attnscope.app.views.heatmap import NONFINITE_LEGEND_HTML, show_nonfinite
from attnscope.app.views.sinks import SpacedTicksAxis, set_short_title, style_plot
from attnscope.core.io.colormaps import lut as colormap_lut
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QLabel,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

if TYPE_CHECKING:
    from attnscope.core.analysis.compare_overview import PairOverview
    from attnscope.core.analysis.compare_runs import CompareResult

HOVER_HINT = "Hover a map to read A's and B's weights; click a row to plot both rows."
ROW_HINT = "Click a map row to plot it"  # short: the plot is ~250 px wide in a 1000 px window
#: the row plot's placeholder while no row is plotted (hidden axes, not bare 0..1 ones)
ROW_EMPTY = "A's and B's weights along a clicked map row"


def diverging_lut() -> np.ndarray:
    """``(256, 3)`` uint8 blue–white–red (colorcet CET-D1, through pyqtgraph): 0 is the middle entry."""
    return pg.colormap.get("CET-D1").getLookupTable(nPts=256).astype(np.uint8)[:, :3]


class CompareMapsMixin:
    """The maps, hover line and row plot of :class:`attnscope.app.views.compare.CompareView`."""

    state: Any  # attnscope.app.state.ViewState (set by CompareView)
    engine: Any  # attnscope.app.engine.Engine
    result: CompareResult | None  # the comparison shown
    labels: tuple[list[str], list[str]]  # A's and B's token labels
    stale: str | None  # why the comparison shown is out of date (None: it is current)
    _gen: int  # the comparison's generation (Request.key)

    _on_failed: Callable[[str], None]  # a job failed (attnscope.app.views.compare)
    _select_row_of: Callable[[int, int], None]  # the table follows the head drawn (compare_table)

    def _build_maps(self) -> QWidget:
        """The three linked maps over the NaN/inf legend and the hover line (returned in one widget), and
        the row plot (:attr:`row_plot`)."""
        self.maps: tuple[np.ndarray, np.ndarray] | None = None
        self.map_key: tuple[int, int] | None = None
        self.pool = 1
        self.overview: PairOverview | None = None  # of a long head
        self.tile: tuple[np.ndarray, np.ndarray, int, int] | None = (
            None  # the exact tile drawn over the overview
        )
        self._levels = ((0.0, 1.0), (-1.0, 1.0))
        self._titles = ("", "", "")
        # A's and B's maps follow the window's Colours combo (A − B stays diverging)
        self.cmap = self.state.colormap
        self.maps_widget = _MapsWidget(self._on_maps_resized)
        self.maps_widget.setBackground("w")
        self.plots, self.images, self.tile_images = [], [], []
        # NaN/inf cells of each map and tile, magenta over them as in every view and output
        # (attnscope.app.views.heatmap.show_nonfinite): a lookup table would draw them as a weight
        self.nonfinite_images: list = []
        self.tile_nonfinite: list = []
        for i, name in enumerate(("A", "B", "A − B")):
            p = self.maps_widget.addPlot(row=0, col=i, title=name)
            p.invertY(True)
            p.setAspectLocked(True)
            p.hideAxis("bottom")
            p.hideAxis("left")
            p.hideButtons()  # pyqtgraph's auto-range "A" button read as the name of map A
            img = pg.ImageItem(axisOrder="row-major")
            p.addItem(img)
            tile = pg.ImageItem(axisOrder="row-major")  # exact tile over a long map's overview
            tile.setZValue(1)
            p.addItem(tile)
            for z, items in ((0.5, self.nonfinite_images), (1.5, self.tile_nonfinite)):
                bad = pg.ImageItem(axisOrder="row-major")
                bad.setZValue(z)
                p.addItem(bad)
                items.append(bad)
            self.plots.append(p)
            self.images.append(img)
            self.tile_images.append(tile)
        for p in self.plots[1:]:
            p.setXLink(self.plots[0])
            p.setYLink(self.plots[0])
        self._tile_timer = QTimer(self.maps_widget)
        self._tile_timer.setSingleShot(True)
        self._tile_timer.setInterval(150)
        self._tile_timer.timeout.connect(self._maybe_request_tile)
        for p in self.plots:
            p.vb.sigRangeChanged.connect(self._on_range_changed)
        self.bar = pg.ColorBarItem(
            values=(-1, 1), colorMap=pg.colormap.get("CET-D1"), interactive=False, width=12
        )
        self.bar.setImageItem(self.images[2], insert_in=self.plots[2])
        self.hover = QLabel(HOVER_HINT)
        self.hover.setStyleSheet("color:#333;")
        # a long readout never widens the tab, and wraps rather than being cut in a narrow window
        self.hover.setWordWrap(True)
        self.hover.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Minimum)
        self.maps_widget.scene().sigMouseMoved.connect(self._on_hover)
        self.maps_widget.scene().sigMouseClicked.connect(self._on_click)

        # -- plots: rows, logits
        self.row_plot = pg.PlotWidget(background="w", axisItems={"left": SpacedTicksAxis("left")})
        style_plot(self.row_plot)
        rp = self.row_plot.getPlotItem()
        set_short_title(rp, ROW_HINT)
        rp.setLabel("bottom", "key position")
        rp.setLabel("left", "weight")
        # no "(x0.001)" SI suffix: it made the label longer than the plot is high (clipped, and a stray
        # ")" stayed painted after the next comparison); the tick labels carry the scale
        rp.getAxis("left").enableAutoSIPrefix(False)
        self.row_a = rp.plot([], [], pen=pg.mkPen("#3b6fb6", width=2), name="A")
        self.row_b = rp.plot([], [], pen=pg.mkPen("#d0702a", width=2, style=Qt.PenStyle.DashLine), name="B")
        self.row_placeholder = Placeholder(rp)
        show_placeholder(rp, self.row_placeholder, ROW_EMPTY)
        mapbox = QWidget()
        ml = QVBoxLayout(mapbox)
        ml.setContentsMargins(0, 0, 0, 0)
        ml.addWidget(self.maps_widget, 1)
        self.map_legend = QLabel("")  # names the NaN/inf cells when a map has any
        self.map_legend.setWordWrap(True)
        self.map_legend.hide()
        ml.addWidget(self.map_legend)
        ml.addWidget(self.hover)
        return mapbox

    def clear_maps(self, titles: tuple[str, str, str] = ("A", "B", "A − B")) -> None:
        """Empty the three maps, the tiles, the row plot and the hover line (nothing selected)."""
        self.maps, self.map_key, self.overview, self.tile, self.pool = None, None, None, None, 1
        for img in (*self.images, *self.tile_images, *self.nonfinite_images, *self.tile_nonfinite):
            img.clear()
        self.map_legend.hide()
        self._titles = titles
        self._show_titles(titles)
        self.row_a.setData([], [])
        self.row_b.setData([], [])
        set_short_title(self.row_plot.getPlotItem(), ROW_HINT)
        show_placeholder(self.row_plot.getPlotItem(), self.row_placeholder, ROW_EMPTY)
        self.hover.setText(HOVER_HINT)
        self.bar.setLevels((-1.0, 1.0))
        self.row_plot.getPlotItem().enableAutoRange()

    # -- titles and size ----------------------------------------------------------------------------
    def _on_maps_resized(self) -> None:
        """The maps' view was resized: fit the titles again, and a map shown whole is shown whole at
        the new size (the aspect-locked views keep the wider range a narrow window gave them otherwise;
        a zoom stays as it is)."""
        self._fit_titles()
        n_r, n_c = self._side() if hasattr(self, "maps") else (0, 0)
        if not n_r or not n_c:
            return
        (x0, x1), (y0, y1) = self.plots[0].vb.viewRange()
        if x0 <= 0 and y0 <= 0 and x1 >= n_c and y1 >= n_r:
            self.plots[0].setRange(xRange=(0, n_c), yRange=(0, n_r), padding=0.01)

    def _show_titles(self, titles: tuple[str, str, str]) -> None:
        """Title the three maps with ``titles`` (A, B, A − B), shortened as far as the maps' width needs
        (:meth:`_fit_titles`)."""
        self._shown_titles = titles
        self._fit_titles()

    def _fit_titles(self) -> None:
        """The longest form of the titles that fits the maps' width (:func:`_short_title`: whole, without
        parentheses, or the map's name alone); a shortened title keeps the whole one as its tooltip. A
        title wider than its map widens the graphics layout past the view, which then cuts off A − B and
        its colour bar on the right (a 1000 px window; a long map's titles at 1400 px)."""
        titles = getattr(self, "_shown_titles", None)
        if titles is None:  # (resized while being built)
            return
        room = self.maps_widget.viewport().width()
        for level in range(3):
            shown = tuple(_short_title(t, level) for t in titles)
            for p, full, t in zip(self.plots, titles, shown, strict=True):
                if p.titleLabel.text != t:
                    p.setTitle(t, color="#222")
                p.titleLabel.setToolTip("" if t == full else full)
            for p in self.plots:  # the size hints are cached until the layouts are invalidated
                p.layout.invalidate()
            self.maps_widget.ci.layout.invalidate()
            if self.maps_widget.ci.effectiveSizeHint(Qt.SizeHint.MinimumSize).width() <= room:
                break
        # the layout keeps the size it was clamped to under longer titles until it is set again
        self.maps_widget.ci.setGeometry(self.maps_widget.range)

    # -- maps ---------------------------------------------------------------------------------------
    def _request(self, channel: str, job, on_done, label: str) -> None:
        """Submit a map/tile/row job for the comparison shown now: its result is dropped (Request.key)
        once another comparison is shown or this one goes out of date."""
        gen = lambda: self._gen  # noqa: E731
        self.engine.submit(channel, Request(job, on_done, label, key=gen, on_error=self._on_failed))

    def request_maps(self, layer: int, head: int) -> None:
        """Ask for one head's A, B and A − B; nothing while no comparison is shown or it is out of date."""
        if self.result is None or self.stale is not None:
            return
        n = self.result.alignment.n
        self._request(
            "compare-maps",
            jobs.maps_job(layer, head, n, self.result.weighting),
            self.set_maps,
            "compare maps",
        )

    def set_maps(self, payload) -> None:
        """Draw A, B and A − B: the exact maps, or a long head's overview (:class:`PairOverview`)."""
        key, wa, wb, ov = payload
        if self.result is None or (ov is None and np.shape(wa) != np.shape(wb)):
            # cannot happen through _request (the generation key); never a traceback if it does
            self.clear_maps()
            self.hover.setText(
                "These maps no longer line up with the comparison: press Run B & compare again."
            )
            return
        self.map_key, self.overview, self.tile = key, ov, None
        self.maps = (wa, wb)
        if ov is None:
            self.pool = 1
            d = wa.astype(np.float64) - wb.astype(np.float64)
            side = wa.shape
        else:
            self.pool = max(1, int(round(ov.n / (len(ov.row_edges) - 1))))
            d = ov.d
            side = (ov.n, ov.n)
        hi = max(finite_max(wa), finite_max(wb), 1e-12)
        m = finite_max(np.abs(d)) or 1e-12
        self._levels = ((0.0, hi), (-m, m))
        lut = colormap_lut(self.cmap)
        for img, w in zip(self.images[:2], (wa, wb), strict=True):
            img.setImage(w, levels=(0.0, hi), lut=lut, autoLevels=False)
        self.images[2].setImage(
            np.asarray(d, np.float32), levels=(-m, m), lut=diverging_lut(), autoLevels=False
        )
        bad = False
        for item, w in zip(self.nonfinite_images, (wa, wb, d), strict=True):
            bad = show_nonfinite(item, np.asarray(w)) or bad
        for img in (*self.images, *self.nonfinite_images):  # view coordinates: token positions
            img.setRect(0, 0, side[1], side[0])
        for t in (*self.tile_images, *self.tile_nonfinite):
            t.clear()
        self._say_nonfinite(bad)
        self.bar.setLevels((-m, m))
        layer, head = key
        vw = " (value-weighted, row-normalised)" if self.result.weighting == "value-weighted" else ""
        if ov is None:
            self._titles = (f"A · L{layer} H{head}{vw}", f"B · L{layer} H{head}", f"A − B (±{m:.3g})")
        else:
            f = ov.n / (len(ov.row_edges) - 1)
            # short: a long title widens the graphics layout past the view (the hover line says more)
            self._titles = (
                f"A · L{layer} H{head}{vw} · max-pooled ~{f:.0f}²",
                "B · max-pooled",
                f"A − B (±{m:.3g}) · signed max-|A−B|",
            )
        self._show_titles(self._titles)
        if ov is not None:
            self.hover.setText(
                f"Long map ({ov.n} tokens): overview of blocks of ~{f:.1f} cells (A, B: block max; "
                "A − B: the largest |difference| with its sign). Zoom in (wheel/drag) for exact tiles."
            )
        self.plots[0].setRange(xRange=(0, side[1]), yRange=(0, side[0]), padding=0.01)
        self._select_row_of(layer, head)
        if self.state.layer != layer or self.state.head != head:
            try:
                self.state.select(layer, head)
            except IndexError:
                pass

    # -- long maps: exact tiles on zoom -------------------------------------------------------------
    def _on_range_changed(self, *_):
        if self.overview is not None:
            self._tile_timer.start()

    def visible_cells(self) -> tuple[int, int, int, int]:
        """``(r0, r1, c0, c1)``: token rows and cols at least partly visible (the views are linked)."""
        import math

        (x0, x1), (y0, y1) = self.plots[0].vb.viewRange()
        n_r, n_c = self._side()
        return (
            max(0, int(math.floor(y0))),
            min(n_r, int(math.ceil(y1))),
            max(0, int(math.floor(x0))),
            min(n_c, int(math.ceil(x1))),
        )

    def _side(self) -> tuple[int, int]:
        if self.overview is not None:
            return self.overview.n, self.overview.n
        return self.maps[0].shape if self.maps is not None else (0, 0)

    def _maybe_request_tile(self) -> None:
        """Zoomed into a long map (at most :data:`attnscope.app.views.compare_jobs.MAX_CELLS` a side visible): ask the engine for the
        exact tile of A and B over the view plus a quarter margin, unless the one drawn covers it."""
        ov = self.overview
        if ov is None or self.map_key is None or self.result is None or self.stale is not None:
            return
        r0, r1, c0, c1 = self.visible_cells()
        if r1 - r0 > jobs.MAX_CELLS or c1 - c0 > jobs.MAX_CELLS:
            if self.tile is not None:  # zoomed back out: the overview on its own range again
                self.tile = None
                for t in self.tile_images:
                    t.clear()
                self._show_levels(*self._levels)
                self._show_titles(self._titles)
            return
        if r1 <= r0 or c1 <= c0:
            return
        if self.tile is not None:
            ta, _, tr, tc = self.tile
            if tr <= r0 and tc <= c0 and r1 <= tr + ta.shape[0] and c1 <= tc + ta.shape[1]:
                return
        mr, mc = (r1 - r0) // 4, (c1 - c0) // 4
        want = (max(0, r0 - mr), min(ov.n, r1 + mr), max(0, c0 - mc), min(ov.n, c1 + mc))
        layer, head = self.map_key
        job = jobs.tile_job(layer, head, ov.n, *want, self.result.weighting)
        self._request("compare-tile", job, self.set_tile, "compare tile")

    def set_tile(self, payload) -> None:
        """Draw the exact tile of A, B and A − B over the overview (dropped if the head changed)."""
        key, n, r0, c0, wa, wb = payload
        if self.overview is None or key != self.map_key or n != self.overview.n:
            return
        wa, wb = np.asarray(wa, np.float32), np.asarray(wb, np.float32)
        self.tile = (wa, wb, int(r0), int(c0))
        d = wa - wb
        # zoomed in, the colours span the tile's own range (A and B share theirs; A − B stays symmetric):
        # the overview's range is set by the whole map's largest weights (often a sink)
        hi = max(finite_max(wa), finite_max(wb), 1e-12)
        m = finite_max(np.abs(d)) or 1e-12
        lut = colormap_lut(self.cmap)
        nr, nc = wa.shape
        bad = False
        for t, nf, w, lt in (
            (self.tile_images[0], self.tile_nonfinite[0], wa, lut),
            (self.tile_images[1], self.tile_nonfinite[1], wb, lut),
            (self.tile_images[2], self.tile_nonfinite[2], d, diverging_lut()),
        ):
            t.setImage(w, lut=lt, autoLevels=False)
            t.setRect(c0, r0, nc, nr)
            bad = show_nonfinite(nf, w) or bad
            nf.setRect(c0, r0, nc, nr)
        self._say_nonfinite(bad or not self.map_legend.isHidden())
        self._show_levels((0.0, hi), (-m, m))
        names = (
            f"A · exact tile (0–{hi:.3g})",
            f"B · exact tile (0–{hi:.3g})",
            f"A − B · exact tile (±{m:.3g})",
        )
        self._show_titles(names)
        self.hover.setText(
            f"Exact tile: rows {r0}..{r0 + nr - 1} × keys {c0}..{c0 + nc - 1} of A, B and A − B, "
            "recomputed from both runs. Hover a cell for its weights."
        )

    def set_colormap(self, name: str) -> None:
        """Paint A and B (maps and tiles) with the window's colour map ``name``; A − B keeps its
        diverging blue–white–red map centred on 0 (a sign, not a magnitude). The heatmap's scale and
        gamma are not applied: A, B and A − B are read on one linear axis."""
        self.cmap = name
        lut = colormap_lut(name)
        for img in (*self.images[:2], *self.tile_images[:2]):
            if img.image is not None:
                img.setLookupTable(lut)

    def _show_levels(self, ab: tuple[float, float], d: tuple[float, float]) -> None:
        """Colour ranges of A and B (``ab``) and of A − B (``d``), overview and tile alike."""
        for i, lv in ((0, ab), (1, ab), (2, d)):
            self.images[i].setLevels(lv)
            if self.tile_images[i].image is not None:
                self.tile_images[i].setLevels(lv)
        self.bar.setLevels(d)

    def values_at(self, r: int, c: int) -> tuple[float, float, float, bool]:
        """``(A, B, A − B, exact)`` at token ``(r, c)``: exact from a short map or the tile, else the
        overview's block values (block max of A and B, signed max-|A − B|)."""
        if self.overview is None:
            if self.maps is None:
                raise ValueError("no maps are shown")
            a, b = float(self.maps[0][r, c]), float(self.maps[1][r, c])
            return a, b, a - b, True
        if self.tile is not None:
            ta, tb, tr, tc = self.tile
            if tr <= r < tr + ta.shape[0] and tc <= c < tc + ta.shape[1]:
                a, b = float(ta[r - tr, c - tc]), float(tb[r - tr, c - tc])
                return a, b, a - b, True
        from attnscope.core.analysis.compare_overview import block_of

        ov = self.overview
        i, j = block_of(ov.row_edges, r), block_of(ov.col_edges, c)
        return float(ov.a[i, j]), float(ov.b[i, j]), float(ov.d[i, j]), False

    def _cell_at(self, scene_pos):
        if self.maps is None:
            return None
        n_r, n_c = self._side()
        for p in self.plots:
            if p.sceneBoundingRect().contains(scene_pos):
                pt = p.vb.mapSceneToView(scene_pos)
                r, c = int(np.floor(pt.y())), int(np.floor(pt.x()))
                if 0 <= r < n_r and 0 <= c < n_c:
                    return r, c
        return None

    def _on_hover(self, pos) -> None:
        rc = self._cell_at(pos)
        if rc is None:
            return
        r, c = rc
        wa, wb, d, exact = self.values_at(r, c)
        la, lb = self.labels
        if not exact:
            from attnscope.core.analysis.compare_overview import block_of

            ov = self.overview
            assert ov is not None  # (values_at says exact unless an overview is shown)
            i, j = block_of(ov.row_edges, r), block_of(ov.col_edges, c)
            where = (
                f"rows {ov.row_edges[i]}–{ov.row_edges[i + 1] - 1}, keys {ov.col_edges[j]}–"
                f"{ov.col_edges[j + 1] - 1} (block max; A − B: largest |difference|)"
            )
        else:
            ta = la[r] if r < len(la) else "?"
            tk = la[c] if c < len(la) else "?"
            tb = lb[r] if r < len(lb) else "?"
            where = f"query {r} {ta!r}" + (f" (B: {tb!r})" if tb != ta else "") + f" → key {c} {tk!r}"
        self.hover.setText(
            f"{where}: A {weight_readout(wa)} · B {weight_readout(wb)} · A − B {weight_readout(d, '+')}"
        )

    def _on_click(self, ev) -> None:
        rc = self._cell_at(ev.scenePos())
        if rc is None or self.map_key is None or self.result is None or self.stale is not None:
            return
        row = rc[0]  # view coordinates are token positions, overview or not
        layer, head = self.map_key
        job = jobs.row_job(layer, head, row, self.result.alignment.n, self.result.weighting)
        self._request("compare-row", job, self.set_rows, "compare row")

    def _say_nonfinite(self, any_bad: bool) -> None:
        """Name the magenta cells under the maps while any map shows some."""
        self.map_legend.setText(NONFINITE_LEGEND_HTML if any_bad else "")
        self.map_legend.setVisible(any_bad)

    def set_rows(self, payload) -> None:
        row, ra, rb = payload
        x = np.arange(len(ra), dtype=float)
        self.row_a.setData(x[: row + 1], ra[: row + 1])
        self.row_b.setData(x[: row + 1], rb[: row + 1])
        # the range of this row (keys 0..row, weights 0..its largest), never the previous row's or a
        # zoom left over: auto-range is off once the user has dragged the plot
        top = max(finite_max(np.asarray(ra[: row + 1])), finite_max(np.asarray(rb[: row + 1])), 1e-6)
        rp = self.row_plot.getPlotItem()
        show_placeholder(rp, self.row_placeholder, "")
        rp.setXRange(0, max(row, 1), padding=0.02)
        rp.setYRange(0, top, padding=0.05)
        set_short_title(self.row_plot.getPlotItem(), f"Row {row} (A blue, B dashed)")


def _short_title(title: str, level: int) -> str:
    """``title`` whole (level 0); without its parentheses (1: ``"A − B (±0.295) · signed max-|A−B|"`` →
    ``"A − B · signed max-|A−B|"``; the colour bar gives the range); up to its first ``" · "`` (2: the
    map's name, ``"A − B"``)."""
    if level >= 1:
        title = re.sub(r" \([^)]*\)", "", title)
    if level >= 2:
        title = title.split(" · ")[0]
    return title


class _MapsWidget(pg.GraphicsLayoutWidget):
    """The maps' graphics view; ``on_resize()`` runs after each resize (the titles are fitted again)."""

    def __init__(self, on_resize: Callable[[], None]):
        self._on_resize: Callable[[], None] | None = None  # (pyqtgraph resizes while it builds)
        super().__init__()
        self._on_resize = on_resize

    def resizeEvent(self, ev) -> None:
        super().resizeEvent(ev)
        if self._on_resize is not None:
            self._on_resize()


def finite_max(a: np.ndarray) -> float:
    """The largest finite value of ``a`` (0.0 when it has none): a map's colour range, never NaN."""
    a = np.asarray(a, dtype=np.float64)
    ok = np.isfinite(a)
    return float(a[ok].max()) if ok.any() else 0.0


def weight_readout(v: float, sign: str = "") -> str:
    """A weight as the heatmap's readout writes it (:func:`attnscope.app.views.heatmap.weight_text`): 4
    decimals from 0.01, 3 significant digits below (``3.21e-05``); ``sign="+"`` signs a difference."""
    v = float(v)
    return f"{v:{sign}.4f}" if v == 0 or abs(v) >= 0.01 else f"{v:{sign}.2e}"
