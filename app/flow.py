"""A row of controls that wraps onto more lines instead of squeezing them (:class:`FlowLayout`).

A QHBoxLayout of combo boxes gives each combo less than its text needs once the row is narrower than
all of them together (a 1400 px window with the Why panel docked cut "Single head" to "Single he").
A flow keeps every unit (a label with its control, or a control alone) at its size hint and starts a
new line when the next unit does not fit; the widest unit is its minimum width. It reports
height-for-width, so the layout holding it gives it the lines it needs (Qt's flow layout example).
"""

from __future__ import annotations

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtWidgets import QLayout, QLayoutItem, QWidget, QWidgetItem


class FlowLayout(QLayout):
    """Units of widgets left to right, wrapped at the layout's width, each unit at its size hint.

    Args:
        parent: the widget it lays out (or None, to be added to another layout).
        spacing: pixels between two units on a line.
        line_spacing: pixels between two lines.
        inner: pixels between the widgets of one unit (a label and its combo).
    """

    def __init__(
        self, parent: QWidget | None = None, spacing: int = 10, line_spacing: int = 3, inner: int = 4
    ):
        super().__init__(parent)
        self._units: list[list[QLayoutItem]] = []
        self._gap, self._line_gap, self._inner = spacing, line_spacing, inner
        self._height = 0  # the height the last layout used (its lines at its width): the minimum's
        self.setContentsMargins(0, 0, 0, 0)

    # -- building ---------------------------------------------------------------------------------
    def add_unit(self, *widgets: QWidget) -> None:
        """Add ``widgets`` as one unit: kept together on one line (a label and the control it names)."""
        items: list[QLayoutItem] = []
        for w in widgets:
            self.addChildWidget(w)
            items.append(QWidgetItem(w))
        if items:
            self._units.append(items)
            self.invalidate()

    def addItem(self, item: QLayoutItem) -> None:  # noqa: N802 (Qt's name)
        """A unit of one item (what ``addWidget`` adds)."""
        self._units.append([item])

    # -- QLayout's item list ------------------------------------------------------------------------
    def _flat(self) -> list[QLayoutItem]:
        return [it for unit in self._units for it in unit]

    def count(self) -> int:
        return sum(len(unit) for unit in self._units)

    def itemAt(self, index: int) -> QLayoutItem | None:  # noqa: N802 (Qt's name)
        flat = self._flat()
        return flat[index] if 0 <= index < len(flat) else None

    def takeAt(self, index: int) -> QLayoutItem | None:  # noqa: N802 (Qt's name)
        i = index
        for unit in self._units:
            if i < len(unit):
                item = unit.pop(i)
                if not unit:
                    self._units.remove(unit)
                self.invalidate()
                return item
            i -= len(unit)
        return None

    # -- sizes ----------------------------------------------------------------------------------------
    def expandingDirections(self) -> Qt.Orientation:  # noqa: N802 (Qt's name)
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:  # noqa: N802 (Qt's name)
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 (Qt's name)
        return self._place(QRect(0, 0, width, 0), apply=False)

    def _unit_sizes(self) -> list[tuple[list[QLayoutItem], int, int]]:
        """``(shown items, width, height)`` of each unit with a shown widget, at the size hints."""
        out = []
        for unit in self._units:
            shown = [it for it in unit if not it.isEmpty()]
            if not shown:
                continue
            hints = [it.sizeHint() for it in shown]
            width = sum(h.width() for h in hints) + self._inner * (len(hints) - 1)
            out.append((shown, width, max(h.height() for h in hints)))
        return out

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        """All units on one line."""
        units = self._unit_sizes()
        m = self.contentsMargins()
        width = sum(u[1] for u in units) + self._gap * max(0, len(units) - 1)
        height = max((u[2] for u in units), default=0)
        return QSize(width + m.left() + m.right(), height + m.top() + m.bottom())

    def minimumSize(self) -> QSize:  # noqa: N802 (Qt's name)
        """The widest unit (each unit is shown whole); as high as the lines of the last layout (at
        least one), so that what holds the flow counts its wrapped lines in its own minimum height
        (a page then scrolls instead of squeezing the widgets under the flow below their minimum)."""
        units = self._unit_sizes()
        m = self.contentsMargins()
        width = max((u[1] for u in units), default=0)
        height = max((u[2] for u in units), default=0) + m.top() + m.bottom()
        return QSize(width + m.left() + m.right(), max(height, self._height))

    def setGeometry(self, rect: QRect) -> None:  # noqa: N802 (Qt's name)
        super().setGeometry(rect)
        height = self._place(rect, apply=True)
        if height != self._height:  # more or fewer lines: the minimum height changed
            self._height = height
            self.invalidate()
            parent = self.parentWidget()
            if parent is not None:
                parent.updateGeometry()

    def _place(self, rect: QRect, apply: bool) -> int:
        """Lay the units out in ``rect`` (``apply``: move the widgets); returns the height used."""
        m = self.contentsMargins()
        left, top = rect.x() + m.left(), rect.y() + m.top()
        room = max(1, rect.width() - m.left() - m.right())
        lines: list[list[tuple[list[QLayoutItem], int, int, int]]] = [[]]
        x = 0
        for shown, width, height in self._unit_sizes():
            width = min(width, room)  # a unit wider than the whole row: cut at it (a very narrow window)
            if lines[-1] and x + width > room:
                lines.append([])
                x = 0
            lines[-1].append((shown, x, width, height))
            x += width + self._gap
        y = top
        for line in lines:
            if not line:
                continue
            line_h = max(u[3] for u in line)
            if apply:
                for shown, ux, width, _h in line:
                    self._apply(shown, left + ux, y, width, line_h)
            y += line_h + self._line_gap
        used = y - top - (self._line_gap if any(lines) else 0)
        return max(0, used) + m.top() + m.bottom()

    def _apply(self, shown: list[QLayoutItem], x: int, y: int, width: int, line_h: int) -> None:
        """Place one unit's items side by side from ``x``, each vertically centred on its line."""
        end = x + width
        for it in shown:
            hint = it.sizeHint()
            w = min(hint.width(), max(0, end - x))
            h = min(hint.height(), line_h)
            it.setGeometry(QRect(x, y + (line_h - h) // 2, w, h))
            x += w + self._inner
