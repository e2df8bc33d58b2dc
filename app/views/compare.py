"""Compare tab: run B next to the window's run A, head by head (:mod:`attnscope.core.analysis.compare_runs`).

Run A is the window's session as it is (prompt + decode steps). Run B is chosen here: another
model sharing the tokenizer, the same model at another precision, on the other backend, or on an
edited prompt. B is loaded and run where A's model is, from the engine thread (a second session
held next to A by :mod:`attnscope.core.analysis.compare_run_b`: in this process, or on the remote
engine the window is connected to; never on the GUI side; the previous B is dropped first), then
fed A's generated tokens, so a decode lines up too. A's per-position logits are kept by re-running A's sequence once when the window's
prefill did not keep them (same ops, same numbers).

The panel draws only: the layers × heads table of Jensen–Shannon distances (sortable, most
changed first), the logits' KL(A‖B) and top-1 agreement per position, and for the selected head
A, B and A − B side by side (A − B on a diverging map centred on 0 with a symmetric range). Maps longer than :data:`MAX_CELLS`
are shown like the heatmap's long maps: an overview (A and B max-pooled, A − B by the signed
max-|A − B| per block, :mod:`attnscope.core.analysis.compare_overview`, so a changed sink column or diagonal survives), and
on zoom an exact tile of all three for the visible region, computed on the engine thread from both
runs' exact weights; the three views are linked. Hover reads both weights; a click on a row plots
A's and B's rows as lines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyqtgraph as pg
from attnscope.app.engine import Request
from attnscope.app.heatmap import NONFINITE_LEGEND_HTML, show_nonfinite
from attnscope.app.tabs import PageLayout
from attnscope.app.views.saved_controls import SavedControls
from attnscope.app.views.sinks import style_plot
from attnscope.core import backend_registry as registry
from attnscope.core.io.colormaps import lut as colormap_lut
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

if TYPE_CHECKING:
    from attnscope.core.analysis.compare_overview import PairOverview
    from attnscope.core.analysis.compare_runs import CompareResult

KINDS = {
    "model": "Another model (same tokenizer)",
    "dtype": "Same model, another precision",
    "backend": "Same model, other backend",
    "prompt": "Same model, edited prompt",
}
DTYPES = ("float32", "bfloat16", "float16")
MAX_CELLS = (
    512  # maps longer than this show a pooled overview (this many blocks a side) + exact tiles on zoom
)
COLUMNS = ("Rank", "Layer", "Head", "JS mean", "JS max", "Max at row")
HOVER_HINT = "Hover a map to read A's and B's weights; click a row to plot both rows."
ROW_HINT = "Click a row of a map to plot A's and B's rows"


def run_a_key(snap, session, ids=None) -> tuple | None:
    """What makes run A the run a comparison was made of: the session object (B is held for it, and a
    new load replaces it), its model info (name, dtype, quantisation…), backend, device, chat-template
    setting and token ids (``ids``: these instead of the snapshot's). None without a snapshot."""
    if snap is None:
        return None
    ids = tuple(t.id for t in snap.tokens) if ids is None else tuple(ids)
    return (id(session), snap.info, snap.backend, snap.device, snap.chat_template, ids)


@dataclass(frozen=True)
class RunBSpec:
    """What run B is: every field None = A's."""

    kind: str
    model: str | None
    backend: str
    dtype: str
    prompt: str
    weighting: str = "attention"


def _run_b_job(spec: RunBSpec):
    def job(ctx):
        from attnscope.core.analysis.compare_run_b import kept_all_logits, run_b
        from attnscope.core.errors import SessionError

        sa = ctx.session
        if sa is None or sa.seq_len == 0:
            raise SessionError("run a prompt first: run A is the window's sequence")
        if not kept_all_logits(sa):  # the window's prefill kept only the last logits: replay A once
            ctx.progress("Re-running A to keep every position's logits…", 0.02)
            gen = sa.ids[sa.n_prompt :]
            sa.prefill(sa.prompt, chat_template=sa.chat_template, all_logits=True, cancelled=ctx.cancelled)
            if gen:
                sa.feed(gen, cancelled=ctx.cancelled)
        # B is loaded, run and compared where A's model is: here, or on the remote engine
        res, labels_a, labels_b = run_b(
            sa,
            spec.kind,
            spec.model,
            spec.backend,
            spec.dtype,
            spec.prompt,
            spec.weighting,
            progress=ctx.progress,
            cancelled=ctx.cancelled,
        )
        return res, (list(labels_a), list(labels_b))

    return job


def _maps_job(layer: int, head: int, n: int, weighting: str):
    """A's and B's maps of one head over the aligned ``n × n``. Up to :data:`MAX_CELLS` the exact maps
    (payload ``(key, wa, wb, None)``); longer, the overview :class:`attnscope.core.analysis.compare_overview.PairOverview`
    (payload ``(key, a, b, overview)``), computed in row bands: never a whole long map on either side."""

    def job(ctx):
        # computed where both runs are: here, or on the remote engine (attnscope.core.analysis.compare_run_b)
        from attnscope.core.analysis.compare_run_b import b_maps, b_overview
        from attnscope.core.errors import Cancelled, SessionError

        if ctx.session is None:
            raise SessionError("run B first")
        if n > MAX_CELLS:
            ov = b_overview(ctx.session, layer, head, n, MAX_CELLS, weighting, cancelled=ctx.cancelled)
            return (layer, head), ov.a, ov.b, ov
        band = max(1, (1 << 22) // n)  # rows per band: about 4M cells of each map at a time
        pa, pb = [], []
        for r0 in range(0, n, band):
            if ctx.cancelled():
                raise Cancelled("cancelled")
            wa, wb = b_maps(
                ctx.session, layer, head, n, rows=slice(r0, min(r0 + band, n)), weighting=weighting
            )
            pa.append(np.asarray(wa, np.float32))
            pb.append(np.asarray(wb, np.float32))
        return (layer, head), np.concatenate(pa), np.concatenate(pb), None

    return job


def _tile_job(layer: int, head: int, n: int, r0: int, r1: int, c0: int, c1: int, weighting: str):
    """The exact ``rows r0:r1 × cols c0:c1`` tile of A and B (engine thread, both runs' weights)."""

    def job(ctx):
        from attnscope.core.analysis.compare_run_b import b_maps
        from attnscope.core.errors import SessionError

        if ctx.session is None:
            raise SessionError("run B first")
        wa, wb = b_maps(
            ctx.session, layer, head, n, rows=slice(r0, r1), cols=slice(c0, c1), weighting=weighting
        )
        return (layer, head), n, r0, c0, wa, wb

    return job


def _row_job(layer: int, head: int, row: int, n: int, weighting: str):
    def job(ctx):
        from attnscope.core.analysis.compare_run_b import b_maps

        wa, wb = b_maps(ctx.session, layer, head, n, rows=slice(row, row + 1), weighting=weighting)
        return row, wa[0], wb[0]

    return job


def diverging_lut() -> np.ndarray:
    """``(256, 3)`` uint8 blue–white–red (colorcet CET-D1, through pyqtgraph): 0 is the middle entry."""
    return pg.colormap.get("CET-D1").getLookupTable(nPts=256).astype(np.uint8)[:, :3]


class _NumItem(QTableWidgetItem):
    """A table cell that sorts by its number, not its text; equal numbers by ``tie`` (minus the
    rank: sorted high to low, tied heads keep their rank order)."""

    def __init__(self, value: float, text: str, tie: float = 0.0):
        super().__init__(text)
        self.setData(Qt.ItemDataRole.UserRole, float(value))
        self.setData(Qt.ItemDataRole.UserRole + 1, float(tie))
        self.setFlags(Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsEnabled)
        self.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)

    def __lt__(self, other):
        a, b = self.data(Qt.ItemDataRole.UserRole), other.data(Qt.ItemDataRole.UserRole)
        if a is None or b is None:
            return super().__lt__(other)
        return (a, self.data(Qt.ItemDataRole.UserRole + 1)) < (b, other.data(Qt.ItemDataRole.UserRole + 1))


class CompareView(QWidget, SavedControls):
    """The Compare tab, built with the :class:`attnscope.app.state.ViewState` (run A is its sequence)
    and the :class:`attnscope.app.engine.Engine`."""

    # saved in session files (B's prompt too: docs/tabs/compare.md)
    STATE_CONTROLS = ("kind_combo", "dtype_combo", "backend_combo", "weighting_combo", "prompt_edit")

    def __init__(self, state, engine, parent: QWidget | None = None):
        super().__init__(parent)
        self.state, self.engine = state, engine
        state.events.snapshot.connect(self.on_snapshot)
        state.events.selection.connect(lambda sel: self.on_selection(*sel))
        self.result: CompareResult | None = None
        self.labels: tuple[list[str], list[str]] = ([], [])
        self.maps: tuple[np.ndarray, np.ndarray] | None = None
        self.map_key: tuple[int, int] | None = None
        self.pool = 1
        self.overview: PairOverview | None = None  # of a long head
        self.tile: tuple[np.ndarray, np.ndarray, int, int] | None = (
            None  # the exact tile drawn over the overview
        )
        self._levels = ((0.0, 1.0), (-1.0, 1.0))
        self._titles = ("", "", "")
        # Every map, tile and row request carries the generation it was made for (Request.key): a new
        # comparison, Run B & compare and run A going out of date each bump it, so nothing computed for
        # an older comparison is ever drawn over a newer one.
        self._gen = 0
        self._a_key: tuple | None = None  # run A as compared (run_a_key)
        self._reloaded = False  # a model load since the comparison: its B is gone for good
        self.stale: str | None = None  # why the comparison shown no longer matches run A (None: it does)
        self._summary_text = ""
        # A's and B's maps follow the window's Colours combo (A − B stays diverging)
        self.cmap = state.colormap
        state.events.colour.connect(lambda spec: self.set_colormap(spec.cmap))
        state.events.loaded.connect(lambda _snap: self.on_model_loaded())

        # -- run B controls
        top = QHBoxLayout()
        top.addWidget(QLabel("Run B"))
        self.kind_combo = QComboBox()
        for k, text in KINDS.items():
            self.kind_combo.addItem(text, k)
        top.addWidget(self.kind_combo)
        self.model_edit = QLineEdit()
        self.model_edit.setPlaceholderText("model folder or .gguf sharing A's tokenizer")
        top.addWidget(self.model_edit, 2)
        self.browse_button = QPushButton("Browse…")
        self.browse_button.setToolTip("Pick run B's model from the local models")
        top.addWidget(self.browse_button)
        self.dtype_combo = QComboBox()
        self.dtype_combo.addItems(DTYPES)
        self.dtype_combo.setToolTip("Run B's precision")
        top.addWidget(self.dtype_combo)
        self.backend_combo = QComboBox()
        self.backend_combo.addItems(registry.names())
        self.backend_combo.setToolTip("Run B's backend")
        top.addWidget(self.backend_combo)
        # what is compared and the Run button end the prompt row: one row of all of it is wider than
        # the tab in a 1000 px window (the page scrolled sideways, cutting the alignment line)
        prow = QHBoxLayout()
        prow.addWidget(QLabel("B's prompt"))
        self.prompt_edit = QLineEdit()
        self.prompt_edit.setPlaceholderText("run B's prompt (defaults to A's)")
        prow.addWidget(self.prompt_edit, 1)
        prow.addWidget(QLabel("Compare"))
        self.weighting_combo = QComboBox()
        self.weighting_combo.addItem("attention weights", "attention")
        self.weighting_combo.addItem("value-weighted", "value-weighted")
        self.weighting_combo.setToolTip(
            "Weights α, or the row-normalised value-weighted maps α_ij‖v_j W_O^h‖ (Kobayashi et al. 2020)"
        )
        prow.addWidget(self.weighting_combo)
        self.run_button = QPushButton("Run B && compare")
        self.run_button.setToolTip(
            "Load and run B on the engine thread, then compare every head (Esc cancels)"
        )
        prow.addWidget(self.run_button)
        self.export_table_button = QPushButton("Export table…")
        self.export_table_button.setToolTip(
            "The ranked heads table and the logits as CSV or JSON, naming both runs"
        )
        self.export_maps_button = QPushButton("Export maps…")
        self.export_maps_button.setToolTip(
            "A, B and A − B of the selected head as PNG/SVG/PDF + a JSON sidecar"
        )
        prow.addWidget(self.export_table_button)
        prow.addWidget(self.export_maps_button)

        self.summary = QLabel("Run a prompt (run A), choose run B, then press Run B & compare.")
        self.summary.setStyleSheet("color:#335;")
        # word-wrapped, so no line is cut at any width (its PageLayout fills the tab page: no scrolling)
        self.summary.setWordWrap(True)
        self.summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Minimum)
        self.summary.setMinimumHeight(2 * self.summary.fontMetrics().lineSpacing() + 4)

        # -- table
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(20)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.setSortingEnabled(True)
        self._fit_table_width()
        self.table.setToolTip(
            "Jensen–Shannon distance (base 2) between A's and B's rows, over the aligned "
            "query rows 1..n-1. Click a head to see its maps; click a header to sort."
        )

        # -- maps: A, B, A − B
        self.maps_widget = pg.GraphicsLayoutWidget()
        self.maps_widget.setBackground("w")
        self.plots, self.images, self.tile_images = [], [], []
        # NaN/inf cells of each map and tile, magenta over them as in every view and output
        # (attnscope.app.heatmap.show_nonfinite): a lookup table would draw them as a weight
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
        self._tile_timer = QTimer(self)
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
        self.hover.setSizePolicy(
            QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred
        )  # a long readout never widens the tab
        self.maps_widget.scene().sigMouseMoved.connect(self._on_hover)
        self.maps_widget.scene().sigMouseClicked.connect(self._on_click)

        # -- plots: rows, logits
        self.row_plot = pg.PlotWidget(background="w")
        style_plot(self.row_plot)
        rp = self.row_plot.getPlotItem()
        rp.setTitle(ROW_HINT, color="#222", size="9pt")
        rp.setLabel("bottom", "key position")
        rp.setLabel("left", "weight")
        # no "(x0.001)" SI suffix: it made the label longer than the plot is high (clipped, and a stray
        # ")" stayed painted after the next comparison); the tick labels carry the scale
        rp.getAxis("left").enableAutoSIPrefix(False)
        self.row_a = rp.plot([], [], pen=pg.mkPen("#3b6fb6", width=2), name="A")
        self.row_b = rp.plot([], [], pen=pg.mkPen("#d0702a", width=2, style=Qt.PenStyle.DashLine), name="B")
        self.logit_plot = pg.PlotWidget(background="w")
        style_plot(self.logit_plot)
        lp = self.logit_plot.getPlotItem()
        lp.setLabel("bottom", "position")
        lp.setLabel("left", "KL, bits")  # short: the title says KL(A‖B)
        lp.getAxis("left").enableAutoSIPrefix(False)
        # no legend: in a plot this narrow it covered the curve; the title says what the marks are
        lp.setTitle("KL(A‖B) of the logits per position · × top-1 differs", color="#222", size="9pt")
        self.kl_curve = lp.plot(
            [],
            [],
            pen=pg.mkPen("#3b6fb6", width=1.5),
            symbol="o",
            symbolSize=4,
            symbolBrush="#3b6fb6",
            symbolPen=None,
            name="KL(A‖B)",
        )
        self.disagree = lp.plot(
            [],
            [],
            pen=None,
            symbol="x",
            symbolSize=9,
            symbolBrush="#b02a2a",
            symbolPen=pg.mkPen("#b02a2a"),
            name="top-1 differs",
        )

        for w, h in (
            (self.maps_widget, 160),
            (self.row_plot, 110),
            (self.logit_plot, 110),
            (self.table, 120),
        ):
            w.setMinimumHeight(h)
        left = QSplitter(Qt.Orientation.Vertical)  # table over the logits
        left.addWidget(self.table)
        left.addWidget(self.logit_plot)
        left.setSizes([380, 200])
        right = QSplitter(Qt.Orientation.Vertical)  # maps over the clicked rows
        mapbox = QWidget()
        ml = QVBoxLayout(mapbox)
        ml.setContentsMargins(0, 0, 0, 0)
        ml.addWidget(self.maps_widget, 1)
        self.map_legend = QLabel("")  # names the NaN/inf cells when a map has any
        self.map_legend.setWordWrap(True)
        self.map_legend.hide()
        ml.addWidget(self.map_legend)
        ml.addWidget(self.hover)
        right.addWidget(mapbox)
        right.addWidget(self.row_plot)
        right.setSizes([400, 180])
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(1, 3)
        split.setSizes([380, 1000])

        lay = PageLayout(self)  # fills the tab page; wrapped labels never make it scroll
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(top)
        lay.addLayout(prow)
        lay.addWidget(self.summary)
        lay.addWidget(split, 1)

        self.kind_combo.currentIndexChanged.connect(self._on_kind)
        self.browse_button.clicked.connect(self._browse)
        self.run_button.clicked.connect(self.run_b)
        self.table.itemSelectionChanged.connect(self._on_table_selection)
        self.export_table_button.clicked.connect(self._export_table_dialog)
        self.export_maps_button.clicked.connect(self._export_maps_dialog)
        self._on_kind()

    # -- state ------------------------------------------------------------------------------------
    def on_snapshot(self, snap) -> None:
        # every command that changes run A (Run, step, step back, a reopened session, another model,
        # a failed load) ends in a new snapshot: check the comparison shown against it first
        self.check_current()
        if snap is None:
            return
        if not self.prompt_edit.text() or self.kind_combo.currentData() != "prompt":
            self.prompt_edit.setText(snap.prompt or "")
        self._on_kind()

    def on_selection(self, layer: int, head: int) -> None:
        if self.result is not None and (layer, head) != self.map_key:
            self.request_maps(layer, head)

    # -- is the comparison still of run A? ---------------------------------------------------------
    def on_model_loaded(self) -> None:
        """A model was loaded (another one, the same one again, a reopened session on another model, a
        connection): B went with the old model (dropped with A's session here; a remote engine drops
        it before it loads), so the comparison shown can never be current again, not even once the
        same prompt has run on the same model (a remote session object outlives the load)."""
        if self.result is not None:
            self._reloaded = True
            self.check_current()

    def why_stale(self) -> str | None:
        """Why the comparison shown is no longer of the window's run A (one phrase), None while it is."""
        if self.result is None or self._a_key is None:
            return None
        snap = self.state.snapshot
        now = run_a_key(snap, self.engine.session)
        old = self._a_key
        if now == old and not self._reloaded:
            return None
        if snap is None or now is None:  # (run_a_key is None exactly without a snapshot)
            return "no model is loaded any more"
        if self._reloaded or now[:4] != old[:4]:
            i = snap.info
            return (
                f"run A was reloaded ({i.name} · {i.dtype} · {snap.backend}), and run B went with the old one"
            )
        if now[4] != old[4]:
            return "run A's chat-template setting changed"
        n_old, n_new = len(old[5]), snap.seq_len
        return f"run A's sequence changed ({n_old} tokens compared, {n_new} now)"

    def check_current(self) -> None:
        """Mark the comparison out of date when run A changed under it (or current again when A is back
        to the compared sequence, e.g. a step back and the same greedy step): an out-of-date table is
        greyed, its maps, row plot and hover line are cleared, and no map is computed from it."""
        why = self.why_stale()
        if why == self.stale:
            return
        self.stale = why
        self._gen += 1
        self.clear_maps()
        if why is None:
            self.table.setEnabled(True)
            self.summary.setStyleSheet("color:#335;")
            self.summary.setText(self._summary_text)
            self._on_table_selection()
        else:
            self.table.setEnabled(False)
            self.summary.setStyleSheet("color:#a02020;")
            self.summary.setText(
                f"Out of date: {why}. Press Run B & compare again.\n"
                f"The greyed table is the old comparison's ({(self._summary_text.splitlines() or [''])[0]})"
            )
            self.hover.setText("Out of date: run A changed since this comparison; no maps are drawn from it.")
        self.summary.setToolTip(self.summary.text())

    def clear_maps(self, titles: tuple[str, str, str] = ("A", "B", "A − B")) -> None:
        """Empty the three maps, the tiles, the row plot and the hover line (nothing selected)."""
        self.maps, self.map_key, self.overview, self.tile, self.pool = None, None, None, None, 1
        for img in (*self.images, *self.tile_images, *self.nonfinite_images, *self.tile_nonfinite):
            img.clear()
        self.map_legend.hide()
        self._titles = titles
        for p, t in zip(self.plots, titles, strict=True):
            p.setTitle(t, color="#222")
        self.row_a.setData([], [])
        self.row_b.setData([], [])
        self.row_plot.getPlotItem().setTitle(ROW_HINT, color="#222", size="9pt")
        self.hover.setText(HOVER_HINT)
        self.bar.setLevels((-1.0, 1.0))
        self.row_plot.getPlotItem().enableAutoRange()

    def _clear_result(self) -> None:
        """No comparison shown: empty table and logits, cleared maps (B is about to be replaced)."""
        self.result, self._a_key, self.stale, self._reloaded = None, None, None, False
        self._gen += 1
        self.table.setRowCount(0)
        self.table.setEnabled(True)
        self.kl_curve.setData([], [])
        self.disagree.setData([], [])
        self.logit_plot.getPlotItem().enableAutoRange()
        self.clear_maps()

    def refresh(self) -> None:
        pass

    # -- run B --------------------------------------------------------------------------------------
    def _on_kind(self, *_):
        kind = self.kind_combo.currentData()
        snap = self.state.snapshot
        self.model_edit.setEnabled(kind == "model")
        self.browse_button.setEnabled(kind == "model")
        self.dtype_combo.setEnabled(kind in ("model", "dtype"))
        self.backend_combo.setEnabled(kind in ("model", "backend"))
        self.prompt_edit.setEnabled(kind == "prompt")
        if snap is not None:
            a_backend = snap.backend
            if kind != "backend" and kind != "model":
                self.backend_combo.setCurrentText(a_backend)
            elif kind == "backend":
                self.backend_combo.setCurrentText(
                    next((n for n in registry.names() if n != a_backend), a_backend)
                )
            if kind in ("backend", "prompt"):
                self.dtype_combo.setCurrentText(snap.info.dtype if snap.info.dtype in DTYPES else "float32")
            if kind != "prompt":
                self.prompt_edit.setText(snap.prompt or "")

    def _browse(self) -> None:
        from attnscope.app import remote_picker
        from attnscope.app.model_picker import ModelPickerDialog

        session = self.engine.session
        remote = remote_picker.is_remote(session)  # B loads on the engine: list the engine's models
        dlg = ModelPickerDialog(self, **(remote_picker.picker_options(session) if remote else {}))
        if remote:
            remote_picker.adapt(dlg, session)
        dlg.modelChosen.connect(self.model_edit.setText)
        dlg.exec()

    def spec(self) -> RunBSpec:
        """Run B as the controls say (defaults from A)."""
        snap = self.state.snapshot
        kind = self.kind_combo.currentData()
        prompt = self.prompt_edit.text() if kind == "prompt" else (snap.prompt if snap is not None else "")
        return RunBSpec(
            kind=kind,
            model=self.model_edit.text().strip() or None,
            backend=self.backend_combo.currentText(),
            dtype=self.dtype_combo.currentText(),
            prompt=prompt or "",
            weighting=self.weighting_combo.currentData(),
        )

    def run_b(self) -> int | None:
        """Submit run B + the comparison to the engine thread. Returns the job id (None when refused)."""
        snap = self.state.snapshot
        if snap is None or snap.seq_len == 0:
            self.summary.setText("Run a prompt first: run A is the window's sequence.")
            return None
        spec = self.spec()
        if spec.kind == "model" and not spec.model:
            self.summary.setText("Choose run B's model (a folder or .gguf sharing A's tokenizer).")
            return None
        if not spec.prompt.strip():
            self.summary.setText("Run B's prompt is empty: type some text.")
            return None
        self._clear_result()  # the job drops the B held so far first: the comparison shown goes with it
        self.summary.setStyleSheet("color:#335;")
        self.summary.setText("Running B and comparing every head…")
        self.run_button.setEnabled(False)
        return self.engine.enqueue(_run_b_job(spec), self.set_result, self._on_failed, label="compare")

    def _on_failed(self, message: str) -> None:
        self.run_button.setEnabled(True)
        self.summary.setText(f"Compare stopped: {message}")
        self.state.say(f"Compare: {message}", 8000)

    def set_result(self, payload) -> None:
        """Show a :class:`attnscope.core.analysis.compare_runs.CompareResult` (GUI thread)."""
        res, labels = payload
        self.run_button.setEnabled(True)
        self._clear_result()  # the maps, row plot and hover line of the previous comparison go
        a, b, al = res.run_a, res.run_b, res.alignment
        if res.nothing_to_compare() is not None:  # all zero by construction: not a result to show
            k = res.same_by_construction()
            self.summary.setStyleSheet("color:#a02020;")
            self.summary.setText(
                f"Nothing to compare: B's prompt differs from position {k} on ({al.n_a} tokens in A, "
                f"{al.n_b} in B), and a causal model's first {k} positions are the same in both runs.\n"
                f"Only positions ≥ {k} can differ, and there the sequences do not line up. To compare "
                "the positions after an edit, keep the token count (swap a word for one of as many tokens)."
            )
            self.summary.setToolTip(res.nothing_to_compare())
            self.hover.setText("Nothing to compare: see the line above.")
            return
        self.result, self.labels = res, labels
        self._a_key = run_a_key(self.state.snapshot, self.engine.session, ids=a.ids)
        ranked = res.ranked()
        self.table.blockSignals(True)  # rank 1 is selected and drawn below, once
        self.table.setSortingEnabled(False)
        self.table.setRowCount(len(ranked))
        for i, d in enumerate(ranked):
            tie = -(i + 1)
            cells = (
                _NumItem(i + 1, str(i + 1)),
                _NumItem(d.layer, str(d.layer), tie),
                _NumItem(d.head, str(d.head), tie),
                _NumItem(d.js_mean, f"{d.js_mean:.3g}", tie),
                _NumItem(d.js_max, f"{d.js_max:.3g}", tie),
                _NumItem(d.js_argmax, str(d.js_argmax), tie),
            )
            for c, it in enumerate(cells):
                self.table.setItem(i, c, it)
        self.table.setSortingEnabled(True)
        self._fit_table_width()
        self.table.sortItems(3, Qt.SortOrder.DescendingOrder)
        self.table.clearSelection()
        self.table.selectRow(0)
        self.table.blockSignals(False)
        agree = f"{res.top1_agree.mean():.0%}" if len(res.top1_agree) else "n/a"
        klm = f"{res.kl.mean():.3g}" if len(res.kl) else "n/a"
        k = res.same_by_construction()
        same = f" (rows 0..{k - 1} precede it: equal by construction)" if k else ""
        self._summary_text = (
            f"A: {a.label()} · B: {b.label()} · {al.description}{same}\n"
            f"compared: {res.weighting} · most changed: L{ranked[0].layer} H{ranked[0].head} "
            f"(JS mean {ranked[0].js_mean:.3g}) · logits: mean KL(A‖B) {klm} bits, top-1 agreement {agree}"
        )
        self.summary.setStyleSheet("color:#335;")
        self.summary.setText(self._summary_text)
        self.summary.setToolTip(self.summary.text())
        self._draw_logits()
        self.check_current()  # run A may have changed while B ran
        if self.stale is None:
            self.request_maps(ranked[0].layer, ranked[0].head)  # a new comparison shows its rank-1 head

    def _draw_logits(self) -> None:
        res = self.result
        if res is None:
            return
        x = np.arange(len(res.kl)).astype(float)
        self.kl_curve.setData(x, res.kl)
        bad = ~res.top1_agree
        self.disagree.setData(x[bad], res.kl[bad])

    def _on_table_selection(self) -> None:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        if not rows or self.result is None:
            return
        r = rows[0].row()
        li, hi = self.table.item(r, 1), self.table.item(r, 2)
        if li is None or hi is None:  # (every row has both: set_result)
            return
        layer, head = int(li.data(Qt.ItemDataRole.UserRole)), int(hi.data(Qt.ItemDataRole.UserRole))
        self.request_maps(layer, head)

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
            "compare-maps", _maps_job(layer, head, n, self.result.weighting), self.set_maps, "compare maps"
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
        hi = max(_finite_max(wa), _finite_max(wb), 1e-12)
        m = _finite_max(np.abs(d)) or 1e-12
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
        for p, t in zip(self.plots, self._titles, strict=True):
            p.setTitle(t, color="#222")
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

    def _select_row_of(self, layer: int, head: int) -> None:
        """Select the table row of the head drawn (e.g. picked with the window's layer/head boxes)."""
        for r in range(self.table.rowCount()):
            la, he = self.table.item(r, 1), self.table.item(r, 2)
            if (
                la is not None
                and he is not None
                and (la.data(Qt.ItemDataRole.UserRole), he.data(Qt.ItemDataRole.UserRole)) == (layer, head)
            ):
                first = self.table.item(r, 0)
                if first is not None and not first.isSelected():
                    self.table.blockSignals(True)
                    self.table.selectRow(r)
                    self.table.blockSignals(False)
                return

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
        """Zoomed into a long map (at most :data:`MAX_CELLS` a side visible): ask the engine for the
        exact tile of A and B over the view plus a quarter margin, unless the one drawn covers it."""
        ov = self.overview
        if ov is None or self.map_key is None or self.result is None or self.stale is not None:
            return
        r0, r1, c0, c1 = self.visible_cells()
        if r1 - r0 > MAX_CELLS or c1 - c0 > MAX_CELLS:
            if self.tile is not None:  # zoomed back out: the overview on its own range again
                self.tile = None
                for t in self.tile_images:
                    t.clear()
                self._show_levels(*self._levels)
                for p, t in zip(self.plots, self._titles, strict=True):
                    p.setTitle(t, color="#222")
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
        job = _tile_job(layer, head, ov.n, *want, self.result.weighting)
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
        hi = max(_finite_max(wa), _finite_max(wb), 1e-12)
        m = _finite_max(np.abs(d)) or 1e-12
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
        for p, title in zip(self.plots, names, strict=True):
            p.setTitle(title, color="#222")
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
        self.hover.setText(f"{where}: A {_weight(wa)} · B {_weight(wb)} · A − B {_weight(d, '+')}")

    def _on_click(self, ev) -> None:
        rc = self._cell_at(ev.scenePos())
        if rc is None or self.map_key is None or self.result is None or self.stale is not None:
            return
        row = rc[0]  # view coordinates are token positions, overview or not
        layer, head = self.map_key
        job = _row_job(layer, head, row, self.result.alignment.n, self.result.weighting)
        self._request("compare-row", job, self.set_rows, "compare row")

    def _fit_table_width(self) -> None:
        """The table is at least as wide as its columns (and a vertical scroll bar): its last column
        is never cut off behind a horizontal scroll bar."""
        t, header = self.table, self.table.horizontalHeader()
        cols = sum(max(header.sectionSizeHint(c), t.sizeHintForColumn(c)) for c in range(t.columnCount()))
        t.setMinimumWidth(cols + t.verticalScrollBar().sizeHint().width() + 2 * t.frameWidth() + 2)

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
        top = max(_finite_max(np.asarray(ra[: row + 1])), _finite_max(np.asarray(rb[: row + 1])), 1e-6)
        rp = self.row_plot.getPlotItem()
        rp.setXRange(0, max(row, 1), padding=0.02)
        rp.setYRange(0, top, padding=0.05)
        self.row_plot.getPlotItem().setTitle(
            f"Query row {row}: A (blue) and B (orange, dashed)", color="#222", size="9pt"
        )

    # -- export -------------------------------------------------------------------------------------
    def _export_table_dialog(self) -> None:
        if self.result is None:
            self.summary.setText("Nothing to export yet: run B first.")
            return
        path, _ = QFileDialog.getSaveFileName(
            self, "Export comparison table", "compare.csv", "CSV (*.csv);;JSON (*.json)"
        )
        if path:
            self.export_table(path)

    def export_table(self, path) -> Path:
        """The ranked table as CSV (+ the full JSON as ``<file>.json`` sidecar), or JSON (by suffix).

        Raises:
            ValueError: another suffix, or no comparison yet. OSError: could not write.
        """
        from attnscope.core.io.data_writers import write_compare_csv as write_csv
        from attnscope.core.io.provenance import sidecar_path

        path = Path(path)
        if path.suffix.lower() not in (".csv", ".json"):
            raise ValueError(f"choose a .csv or .json file, not {path.name!r}")
        if self.result is None:
            raise ValueError("nothing to export yet: run B first")
        data = self.result.to_json()
        if path.suffix.lower() == ".json":
            path.write_text(json.dumps(data, indent=1), encoding="utf-8")
        else:
            write_csv(self.result, path)
            sidecar_path(path).write_text(json.dumps(data, indent=1), encoding="utf-8")
        self.state.say(f"Wrote {path}", 6000)
        return path

    def _export_maps_dialog(self) -> None:
        if self.maps is None or self.map_key is None:
            self.summary.setText("Nothing to export yet: run B and select a head first.")
            return
        layer, head = self.map_key
        path, _ = QFileDialog.getSaveFileName(
            self,
            "Export A, B and A − B",
            f"compare_L{layer}_H{head}.png",
            "PNG (*.png);;SVG (*.svg);;PDF (*.pdf)",
        )
        if path:
            self.export_maps(path)

    def export_maps(self, path) -> list[Path]:
        """The three maps as drawn (PNG/SVG/PDF by suffix) and a JSON sidecar naming both runs
        (model, sha256, dtype, backend, prompt, ids), the head, the alignment and the weighting.
        Raises ValueError when no head's maps are shown yet."""
        from attnscope.app.paint import render_widget
        from attnscope.core.io.provenance import sidecar_path, write_json

        res = self.result
        if res is None or self.map_key is None:
            raise ValueError("nothing to export yet: run B and select a head first")
        out = render_widget(self.maps_widget, path, title="AttnScope · Compare")
        layer, head = self.map_key
        d = next(x for x in res.ranked() if (x.layer, x.head) == (layer, head))
        meta = {
            "kind": "compare maps",
            "layer": layer,
            "head": head,
            "weighting": res.weighting,
            "maps": ["A", "B", "A - B"],
            "pooled": self.pool,
            "pooling": (
                None
                if self.overview is None
                else "A, B: block max; A - B: signed max-|A - B| per block"
                + ("; exact tile in view" if self.tile is not None else "")
            ),
            "colormap": self.cmap,
            "diverging": "A - B on CET-D1, symmetric range centred on 0",
            "js_mean": d.js_mean,
            "js_max": d.js_max,
            "alignment": res.alignment.to_json(),
            "run_a": res.run_a.to_json(),
            "run_b": res.run_b.to_json(),
            "image": out.name,
        }
        side = write_json(sidecar_path(out), meta)
        self.state.say(f"Wrote {out} and {side.name}", 6000)
        return [out, side]


def _finite_max(a: np.ndarray) -> float:
    """The largest finite value of ``a`` (0.0 when it has none): a map's colour range, never NaN."""
    a = np.asarray(a, dtype=np.float64)
    ok = np.isfinite(a)
    return float(a[ok].max()) if ok.any() else 0.0


def _weight(v: float, sign: str = "") -> str:
    """A weight as the heatmap's readout writes it (:func:`attnscope.app.heatmap.weight_text`): 4
    decimals from 0.01, 3 significant digits below (``3.21e-05``); ``sign="+"`` signs a difference."""
    v = float(v)
    return f"{v:{sign}.4f}" if v == 0 or abs(v) >= 0.01 else f"{v:{sign}.2e}"


def install_view(window) -> CompareView:
    """Create the Compare tab and register it with ``window.add_view("compare", ...)``."""
    view = CompareView(window.state, window.engine)
    window.add_view("compare", "Compare", view)
    return view
