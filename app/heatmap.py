"""One head's attention map: rows = queries (top to bottom), columns = keys (left to right).

pyqtgraph MatrixDisplay pattern: a row-major ``ImageItem`` in a ``PlotItem`` with ``invertY``, so
the causal triangle sits below the diagonal with row 0 at the top; token labels as axis ticks,
thinned to stay readable at any zoom; a ``ColorBarItem`` with explicit levels ([0, 1] for
probabilities); a hover readout "query → key: weight".
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from core.tokens import Token

pg.setConfigOptions(imageAxisOrder="row-major", antialias=False)

MAX_LABEL_CHARS = 12


def short(text: str, n: int = MAX_LABEL_CHARS) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def qt_colormap(name: str = "viridis") -> pg.ColorMap:
    """A pyqtgraph ColorMap from AttnScope's shared LUT (same colours as the headless PNGs)."""
    from core.colormaps import lut

    table = lut(name)
    return pg.ColorMap(np.linspace(0, 1, len(table)), table, name=name)


class HeatmapView(QWidget):
    """Shows a ``(n_query, n_key)`` matrix with token labels; emits ``hovered(text)``."""

    hovered = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.glw = pg.GraphicsLayoutWidget()
        self.glw.setBackground("w")
        self.plot = self.glw.addPlot()
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
        self.image = pg.ImageItem()
        self.plot.addItem(self.image)
        self.levels = (0.0, 1.0)
        self.colorbar = pg.ColorBarItem(values=self.levels, colorMap=qt_colormap(), interactive=False,
                                        label="attention weight", width=16)
        self.colorbar.setImageItem(self.image, insert_in=self.plot)
        self.readout = QLabel("Run a prompt to see attention.")
        self.readout.setTextInteractionFlags(Qt.TextSelectableByMouse)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.glw, 1)
        lay.addWidget(self.readout)
        self.weights: np.ndarray | None = None
        self.q_tokens: list[Token] = []
        self.k_tokens: list[Token] = []
        self.q_offset = 0
        self.k_offset = 0
        self.plot.sigRangeChanged.connect(self._update_ticks)
        self.glw.scene().sigMouseMoved.connect(self._on_mouse)

    # -- data --------------------------------------------------------------------------------
    def set_colormap(self, name: str) -> None:
        self.colorbar.setColorMap(qt_colormap(name))

    def set_levels(self, lo: float, hi: float) -> None:
        self.levels = (lo, hi)
        self.colorbar.setLevels((lo, hi))
        if self.weights is not None:
            self.image.setLevels(self.levels)

    def set_weights(self, w: np.ndarray, q_tokens: list[Token], k_tokens: list[Token], title: str = "",
                    q_offset: int = 0, k_offset: int = 0, reset_view: bool = True) -> None:
        """Show ``w`` ``(len(q_tokens), len(k_tokens))``; offsets are the absolute positions of row/col 0."""
        self.weights = np.asarray(w, dtype=np.float32)
        self.q_tokens, self.k_tokens = list(q_tokens), list(k_tokens)
        self.q_offset, self.k_offset = q_offset, k_offset
        self.image.setImage(self.weights, autoLevels=False, levels=self.levels)
        self.image.setRect(0, 0, self.weights.shape[1], self.weights.shape[0])
        self.plot.setTitle(title, color="k")
        self.readout.setText("Hover a cell to read query → key: weight. Click a row to shade the text by it.")
        if reset_view:
            self.plot.setRange(xRange=(0, self.weights.shape[1]), yRange=(0, self.weights.shape[0]), padding=0.02)
        self._update_ticks()

    def clear(self) -> None:
        self.weights = None
        self.image.clear()
        self.readout.setText("Run a prompt to see attention.")

    # -- ticks ----------------------------------------------------------------------------------
    def _update_ticks(self, *_):
        if self.weights is None:
            return
        vb = self.plot.getViewBox()
        (x0, x1), (y0, y1) = vb.viewRange()
        width_px = max(1.0, vb.width())
        height_px = max(1.0, vb.height())
        px_per_col = width_px / max(1e-9, x1 - x0)
        px_per_row = height_px / max(1e-9, y1 - y0)
        self._set_axis_ticks("bottom", self.k_tokens, x0, x1, px_per_col, 62.0)
        self._set_axis_ticks("left", self.q_tokens, y0, y1, px_per_row, 15.0)

    def _set_axis_ticks(self, axis: str, tokens: list[Token], lo: float, hi: float, px_per_cell: float,
                        px_per_label: float) -> None:
        n = len(tokens)
        stride = max(1, math.ceil(px_per_label / max(px_per_cell, 1e-9)))
        first = max(0, int(math.floor(lo)))
        last = min(n, int(math.ceil(hi)) + 1)
        first -= first % stride
        ticks = [(i + 0.5, short(tokens[i].text.replace(" ", "␣") if tokens[i].text.strip() == "" else tokens[i].text))
                 for i in range(first, last, stride)]
        self.plot.getAxis(axis).setTicks([ticks, []])

    # -- hover -----------------------------------------------------------------------------------
    def cell_text(self, row: int, col: int) -> str:
        """Readout of one cell: ``query 'cat' #5 → key 'the' #2: 0.1234``."""
        q, k = self.q_tokens[row], self.k_tokens[col]
        v = float(self.weights[row, col])
        return (f"query {q.text!r} #{q.position} (id {q.id}, raw {q.raw!r})  →  key {k.text!r} #{k.position} "
                f"(id {k.id}, raw {k.raw!r}):  {v:.4f}")

    def _on_mouse(self, pos) -> None:
        if self.weights is None or not self.plot.sceneBoundingRect().contains(pos):
            return
        p = self.plot.getViewBox().mapSceneToView(pos)
        col, row = int(math.floor(p.x())), int(math.floor(p.y()))
        if 0 <= row < self.weights.shape[0] and 0 <= col < self.weights.shape[1]:
            text = self.cell_text(row, col)
            self.readout.setText(text)
            self.hovered.emit(text)
