"""Sinks panel: a layers × heads table of attention-sink scores, and one head's sink mass over time.

The numbers are :class:`attnscope.core.analysis.sinks.SinkReport` (engine thread): the sink score of a head is the
mean over query rows ``i >= 1`` of its weight on token 0, computed for every head from ``q``,
``k_0`` and the LSE rows (linear in the sequence). The panel only draws: cells coloured by score,
sink heads (score >= the threshold shown) flagged with ●, the table at any earlier step of the
decode (the "at seq_len" box), and, for the selected head, the weight each query row puts on
token 0 with its running mean. Double-click (or Enter on) a cell opens that head in the heatmap.

A model with learned sinks (gpt-oss: one logit per query head in the softmax denominator) gets two
more scores, "Learned sink" and "Token 0 + learned sink" (what sink heads are counted by), and the
head's plot draws each row's learned-sink share beside its weight on token 0: the two fixes for a
head with nothing to attend to, side by side. In the value-weighted score the slot moves nothing.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from attnscope.app.engine import Request
from attnscope.app.tabs import PageLayout
from attnscope.app.views.saved_controls import SavedControls
from attnscope.core.analysis.sinks import DEFAULT_THRESHOLD, SinkReport
from attnscope.core.io.colormaps import to_rgb
from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetrics, QPen
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDoubleSpinBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QSpinBox,
    QSplitter,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

METRICS = {
    "sink": "Token 0 (sink score)",
    "sink_set": "Token 0 + delimiters / special tokens",
    "sink_vw": "Token 0, value-weighted (share of ‖output‖)",
}
# offered only for a model with learned sinks (SinkReport.has_learned_sinks)
LEARNED_METRICS = {
    "learned": "Learned sink (softmax slot)",
    "sink_total": "Token 0 + learned sink",
}
LEARNED_COLOUR = "#2a9d5c"
FLAG = "●"


def _report_job(ctx):
    from attnscope.core.analysis.sinks import session_sink_report

    return session_sink_report(ctx.require())


def _vw_job(ctx):
    """Value-weighted share of token 0 per row, ``(L, H, T)`` (:func:`attnscope.core.analysis.value_weighted.value_weighted_sink_rows`)."""
    from attnscope.core.analysis.value_weighted import value_weighted_sink_rows

    s = ctx.require()
    return s.seq_len, value_weighted_sink_rows(s, cancelled=ctx.cancelled)


class WrappedLabel(QLabel):
    """A word-wrapped label whose minimum height is the height its lines need at its width, so the
    layout (and the splitter around it) never gives it fewer lines' room and cuts what is below:
    QLabel's own minimum size counts one line, and a word-wrapped label's height-for-width is not
    asked for inside a :class:`attnscope.app.tabs.PageLayout`."""

    def __init__(self, text: str = ""):
        super().__init__(text)
        self.setWordWrap(True)

    def _fit(self) -> None:
        h = self.heightForWidth(max(1, self.width()))
        if h > 0 and self.minimumHeight() != h:
            self.setMinimumHeight(h)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        super().setText(text)
        self._fit()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._fit()


def style_plot(pw: pg.PlotWidget) -> None:
    """Dark axes, ticks and title on a white plot (pyqtgraph's defaults are for a black background)."""
    pi = pw.getPlotItem()
    for name in ("left", "bottom", "right", "top"):
        ax = pi.getAxis(name)
        ax.setPen(pg.mkPen("#444"))
        ax.setTextPen(pg.mkPen("#222"))
    pi.titleLabel.item.setDefaultTextColor(pg.mkColor("#222"))


TITLE_ROW = 20  # px: a one-line 9 pt plot title (pyqtgraph gives every title 30 px)


def set_short_title(pi: pg.PlotItem, text: str, size: str = "9pt") -> None:
    """Title ``pi`` with one line of ``size`` text in a :data:`TITLE_ROW` px row, not pyqtgraph's 30:
    a plot ~110-160 px tall (a 1000 x 650 window) keeps the 10 px for its curves and ticks."""
    pi.setTitle(text, color="#222", size=size)
    pi.titleLabel.setMaximumHeight(TITLE_ROW)
    pi.layout.setRowFixedHeight(0, TITLE_ROW)


class SpacedTicksAxis(pg.AxisItem):
    """An axis whose labelled ticks are at least :data:`MIN_GAP` labels apart: label heights on a
    vertical axis (in a plot ~40 px tall, Compare's KL and row plots in a 1000 x 650 window, pyqtgraph's
    own spacing put three to six labels on top of each other), the width of a label such as "-0.25" on a
    horizontal one (the heads tab's DLA bars in a narrow tab read "0 0.10.20.3"). A coarser 1-2-5 step
    when no level of pyqtgraph's spacing is that wide."""

    MIN_GAP = 1.6  # label centres this many labels apart: a gap of 0.6 of a label between them
    WIDE_LABEL = "-0.25"  # a horizontal axis's typical label (its width sets the gap)

    def tickSpacing(self, minVal, maxVal, size):  # noqa: N802, N803 (pyqtgraph's names)
        levels = super().tickSpacing(minVal, maxVal, size)
        span = abs(maxVal - minVal)
        if not levels or span == 0 or size <= 0:
            return levels
        metrics = QFontMetrics(self.style["tickFont"] or self.font())
        vertical = self.orientation in ("left", "right")
        label = metrics.height() if vertical else metrics.horizontalAdvance(self.WIDE_LABEL)
        need = self.MIN_GAP * label * span / size  # data units between labels
        wide = [(step, offset) for step, offset in levels if step >= need]
        if wide:
            return wide
        p10 = 10 ** math.floor(math.log10(need))
        return [(next(m * p10 for m in (1, 2, 5, 10) if m * p10 >= need), 0)]


def cell_colours(values: np.ndarray, cmap: str = "viridis") -> tuple[np.ndarray, np.ndarray]:
    """Background RGB ``(..., 3)`` uint8 for scores in [0, 1], and a bool "use white text" mask."""
    rgb = to_rgb(np.atleast_2d(values), cmap)
    lum = 0.2126 * rgb[..., 0] + 0.7152 * rgb[..., 1] + 0.0722 * rgb[..., 2]
    return rgb, lum < 140


class FramedSelectionDelegate(QStyledItemDelegate):
    """Paints cells with their own colour also when selected, and frames the selected cell in red."""

    def paint(self, painter, option, index) -> None:
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        opt = QStyleOptionViewItem(option)
        opt.state &= ~(QStyle.StateFlag.State_Selected | QStyle.StateFlag.State_HasFocus)
        super().paint(painter, opt, index)
        if selected:
            painter.save()
            painter.setPen(QPen(QColor("#e0301e"), 3))
            painter.drawRect(option.rect.adjusted(1, 1, -2, -2))
            painter.restore()


NO_MAP_CELL = QColor(240, 240, 240)  # a hybrid model's layer with no attention map: a grey row, no score


def no_map_lines(info) -> dict[int, str]:
    """``{layer: "layer 2: linear attention, no map"}`` for a hybrid model's layers with no map (empty
    for a model whose layers all have one); ``info``: a ModelInfo."""
    arch = info.arch
    return {i: arch.no_map_line(i) for i in range(arch.n_layers) if not arch.has_map(i)}


def fill_score_table(
    table: QTableWidget,
    values: np.ndarray,
    flags: np.ndarray | None,
    group_size: int,
    cmap: str = "viridis",
    no_map: dict[int, str] | None = None,
) -> None:
    """Fill a layers × heads ``QTableWidget`` with scores, coloured cells and flagged heads. Rows are the
    real layer indices; the rows in ``no_map`` (a hybrid model's layers with no attention map, NaN
    scores) are grey, empty, not selectable, and say why in their tooltip and header."""
    no_map = no_map or {}
    L, H = values.shape
    table.setRowCount(L)
    table.setColumnCount(H)
    table.setHorizontalHeaderLabels([f"q{h}\nKV {h // group_size}" for h in range(H)])
    table.setVerticalHeaderLabels(
        [f"L{layer}" + (" · no map" if layer in no_map else "") for layer in range(L)]
    )
    rgb, white = cell_colours(np.nan_to_num(values), cmap)
    bold = QFont()
    bold.setBold(True)
    for layer in range(L):
        for head in range(H):
            it = table.item(layer, head)
            if it is None:
                it = QTableWidgetItem()
                it.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                table.setItem(layer, head, it)
            if layer in no_map:
                it.setFlags(Qt.ItemFlag.NoItemFlags)
                it.setText(
                    no_map[layer].split(": ", 1)[-1] if head == 0 else ""
                )  # "linear attention, no map"
                it.setToolTip(no_map[layer])
                it.setBackground(QBrush(NO_MAP_CELL))
                it.setData(Qt.ItemDataRole.UserRole, None)
                continue
            it.setFlags(Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsEnabled)
            it.setToolTip("")
            v = float(values[layer, head])
            flagged = flags is not None and bool(flags[layer, head])
            it.setText(("nan" if np.isnan(v) else f"{v:.2f}") + (f" {FLAG}" if flagged else ""))
            it.setFont(bold if flagged else QFont())
            r, g, b = (int(x) for x in rgb[layer, head])
            it.setBackground(QBrush(QColor(r, g, b)))
            it.setForeground(QBrush(QColor("white" if white[layer, head] else "black")))
            it.setData(Qt.ItemDataRole.UserRole, v)


class SinksView(QWidget, SavedControls):
    """The Sinks tab, built with the :class:`attnscope.app.state.ViewState` (sequence, step, selection,
    colours) and the :class:`attnscope.app.engine.Engine`."""

    STATE_CONTROLS = ("metric_combo", "threshold_spin", "step_spin")  # saved in session files

    def __init__(self, state, engine, parent: QWidget | None = None):
        super().__init__(parent)
        self.state, self.engine = state, engine
        self.report: SinkReport | None = None
        self.report_key: tuple | None = None  # the state's sequence_key the report was computed for
        self.vw: tuple[np.ndarray, np.ndarray] | None = None  # value-weighted (per row, running), "sink_vw"
        self._restored_step: int | None = None  # a reopened session's step, applied when its report arrives
        state.events.snapshot.connect(self.on_snapshot)
        state.events.selection.connect(lambda sel: self._draw_head(*sel))
        state.events.changed.connect(self._on_changed)
        state.events.colour.connect(lambda _spec: self._redraw())

        top = QHBoxLayout()
        top.addWidget(QLabel("Score"))
        self.metric_combo = QComboBox()
        for key, text in METRICS.items():
            self.metric_combo.addItem(text, key)
        self.metric_combo.setToolTip(
            "Token 0: mean over query rows i ≥ 1 of the weight on token 0.\n"
            "Token 0 + delimiters: the same for the total weight on token 0, special tokens "
            "(BOS, <|im_start|>…), punctuation and newlines.\n"
            "Value-weighted: the mean over rows i ≥ 1 of token 0's share α_i0‖v_0 W_O^h‖ / Σ_j α_ij‖v_j W_O^h‖ "
            "of what the head moves (Kobayashi et al. 2020): a sink that takes the weight but moves little scores low.\n"
            "Learned sink (models with one, e.g. gpt-oss): the mean share of each row that the head's learned "
            "softmax slot takes, exp(sink − lse) = 1 − Σ_j w_ij; it moves no value. Token 0 + learned sink: "
            "both no-op destinations together."
        )
        self.metric_combo.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.metric_combo.setMinimumContentsLength(18)
        top.addWidget(self.metric_combo)
        top.addSpacing(12)
        top.addWidget(QLabel("Sink threshold"))
        self.threshold_spin = QDoubleSpinBox()
        self.threshold_spin.setRange(0.0, 1.0)
        self.threshold_spin.setSingleStep(0.05)
        self.threshold_spin.setDecimals(2)
        self.threshold_spin.setValue(DEFAULT_THRESHOLD)
        self.threshold_spin.setToolTip(f"Heads whose score is at or above this are flagged {FLAG}")
        top.addWidget(self.threshold_spin)
        top.addSpacing(12)
        top.addWidget(QLabel("Table at seq_len"))
        self.step_spin = QSpinBox()
        self.step_spin.setToolTip(
            "Show the table as it was after this many tokens (prefill, then each decode step)"
        )
        top.addWidget(self.step_spin)
        top.addStretch(1)
        # under the controls, the tab's whole width (beside them, a 1000 px window left it a narrow
        # column of seven lines); as many lines as it needs, never cut
        self.summary = WrappedLabel("Run a prompt to see the sink table.")
        self.summary.setStyleSheet("color:#335;")

        self.table = QTableWidget()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.setToolTip("Click: select the head · double-click: open it in the heatmap")
        # keep the score colour of the selected cell visible: a frame, not a fill
        self.table.setItemDelegate(FramedSelectionDelegate(self.table))

        self.plot = pg.PlotWidget(background="w")
        self.plot.setMinimumHeight(150)
        style_plot(self.plot)
        pi = self.plot.getPlotItem()
        pi.setLabel("bottom", "query position (row)")
        pi.setLabel("left", "weight on token 0")
        pi.setYRange(0, 1.02, padding=0)
        pi.showGrid(x=True, y=True, alpha=0.25)
        self.row_curve = pi.plot(
            [],
            [],
            pen=pg.mkPen("#3b6fb6", width=1.5),
            symbol="o",
            symbolSize=5,
            symbolBrush="#3b6fb6",
            symbolPen=None,
        )
        self.mean_curve = pi.plot([], [], pen=pg.mkPen("#d0702a", width=2.5))
        # what a uniform causal head's score would be so far (Token 0 score only): a sink is far above it
        self.uniform_curve = pi.plot([], [], pen=pg.mkPen("#777", width=1.5, style=Qt.PenStyle.DashLine))
        # learned sinks (gpt-oss): each row's share on the softmax slot, beside its weight on token 0
        self.learned_curve = pi.plot(
            [],
            [],
            pen=pg.mkPen(LEARNED_COLOUR, width=1.5, style=Qt.PenStyle.DashLine),
            symbol="t",
            symbolSize=5,
            symbolBrush=LEARNED_COLOUR,
            symbolPen=None,
        )
        self.threshold_line = pg.InfiniteLine(
            angle=0,
            pos=DEFAULT_THRESHOLD,
            pen=pg.mkPen("#b02a2a", width=1, style=Qt.PenStyle.DashLine),
            # no label on the line: drawn in the plot it sat on the curves (a head's weights start near
            # the threshold); the title's first line names it instead (tests/app/test_map_labels_fit_gui.py)
        )
        self.decode_line = pg.InfiniteLine(
            angle=90,
            pen=pg.mkPen("#666", width=1, style=Qt.PenStyle.DotLine),
            label="decode →",
            labelOpts={"position": 0.06, "color": "#444"},
        )
        pi.addItem(self.threshold_line)
        pi.addItem(self.decode_line)
        self.decode_line.hide()

        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.table)
        split.addWidget(self.plot)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 1)
        split.setSizes([430, 260])
        lay = PageLayout(self)  # fills the tab page: the wrapped summary never makes it scroll
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(top)
        lay.addWidget(self.summary)
        lay.addWidget(split, 1)

        self.metric_combo.currentIndexChanged.connect(lambda _i: self._redraw())
        self.threshold_spin.valueChanged.connect(lambda _v: self._redraw())
        self.step_spin.valueChanged.connect(lambda _v: self._redraw())
        self.table.cellClicked.connect(self._on_cell_clicked)
        self.table.cellActivated.connect(self._on_cell_activated)
        self.table.cellDoubleClicked.connect(self._on_cell_activated)

    # -- state ------------------------------------------------------------------------------------
    @property
    def current(self) -> bool:
        """True when the report shown is the current sequence's."""
        return self.report is not None and self.report_key == self.state.sequence_key

    def on_snapshot(self, _snap) -> None:
        if self.report_key != self.state.sequence_key:
            self.vw = None
            self._restored_step = None  # a step restored for another sequence no longer applies

    def _on_changed(self, names) -> None:
        if "step" in names and "snapshot" not in names:  # the timeline moved (not a new sequence)
            self.follow_timeline(self.state.visible_len)

    def refresh(self) -> None:
        if not self.current and self.state.has_sequence:
            self.summary.setText("Computing sink scores…")
            key = self.state.sequence_key
            self.engine.submit(
                "sinks", Request(_report_job, lambda r: self.set_report(r, key), "sink scores", key=self._seq)
            )

    def _seq(self) -> tuple:
        return self.state.sequence_key

    # -- drawing ---------------------------------------------------------------------------------
    @property
    def metric_key(self) -> str:
        # not ``metric``: that name is QPaintDevice.metric(), which Qt calls when painting the widget
        return self.metric_combo.currentData()

    @property
    def threshold(self) -> float:
        return float(self.threshold_spin.value())

    def restore_view_state(self, state: dict) -> None:
        """Restore the saved controls; the saved step waits for the reopened sequence's report (it
        would otherwise be clamped to the previous report's range, then reset to the new length)."""
        super().restore_view_state(state)
        step = state.get("step_spin") if isinstance(state, dict) else None
        self._restored_step = step if isinstance(step, int) and step >= 2 else None
        if self.current and self.report is not None:
            # the report shown stays (the same sequence): apply the step to it now. A step below 2 is
            # "now" (saved before the tab had a report), which the box would otherwise keep clamped at 2.
            self.set_report(self.report, self.report_key)

    def set_report(self, report: SinkReport, key: tuple | None = None) -> None:
        """Show ``report`` (GUI thread), computed for the state's ``sequence_key`` ``key`` (default: now)."""
        self.report = report
        self.report_key = self.state.sequence_key if key is None else key
        self._offer_learned(bool(getattr(report, "has_learned_sinks", False)))
        step, self._restored_step = self._restored_step, None
        self._set_step_range(step)
        if hasattr(self, "push_settings"):
            self.push_settings()  # the step was set with the spin box's signals blocked
        self._redraw()

    def _offer_learned(self, on: bool) -> None:
        """Add (``on``) or remove the learned-sink scores in the metric box, keeping the choice when it stays."""
        have = [self.metric_combo.itemData(i) for i in range(self.metric_combo.count())]
        if on == all(k in have for k in LEARNED_METRICS):
            return
        self.metric_combo.blockSignals(True)
        if on:
            for k, text in LEARNED_METRICS.items():
                self.metric_combo.addItem(text, k)
        else:
            if self.metric_key in LEARNED_METRICS:
                self.metric_combo.setCurrentIndex(0)
            for k in LEARNED_METRICS:
                i = self.metric_combo.findData(k)
                if i >= 0:
                    self.metric_combo.removeItem(i)
        self.metric_combo.blockSignals(False)

    def timeline_len(self) -> int:
        """The seq_len the timeline shows (``state.visible_len``), within the report's 2..seq_len."""
        T = self.report.seq_len if self.report is not None else 0
        return max(min(self.state.visible_len or T, T), min(T, 2))

    def _set_step_range(self, step: int | None = None) -> None:
        """The "at seq_len" box: 2 .. the timeline's seq_len (a later length is not on screen
        anywhere else), at ``step`` when it is in that range, else at the timeline's seq_len."""
        if self.report is None:
            return
        T = self.report.seq_len
        n = self.timeline_len()
        self.step_spin.blockSignals(True)
        self.step_spin.setRange(min(n, 2), max(n, 2))
        self.step_spin.setValue(step if step is not None and 2 <= step <= n else n)
        self.step_spin.setEnabled(n > 2 and T > 2)
        self.step_spin.blockSignals(False)

    def table_values(self) -> np.ndarray | None:
        """The ``(n_layers, n_heads)`` scores shown (metric and seq_len as chosen)."""
        r = self.report
        if r is None:
            return None
        n = self.step_spin.value()
        if self.metric_key == "sink_vw":
            if self.vw is None:
                return None
            return (
                self.vw[1][..., max(n, 2) - 1]
                if r.seq_len >= 2
                else np.zeros(self.vw[0].shape[:2], np.float32)
            )
        if self.metric_key in LEARNED_METRICS and not r.has_learned_sinks:
            return None if r.seq_len < 2 else r.running[..., n - 1]
        if r.seq_len < 2:
            return getattr(r, self.metric_key)
        return self._running(r)[..., n - 1]

    def _running(self, r: SinkReport) -> np.ndarray:
        """The running mean ``(L, H, T)`` of the metric shown (not the value-weighted one)."""
        if self.metric_key == "learned" and r.running_learned is not None:
            return r.running_learned
        if self.metric_key == "sink_total":
            return r.running_total
        return r.running if self.metric_key == "sink" else r.running_set

    def _per_row(self, r: SinkReport) -> np.ndarray:
        """Each row's mass ``(L, H, T)`` for the metric shown (not the value-weighted one)."""
        if self.metric_key == "learned" and r.per_row_learned is not None:
            return r.per_row_learned
        if self.metric_key == "sink_total" and r.per_row_learned is not None:
            return r.per_row + r.per_row_learned
        return r.per_row if self.metric_key == "sink" else r.per_row_set

    def _redraw(self) -> None:
        r = self.report
        if r is None:
            return
        vals = self.table_values()
        if vals is None:  # value-weighted shares not computed yet for this sequence
            self.summary.setText("Computing value-weighted sink shares…")
            self.engine.submit(
                "sinks-vw", Request(_vw_job, self._set_vw, "value-weighted sinks", key=self._seq)
            )
            return
        flags = vals >= self.threshold
        snap = self.state.snapshot
        no_map = no_map_lines(snap.info) if snap is not None else {}
        fill_score_table(self.table, vals, flags, self.state.group_size, self.state.colormap, no_map)
        n_heads = int(np.count_nonzero(~np.isnan(vals)))  # a hybrid model: the attention layers' heads
        n = self.step_spin.value()
        when = "now" if n == r.seq_len else f"after {n} of {r.seq_len} tokens"
        if n == self.timeline_len() and n < r.seq_len:
            when += f", the timeline's step {self.state.step}"
        what = {
            "sink": "token 0",
            "sink_vw": "token 0, value-weighted",
            "learned": "the learned sink",
            "sink_total": "token 0 + the learned sink",
        }.get(self.metric_key, f"token 0 + {len(r.delimiters)} delimiter/special tokens")
        base = ""
        if self.metric_key == "sink" and n >= 2:  # token 0's share under plain causal averaging, and × that
            from attnscope.core.analysis.sinks import uniform_causal_baseline

            b = uniform_causal_baseline(n)
            base = f" · uniform causal baseline {b:.3f} (mean ×{np.nanmean(vals) / b:.1f})"
            for layer in range(vals.shape[0]):
                for head in range(vals.shape[1]):
                    it = self.table.item(layer, head)
                    if it is not None and np.isfinite(vals[layer, head]):
                        it.setToolTip(
                            f"L{layer} q{head}: {vals[layer, head]:.3f} on token 0 = ×{vals[layer, head] / b:.1f} "
                            f"the uniform causal baseline {b:.3f} at {n} tokens (mean over rows i ≥ 1 of 1/(i+1))"
                        )
        text = (
            f"{int(flags.sum())} of {n_heads} heads are sink heads (mass on {what} ≥ {self.threshold:.2f}, {when}) · "
            f"mean {np.nanmean(vals):.2f}{base}"
            + (f" · {len(no_map)} layers have no map (grey)" if no_map else "")
        )
        if r.has_learned_sinks and r.running_learned is not None and r.seq_len >= 2:
            learned = r.running_learned[..., max(n, 2) - 1]
            text += f" · learned sink: mean share {float(np.mean(learned)):.2f}" + (
                ", moves nothing" if self.metric_key == "sink_vw" else ""
            )
        self.summary.setText(text)
        self.threshold_line.setValue(self.threshold)
        self._draw_head(self.state.layer, self.state.head)

    def _draw_head(self, layer: int, head: int) -> None:
        r = self.report
        if r is None or layer >= r.n_layers or head >= r.n_heads:
            return
        snap = self.state.snapshot
        if snap is not None and not snap.info.arch.has_map(layer):  # a hybrid model's layer with no map
            self.row_curve.setData([], [])
            self.mean_curve.setData([], [])
            self.uniform_curve.setData([], [])
            self.learned_curve.setData([], [])
            self.plot.getPlotItem().setTitle(snap.info.arch.no_map_line(layer), color="#222", size="10pt")
            return
        per_row, running = self._per_row(r), self._running(r)
        if self.metric_key == "sink_vw" and self.vw is not None:
            per_row, running = self.vw
        n = min(self.step_spin.value(), r.seq_len)  # the table's seq_len: rows 0 .. n - 1
        x = np.arange(n, dtype=float)
        self.row_curve.setData(x[1:], per_row[layer, head, 1:n])
        self.mean_curve.setData(x[1:], running[layer, head, 1:n])
        uniform = self.metric_key == "sink" and n >= 2
        if uniform:  # row i's running mean of 1/(k + 1), k = 1..i: uniform_causal_baseline(i + 1)
            u = np.cumsum(1.0 / np.arange(2, n + 1)) / np.arange(1, n)
            self.uniform_curve.setData(x[1:], u)
        else:
            self.uniform_curve.setData([], [])
        side = r.per_row_learned is not None and self.metric_key in ("sink", "sink_set")
        if (
            side and r.per_row_learned is not None
        ):  # the learned sink's share of each row, beside token 0's weight
            self.learned_curve.setData(x[1:], r.per_row_learned[layer, head, 1:n])
        else:
            self.learned_curve.setData([], [])
        pi = self.plot.getPlotItem()
        target = {
            "sink": "token 0",
            "sink_vw": "token 0 (value-weighted share)",
            "learned": "the learned sink",
            "sink_total": "token 0 + learned sink",
        }.get(self.metric_key, "token 0 + delimiters")
        snap = self.state.snapshot
        kv = snap.info.kv_head(head) if snap is not None else head
        pi.setLabel(
            "left",
            "share of the row" if side or self.metric_key in LEARNED_METRICS else f"weight on {target}",
        )
        if side and r.running_learned is not None:  # two series: shorter words, one line
            title = (
                f"Layer {layer} · head {head} (KV {kv})<br>"
                f"<span style='color:#3b6fb6'>● token 0</span> · "
                f"<span style='color:#d0702a'>━ sink score so far: {running[layer, head, n - 1]:.3f}</span> · "
                f"<span style='color:{LEARNED_COLOUR}'>▲ learned sink's share "
                f"(mean {r.running_learned[layer, head, n - 1]:.3f})</span>"
            )
        else:
            score = running[layer, head, n - 1]
            if uniform:  # beside the head's score: a uniform causal head's, and the ratio
                from attnscope.core.analysis.sinks import uniform_causal_baseline

                b = uniform_causal_baseline(n)
                so_far = (
                    f"━ sink score so far: {score:.3f}</span> · <span style='color:#555'>╌ a uniform "
                    f"causal head: {b:.3f}</span> (×{score / b:.1f})"
                )
            else:
                so_far = f"━ sink score so far (mean of rows ≥ 1): {score:.3f}</span>"
            title = (
                f"Layer {layer} · query head {head} (KV head {kv})<br>"
                f"<span style='color:#3b6fb6'>● each row's weight on {target}</span> · "
                f"<span style='color:#d0702a'>{so_far}"
            )
        # two lines (which head and the threshold line's key; its legend), each short enough for the
        # plot of a 1000 px window
        head_line, legend = title.split("<br>", 1)
        title = (
            f"{head_line} · <span style='color:#b02a2a'>╌ threshold {self.threshold:.2f}</span><br>{legend}"
        )
        pi.setTitle(
            title + (f" · rows 0..{n - 1}" if n < r.seq_len else ""),
            color="#222",
            size="9pt",
        )
        if r.n_prompt < n:
            self.decode_line.setValue(r.n_prompt - 0.5)
            self.decode_line.show()
        else:
            self.decode_line.hide()
        pi.setXRange(0, max(1, n - 1), padding=0.02)
        if self.table.currentRow() != layer or self.table.currentColumn() != head:
            self.table.blockSignals(True)
            self.table.setCurrentCell(layer, head)
            self.table.blockSignals(False)
        it = self.table.item(layer, head)
        if it is not None:
            self.table.scrollToItem(it, QAbstractItemView.ScrollHint.PositionAtCenter)

    def _set_vw(self, result) -> None:
        """Value-weighted per-row shares arrived (GUI thread): keep them with their running means."""
        from attnscope.core.analysis.sinks import running_mean_from_row1

        T, rows = result
        if self.report is None or T != self.report.seq_len:
            return  # another sequence by now
        self.vw = (rows.astype(np.float32), running_mean_from_row1(rows))
        self._redraw()

    def follow_timeline(self, visible_len: int) -> None:
        """Show the table as it was with ``visible_len`` tokens (the main window's timeline step)."""
        if self.report is not None and 2 <= visible_len <= self.report.seq_len:
            self._set_step_range()
            self._redraw()
            if hasattr(self, "push_settings"):
                self.push_settings()  # set with the spin box's signals blocked

    # -- clicks -----------------------------------------------------------------------------------
    def _on_cell_clicked(self, layer: int, head: int) -> None:
        self.state.select(layer, head)

    def _on_cell_activated(self, layer: int, head: int) -> None:
        self.state.select(layer, head)
        self.state.tab = "heatmap"


def install_view(window) -> SinksView:
    """Create the Sinks tab and register it with ``window.add_view("sinks", ...)``; the timeline's
    step (``state.step``) picks the table's seq_len too."""
    view = SinksView(window.state, window.engine)
    window.add_view("sinks", "Sinks", view)
    return view
