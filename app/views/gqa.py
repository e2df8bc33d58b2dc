"""GQA panel: the query heads of one KV group side by side, how alike they are, the KV head they read.

For the selected layer and the KV group of the selected head (query head ``h`` reads KV head
``h // group_size``): each query head's map as a small heatmap (exact, or max-pooled beyond 256
tokens), the cached keys of the KV head they all read, the Jensen–Shannon distance between each
pair of heads (mean over query rows, base 2, in [0, 1]; :mod:`attnscope.core.analysis.gqa`), and for the whole
layer the mean within-group vs across-group distance; a plot repeats the two means for every
layer. Click a small map to select that head.

Colours follow the heatmap's default, chosen from the group's own maps (log over [1e-6, 1] when
fewer than a quarter of their cells show on linear [0, 1], and from 2,048 tokens; said in the
header: :func:`attnscope.core.io.colour_scale.scale_for_map`); each map's cells are square. Blocks
the causal mask (or the layer's sliding window) hides entirely are drawn hatched grey, not in the
colour of weight 0; NaN/inf cells (a forward that overflowed) magenta, named in the header, as in
every view and output (:mod:`attnscope.core.io.render`).
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from attnscope.app.engine import Request
from attnscope.app.tabs import PageLayout
from attnscope.app.views.head_grid import MASK_HATCH, masked_blocks
from attnscope.app.views.heatmap import (
    LOG_FLOOR,
    NONFINITE_LEGEND_HTML,
    colorbar_ticks,
    qt_colormap,
    show_nonfinite,
)
from attnscope.app.views.saved_controls import SavedControls
from attnscope.app.views.sinks import WrappedLabel
from attnscope.core.analysis.pooling import block_edges
from attnscope.core.io.colormaps import normalize
from attnscope.core.io.colour_scale import ScaleChoice, default_colour_scale, scale_for_map
from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtGui import QColor, QFontMetrics
from PySide6.QtWidgets import (
    QComboBox,
    QGraphicsRectItem,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)


def _report_job(layer: int, kv_head: int, n: int):
    def job(ctx):
        from attnscope.core.analysis.gqa import group_report

        s = ctx.require()
        report = group_report(s, layer, kv_head, n, cancelled=ctx.cancelled)
        try:  # the layer's sliding window (None: causal only), to hatch the blocks it masks
            window = s.trace.layers[layer].sliding_window
        except (AttributeError, IndexError):
            window = None
        return report, window

    return job


def _layers_job(n: int):
    def job(ctx):
        from attnscope.core.analysis.gqa import layer_table

        return n, layer_table(ctx.require(), n, cancelled=ctx.cancelled)

    return job


def _sparse_ticks(n: int) -> list[int]:
    """Tick positions for a small map of ``n`` tokens: multiples of the smallest 1-2-5 step that
    gives at most 3 of them in ``[0, n)``, e.g. ``185 -> [0, 100]``, ``58 -> [0, 20, 40]``."""
    step = 1
    while True:
        for m in (1, 2, 5):
            if -(-max(n, 1) // (m * step)) <= 3:
                return list(range(0, max(n, 1), m * step))
        step *= 10


def _shade(v: float) -> QColor:
    """Light background for a distance in [0, 1]: white (alike) → orange (different)."""
    v = 0.0 if not np.isfinite(v) else float(np.clip(v, 0, 1))
    return QColor(255, int(255 - 110 * v), int(255 - 200 * v))


class GqaView(QWidget, SavedControls):
    """The GQA tab, built with the :class:`attnscope.app.state.ViewState` (selection, step, colours)
    and the :class:`attnscope.app.engine.Engine`."""

    STATE_CONTROLS = ("range_combo",)  # saved in session files

    KEY = "gqa"
    MAP_MIN_PX = 80  # the smallest side of a small map before the page scrolls
    KEYS_MIN_PX = 150  # the narrowest the cached keys plot gets beside the maps

    def __init__(self, state, engine, parent: QWidget | None = None):
        super().__init__(parent)
        self.state, self.engine = state, engine
        self.report = None
        self.sliding_window: int | None = None  # the report's layer's sliding window
        self.scale = "linear"  # colour scale of the maps shown: colour_scale.scale_for_map(their maps)
        self.choice: ScaleChoice | None = None  # ... and why (the header says it)
        self.layers = None  # (n, (within, across, rows_used))
        self.query_axis_px = 50  # q0's query axis (set from its labels in _draw_maps)
        self.cmap = state.colormap
        state.events.selection.connect(self.on_selection)
        state.events.snapshot.connect(self.on_snapshot)
        state.events.colour.connect(lambda spec: self.set_colormap(spec.cmap))
        lay = PageLayout(self)  # fills the tab page; wrapped labels never make it scroll
        lay.setContentsMargins(4, 4, 4, 4)
        self.header = WrappedLabel("Run a prompt to compare the query heads of a GQA group.")
        lay.addWidget(self.header)  # the tab's whole width: two lines in a 1000 px window
        top = QHBoxLayout()  # under the tabs, beside the hover readout
        self.readout = QLabel("")
        top.addWidget(self.readout, 1)
        top.addWidget(QLabel("Range"))
        self.range_combo = QComboBox()
        self.range_combo.addItems(["Fixed [0, 1]", "Shared auto (this group)"])
        self.range_combo.setToolTip(
            "Colour range of the small maps; shared auto = 99.5th percentile of the group's non-zero weights"
        )
        self.range_combo.currentIndexChanged.connect(lambda _i: self._draw_maps())
        top.addWidget(self.range_combo)

        split = QSplitter(Qt.Orientation.Vertical)
        split.setChildrenCollapsible(False)  # neither pane is dragged (or squeezed) out of sight
        self.glw = pg.GraphicsLayoutWidget()
        self.glw.setBackground("w")
        split.addWidget(self.glw)
        bottom = QWidget()
        bl = QHBoxLayout(bottom)
        bl.setContentsMargins(0, 0, 0, 0)
        left = QVBoxLayout()
        self.pair_title = WrappedLabel("<b>JS distance</b> (base 2)")
        left.addWidget(self.pair_title)
        self.pair_table = QTableWidget()
        self.pair_table.setToolTip("Mean over query rows of sqrt(JSD) in bits: 0 = same rows, 1 = disjoint")
        left.addWidget(self.pair_table)
        bl.addLayout(left, 0)  # as wide as its numbers (_fill_pairs)
        mid = QVBoxLayout()
        self.layer_title = WrappedLabel("<b>This layer</b>: within/across")
        mid.addWidget(self.layer_title)
        self.layer_table_widget = QTableWidget()
        self.layer_table_widget.setMaximumWidth(380)
        self.layer_table_widget.setMinimumWidth(250)
        mid.addWidget(self.layer_table_widget)
        bl.addLayout(mid, 2)
        self.layers_plot = pg.PlotWidget(background="w")
        self.layers_plot.setMenuEnabled(False)
        self.layers_plot.hideButtons()
        self.layers_plot.setLabel("bottom", "layer")
        self.layers_plot.setLabel("left", "mean JS")  # short: the plot is ~100 px tall in a 650 px window
        self.layers_plot.getAxis("left").enableAutoSIPrefix(False)
        self.layers_plot.showGrid(x=True, y=True, alpha=0.2)
        for ax in ("left", "bottom"):
            self.layers_plot.getAxis(ax).setPen("k")
            self.layers_plot.getAxis(ax).setTextPen("k")
        right = QVBoxLayout()
        self.layers_title = WrappedLabel("<b>Every layer</b>")
        right.addWidget(self.layers_title)
        right.addWidget(self.layers_plot, 1)
        bl.addLayout(right, 4)
        split.addWidget(bottom)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setSizes([380, 250])
        lay.addWidget(split, 1)
        lay.addLayout(top)
        self.plots: list[pg.PlotItem] = []
        self.images: list[pg.ImageItem] = []
        self.glw.installEventFilter(self)  # refit the maps' columns on resize (_fit_columns)
        self.glw.scene().sigMouseClicked.connect(self._on_click)
        self.glw.scene().sigMouseMoved.connect(self._on_mouse)

    # -- state ------------------------------------------------------------------------------------
    def _group_key(self) -> tuple[tuple, int, int, int]:
        """(sequence, layer, KV head of the selected head, visible_len): what the group report is for
        (a report computed for another sequence of the same length is stale too)."""
        s = self.state
        kv = s.snapshot.info.kv_head(s.head) if s.snapshot is not None else 0
        return s.sequence_key, s.layer, kv, s.visible_len

    def refresh(self) -> None:
        _seq, layer, kv, n = self._group_key()
        self.engine.submit(
            "gqa", Request(_report_job(layer, kv, n), self._on_report, "GQA group", key=self._group_key)
        )
        if self.layers is None or self.layers[0] != n:
            self.engine.submit(
                "gqa-layers",
                Request(
                    _layers_job(n),
                    self._on_layers,
                    "GQA layers",
                    key=lambda: (self.state.sequence_key, self.state.visible_len),
                ),
            )

    def on_selection(self, _selection=None) -> None:
        if self.state.tab == self.KEY:
            self.refresh()

    def on_snapshot(self, snap) -> None:
        self.layers = None

    def set_colormap(self, name: str) -> None:
        self.cmap = name
        self._draw_maps()

    # -- drawing ----------------------------------------------------------------------------------
    def _on_report(self, result) -> None:
        r, self.sliding_window = result if isinstance(result, tuple) else (result, None)
        self.report = r
        info = self.state.snapshot.info
        members = ", ".join(f"q{h}" for h in r.heads)
        pooled = f" (max-pooled to {r.maps.shape[-1]}×{r.maps.shape[-1]})" if r.pooled else ""
        self.choice = self._scale_choice(r)
        bad = "" if np.isfinite(r.maps).all() else f" · {NONFINITE_LEGEND_HTML}"
        self.header.setText(
            f"<b>Layer {r.layer} · KV group {r.kv_head}</b>: query heads {members} all read "
            f"<b>KV head {r.kv_head}</b> (group_size = {info.n_heads} / {info.n_kv_heads} = {info.group_size}) · "
            f"seq_len {r.n}{pooled} · {self.choice.note()} · "
            f"▨ hatched: masked, not 0{bad}"
        )
        self._build_plots(len(r.heads))
        self._draw_maps()
        self._fill_pairs(r)
        self._fill_layer(r, info)
        self._draw_layers_plot()

    @staticmethod
    def _scale_choice(r) -> ScaleChoice:
        """The group's default scale: from its exact maps (one choice for all, so they compare), by
        length for a pooled overview (block maxima overstate what linear shows)."""
        if r.pooled:
            return ScaleChoice(default_colour_scale(r.n), r.n)
        return scale_for_map(list(r.maps), n=r.n)

    def _on_layers(self, result) -> None:
        self.layers = result
        self._draw_layers_plot()

    def _build_plots(self, g: int) -> None:
        if len(self.plots) == g + 1:
            return
        self.glw.clear()
        self.plots, self.images, self.nonfinite = [], [], []
        for i in range(g + 1):
            p = self.glw.addPlot(row=0, col=i if i < g else g + 1)
            p.invertY(True)
            if i < g:  # a map's cells are square (query × key); the keys plot is position × channel
                p.setAspectLocked(True)
            p.setMenuEnabled(False)
            p.hideButtons()
            p.setMouseEnabled(x=False, y=False)
            for ax in ("left", "bottom"):
                p.getAxis(ax).setPen("k")
                p.getAxis(ax).setTextPen("k")
            img = pg.ImageItem(axisOrder="row-major")
            p.addItem(img)
            self.plots.append(p)
            self.images.append(img)
            if i < g:  # NaN/inf cells: magenta over the map (attnscope.app.views.heatmap.show_nonfinite)
                bad = pg.ImageItem(axisOrder="row-major")
                bad.setZValue(1)
                p.addItem(bad)
                self.nonfinite.append(bad)
        for p in self.plots[:g]:
            p.setLabel("bottom", "key")
        self.plots[0].setLabel("left", "query")
        for p in self.plots[1:g]:  # the maps share q0's query axis: room for the cells instead
            p.hideAxis("left")
        grid = self.glw.ci.layout
        for i in range(g + 1):  # the maps' columns are sized by _fit_columns; the keys plot takes the rest
            grid.setColumnStretchFactor(i, 0)
        grid.setColumnStretchFactor(g + 1, 1)
        self.plots[g].setLabel("bottom", "channel")
        self.plots[g].setLabel("left", "position")
        self.colorbar = pg.ColorBarItem(
            values=(0, 1), colorMap=qt_colormap(self.cmap), interactive=False, width=12, label="weight"
        )
        self.glw.addItem(self.colorbar, row=0, col=g)
        self.hatches = []
        for p in self.plots[:g]:  # masked cells are NaN (transparent): this hatch behind shows
            bg = QGraphicsRectItem(0, 0, 1, 1)
            brush = pg.mkBrush(MASK_HATCH)
            brush.setStyle(Qt.BrushStyle.BDiagPattern)
            bg.setBrush(brush)
            bg.setPen(pg.mkPen(None))
            bg.setZValue(-10)
            p.addItem(bg)
            self.hatches.append(bg)
        self._fit_columns()
        # no X/Y links between the maps: linked views that each lock their aspect push each other's
        # ranges outwards (a 29 x 29 map drawn in a -200..400 view); each map gets the same range

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 (Qt's name)
        if obj is self.glw and event.type() == QEvent.Type.Resize:
            self._fit_columns(event.size())  # (the viewport is resized after this event)
        return False

    def _fit_columns(self, size: QSize | None = None) -> None:
        """Give each small map the largest square the plot row allows: ``side`` = the smaller of the
        row's height (less the title and key axis) and its width shared by the ``g`` maps after the
        query axis, the colour bar and :attr:`KEYS_MIN_PX` for the keys plot, which takes the rest."""
        g = len(self.plots) - 1
        if g < 1:
            return
        grid = self.glw.ci.layout
        left, top, right, bottom = grid.getContentsMargins()
        gap = grid.horizontalSpacing()
        frame = 2 * self.glw.frameWidth()
        slack = 12  # what the grid's own rounding and the plots' borders take
        size = size if size is not None else self.glw.size()
        width = size.width() - frame - left - right - gap * (g + 1) - slack
        height = size.height() - frame - top - bottom
        p0 = self.plots[0]
        axis = self.query_axis_px
        bar = self.colorbar.preferredWidth() + 4
        room = 6  # the plot's own margins around its view box (and as much again above and below)
        v_over = p0.titleLabel.preferredHeight() + p0.getAxis("bottom").preferredHeight() + 2 * room
        keys = max(self.KEYS_MIN_PX, self.plots[g].effectiveSizeHint(Qt.SizeHint.MinimumSize).width())
        side = min((width - axis - bar - keys) / g - room, height - v_over)
        side = max(side, 8.0)
        # below MAP_MIN_PX a side, the tab page scrolls (the view's minimum height) rather than shrink them
        self.glw.setMinimumHeight(int(self.MAP_MIN_PX + v_over + top + bottom + frame))
        for i in range(g):
            grid.setColumnFixedWidth(i, side + room + (axis if i == 0 else 0))
        grid.setColumnFixedWidth(g, bar)

    def _draw_maps(self) -> None:
        r = self.report
        if r is None or not self.images:
            return
        g = len(r.heads)
        hi = 1.0 if self.range_combo.currentIndex() == 0 else r.auto_max
        hi = hi if hi > LOG_FLOOR else 1.0
        # the heatmap's default: chosen from the group's maps (log over [1e-6, hi] where linear is flat)
        self.scale = self.choice.scale if self.choice is not None else default_colour_scale(r.n)
        cmap = qt_colormap(self.cmap)
        self.colorbar.setColorMap(cmap)
        self.colorbar.setLevels((0.0, 1.0))  # the images hold normalised values
        self.colorbar.axis.setTicks([colorbar_ticks(0.0, hi, self.scale), []])
        P = r.maps.shape[-1]
        masked = masked_blocks(r.n, P, self.sliding_window)
        for i, h in enumerate(r.heads):
            img = normalize(r.maps[i], 0.0, hi, self.scale).astype(np.float32)
            img[masked] = np.nan  # transparent: the hatch behind, not the colour of weight 0
            self.images[i].setImage(img, autoLevels=False, levels=(0.0, 1.0))
            self.images[i].setColorMap(cmap)
            self.images[i].setRect(0, 0, r.n, r.n)
            show_nonfinite(self.nonfinite[i], r.maps[i], masked)  # never transparent (= masked)
            self.nonfinite[i].setRect(0, 0, r.n, r.n)
            self.hatches[i].setRect(0, 0, r.n, r.n)
            sel = h == self.state.head
            # a title no wider than the smallest map: its text sets the plot's minimum width
            self.plots[i].setTitle(
                f"q{h}" + (" selected" if sel else ""), color="#c01818" if sel else "k", size="9pt"
            )
        ticks = [[(float(t), str(t)) for t in _sparse_ticks(r.n)]]
        for p in self.plots[:g]:  # aspect locked: the view fits the map's square on its tighter side
            p.setRange(xRange=(0, r.n), yRange=(0, r.n), padding=0.02)
            for ax in ("bottom", "left"):  # at most 3 labels: a small map's never run together
                p.getAxis(ax).setTicks(ticks)
        # the query axis as wide as its longest label (and its title), fixed: _fit_columns counts it
        # before pyqtgraph measures it at the first paint
        axis = self.plots[0].getAxis("left")
        fm = QFontMetrics(axis.style["tickFont"] or self.font())
        widest = max(fm.horizontalAdvance(label) for _t, label in ticks[0])
        self.query_axis_px = widest + 34
        axis.setWidth(self.query_axis_px)
        self._fit_columns()
        del P
        k = self.images[g]
        k.setImage(r.keys, autoLevels=False, levels=(-r.keys_absmax, r.keys_absmax))
        k.setColorMap(cmap)
        k.setRect(0, 0, r.keys.shape[1], r.n)
        # a short title (a title's text sets its plot's minimum width, and a long axis label overflows it)
        self.plots[g].setTitle(f"KV {r.kv_head} keys ±{r.keys_absmax:.2g}", color="k", size="9pt")
        self.plots[g].setToolTip(
            f"KV head {r.kv_head}: its cached keys (post-RoPE), position × head_dim channel; "
            f"colours −{r.keys_absmax:.2g} … +{r.keys_absmax:.2g}"
        )
        self.plots[g].setRange(xRange=(0, r.keys.shape[1]), yRange=(0, r.n), padding=0.02)

    def _fill_pairs(self, r) -> None:
        t = self.pair_table
        names = [f"q{h}" for h in r.heads]
        t.setRowCount(len(names))
        t.setColumnCount(len(names))
        t.setHorizontalHeaderLabels(names)
        t.setVerticalHeaderLabels(names)
        for i, a in enumerate(r.heads):
            for j, b in enumerate(r.heads):
                v = float(r.distances[a, b])
                item = QTableWidgetItem(f"{v:.3f}")
                item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                item.setBackground(_shade(v))
                item.setFlags(Qt.ItemFlag.ItemIsEnabled)
                t.setItem(i, j, item)
        t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        vh = t.verticalHeader()
        vh.setMinimumSectionSize(t.fontMetrics().height() + 4)  # compact rows: a 650 px window shows all
        vh.setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        # tall enough for every row (up to 8) at the header's smallest row height: the splitter
        # shrinks the maps before it cuts the table
        shown = min(len(names), 8)
        t.setMinimumHeight(
            t.horizontalHeader().sizeHint().height()
            + shown * vh.minimumSectionSize()
            + 2 * t.frameWidth()
            + 2
        )
        # ... and wide enough for every number ("0.000") and header whole, never elided to "0...."
        fm = t.fontMetrics()
        column = max(fm.horizontalAdvance(s) for s in ["0.000", *names]) + 14
        t.setFixedWidth(vh.sizeHint().width() + len(names) * column + 2 * t.frameWidth() + 2)
        rows = (
            f"all {r.rows_used} query rows after row 0"
            if r.rows_used == r.n - 1
            else f"the last {r.rows_used} of {r.n - 1} query rows"
        )
        # one line in the narrow column of a 1000 px window; what it averages in the tooltip
        self.pair_title.setText("<b>JS distance</b> (base 2)")
        self.pair_title.setToolTip(
            f"Jensen–Shannon distance between the group's heads: sqrt(JSD) in bits, mean over {rows}"
        )

    def _fill_layer(self, r, info) -> None:
        t = self.layer_table_widget
        g = info.group_size
        t.setColumnCount(2)
        t.setHorizontalHeaderLabels(["heads", "mean JS"])
        rows = []
        for k in range(info.n_kv_heads):
            rows.append(
                (f"within KV group {k}", f"q{k * g}–q{(k + 1) * g - 1}", float(r.within[k]), k == r.kv_head)
            )
        rows.append(("within groups (all)", "", r.within_mean, False))
        rows.append(("across groups", "", r.across_mean, False))
        t.setRowCount(len(rows))
        t.setVerticalHeaderLabels([x[0] for x in rows])
        for i, (_name, heads, v, sel) in enumerate(rows):
            a = QTableWidgetItem(heads)
            b = QTableWidgetItem("—" if not np.isfinite(v) else f"{v:.3f}")
            b.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
            b.setBackground(_shade(v))
            for it in (a, b):
                it.setFlags(Qt.ItemFlag.ItemIsEnabled)
                if sel:
                    f = it.font()
                    f.setBold(True)
                    it.setFont(f)
            t.setItem(i, 0, a)
            t.setItem(i, 1, b)
        t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        ratio = (
            r.within_mean / r.across_mean if r.across_mean and np.isfinite(r.across_mean) else float("nan")
        )
        self.layer_title.setText(f"<b>Layer {r.layer}</b>: within/across = {ratio:.2f}")
        self.layer_title.setToolTip(
            f"Layer {r.layer}: mean JS distance within each KV group vs across groups; "
            f"within/across = {ratio:.2f} (below 1: a group's heads are more alike than heads of different groups)"
        )

    def _draw_layers_plot(self) -> None:
        p = self.layers_plot
        p.clear()
        if self.layers is None:
            return
        _n, (within, across, rows_used) = self.layers
        # a hybrid model's layers with no map are NaN (attnscope.core.trace.base): the attention layers'
        # points only, at their real indices
        x = np.flatnonzero(np.isfinite(within))
        n_all = len(within)
        within, across = np.asarray(within)[x], np.asarray(across)[x]
        p.plot(
            x,
            within,
            pen=pg.mkPen((59, 82, 139), width=2),
            symbol="o",
            symbolSize=5,
            symbolBrush=(59, 82, 139),
            name="within a KV group",
        )
        p.plot(
            x,
            across,
            pen=pg.mkPen((230, 120, 20), width=2),
            symbol="s",
            symbolSize=5,
            symbolBrush=(230, 120, 20),
            name="across groups",
        )
        if self.report is not None:
            p.addItem(
                pg.InfiniteLine(self.report.layer, angle=90, pen=pg.mkPen((200, 30, 30), style=Qt.DashLine))
            )
        # one line in a 1000 px window (the legend in words); the rest in the tooltip
        self.layers_title.setText(
            "<b>Every layer</b>: <span style='color:#3b528b'>● within</span> vs "
            "<span style='color:#e67814'>■ across groups</span>"
        )
        self.layers_title.setToolTip(
            f"Mean JS distance over {rows_used} query rows each, within a KV group vs across groups; "
            "dashed: this layer" + (f"; the {len(x)} attention layers of {n_all}" if len(x) != n_all else "")
        )

    # -- interaction -------------------------------------------------------------------------------
    def _plot_at(self, pos):
        for i, p in enumerate(self.plots[:-1]):
            if p.sceneBoundingRect().contains(pos):
                return i, p
        return None, None

    def _on_click(self, ev) -> None:
        i, _p = self._plot_at(ev.scenePos())
        if i is not None and self.report is not None:
            self.state.select(self.report.layer, self.report.heads[i])

    def _on_mouse(self, pos) -> None:
        i, p = self._plot_at(pos)
        r = self.report
        if i is None or r is None:
            return
        pt = p.getViewBox().mapSceneToView(pos)
        q, k = int(np.floor(pt.y())), int(np.floor(pt.x()))
        if 0 <= q < r.n and 0 <= k < r.n:
            edges = block_edges(r.n, r.maps.shape[-1])
            a = int(np.searchsorted(edges, q, side="right") - 1)
            b = int(np.searchsorted(edges, k, side="right") - 1)
            v = float(r.maps[i, a, b])
            what = "block max ≤" if r.pooled else "weight"
            self.readout.setText(
                f"q{r.heads[i]}: query #{q} → key #{k}: {what} {v:.4f}   (click to select this head)"
            )
