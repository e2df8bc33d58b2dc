"""One attention map: rows = queries (top to bottom), columns = keys (left to right).

pyqtgraph MatrixDisplay pattern: a row-major ``ImageItem`` in a ``PlotItem`` with ``invertY``, so
the causal triangle sits below the diagonal with row 0 at the top; token labels as axis ticks,
thinned by their measured width so they stay readable at any zoom; a ``ColorBarItem`` whose tick
labels are the real weights whatever the colour scale (linear, log, power); a hover readout with
the raw token, id, position and weight of both ends. Masked cells (a later key; a key outside the
layer's sliding window, :meth:`HeatmapView.set_mask_window`) are drawn as a grey hatch outside the
colour map, never as weight 0, and the line under the map says so.

Long maps (more than :data:`attnscope.core.analysis.aggregate.LONG_PROMPT` tokens) arrive as a max-pooled overview
(:class:`attnscope.core.analysis.aggregate.PooledMap`); when the visible region is small enough the view emits
``tileWanted(r0, r1, c0, c1)`` and draws the exact tile it gets back (:meth:`set_tile`) over the
overview, at its position, on an opaque masked backdrop (:class:`MaskedBackdrop`: the tile's masked
cells show as masked, never as the pooled block under them) inside a red frame. The title and the
line under the map say what the view shows (:meth:`HeatmapView.tile_state`): exact weights in view,
exact inside the red frame (part of the view), the overview while the exact tile is computing, or the
overview alone; a long title wraps after a ``·``, never inside a word (:func:`title_breaks`).

The toolbar holds the display options: aggregate (one head, mean of a KV group, of a layer, of
all layers; computed in :mod:`attnscope.core.analysis.aggregate`), colour scale, gamma, and colour range (fixed
[0, 1]; auto per map; shared across the heads of the layer).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from attnscope.app.figure import token_label
from attnscope.app.flow import FlowLayout
from attnscope.core.analysis.aggregate import MODE_LABELS, MODES, PooledMap
from attnscope.core.attention.masks import hidden_blocks, hidden_cells
from attnscope.core.io.colormaps import NONFINITE_RGB, RANGE_MODES, SCALES, normalize
from attnscope.core.tokens import Token
from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QFontMetrics, QTextOption
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

#: the range box's wording of each of attnscope.core.io.colormaps.RANGE_MODES, in its order
RANGE_LABELS = dict(zip(RANGE_MODES, ("Fixed [0, 1]", "Auto", "Shared (layer)"), strict=True))
MASK_HATCH = (150, 150, 150)  # masked cells: grey hatch on white, outside every colour map
LONG_SQUARE = 1024  # above this many tokens the overview fills the plot's rectangle (aspect unlocked)
LONG_SCALE_NOTE = 2048  # from this many tokens the title says the scale was chosen by length
TILE_MAX = 768  # exact tiles are requested once the visible region is at most this many rows and cols
LOG_FLOOR = 1e-6  # lowest weight the log scale shows (attnscope.core.io.colormaps.normalize)


def qt_colormap(name: str = "viridis") -> pg.ColorMap:
    """A pyqtgraph ColorMap from AttnScope's shared LUT (same colours as the headless PNGs)."""
    from attnscope.core.io.colormaps import lut

    table = lut(name)
    return pg.ColorMap(np.linspace(0, 1, len(table)), table, name=name)


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) < 1e-3:
        return f"{v:.0e}"
    return f"{v:.3g}"


def weight_text(v: float, scale: str = "linear") -> str:
    """A weight for the hover readout, with enough significant digits for any colour scale: 4
    decimals from 0.01 (``0.1234``), 3 significant digits in scientific notation below it
    (``3.21e-05``: the log scale shows down to 1e-6, where ``f"{v:.4f}"`` said ``0.0000``). An
    exact 0 that no mask hid says it underflowed float32; a weight under the log scale's floor says
    it is drawn in the floor's colour. Masked cells never reach here (the readout says "masked")."""
    v = float(v)
    if not math.isfinite(v):
        return f"{v} (non-finite: the forward overflowed; not a weight)"
    if v == 0:
        return "0 (not masked: under float32's smallest weight, ~1e-45)"
    text = f"{v:.4f}" if abs(v) >= 0.01 else f"{v:.2e}"
    if scale == "log" and 0 < v < LOG_FLOOR:
        text += f" (under the log scale's {LOG_FLOOR:.0e}: drawn in its lowest colour)"
    return text


#: the legend of non-finite cells, as every view and output names them (attnscope.core.io.render)
NONFINITE_LEGEND_HTML = (
    '<span style="color:#{:02x}{:02x}{:02x}">■</span> magenta: NaN/inf (the forward overflowed), '
    "not a weight".format(*NONFINITE_RGB)
)


def show_nonfinite(item, src: np.ndarray, masked: np.ndarray | None = None) -> bool:
    """Paint ``src``'s non-finite cells (NaN, ±inf; not ``masked``) in the one non-finite colour of
    every output (:data:`attnscope.core.io.colormaps.NONFINITE_RGB`, magenta: the cell kinds of
    :mod:`attnscope.core.io.render`) on the RGBA ``pg.ImageItem`` ``item`` laid over the map, the rest transparent; clear it
    when there are none (a map's own lookup table would draw them as a weight, or transparent, i.e.
    as masked). ``src``: ``(rows, cols)``, row-major. Returns whether there were any."""
    bad = ~np.isfinite(np.asarray(src, dtype=np.float64))
    if masked is not None and np.shape(masked) == bad.shape:
        bad &= ~np.asarray(masked, dtype=bool)
    if not bad.any():
        item.clear()
        return False
    rgba = np.zeros((*bad.shape, 4), dtype=np.uint8)  # (rows, cols, RGBA): row-major as the map
    rgba[bad] = (*NONFINITE_RGB, 255)
    item.setImage(rgba, autoLevels=False, levels=(0, 255))
    return True


TICK_GAP = 0.07  # the least distance, in bar heights, between two colour-bar tick labels


def colorbar_ticks(vmin: float, vmax: float, scale: str, gamma: float = 0.5) -> list[tuple[float, str]]:
    """Tick positions in the normalised [0, 1] bar and their labels in real weights.

    The image is drawn as ``normalize(w, vmin, vmax, scale, gamma)`` (:mod:`attnscope.core.io.colormaps`), so
    a tick at real value ``v`` sits at ``normalize(v)``: decades for log, nice steps otherwise.
    """
    if scale == "log":
        lo = max(vmin, LOG_FLOOR)
        vals = [10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(vmax)) + 1)]
        vals = [v for v in vals if lo <= v <= vmax * 1.0001] + [vmax]
    else:
        span = vmax - vmin
        step = 10 ** math.floor(math.log10(span / 4)) if span > 0 else 1.0
        for m in (1, 2, 2.5, 5, 10):
            if span / (step * m) <= 5:
                step *= m
                break
        vals = list(np.arange(math.ceil(vmin / step) * step, vmax + step * 1e-6, step))
        if scale == "power":  # power compresses the top: add small values where the colours change most
            vals = sorted(set([round(v, 12) for v in vals] + [vmin + span * f for f in (0.01, 0.05)]))
    out: list[tuple[float, str]] = []
    # the range's ends are always labelled; a tick closer than TICK_GAP of the bar to one kept (the
    # decade 0.1 under an auto top of 0.128) is dropped: two labels must never overlap
    ends = {vals[0], vals[-1]} if vals else set()
    for v in sorted(vals, key=lambda v: v not in ends):
        pos = float(normalize(np.array([v]), vmin, vmax, scale, gamma)[0])
        if all(abs(pos - p) >= TICK_GAP for p, _ in out):
            out.append((pos, _fmt(v)))
    return sorted(out)


_TAG = re.compile(r"(<[^>]*>)")
NB_HYPHEN, NB_SPACE = "\u2011", "\u00a0"


def title_breaks(text: str, at_separators: bool = True) -> str:
    """``text`` (a plot title, rich text) marked so that wrapping never splits a word: a hyphen between
    letters becomes a non-breaking one (Qt broke "max-pooled" into "max-" / "pooled"), and with
    ``at_separators`` the spaces inside each `` · ``-separated part become non-breaking, so a line
    breaks only after a ``·``. Tags are left alone."""

    def mark(part: str) -> str:
        part = re.sub(r"(?<=\w)-(?=\w)", NB_HYPHEN, part)
        return re.sub(r"(?<!·) ", NB_SPACE, part) if at_separators else part

    return "".join(p if i % 2 else mark(p) for i, p in enumerate(_TAG.split(text)))


def _wrap_title_at_words(label) -> None:
    """Make ``label`` (a pyqtgraph LabelItem) show every text it is given through :func:`title_breaks`,
    keeping ``label.text`` the text as given (what readers and exports of the title see)."""

    def set_text(text, **args):
        pg.LabelItem.setText(label, title_breaks(text), **args)
        label.text = text

    label.setText = set_text


def stacked_label_pitch(fm: QFontMetrics, labels: list[str], neighbours: bool = True) -> float:
    """Pixels between the centres of stacked (left-axis) labels so that no two of ``labels`` touch,
    from the measured glyph boxes (not the font's line height, which holds space one label per row
    does not need). ``neighbours``: ``labels`` are consecutive rows, so each label only has to clear
    the next one (its descent plus the next one's ascent); otherwise any two may meet."""
    boxes = [fm.tightBoundingRect(t) for t in labels] or [fm.tightBoundingRect("Ag")]
    up = [max(0, -r.top()) for r in boxes]
    down = [max(0, r.bottom()) for r in boxes]
    if neighbours and len(boxes) > 1:
        need = max(d + u for d, u in zip(down[:-1], up[1:], strict=True))
    else:
        need = max(up) + max(down)
    return float(max(need, fm.capHeight()) + 1)


class MaskedBackdrop(pg.QtWidgets.QGraphicsRectItem):
    """An opaque rectangle drawn as masked cells are: white under the grey hatch ``hatch``.

    Put under an exact tile (over the pooled overview), so the tile's masked cells, transparent in
    its image, show as masked instead of letting the overview's block colour through."""

    def __init__(self, hatch):
        super().__init__()
        self._hatch = hatch
        self.setPen(pg.mkPen(None))

    def paint(self, painter, option, widget=None):
        painter.fillRect(self.rect(), pg.mkBrush("w"))
        painter.fillRect(self.rect(), self._hatch)


class ReadoutLabel(QLabel):
    """The hover readout under the map: it wraps where the map is narrow (its one-line hint set the
    map's minimum width at 457 px, the Why dock beside it left less), yet asks for its one-line width,
    so a window laid out at its natural size (never shown: tests/app/test_window_screens_gui.py) is as
    wide as before."""

    def __init__(self):
        super().__init__()
        self.setWordWrap(True)

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        hint = super().sizeHint()
        m = self.contentsMargins()
        one_line = self.fontMetrics().horizontalAdvance(self.text()) + m.left() + m.right() + 2
        return QSize(max(hint.width(), one_line), hint.height())


class HeatmapView(QWidget):
    """Shows a ``(n_query, n_key)`` matrix with token labels; emits ``hovered(text)``.

    Signals:
        optionsChanged(): the aggregate or the range mode changed (the data must be re-requested).
        tileWanted(r0, r1, c0, c1): a long map is zoomed in: the exact tile of rows ``r0:r1`` and
            cols ``c0:c1`` is wanted (answer with :meth:`set_tile`).
        rowClicked(row): a query row was clicked.
        cellClicked(row, col): the cell at query ``row``, key ``col`` (absolute positions) was clicked.
    """

    #: the tab widget adds it as it is, not in a scrolling page (attnscope.app.tabs.ViewTabs.addTab): its
    #: plot scales to the page
    SCALES_ITSELF = True

    hovered = Signal(str)
    optionsChanged = Signal()
    tileWanted = Signal(int, int, int, int)
    rowClicked = Signal(int)
    cellClicked = Signal(int, int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        # -- toolbar
        bar = QHBoxLayout()
        bar.setContentsMargins(4, 2, 4, 0)
        self.aggregate_combo = QComboBox()
        for m in MODES:
            self.aggregate_combo.addItem(MODE_LABELS[m], m)
        self.aggregate_combo.setToolTip("Show one head, or the mean of the exact weights of several heads")
        self.scale_combo = QComboBox()
        self.scale_combo.addItems(SCALES)
        self.scale_combo.setToolTip("Colour scale: linear, log10 (from 1e-6) or power (weight ** gamma)")
        self.gamma_spin = QDoubleSpinBox()
        self.gamma_spin.setRange(0.05, 4.0)
        self.gamma_spin.setSingleStep(0.05)
        self.gamma_spin.setValue(0.5)
        self.gamma_spin.setToolTip("Gamma of the power scale: < 1 brightens small weights")
        self.range_combo = QComboBox()
        for k, v in RANGE_LABELS.items():
            self.range_combo.addItem(v, k)
        self.range_combo.setToolTip(
            "Colour range. Fixed [0, 1]: probabilities as they are. Auto: [0, 99.5th percentile of the "
            "map's non-zero weights] (the max is always 1: row 0 sees only key 0). Shared: the largest "
            "auto value over the heads of the layer, so heads compare on one scale."
        )
        self.weighting_combo = QComboBox()  # attnscope.core.analysis.value_weighted: what a cell measures
        self.weighting_combo.addItem("attention", "attention")
        self.weighting_combo.addItem("value-weighted", "value-weighted")
        self.weighting_combo.setToolTip(
            "Attention: the weights α_ij. Value-weighted: α_ij·‖v_j W_O^h‖ (the size of what key j moves "
            "into head h's output; Kobayashi et al. 2020), row-normalised. Maps up to 1024 tokens."
        )
        # the options wrap onto a second line (a label stays with its control) where the bar is too
        # narrow for them, never cutting a combo's text (the Why panel docked beside the map left
        # "Single he"): tests/app/test_why_dock_layout_gui.py
        self.options = QWidget()
        flow = FlowLayout(self.options, spacing=12)
        for label, w in (
            ("Show", self.aggregate_combo),
            ("Weights", self.weighting_combo),
            ("Scale", self.scale_combo),
            ("γ", self.gamma_spin),
            ("Range", self.range_combo),
        ):
            flow.add_unit(QLabel(label), w)
        bar.addWidget(self.options)
        self.mode_label = QLabel("")
        self.mode_label.setStyleSheet("color:#555;")
        self.mode_label.setSizePolicy(
            QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred
        )  # never widens the window
        for combo in (self.aggregate_combo, self.range_combo, self.weighting_combo):
            combo.setSizeAdjustPolicy(
                QComboBox.SizeAdjustPolicy.AdjustToContents
            )  # as wide as the longest item, no wider
        bar.addWidget(self.mode_label, 1)
        # takes the bar's spare width only while the note is on its own line (_place_note): the
        # option widgets stay packed at the left, not spread over the bar
        bar.addStretch(0)

        # -- plot
        self.glw = pg.GraphicsLayoutWidget()
        # the map keeps room when the option bar and the readout wrap (a narrow window, the Why dock
        # beside it): a never-shown window laid out at its natural size exports it whole
        # (tests/app/test_window_screens_gui.py)
        self.glw.setMinimumHeight(220)
        self.glw.setBackground("w")
        self.plot = self.glw.addPlot()
        _wrap_title_at_words(self.plot.titleLabel)
        self.plot.vb.sigResized.connect(self._fit_title)
        self.plot.vb.sigResized.connect(self._overview_follows_size)
        self.plot.vb.sigResized.connect(self._update_ticks)  # label spacing is in pixels
        self.plot.invertY(True)
        self.plot.setAspectLocked(True)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setLabel("left", "query (row)")
        self.plot.setLabel("bottom", "key (column)")
        for ax in ("left", "bottom"):
            axis = self.plot.getAxis(ax)
            axis.setPen("k")
            axis.setTextPen("k")
            axis.enableAutoSIPrefix(False)
        # one line of token labels under the map, whatever was (not) drawn before: a fixed text height
        bottom = self.plot.getAxis("bottom")
        bottom.setStyle(autoExpandTextSpace=False, tickTextHeight=QFontMetrics(bottom.font()).height() + 6)
        for ax in ("left", "bottom"):  # _set_axis_ticks spaces the labels itself: pyqtgraph must not drop any
            self.plot.getAxis(ax).setStyle(textFillLimits=[(0, 2.0)])
        self.placeholder = pg.TextItem(
            "Run a prompt to see attention", color=(120, 120, 120), anchor=(0.5, 0.5)
        )
        self.placeholder.setPos(0.5, 0.5)
        self.plot.addItem(self.placeholder)
        # masked cells (causal mask, outside a sliding window) are NaN in the image, so transparent:
        # this hatch behind the map shows through them (set_mask_window / mask_window_provider)
        self.mask_bg = pg.QtWidgets.QGraphicsRectItem()
        hatch = pg.mkBrush(MASK_HATCH)
        hatch.setStyle(Qt.BrushStyle.BDiagPattern)
        self.mask_bg.setBrush(hatch)
        self.mask_bg.setPen(pg.mkPen(None))
        self.mask_bg.setZValue(-1)
        self.mask_bg.hide()
        self.plot.addItem(self.mask_bg)
        self.mask_window: int | None = (
            None  # sliding window the shown map was masked with (None = causal only)
        )
        self.mask_window_provider: Callable[[], int | None] | None = None  # asked at each redraw
        # learned sinks (gpt-oss): each query row's share on the sink slot for the map shown, by absolute
        # row (None: no learned sinks, or not this map's yet); the readout says it
        self.learned_share: np.ndarray | None = None
        self._legend_masked = False  # the legend names masked cells (_update_mask_legend)
        # row-major per item (rows = queries): never the global pyqtgraph option, which only an app
        # entry point sets, so a view built from a script or a notebook is not transposed
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        # non-finite cells (NaN/inf of a forward that overflowed) are NaN in the image like masked ones:
        # this RGBA layer over it paints them magenta (attnscope.core.io.render), never as a weight
        self.nonfinite_image = pg.ImageItem(axisOrder="row-major")
        self.nonfinite_image.setZValue(1)
        self.plot.addItem(self.nonfinite_image)
        # under the exact tile, over the overview: its masked cells are NaN (transparent) like the map's,
        # and must show as masked, not as the pooled block below them (that block's max is of cells
        # the mask let through, so a staircase of coloured blocks showed along the diagonal)
        self.tile_backdrop = MaskedBackdrop(hatch)
        self.tile_backdrop.setZValue(4)
        self.tile_backdrop.hide()
        self.plot.addItem(self.tile_backdrop)
        self.tile_image = pg.ImageItem(axisOrder="row-major")
        self.tile_image.setZValue(5)
        self.plot.addItem(self.tile_image)
        self.tile_nonfinite = pg.ImageItem(axisOrder="row-major")
        self.tile_nonfinite.setZValue(5.5)
        self.plot.addItem(self.tile_nonfinite)
        self.tile_frame = pg.QtWidgets.QGraphicsRectItem()
        self.tile_frame.setPen(pg.mkPen((230, 60, 60), width=2, cosmetic=True))
        self.tile_frame.setZValue(6)
        self.tile_frame.hide()
        self.plot.addItem(self.tile_frame)
        self.row_frame = pg.QtWidgets.QGraphicsRectItem()  # the clicked query row (mark_row)
        self.row_frame.setPen(pg.mkPen((255, 255, 255), width=1.5, cosmetic=True, style=Qt.PenStyle.DashLine))
        self.row_frame.setZValue(7)
        self.row_frame.hide()
        self.plot.addItem(self.row_frame)
        self.levels = (0.0, 1.0)
        self.colorbar = pg.ColorBarItem(
            values=(0.0, 1.0), colorMap=qt_colormap(), interactive=False, label="attention weight", width=16
        )
        self.colorbar.setImageItem([self.image, self.tile_image], insert_in=self.plot)
        self.mask_legend = self.glw.addLabel("", row=1, col=0, color="#555", size="8pt")
        self.readout = ReadoutLabel()
        self.readout.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(bar)
        self._bar = bar
        # the range note's own line, used when the option bar has no room for all of it (_place_note)
        self.note_row = QHBoxLayout()
        self.note_row.setContentsMargins(8, 0, 4, 0)
        lay.addLayout(self.note_row)
        lay.addWidget(self.glw, 1)
        lay.addWidget(self.readout)

        # -- state (clear() sets the empty state: no map, placeholder, no ticks)
        self._overview_title = ""
        self._reset_pending = True  # (clear() sets it too)
        self.weights: np.ndarray | None = None  # exact map (short prompts)
        self.pooled: PooledMap | None = None  # long prompts
        self.tile: tuple[np.ndarray, int, int] | None = None  # (exact tile, r0, c0) over the overview
        self.clear()
        self.q_tokens: list[Token] = []
        self.k_tokens: list[Token] = []
        self.q_offset = 0
        self.k_offset = 0
        self.auto_max = 1.0
        self.shared_max: float | None = None
        self._pending_tile: tuple[int, int, int, int] | None = None
        self._resize_timer = QTimer(self)  # re-request a long overview at the plot's new size
        self._resize_timer.setSingleShot(True)
        self._resize_timer.setInterval(300)
        self._resize_timer.timeout.connect(self.optionsChanged.emit)
        self._tile_timer = QTimer(self)
        self._tile_timer.setSingleShot(True)
        self._tile_timer.setInterval(150)
        self._tile_timer.timeout.connect(self._maybe_request_tile)

        self.plot.sigRangeChanged.connect(self._on_range_changed)
        self.glw.scene().sigMouseMoved.connect(self._on_mouse)
        self.glw.scene().sigMouseClicked.connect(self._on_click)
        self.aggregate_combo.currentIndexChanged.connect(lambda _i: self.optionsChanged.emit())
        self.weighting_combo.currentIndexChanged.connect(self._on_weighting)
        self.range_combo.currentIndexChanged.connect(self._on_range_mode)
        self.scale_combo.currentIndexChanged.connect(self._on_scale)
        self.gamma_spin.valueChanged.connect(lambda _v: self._redraw())
        # the scale follows the map's length (apply_length_defaults) until it is chosen: by a click
        # (the combo's activated, not setCurrentText) or by set_scale (a reopened session, the state)
        self._scale_user_set = False
        self.scale_combo.activated.connect(self._on_user_scale)
        self._on_scale()

    # -- options -----------------------------------------------------------------------------
    @property
    def aggregate(self) -> str:
        return self.aggregate_combo.currentData()

    @property
    def scale(self) -> str:
        return self.scale_combo.currentText()

    @property
    def weighting(self) -> str:
        """``"attention"`` or ``"value-weighted"`` (:mod:`attnscope.core.analysis.value_weighted`)."""
        return self.weighting_combo.currentData()

    def _on_weighting(self, *_):
        self.set_bar_label(self.weighting)
        self.optionsChanged.emit()  # the data must be re-requested

    #: the colour bar's label per weighting shown
    BAR_LABELS = {
        "attention": "attention weight",
        "value-weighted": "value-weighted share (α·‖v W_O‖, row-normalised)",
    }

    def set_bar_label(self, shown: str) -> None:
        """Label the colour bar with what the cells show (``"attention"`` or ``"value-weighted"``;
        a long map that falls back to attention says attention). The label is the bar's one side
        label (pyqtgraph's ColorBarItem draws it on its left axis; the tick axis stays unlabelled)."""
        self.colorbar.getAxis("left").setLabel(self.BAR_LABELS.get(shown, shown))

    @property
    def gamma(self) -> float:
        return float(self.gamma_spin.value())

    @property
    def range_mode(self) -> str:
        return self.range_combo.currentData()

    def set_aggregate(self, mode: str) -> None:
        self.aggregate_combo.setCurrentIndex(MODES.index(mode))

    def set_scale(self, scale: str, gamma: float | None = None, chosen: bool = True) -> None:
        """Show colour scale ``scale`` (and ``gamma``). ``chosen``: it counts as the user's choice (a
        reopened session, the state), so a later map's length default does not replace it."""
        if gamma is not None:
            self.gamma_spin.setValue(gamma)
        self.scale_combo.setCurrentText(scale)
        if chosen:
            self._scale_user_set = True

    @property
    def scale_chosen(self) -> bool:
        """True once the scale was chosen (a click, :meth:`set_scale`): maps' lengths no longer pick it."""
        return self._scale_user_set

    @scale_chosen.setter
    def scale_chosen(self, chosen: bool) -> None:
        self._scale_user_set = bool(chosen)

    def set_range_mode(self, mode: str) -> None:
        self.range_combo.setCurrentIndex(list(RANGE_MODES).index(mode))

    def _on_scale(self, *_):
        self.gamma_spin.setEnabled(self.scale == "power")
        self._redraw()

    def _on_range_mode(self, *_):
        if self.range_mode == "shared" and self.shared_max is None:
            self.optionsChanged.emit()  # needs the layer's heads: ask the engine
        self._redraw()

    def export_widget(self):
        """What Export → view renders: the plot (title, axes, map, colour bar), not the option bar
        above it or the hint line below (:func:`attnscope.app.paint.export_target`)."""
        return self.glw

    def value_range(self) -> tuple[float, float]:
        """``(vmin, vmax)`` of the colour range now in force."""
        if self.range_mode == "auto":
            return 0.0, max(self.auto_max, 1e-6)
        if self.range_mode == "shared" and self.shared_max is not None:
            return 0.0, max(self.shared_max, 1e-6)
        return self.levels

    def set_colormap(self, name: str) -> None:
        self.colorbar.setColorMap(qt_colormap(name))

    def _norm(self, data: np.ndarray) -> np.ndarray:
        vmin, vmax = self.value_range()
        return normalize(data, vmin, vmax, self.scale, self.gamma).astype(np.float32)

    # -- masked cells --------------------------------------------------------------------------
    def set_mask_window(self, window: int | None) -> None:
        """The sliding window (keys) the shown map was masked with, None for the causal mask only:
        cells outside it are drawn as masked (hatched) rather than as weight 0."""
        if window != self.mask_window:
            self.mask_window = window
            self._redraw()

    def _current_window(self) -> int | None:
        if self.mask_window_provider is not None:
            try:
                self.mask_window = self.mask_window_provider()
            except Exception:  # noqa: BLE001 - a provider must never break drawing; fall back to causal only
                self.mask_window = None
        return self.mask_window

    def masked(self, q_pos, k_pos) -> np.ndarray:
        """``(len(q_pos), len(k_pos))`` bool: True where the mask hid the key from the query: a later
        key (causal), or one at least ``W`` positions back (sliding window ``W``):
        :func:`attnscope.core.attention.masks.hidden_cells`."""
        return hidden_cells(q_pos, k_pos, self.mask_window)

    def _pooled_masked(self, pm) -> np.ndarray:
        """Overview blocks whose every cell is masked (:func:`attnscope.core.attention.masks.hidden_blocks`)."""
        return hidden_blocks(pm.row_edges, pm.col_edges, self.mask_window)

    def _with_mask(self, img: np.ndarray, masked: np.ndarray | None) -> np.ndarray:
        if masked is not None and masked.shape == img.shape and masked.any():
            img = img.copy()
            img[masked] = np.nan  # transparent: the hatch behind shows
        return img

    @staticmethod
    def _show_nonfinite(item, src: np.ndarray, masked: np.ndarray | None) -> bool:
        """Paint ``src``'s non-finite cells (not masked) magenta on the RGBA layer ``item``, the rest
        transparent; clear it when there are none. Returns whether there were any."""
        return show_nonfinite(item, src, masked)

    def _update_mask_legend(self, any_masked: bool, any_nonfinite: bool = False) -> None:
        self._legend_masked = any_masked
        parts = []
        if any_masked:
            what = "causal mask" + (
                f", outside the {self.mask_window:,}-key sliding window" if self.mask_window else ""
            )
            parts.append(f"▨ hatched grey: masked ({what}), not a weight of 0")
        if any_nonfinite:
            parts.append(NONFINITE_LEGEND_HTML)
        self.mask_legend.setText(" · ".join(parts))

    def _redraw(self) -> None:
        vmin, vmax = self.value_range()
        self.colorbar.axis.setTicks([colorbar_ticks(vmin, vmax, self.scale, self.gamma), []])
        self.colorbar.setLevels((0.0, 1.0))
        src = self.weights if self.pooled is None else self.pooled.image
        self._current_window()
        any_masked = any_nonfinite = False
        if src is not None:
            if self.pooled is None:
                m = (
                    self.masked([t.position for t in self.q_tokens], [t.position for t in self.k_tokens])
                    if len(self.q_tokens) == src.shape[0] and len(self.k_tokens) == src.shape[1]
                    else None
                )
            else:
                m = self._pooled_masked(self.pooled)
            any_masked = m is not None and bool(m.any())
            bad = ~np.isfinite(src)
            self.image.setImage(
                self._with_mask(self._norm(src), bad | m if m is not None and m.shape == bad.shape else bad),
                autoLevels=False,
                levels=(0.0, 1.0),
            )
            any_nonfinite = self._show_nonfinite(self.nonfinite_image, src, m)
        if self.tile is not None:
            t, r0, c0 = self.tile
            m = self.masked(np.arange(r0, r0 + t.shape[0]), np.arange(c0, c0 + t.shape[1]))
            self.tile_image.setImage(
                self._with_mask(self._norm(t), m | ~np.isfinite(t)), autoLevels=False, levels=(0.0, 1.0)
            )
            any_nonfinite = self._show_nonfinite(self.tile_nonfinite, t, m) or any_nonfinite
        self._update_mask_legend(any_masked, any_nonfinite)
        rng = (
            "fixed"
            if self.range_mode == "fixed" or (self.range_mode == "shared" and self.shared_max is None)
            else self.range_mode
        )
        lo = max(vmin, LOG_FLOOR) if self.scale == "log" else vmin  # what the bar runs from
        self.mode_label.setText(
            f"colour range [{_fmt(lo)}, {_fmt(vmax)}] ({rng}), {self.scale}"
            + (f" γ={self.gamma:g}" if self.scale == "power" else "")
            + (" · weights above the range show its top colour" if vmax < 1.0 else "")
        )
        self.mode_label.setToolTip(self.mode_label.text())
        self._place_note()

    def _place_note(self) -> None:
        """The range note ends the option bar where all of it fits there, else it takes a line of its
        own under the bar: never cut (a 1000 px window left it no width at all)."""
        bar, label = self._bar, self.mode_label
        used = bar.contentsMargins().left() + bar.contentsMargins().right()
        for i in range(bar.count()):
            item = bar.itemAt(i)
            if item is not None and item.widget() is not label:
                used += item.sizeHint().width() + bar.spacing()
        fits = self.width() - used >= label.fontMetrics().horizontalAdvance(label.text()) + 4
        in_bar = bar.indexOf(label) >= 0
        if fits and not in_bar:
            self.note_row.removeWidget(label)
            bar.insertWidget(bar.count() - 1, label, 1)  # before the closing stretch
        elif not fits and in_bar:
            bar.removeWidget(label)
            self.note_row.addWidget(label, 1)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._place_note()

    # -- data --------------------------------------------------------------------------------
    @property
    def n_rows(self) -> int:
        return (
            self.weights.shape[0]
            if self.pooled is None and self.weights is not None
            else (self.pooled.n if self.pooled is not None else 0)
        )

    @property
    def n_cols(self) -> int:
        return (
            self.weights.shape[1]
            if self.pooled is None and self.weights is not None
            else (self.pooled.n if self.pooled is not None else 0)
        )

    def set_weights(
        self,
        w: np.ndarray,
        q_tokens: list[Token],
        k_tokens: list[Token],
        title: str = "",
        q_offset: int = 0,
        k_offset: int = 0,
        reset_view: bool = True,
        auto_max: float | None = None,
        shared_max: float | None = None,
    ) -> None:
        """Show the exact map ``w`` ``(len(q_tokens), len(k_tokens))``.

        ``q_offset``/``k_offset`` are the absolute positions of row/col 0 (the image is placed
        there); ``auto_max``/``shared_max`` the upper levels of the auto and shared ranges
        (computed on the engine thread, :func:`attnscope.core.analysis.aggregate.robust_max`).
        """
        self.weights = np.asarray(w, dtype=np.float32)
        self.placeholder.hide()
        reset_view = reset_view or self._reset_pending
        self._reset_pending = False
        self.pooled, self.tile = None, None
        self._drop_tile()
        self.q_tokens, self.k_tokens = list(q_tokens), list(k_tokens)
        self.q_offset, self.k_offset = q_offset, k_offset
        self.auto_max = 1.0 if auto_max is None else auto_max
        self.shared_max = shared_max
        self._redraw()
        # after setImage: ImageItem.setRect scales by the image's current shape
        self.image.setRect(k_offset, q_offset, self.weights.shape[1], self.weights.shape[0])
        self.nonfinite_image.setRect(k_offset, q_offset, self.weights.shape[1], self.weights.shape[0])
        self.mask_bg.setRect(k_offset, q_offset, self.weights.shape[1], self.weights.shape[0])
        self.mask_bg.show()
        self._status_base = title  # what a later stale/partial status is said of: this map
        self._set_title(title)
        self.readout.setText("Hover a cell to read query → key: weight. Click a row to shade the text by it.")
        if reset_view:
            self.plot.setRange(
                xRange=(k_offset, k_offset + self.weights.shape[1]),
                yRange=(q_offset, q_offset + self.weights.shape[0]),
                padding=0.02,
            )
        self._update_ticks()

    def set_overview(
        self,
        pooled,
        tokens: list[Token],
        title: str = "",
        reset_view: bool = True,
        auto_max: float | None = None,
        shared_max: float | None = None,
    ) -> None:
        """Show a long map as its max-pooled overview (:class:`attnscope.core.analysis.aggregate.PooledMap`)."""
        self.weights, self.pooled, self.tile = None, pooled, None
        self.placeholder.hide()
        reset_view = reset_view or self._reset_pending
        self._reset_pending = False
        self._drop_tile()
        self.q_tokens = self.k_tokens = list(tokens)
        self.q_offset = self.k_offset = 0
        self.auto_max = 1.0 if auto_max is None else auto_max
        self.shared_max = shared_max
        self._redraw()
        self.image.setRect(0, 0, pooled.n, pooled.n)  # after setImage (see set_weights)
        self.nonfinite_image.setRect(0, 0, pooled.n, pooled.n)
        self.mask_bg.setRect(0, 0, pooled.n, pooled.n)
        self.mask_bg.show()
        self._overview_title = self._status_base = title
        self._status_note = ""
        if reset_view:
            self.plot.setRange(xRange=(0, pooled.n), yRange=(0, pooled.n), padding=0.02)
        self._say_tile_state(force=True)
        self._update_ticks()
        self._tile_timer.start()

    def set_tile(self, tile: np.ndarray, r0: int, c0: int) -> None:
        """Draw the exact tile ``tile`` (rows ``r0..``, cols ``c0..``) over the overview."""
        if self.pooled is None:
            return
        self.tile = (np.asarray(tile, dtype=np.float32), int(r0), int(c0))
        nr, nc = self.tile[0].shape
        if self._pending_tile == (r0, r0 + nr, c0, c0 + nc):
            self._pending_tile = None
        self._current_window()
        m = self.masked(np.arange(r0, r0 + nr), np.arange(c0, c0 + nc))
        self.tile_image.setImage(
            self._with_mask(self._norm(self.tile[0]), m | ~np.isfinite(self.tile[0])),
            autoLevels=False,
            levels=(0.0, 1.0),
        )
        if self._show_nonfinite(self.tile_nonfinite, self.tile[0], m):
            self._update_mask_legend(self._legend_masked, True)
        self.tile_image.setRect(c0, r0, nc, nr)
        self.tile_nonfinite.setRect(c0, r0, nc, nr)
        self.tile_backdrop.setRect(c0, r0, nc, nr)
        self.tile_backdrop.show()
        self.tile_frame.setRect(c0, r0, nc, nr)
        self.tile_frame.show()
        self._say_tile_state(force=True)

    def _drop_tile(self) -> None:
        """No exact tile (a new map, an overview, the empty state): its image, backdrop and frame go."""
        self.tile = None
        self._pending_tile = None
        self.tile_image.clear()
        self.tile_nonfinite.clear()
        self.tile_backdrop.hide()
        self.tile_frame.hide()

    def tile_state(self) -> str:
        """What a long map's view shows now: ``"exact"`` (every visible cell is in the exact tile),
        ``"framed"`` (part of the view is exact, inside the red frame; the rest is the overview),
        ``"computing"`` (the overview, while the exact tile of this view is being computed),
        ``"overview"`` (block maxima only); ``""`` for a short (exact) map or no map."""
        if self.pooled is None:
            return ""
        r0, r1, c0, c1 = self.visible_cells()
        if self.tile is not None and r1 > r0 and c1 > c0:
            t, tr, tc = self.tile
            tr1, tc1 = tr + t.shape[0], tc + t.shape[1]
            if tr <= r0 and tc <= c0 and r1 <= tr1 and c1 <= tc1:
                return "exact"
            if tr < r1 and r0 < tr1 and tc < c1 and c0 < tc1:
                return "framed"
        p = self._pending_tile
        if p is not None and p[0] <= r0 and p[2] <= c0 and r1 <= p[1] and c1 <= p[3]:
            return "computing"
        return "overview"

    def _tile_title(self, title: str, state: str) -> str:
        """``title`` with its ``overview: <pooling>-pooled`` part saying what the view shows (:meth:`tile_state`)."""
        match = re.search(r"overview: (\w+)-pooled", title)
        if match is None or state in ("", "overview"):
            return title
        pooled = f"{match.group(1)}-pooled"
        said = {
            "exact": "exact weights in view",
            "framed": f"exact inside the red frame, {pooled} around it",
            "computing": f"overview: {pooled} · computing the exact weights in view…",
        }[state]
        return title[: match.start()] + said + title[match.end() :]

    def _tile_readout(self, state: str) -> str:
        pm = self.pooled
        assert pm is not None  # the caller (_say_tile_state) returns first without an overview
        r, c = pm.image.shape
        blocks = f"about {pm.n / r:.1f} × {pm.n / c:.1f} cells"
        if state in ("exact", "framed") and self.tile is not None:  # (those states mean a tile is held)
            t, r0, c0 = self.tile
            where = f"rows {r0}..{r0 + t.shape[0] - 1} × cols {c0}..{c0 + t.shape[1] - 1}"
            if state == "exact":
                return f"Exact weights: every cell in view (tile {where}), recomputed from the session. Hover a cell for its weight."
            return (
                f"Exact tile: {where} (inside the red frame), recomputed from the session; outside it, "
                f"the overview's block maxima ({blocks}). Hover a cell for its weight."
            )
        if state == "computing":
            return (
                f"Computing the exact weights in view… meanwhile the overview's block maxima ({blocks}) show."
            )
        return f"Long map: overview is the max over blocks of {blocks}. Zoom in (wheel) for exact weights."

    def _say_tile_state(self, force: bool = False) -> None:
        """Title and readout say what the view shows (exact / framed / computing / overview) once it changes."""
        state = self.tile_state()
        if self.pooled is None or (state == getattr(self, "_tile_said", None) and not force):
            return
        self._tile_said = state
        self._show_title()
        self.readout.setText(self._tile_readout(state))

    def _show_title(self) -> None:
        text = self._tile_title(self._status_base, self.tile_state())
        note = getattr(self, "_status_note", "")
        self._set_title(text if not note else f"{text} · <span style='color:#b03000'>{note}</span>")

    def _set_title(self, text: str) -> None:
        """The plot's title, wrapped to the plot's width: a long title (layer, head, seq_len, scale,
        pooling, status) must never widen the graphics layout past the view, which pushed the colour
        bar and the right of the map out of sight."""
        self.plot.setTitle(text, color="k")
        self._fit_title()

    def _fit_title(self, *_) -> None:
        """Wrap the title to the map's width (the view box's) and take it out of the layout's width
        minimum, so the colour bar and the map always stay inside the view whatever the title says."""
        label = self.plot.titleLabel
        vb_w = self.plot.vb.width()
        avail = vb_w if vb_w > 80 else max(120.0, self.glw.width() - 220.0)
        label.item.setTextWidth(-1)
        if label.item.boundingRect().width() > avail:
            self._words_only(label)
            label.item.setTextWidth(avail)  # wraps onto a second line, after a "·" (title_breaks)
            if label.item.document().idealWidth() > avail + 0.5:  # one part is wider than the map:
                plain = label.text  # let it wrap at its spaces too (never inside a word)
                pg.LabelItem.setText(label, title_breaks(plain, at_separators=False))
                label.text = plain
                self._words_only(label)
                label.item.setTextWidth(avail)
        label.resizeEvent(None)  # place the (re)wrapped text again: setTitle centred the unwrapped one
        h = label.item.boundingRect().height()
        label.setMinimumWidth(0)
        # LabelItem answers sizeHint from this table (pyqtgraph's LabelItem.updateMin fills it)
        label._sizeHint[Qt.SizeHint.MinimumSize] = (0, h)
        label._sizeHint[Qt.SizeHint.PreferredSize] = (0, h)
        # the title row as high as its wrapped lines: pyqtgraph fixes it at 30 px (one line), and a
        # title wrapped to three lines at 1000 px with the Why dock open was drawn over the map's top
        # cells (tests/app/test_map_labels_fit_gui.py)
        label.setMaximumHeight(h)
        self.plot.layout.setRowFixedHeight(0, h)
        label.updateGeometry()

    @staticmethod
    def _words_only(label) -> None:
        """Qt's default wrap breaks a word that does not fit anywhere in it: break only between words
        (a part too wide then shows as too wide, which :meth:`_fit_title` measures)."""
        doc = label.item.document()
        option = doc.defaultTextOption()
        if option.wrapMode() != QTextOption.WrapMode.WordWrap:
            option.setWrapMode(QTextOption.WrapMode.WordWrap)
            doc.setDefaultTextOption(option)

    def clear(self) -> None:
        self.weights, self.pooled, self.tile = None, None, None
        self.image.clear()
        self.nonfinite_image.clear()
        self._drop_tile()
        self.row_frame.hide()
        self.mask_bg.hide()
        self.mask_legend.setText("")
        for ax in ("left", "bottom"):
            self.plot.getAxis(ax).setTicks([[], []])  # token labels once there is a map (_update_ticks)
        self._status_base = ""
        self._set_title("")
        self.plot.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
        self.placeholder.show()
        self._reset_pending = True  # the next map is shown whole, whatever zoom was kept before
        self.readout.setText("Run a prompt to see attention.")

    # -- zoom: ticks and tiles -------------------------------------------------------------------
    def _on_range_changed(self, *_):
        self._update_ticks()
        if self.pooled is not None:
            self._say_tile_state()
            self._tile_timer.start()

    def visible_cells(self) -> tuple[int, int, int, int]:
        """``(r0, r1, c0, c1)``: the rows and cols at least partly visible, clipped to the map."""
        (x0, x1), (y0, y1) = self.plot.getViewBox().viewRange()
        n_r, n_c = self.n_rows, self.n_cols
        r0, r1 = max(0, int(math.floor(y0))), min(n_r, int(math.ceil(y1)))
        c0, c1 = max(0, int(math.floor(x0))), min(n_c, int(math.ceil(x1)))
        return r0, r1, c0, c1

    def _maybe_request_tile(self) -> None:
        if self.pooled is None or self.pooled.partial:  # the finished overview asks again
            return
        r0, r1, c0, c1 = self.visible_cells()
        if r1 <= r0 or c1 <= c0 or r1 - r0 > TILE_MAX or c1 - c0 > TILE_MAX:
            return
        if self.tile is not None:
            t, tr, tc = self.tile
            if tr <= r0 and tc <= c0 and r1 <= tr + t.shape[0] and c1 <= tc + t.shape[1]:
                return  # the tile we have covers the view
        # ask for a margin around the view so that small pans need no new tile
        mr, mc = (r1 - r0) // 4, (c1 - c0) // 4
        want = (max(0, r0 - mr), min(self.n_rows, r1 + mr), max(0, c0 - mc), min(self.n_cols, c1 + mc))
        self._pending_tile = want
        self._say_tile_state()
        self.tileWanted.emit(*want)

    def _update_ticks(self, *_):
        if not hasattr(self, "pooled") or self.n_rows == 0:  # (a resize fires during __init__ too)
            return
        vb = self.plot.getViewBox()
        (x0, x1), (y0, y1) = vb.viewRange()
        px_per_col = max(1.0, vb.width()) / max(1e-9, x1 - x0)
        px_per_row = max(1.0, vb.height()) / max(1e-9, y1 - y0)
        self._set_axis_ticks("bottom", self.k_tokens, self.k_offset, x0, x1, px_per_col, horizontal=True)
        self._set_axis_ticks("left", self.q_tokens, self.q_offset, y0, y1, px_per_row, horizontal=False)

    def _set_axis_ticks(
        self,
        axis: str,
        tokens: list[Token],
        offset: int,
        lo: float,
        hi: float,
        px_per_cell: float,
        horizontal: bool,
    ) -> None:
        """Label every ``stride``-th visible token, ``stride`` from the labels' measured size.

        Bottom labels are side by side, so they need their widest label's width (+ a gap) per
        label; left labels are stacked and need one line height. Only the visible range is
        labelled, so a zoom into a 8k-token map costs as little as a short one.
        """
        ax = self.plot.getAxis(axis)
        n = len(tokens)
        first = max(0, int(math.floor(lo)) - offset)
        last = min(n, int(math.ceil(hi)) + 1 - offset)
        if last <= first:
            ax.setTicks([[], []])
            return
        fm = QFontMetrics(ax.style["tickFont"] or ax.font())
        sample = range(first, last, max(1, (last - first) // 200))  # bounded work on long maps
        if horizontal:
            need = (
                float(np.percentile([fm.horizontalAdvance(token_label(tokens[i].text)) for i in sample], 75))
                + 6
            )
        else:
            labels = [token_label(tokens[i].text) for i in range(first, min(last, first + 400))]
            need = stacked_label_pitch(fm, labels, neighbours=True)  # every row labelled if this fits
            if need > px_per_cell:  # a subset: any two labels may then meet
                need = stacked_label_pitch(
                    fm, [token_label(tokens[i].text) for i in sample], neighbours=False
                )
        stride = max(1, math.ceil(need / max(px_per_cell, 1e-9)))
        first -= first % stride  # labels sit on multiples of the stride: they stay put while panning
        ticks, right = [], -math.inf
        for i in range(first, last, stride):
            label = token_label(tokens[i].text)
            if horizontal:  # a longer-than-typical label skips its neighbours instead of overlapping them
                centre = (i + 0.5) * px_per_cell
                half = fm.horizontalAdvance(label) / 2
                if centre - half < right + 6:
                    continue
                right = centre + half
            ticks.append((offset + i + 0.5, label))
        ax.setTicks([ticks, []])

    # -- hover and click ---------------------------------------------------------------------------
    def value_at(self, row: int, col: int) -> tuple[float, bool]:
        """``(weight, exact)`` at absolute ``(row, col)``: exact from the map or a tile, else the pooled max."""
        if self.weights is not None:
            return float(self.weights[row - self.q_offset, col - self.k_offset]), True
        if self.tile is not None:
            t, r0, c0 = self.tile
            if r0 <= row < r0 + t.shape[0] and c0 <= col < c0 + t.shape[1]:
                return float(t[row - r0, col - c0]), True
        pm = self.pooled
        if pm is None:
            raise ValueError("no map is shown")
        a = int(np.searchsorted(pm.row_edges, row, side="right") - 1)
        b = int(np.searchsorted(pm.col_edges, col, side="right") - 1)
        return float(pm.image[a, b]), False

    def cell_text(self, row: int, col: int) -> str:
        """Readout of one cell (``row``/``col`` index the tokens): query and key with raw token,
        id and position, then the weight (``≤`` when only the pooled max is known)."""
        q, k = self.q_tokens[row], self.k_tokens[col]
        v, exact = self.value_at(row + self.q_offset, col + self.k_offset)
        agg = "" if self.aggregate == "head" else f" ({MODE_LABELS[self.aggregate].lower()})"
        val = weight_text(v, self.scale)
        if not exact:  # (a block max of 0: every cell of the block is 0 or masked)
            val = f"≤ {val if v else 0} (block max; zoom in for the exact weight)"
        if k.position > q.position:
            val = "0 (masked: a later key, the causal mask hides it)"
        elif self.mask_window is not None and k.position <= q.position - self.mask_window:
            val = f"0 (masked: {q.position - k.position} keys back, outside the {self.mask_window}-key sliding window)"
        sink = ""
        ls = self.learned_share
        if ls is not None and 0 <= q.position < len(ls):
            sink = f"  ·  learned sink: {weight_text(float(ls[q.position]), self.scale)} of this row"
        return (
            f"query {q.text!r} #{q.position} (id {q.id}, raw {q.raw!r})  →  key {k.text!r} #{k.position} "
            f"(id {k.id}, raw {k.raw!r}):  weight{agg} {val}{sink}"
        )

    def _cell_at(self, scene_pos) -> tuple[int, int] | None:
        if self.n_rows == 0 or not self.plot.sceneBoundingRect().contains(scene_pos):
            return None
        p = self.plot.getViewBox().mapSceneToView(scene_pos)
        col = int(math.floor(p.x())) - self.k_offset
        row = int(math.floor(p.y())) - self.q_offset
        if 0 <= row < len(self.q_tokens) and 0 <= col < len(self.k_tokens):
            return row, col
        return None

    def _on_mouse(self, pos) -> None:
        cell = self._cell_at(pos)
        if cell is not None:
            text = self.cell_text(*cell)
            self.readout.setText(text)
            self.hovered.emit(text)

    def _on_click(self, ev) -> None:
        cell = self._cell_at(ev.scenePos())
        if cell is not None:
            self.mark_row(cell[0] + self.q_offset)
            self.rowClicked.emit(cell[0] + self.q_offset)
            self.cellClicked.emit(cell[0] + self.q_offset, cell[1] + self.k_offset)

    def mark_row(self, row: int | None) -> None:
        """Outline query row ``row`` (absolute position) across the map, or remove the outline (None)."""
        if row is None or self.n_cols == 0:
            self.row_frame.hide()
            return
        self.row_frame.setRect(self.k_offset, row, self.n_cols, 1)
        self.row_frame.show()

    # -- long maps: colours by length, overview at the view's pixel size, partial/stale titles -----
    def apply_length_defaults(self, n: int, weights=None) -> str:
        """Pick the colour scale for a map of ``n`` tokens unless the user chose one: from the map's own
        ``weights`` when given (:func:`attnscope.core.io.colour_scale.scale_for_map`: log when fewer than a
        quarter of its cells show on linear [0, 1], which is then a flat field), else by length (log
        from 2,048 tokens: a long map's overview is not held whole). Long maps also fill the plot's
        rectangle (aspect unlocked) so a wide window is used. Returns the title note for the scale."""
        from attnscope.core.io.colour_scale import (
            ScaleChoice,
            default_colour_scale,
            scale_for_map,
            scale_note,
        )

        by_length = not self._scale_user_set
        choice = ScaleChoice(default_colour_scale(n), n) if weights is None else scale_for_map(weights, n=n)
        if by_length and self.scale != choice.scale:
            self.scale_combo.blockSignals(True)
            self.scale_combo.setCurrentText(choice.scale)
            self.scale_combo.blockSignals(False)
            self.gamma_spin.setEnabled(self.scale == "power")
        self.plot.setAspectLocked(n <= LONG_SQUARE)
        if not by_length:
            return scale_note(n, self.scale, False)
        return choice.note() if weights is not None else scale_note(n, self.scale, n >= LONG_SCALE_NOTE)

    def _on_user_scale(self, *_):
        self._scale_user_set = True
        self.optionsChanged.emit()  # the title says the scale: re-request (cheap for a shown map)

    def overview_pixels(self) -> tuple[int, int]:
        """``(columns, rows)`` for a long map's pooled overview: the plot's size in device pixels
        (a little under it, so no overview pixel is dropped by the display's resampling: each one
        is a block max, and a one-cell sink column is one of them), within [256, 4096]."""
        rect = self.plot.getViewBox().sceneBoundingRect()
        ratio = self.devicePixelRatioF() if hasattr(self, "devicePixelRatioF") else 1.0
        w, h = rect.width() * ratio * 0.96, rect.height() * ratio * 0.96
        if w < 64 or h < 64:  # not laid out yet
            w = h = 1024
        return int(min(4096, max(256, w))), int(min(4096, max(256, h)))

    def _overview_follows_size(self, *_) -> None:
        """A long map's overview is computed at the plot's pixel size: when the plot settles at
        another size (first layout, a resized window or splitter), ask for it again (debounced), so
        every overview pixel stays one block max on screen and no sink column is resampled away."""
        pm = getattr(self, "pooled", None)
        if pm is None or self.tile is not None:  # (fires during __init__ too)
            return
        rows, cols = pm.image.shape
        want_cols, want_rows = (min(pm.n, x) for x in self.overview_pixels())
        if abs(want_cols - cols) > 0.05 * cols or abs(want_rows - rows) > 0.05 * rows:
            self._resize_timer.start()

    def show_status(self, title: str, status: str = "") -> None:
        """Title plus a status such as ``"partial: 40 % of rows, refining"`` or ``"stale: …"``."""
        self._status_base = title
        self._status_note = status
        self._show_title()

    #: the title while a prompt runs and no map is shown (nothing of an earlier state)
    PREFILL_TITLE = "Running the prompt (prefill)… the map comes when it ends; Esc cancels."

    def show_prefilling(self, on: bool) -> None:
        """A prompt runs (``on``, the state's ``prefilling``) or ended: with no map shown the title,
        placeholder and readout say it runs (never the words of the state before); after it, the
        placeholder's words come back for the next empty state."""
        if on:
            if self.weights is None and self.pooled is None:
                self.plot.setTitle(self.PREFILL_TITLE)
                self._placeholder = getattr(self, "_placeholder", None) or self.placeholder.toPlainText()
                self.placeholder.setText("The prompt is running (prefill)…")
                self.readout.setText("The prompt is running: the map comes when the prefill ends.")
        elif getattr(self, "_placeholder", None):
            self.placeholder.setText(self._placeholder)

    def mark_stale(self, why: str = "stale: computing the new map…") -> None:
        """Say that the map on screen no longer matches the request (a new prompt, a long recompute):
        the title of the map shown (its layer, head and seq_len, set with it) plus ``why``."""
        if self.weights is not None or self.pooled is not None:
            self.show_status(getattr(self, "_status_base", "") or self.plot.titleLabel.text, why)
