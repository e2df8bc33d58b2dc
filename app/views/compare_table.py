"""The Compare tab's ranked table (:mod:`attnscope.app.views.compare`): one row per layer and head with the
Jensen–Shannon distance between A's and B's rows (mean, max, and the row of the max), most changed
first, sortable by number; a click on a row draws that head's maps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QTableWidget,
    QTableWidgetItem,
)

if TYPE_CHECKING:
    from attnscope.core.analysis.compare_runs import CompareResult

COLUMNS = ("Rank", "Layer", "Head", "JS mean", "JS max", "Max at row")


class NumItem(QTableWidgetItem):
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


class CompareTableMixin:
    """The heads table of :class:`attnscope.app.views.compare.CompareView`."""

    result: CompareResult | None  # the comparison shown (set by CompareView)

    request_maps: Callable[[int, int], None]  # draws a head's maps (attnscope.app.views.compare_maps)

    def _build_table(self) -> QTableWidget:
        """The heads table (:attr:`table`), empty until a comparison is shown."""
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
        return self.table

    def _fill_table(self, ranked: list) -> None:
        """One row per head of ``ranked`` (:meth:`attnscope.core.analysis.compare_runs.CompareResult.ranked`),
        sorted most changed first with rank 1 selected; no selection signal (the caller draws it)."""
        self.table.blockSignals(True)  # rank 1 is selected and drawn below, once
        self.table.setSortingEnabled(False)
        self.table.setRowCount(len(ranked))
        for i, d in enumerate(ranked):
            tie = -(i + 1)
            cells = (
                NumItem(i + 1, str(i + 1)),
                NumItem(d.layer, str(d.layer), tie),
                NumItem(d.head, str(d.head), tie),
                NumItem(d.js_mean, f"{d.js_mean:.3g}", tie),
                NumItem(d.js_max, f"{d.js_max:.3g}", tie),
                NumItem(d.js_argmax, str(d.js_argmax), tie),
            )
            for c, it in enumerate(cells):
                self.table.setItem(i, c, it)
        self.table.setSortingEnabled(True)
        self._fit_table_width()
        self.table.sortItems(3, Qt.SortOrder.DescendingOrder)
        self.table.clearSelection()
        self.table.selectRow(0)
        self.table.blockSignals(False)

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

    def _fit_table_width(self) -> None:
        """The table is at least as wide as its columns (and a vertical scroll bar): its last column
        is never cut off behind a horizontal scroll bar."""
        t, header = self.table, self.table.horizontalHeader()
        cols = sum(max(header.sectionSizeHint(c), t.sizeHintForColumn(c)) for c in range(t.columnCount()))
        t.setMinimumWidth(cols + t.verticalScrollBar().sizeHint().width() + 2 * t.frameWidth() + 2)
