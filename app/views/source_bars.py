"""Bars of a score split by source (:class:`attnscope.core.analysis.qk_sources.SourceSplit`): the top
(query-side component × key-side component) parts, the rest as one bar, the largest query-side and key-side
totals in words, and the frozen-scale approximation stated under them. Paint only: the split is computed
on the engine thread."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

POSITIVE = (70, 120, 200)
NEGATIVE = (205, 90, 70)
REST = (160, 160, 160)
NOTE = (
    "Exact up to the norms' frozen scale: the parts add up to the score; each norm's scale at the query and "
    "the key is held at its real value, so the query and key are linear in the components."
)


def source_rows(split) -> list[tuple[str, float, tuple]]:
    """``[(label, value, rgb)]`` top to bottom: each listed pair (``"q L0 MLP × k L16 H0"``), then the rest."""
    rows = [(f"q {q} × k {k}", float(v), POSITIVE if v >= 0 else NEGATIVE) for q, k, v in split.pairs]
    n_rest = len(split.components) ** 2 - len(split.pairs)
    rows.append((f"rest ({n_rest} pairs)", float(split.rest), REST))
    return rows


def _totals(items, k: int = 3) -> str:
    return ", ".join(f"{n} {v:+.3g}" for n, v in items[:k])


class SourceBars(QWidget):
    """The by-source split of one cell: a bar chart and three lines of text."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.plot = pg.PlotWidget(background="w")
        self.plot.setMenuEnabled(False)
        self.plot.setMouseEnabled(False, False)
        self.plot.hideButtons()
        item = self.plot.getPlotItem()
        item.invertY(True)
        item.showGrid(x=True, y=False, alpha=0.2)
        self.plot.addItem(pg.InfiniteLine(pos=0, angle=90, pen=pg.mkPen("#444", width=1)))
        for ax in ("left", "bottom"):
            item.getAxis(ax).setTextPen("#222")
        self.plot.setMinimumHeight(180)
        self.bars: pg.BarGraphItem | None = None
        self.rows: list[tuple[str, float, tuple]] = []
        self.totals = QLabel("")
        self.totals.setWordWrap(True)
        self.note = QLabel(NOTE)
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color:#555;")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.plot, 1)
        lay.addWidget(self.totals)
        lay.addWidget(self.note)

    def show_split(self, split) -> None:
        """Draw ``split`` (a :class:`attnscope.core.analysis.qk_sources.SourceSplit`)."""
        rows = source_rows(split)
        self.rows = rows
        self.bars, parts = draw_hbars(self.plot, self.bars, rows)
        lim = float(np.abs(parts).max()) if parts.size else 1.0
        lim = lim or 1.0
        self.plot.setXRange(-lim * 1.05 if (parts < 0).any() else 0.0, lim * 1.05, padding=0)
        self.plot.setYRange(-0.6, len(rows) - 0.4, padding=0)
        self.plot.setTitle(
            f"score {split.score:+.3f} at query {split.query} {split.query_token!r} → key {split.key} "
            f"{split.key_token!r}: query part × key part",
            color="#222",
            size="9pt",
        )
        self.totals.setText(
            f"Query built by: {_totals(split.query_totals)}\nKey built by: {_totals(split.key_totals)}"
        )
        self.note.setToolTip(split.approximation)

    def total(self) -> float:
        """The sum of the bars shown (the score, up to round-off)."""
        return float(sum(r[1] for r in self.rows))


def title_overhangs(plot) -> None:
    """Let ``plot``'s title (a PlotItem's or PlotWidget's pyqtgraph LabelItem, maybe two lines) overhang
    its column on the axis side instead of widening the plot: its one-line minimum width made a plot
    wider than a narrow Why dock, its right side cut (tests/app/test_why_dock_layout_gui.py). The title
    row is as high as the text (pyqtgraph fixes it at 30 px, one line). Call it again after setTitle."""
    item = plot.getPlotItem() if hasattr(plot, "getPlotItem") else plot
    label = item.titleLabel

    def update_min() -> None:  # pyqtgraph's LabelItem.updateMin (each setText and resize), width 0
        h = label.itemRect().height()
        label.setMinimumWidth(0)
        label.setMinimumHeight(h)
        label._sizeHint = {
            Qt.SizeHint.MinimumSize: (0, h),
            Qt.SizeHint.PreferredSize: (0, h),
            Qt.SizeHint.MaximumSize: (-1, -1),
            Qt.SizeHint.MinimumDescent: (0, 0),
        }
        label.updateGeometry()

    label.updateMin = update_min
    label.opts["justify"] = "right"  # a title wider than its column overhangs the axis side, not the edge
    update_min()
    label.resizeEvent(None)
    if label.isVisible():
        h = label.itemRect().height()
        label.setMaximumHeight(h)
        item.layout.setRowFixedHeight(0, h)


def draw_hbars(plot, old, rows) -> tuple[pg.BarGraphItem, np.ndarray]:
    """Horizontal bars on ``plot`` (a pyqtgraph PlotItem or PlotWidget), one per ``(label, value,
    rgb)`` of ``rows``, top to bottom from y = 0, labelled on the left axis; ``old`` (the bars drawn
    before, or None) is removed. Returns the new item and the values as a float array (the caller
    sets the ranges). The Why panel's band bars and its By source bars both draw with it."""
    if old is not None:
        plot.removeItem(old)
    parts = np.array([r[1] for r in rows], dtype=float)
    bars = pg.BarGraphItem(
        x0=np.minimum(parts, 0),
        y=np.arange(len(rows)),
        width=np.abs(parts),
        height=0.7,
        brushes=[pg.mkBrush(*r[2]) for r in rows],
        pens=[pg.mkPen(None) for _ in rows],
    )
    plot.addItem(bars)
    plot.getAxis("left").setTicks([[(i, r[0]) for i, r in enumerate(rows)]])
    return bars, parts
