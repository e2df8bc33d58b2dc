"""Tables with one row per attention head (the Head roles and Which heads matter tabs): a cell that
sorts by its number, and the click handlers that select the row's head (double click: and show it in
the heatmap). A row's ``(layer, head)`` is stored in its first cell under :data:`HEAD_ROLE`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QTableWidget, QTableWidgetItem

if TYPE_CHECKING:
    from attnscope.app.state import ViewState

#: the item data role holding a row's ``(layer, head)`` (first column)
HEAD_ROLE = Qt.ItemDataRole.UserRole + 1


class NumericItem(QTableWidgetItem):
    """A cell that sorts by its numeric value (``Qt.ItemDataRole.UserRole``), not its text; NaN sorts lowest."""

    def __lt__(self, other):
        a, b = self.data(Qt.ItemDataRole.UserRole), other.data(Qt.ItemDataRole.UserRole)
        if isinstance(a, int | float) and isinstance(b, int | float):
            return (-1e300 if np.isnan(a) else a) < (-1e300 if np.isnan(b) else b)
        return super().__lt__(other)


class HeadRows:
    """Mixin for a view with ``self.table`` (a QTableWidget whose rows are heads, :data:`HEAD_ROLE`)
    and ``self.state`` (:class:`attnscope.app.state.ViewState`): connect ``cellClicked`` to
    :meth:`_on_clicked` and ``cellDoubleClicked`` to :meth:`_on_activated`."""

    table: QTableWidget
    state: ViewState

    def head_at(self, row: int) -> tuple[int, int] | None:
        """``(layer, head)`` shown in table row ``row`` (after sorting), None for an empty row."""
        it = self.table.item(row, 0)
        return None if it is None else tuple(it.data(HEAD_ROLE))

    def _on_clicked(self, row: int, _col: int) -> None:
        h = self.head_at(row)
        if h is not None:
            self.state.select(*h)

    def _on_activated(self, row: int, _col: int) -> None:
        h = self.head_at(row)
        if h is not None:
            self.state.select(*h)
            self.state.tab = "heatmap"
