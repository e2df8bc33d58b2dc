"""All heads at a glance: layers × query heads, the query heads grouped under their shared KV head.

Each thumbnail is a max-pooled map (:func:`core.pooling.head_thumbnails`). Columns are laid out in
GQA groups of ``group_size`` query heads (query head ``h`` reads KV head ``h // group_size``), with a
gap and a shaded band per group and a header "KV head k". Clicking a thumbnail emits
``headClicked(layer, head)``.
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QImage, QPainter, QPen
from PySide6.QtWidgets import QScrollArea, QSizePolicy, QWidget

from core.colormaps import to_rgb


class HeadGridCanvas(QWidget):
    headClicked = Signal(int, int)

    THUMB = 40
    GAP = 3
    GROUP_GAP = 18
    LEFT = 64
    TOP = 46

    PLACEHOLDER = "Run a prompt to see every head."

    def __init__(self, parent=None):
        super().__init__(parent)
        self.thumbs: np.ndarray | None = None  # (L, H, P, P)
        self.group_size = 1
        self.selected: tuple[int, int] | None = None
        self.cmap = "viridis"
        self._image: QImage | None = None
        self.placeholder = self.PLACEHOLDER
        self.setSizePolicy(QSizePolicy.Fixed, QSizePolicy.Fixed)
        self.setMouseTracking(True)

    def set_thumbnails(self, thumbs: np.ndarray, group_size: int) -> None:
        self.thumbs = np.asarray(thumbs, dtype=np.float32)
        self.group_size = max(1, group_size)
        self._image = self._compose()
        self.setFixedSize(self.sizeHint())
        self.update()

    def set_selected(self, layer: int, head: int) -> None:
        self.selected = (layer, head)
        self.update()

    # -- geometry -------------------------------------------------------------------------------
    def head_x(self, head: int) -> int:
        g = head // self.group_size
        return self.LEFT + head * (self.THUMB + self.GAP) + g * self.GROUP_GAP

    def layer_y(self, layer: int) -> int:
        return self.TOP + layer * (self.THUMB + self.GAP)

    def sizeHint(self) -> QSize:
        if self.thumbs is None:
            return QSize(400, 200)
        L, H = self.thumbs.shape[:2]
        return QSize(self.head_x(H - 1) + self.THUMB + 12, self.layer_y(L - 1) + self.THUMB + 12)

    def cell_at(self, pos: QPoint) -> tuple[int, int] | None:
        if self.thumbs is None:
            return None
        L, H = self.thumbs.shape[:2]
        for h in range(H):
            x = self.head_x(h)
            if x <= pos.x() < x + self.THUMB:
                layer = (pos.y() - self.TOP) // (self.THUMB + self.GAP)
                if 0 <= layer < L and pos.y() - self.layer_y(layer) < self.THUMB and pos.y() >= self.TOP:
                    return int(layer), h
        return None

    # -- drawing ------------------------------------------------------------------------------
    def _compose(self) -> QImage:
        L, H, P, _ = self.thumbs.shape
        size = self.sizeHint()
        canvas = np.full((size.height(), size.width(), 3), 255, dtype=np.uint8)
        idx = (np.arange(self.THUMB) * P // self.THUMB).clip(0, P - 1)
        n_groups = (H + self.group_size - 1) // self.group_size
        for g in range(n_groups):  # shaded band behind each GQA group
            x0 = self.head_x(g * self.group_size) - 6
            x1 = self.head_x(min(H, (g + 1) * self.group_size) - 1) + self.THUMB + 6
            canvas[self.TOP - 6 : self.layer_y(L - 1) + self.THUMB + 6, x0:x1] = (232, 236, 244) if g % 2 == 0 else (240, 236, 228)
        for layer in range(L):
            for h in range(H):
                rgb = to_rgb(self.thumbs[layer, h], self.cmap)[idx][:, idx]
                x, y = self.head_x(h), self.layer_y(layer)
                canvas[y : y + self.THUMB, x : x + self.THUMB] = rgb
        self._canvas = np.ascontiguousarray(canvas)
        return QImage(self._canvas.data, canvas.shape[1], canvas.shape[0], canvas.shape[1] * 3, QImage.Format_RGB888)

    def set_note(self, text: str) -> None:
        """A line over the grid, e.g. that it is partial while the remaining layers are computed."""
        self.note = text
        self.update()

    def set_placeholder(self, text: str) -> None:
        """What the canvas says while it has no thumbnails (nothing run yet, or computing them)."""
        self.placeholder = text
        if self._image is None:
            self.update()

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.fillRect(self.rect(), Qt.white)
        if self._image is None:
            p.setPen(Qt.darkGray)
            p.drawText(self.rect(), Qt.AlignCenter, self.placeholder)
            return
        p.drawImage(0, 0, self._image)
        L, H = self.thumbs.shape[:2]
        if getattr(self, "note", ""):
            p.setPen(QColor(176, 48, 0))
            p.drawText(QRect(0, 4, self.LEFT - 4, 36), Qt.AlignLeft | Qt.TextWordWrap, self.note)
        font = QFont(self.font())
        font.setPointSizeF(max(7.0, font.pointSizeF() - 1))
        p.setFont(font)
        p.setPen(QColor(40, 40, 40))
        n_groups = (H + self.group_size - 1) // self.group_size
        for g in range(n_groups):
            x0 = self.head_x(g * self.group_size)
            x1 = self.head_x(min(H, (g + 1) * self.group_size) - 1) + self.THUMB
            bold = QFont(font)
            bold.setBold(True)
            p.setFont(bold)
            p.drawText(QRect(x0, 4, x1 - x0, 16), Qt.AlignCenter, f"KV head {g}")
            p.setFont(font)
            for h in range(g * self.group_size, min(H, (g + 1) * self.group_size)):
                p.drawText(QRect(self.head_x(h), 22, self.THUMB, 16), Qt.AlignCenter, f"q{h}")
        for layer in range(L):
            p.drawText(QRect(0, self.layer_y(layer), self.LEFT - 8, self.THUMB), Qt.AlignRight | Qt.AlignVCenter,
                       f"layer {layer}")
        if self.selected is not None and self.selected[0] < L and self.selected[1] < H:
            layer, h = self.selected
            p.setPen(QPen(QColor(220, 30, 30), 3))
            p.drawRect(self.head_x(h) - 2, self.layer_y(layer) - 2, self.THUMB + 3, self.THUMB + 3)
        p.end()

    def mousePressEvent(self, e) -> None:
        cell = self.cell_at(e.position().toPoint())
        if cell is not None:
            self.set_selected(*cell)
            self.headClicked.emit(*cell)

    def mouseMoveEvent(self, e) -> None:
        cell = self.cell_at(e.position().toPoint())
        if cell is None:
            self.setToolTip("")
        else:
            layer, h = cell
            self.setToolTip(f"layer {layer}, query head {h} (reads KV head {h // self.group_size}); click to open")


class HeadGridView(QScrollArea):
    """Scrollable :class:`HeadGridCanvas`."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.canvas = HeadGridCanvas()
        self.setWidget(self.canvas)
        self.setWidgetResizable(False)
        self.setAlignment(Qt.AlignHCenter | Qt.AlignTop)
        self.setStyleSheet("QScrollArea { background: white; }")
        self.headClicked = self.canvas.headClicked
