"""The "Which heads matter" tab's pictures, side by side with the layers down each: the layers × query
heads grid (grouped under their KV head, like the Head grid), the KV-head columns (each GQA group's
effect and its K/V side's), and the direct logit attribution bars (per layer: the attention heads'
sum and the MLP; above layer 0 the embedding) — :class:`EffectPlots`. A plot with nothing to show (before
the first sweep) shows a centred line saying what fills it, not empty axes."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from attnscope.app.views.sinks import SpacedTicksAxis
from attnscope.app.views.source_bars import title_overhangs
from PySide6.QtGui import QColor, QTextOption
from PySide6.QtWidgets import QGraphicsTextItem

CMAP = "CET-D1"  # diverging, symmetric about 0 (the Head grid's frames use the same sense: blue < 0)
ATTN_PEN, MLP_PEN = "#4b6fd6", "#e08a1e"
#: what each empty plot says (before the first sweep, or when "Colour by" has nothing to show)
EMPTY_GRID = "Press Run to see each head's effect on the target (Patch: the patching fractions)"
EMPTY_KV = "Each KV head's effect, after Run"
EMPTY_BARS = "Direct logit attribution per layer, after Run"
#: the bars' legend, the plot's title (above the bars, never over them)
BARS_LEGEND = (
    f'<span style="color:{ATTN_PEN}">■</span> attention&nbsp;&nbsp;<span style="color:{MLP_PEN}">■</span> MLP'
)


class Placeholder(QGraphicsTextItem):
    """A grey line centred on a plot's view box, wrapped to its width (in pixels, not data units)."""

    def __init__(self, plot: pg.PlotItem):
        super().__init__("", plot.vb)
        self.vb = plot.vb
        self.setDefaultTextColor(QColor(120, 120, 120))
        opt = QTextOption()
        opt.setAlignment(pg.QtCore.Qt.AlignmentFlag.AlignHCenter)
        opt.setWrapMode(QTextOption.WrapMode.WordWrap)
        self.document().setDefaultTextOption(opt)
        self.setZValue(100)
        self.vb.sigResized.connect(lambda _vb: self.place())

    def place(self) -> None:
        r = self.vb.boundingRect()
        self.setTextWidth(max(40.0, r.width() - 12))
        b = self.boundingRect()
        self.setPos(r.center().x() - b.width() / 2, r.center().y() - b.height() / 2)


def show_placeholder(plot: pg.PlotItem, placeholder: Placeholder, text: str, axes=("left", "bottom")) -> None:
    """``plot`` with nothing to show when ``text`` is given: ``axes`` hidden, ``text`` centred on it
    (bare 0..1 axes read as data); ``""``: the axes back, the text gone."""
    empty = bool(text)
    for name in axes:
        plot.showAxis(name, not empty)
    placeholder.setPlainText(text)
    placeholder.setVisible(empty)
    placeholder.place()


def _levels(values: np.ndarray) -> tuple[float, float]:
    lim = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
    return (-(lim or 1.0), lim or 1.0)


def dla_bars(dla) -> dict:
    """The bars of a :class:`~attnscope.core.analysis.head_effects.LogitAttribution`: ``{"attention":
    (n_layers,) the heads' sum plus the output projection's bias, "mlp": (n_layers,), "embedding": float,
    "constant": float}``; every bar together is the target logit."""
    return {
        "attention": np.nansum(dla.heads, axis=1) + np.asarray(dla.attn_bias, dtype=np.float64),
        "mlp": np.asarray(dla.mlp, dtype=np.float64),
        "embedding": float(dla.embedding),
        "constant": float(dla.constant),
    }


class EffectPlots(pg.GraphicsLayoutWidget):
    """Three plots in a row (:attr:`grid`, :attr:`kv`, :attr:`bars`), their images :attr:`image` (L, H) and
    :attr:`kv_image` (L, m)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setBackground("w")
        self.grid = self.addPlot(row=0, col=0)
        self.kv = self.addPlot(row=0, col=1)
        # its labels spaced by their width: in a narrow tab they ran together ("0 0.10.20.3")
        self.bars = self.addPlot(row=0, col=2, axisItems={"bottom": SpacedTicksAxis("bottom")})
        for p in (self.grid, self.kv, self.bars):
            p.setMenuEnabled(False)
            p.hideButtons()
            p.invertY(True)
            p.setMouseEnabled(x=False, y=False)
        self.grid.setLabel("left", "layer")
        # short axis titles: the three plots share a narrow tab (the Why dock beside it) and a longer
        # title ran into its neighbour's; the KV heads are named along the top
        self.grid.setLabel("bottom", "query head")
        self.grid.showAxis("top")
        self.kv.setLabel("bottom", "KV head")
        self.kv.getAxis("left").setStyle(showValues=False)
        self.kv.setYLink(self.grid)
        self.bars.setLabel("bottom", "DLA (logit)")
        self.bars.getAxis("bottom").enableAutoSIPrefix(False)  # (no "(x0.001)" after it)
        self.image = pg.ImageItem(axisOrder="row-major")  # rows = layers, columns = heads
        self.grid.addItem(self.image)
        self.kv_image = pg.ImageItem(axisOrder="row-major")
        self.kv.addItem(self.kv_image)
        self.colour_bar = pg.ColorBarItem(colorMap=pg.colormap.get(CMAP), interactive=False, width=10)
        self.colour_bar.setImageItem([self.image], insert_in=self.grid)
        self.kv_image.setColorMap(pg.colormap.get(CMAP))
        self.ci.layout.setColumnStretchFactor(0, 6)
        self.ci.layout.setColumnStretchFactor(1, 2)
        self.ci.layout.setColumnStretchFactor(2, 3)
        self._lines: list = []
        self._kv_line = None
        # the legend is the title above the bars (a legend inside the plot covered the top bars)
        self.bars.setTitle(BARS_LEGEND, size="8pt", color="#222")
        title_overhangs(self.bars)  # (a narrow tab: the legend runs over the axis side, not off the edge)
        self.legend = self.bars.titleLabel
        self.bar_values: dict | None = None  # what the bars show (:func:`dla_bars`)
        self._axes = {
            self.grid: ("left", "bottom", "top"),
            self.kv: ("left", "bottom"),
            self.bars: ("left", "bottom"),
        }
        self.placeholders = {p: Placeholder(p) for p in self._axes}
        for p, text in ((self.grid, EMPTY_GRID), (self.kv, EMPTY_KV), (self.bars, EMPTY_BARS)):
            self.set_empty(p, text)

    def set_empty(self, plot: pg.PlotItem, text: str = "") -> None:
        """``plot`` (:attr:`grid`, :attr:`kv` or :attr:`bars`) with nothing to show when ``text`` is given:
        its axes (and the grid's colour bar, the bars' legend) hidden, ``text`` centred on it; ``""``:
        its axes back, the text gone."""
        empty = bool(text)
        for name in self._axes[plot]:
            plot.showAxis(name, not empty)
        if plot is self.grid:
            self.colour_bar.setVisible(not empty)
        if plot is self.bars:
            self.legend.setVisible(not empty)
        ph = self.placeholders[plot]
        ph.setPlainText(text)
        ph.setVisible(empty)
        ph.place()

    def is_empty(self, plot: pg.PlotItem) -> bool:
        """True while ``plot`` shows its placeholder (:meth:`set_empty`)."""
        return self.placeholders[plot].isVisible()

    def show_heads(self, q: np.ndarray, n_kv: int, empty: str = EMPTY_GRID) -> None:
        """The layers × heads grid of ``q`` ((L, H), NaN drawn as 0), with a line between KV groups; no
        finite value: the placeholder ``empty`` instead."""
        L, H = q.shape
        if not np.isfinite(q).any():
            self.image.clear()
            for line in self._lines:
                self.grid.removeItem(line)
            self._lines = []
            self.set_empty(self.grid, empty)
            return
        self.set_empty(self.grid)
        lv = _levels(q)
        self.image.setImage(np.nan_to_num(q), levels=lv)
        self.colour_bar.setLevels(lv)
        self.image.setRect(-0.5, -0.5, H, L)
        for line in self._lines:
            self.grid.removeItem(line)
        g = H // max(1, n_kv)
        self._lines = [
            pg.InfiniteLine(pos=k * g - 0.5, angle=90, pen=pg.mkPen("#444", width=1)) for k in range(1, n_kv)
        ]
        for line in self._lines:
            self.grid.addItem(line)
        every = 1 if H <= 16 else 2 if H <= 32 else 4
        self.grid.getAxis("bottom").setTicks([[(h, str(h)) for h in range(0, H, every)]])
        self.grid.getAxis("top").setTicks([[(k * g + (g - 1) / 2, f"KV{k}") for k in range(n_kv)]])
        step = max(1, L // 15)
        self.grid.getAxis("left").setTicks([[(i, str(i)) for i in range(0, L, step)]])
        self.grid.setXRange(-0.5, H - 0.5, padding=0)
        self.grid.setYRange(-0.5, L - 0.5, padding=0)

    def show_kv(
        self, values: np.ndarray | None, labels: list[str], blocks: str = "KV head", empty: str = EMPTY_KV
    ) -> None:
        """The KV-head columns: ``values`` (L, m) with a label per column (None or empty: the placeholder
        ``empty``); ``blocks`` names them under the axis; a line parts two blocks of ``m / 2`` columns
        when ``blocks`` names two (``"group | K/V side"``)."""
        if self._kv_line is not None:
            self.kv.removeItem(self._kv_line)
            self._kv_line = None
        if values is None or not values.size:
            self.kv_image.clear()
            self.kv.getAxis("bottom").setTicks([[]])
            self.set_empty(self.kv, empty)
            return
        self.set_empty(self.kv)
        L, m = values.shape
        self.kv_image.setImage(np.nan_to_num(values), levels=_levels(values))
        self.kv_image.setRect(-0.5, -0.5, m, L)
        self.kv.getAxis("bottom").setTicks([list(enumerate(labels))])
        self.kv.setLabel("bottom", blocks)
        if "|" in blocks:
            self._kv_line = pg.InfiniteLine(pos=m / 2 - 0.5, angle=90, pen=pg.mkPen("#444", width=1))
            self.kv.addItem(self._kv_line)
        self.kv.setXRange(-0.5, m - 0.5, padding=0)

    def show_bars(self, dla, empty: str = EMPTY_BARS) -> None:
        """Per layer the attention heads' and the MLP's direct logit attribution; the embedding above layer
        0 (and the biases' constant below the last layer, where it is not 0). The legend is the plot's
        title, above the bars. ``dla`` None: the placeholder ``empty``."""
        self.bars.clear()
        if dla is None:
            self.bar_values = None
            self.bars.getAxis("left").setTicks(None)
            self.bars.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
            self.set_empty(self.bars, empty)
            return
        self.set_empty(self.bars)
        b = self.bar_values = dla_bars(dla)
        L = len(b["mlp"])
        y = np.arange(L, dtype=np.float64)
        attn = pg.BarGraphItem(x0=0, y=y - 0.2, height=0.38, width=b["attention"], brush=ATTN_PEN, pen=None)
        mlp = pg.BarGraphItem(x0=0, y=y + 0.2, height=0.38, width=b["mlp"], brush=MLP_PEN, pen=None)
        emb = pg.BarGraphItem(x0=0, y=[-1.0], height=0.6, width=[b["embedding"]], brush="#777", pen=None)
        for item in (attn, mlp, emb):
            self.bars.addItem(item)
        ticks = [(-1.0, "emb")] + [(i, str(i)) for i in range(0, L, max(1, L // 15))]
        if b["constant"]:
            self.bars.addItem(
                pg.BarGraphItem(x0=0, y=[float(L)], height=0.6, width=[b["constant"]], brush="#bbb", pen=None)
            )
            ticks.append((float(L), "bias"))
        self.bars.addItem(pg.InfiniteLine(pos=0, angle=90, pen=pg.mkPen("#444", width=1)))
        self.bars.getAxis("left").setTicks([ticks])
        self.bars.setYRange(-1.5, L - 0.5 + (1 if b["constant"] else 0), padding=0)
