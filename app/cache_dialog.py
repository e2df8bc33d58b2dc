"""The converted-models cache dialog, opened from the model picker: the GGUF conversion cache
(:mod:`attnscope.core.loading.conversion_cache`) and the quantised-weights cache beside it
(:mod:`attnscope.core.loading.quant_cache`), one row per entry with size, source and kind; clear one or all.
"""

from __future__ import annotations

from attnscope.core.loading.fit import (
    human_bytes,
)
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)


class ConvertedCacheDialog(QDialog):
    """The GGUF conversion cache and the quantised-weights cache beside it
    (:mod:`attnscope.core.loading.quant_cache`): one row per entry, with size, source and kind;
    clear one or all."""

    def __init__(self, parent=None):
        super().__init__(parent)
        from attnscope.core.loading.cache_folder import cache_root

        self.setWindowTitle("Converted models cache")
        self.resize(1000, 300)
        lay = QVBoxLayout(self)
        self.where = QLabel(
            f"GGUF files are converted once per load precision and kept here: {cache_root() / 'converted'}; "
            f"models opened with Quantise int8/int4 keep their quantised weights in {cache_root() / 'quantised'}"
        )
        self.where.setWordWrap(True)
        lay.addWidget(self.where)
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["Converted model", "Size", "From", "Kind"])
        self.table.horizontalHeader().setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        lay.addWidget(self.table)
        self.total = QLabel()
        lay.addWidget(self.total)
        row = QHBoxLayout()
        self.clear_one = QPushButton("Clear selected")
        self.clear_all = QPushButton("Clear all")
        close = QPushButton("Close")
        self.clear_one.clicked.connect(self._clear_selected)
        self.clear_all.clicked.connect(self._clear_all)
        close.clicked.connect(self.accept)
        row.addWidget(self.clear_one)
        row.addWidget(self.clear_all)
        row.addStretch(1)
        row.addWidget(close)
        lay.addLayout(row)
        self.refresh()

    def refresh(self) -> None:
        from attnscope.core.loading.conversion_cache import list_converted

        self.items = list_converted()
        self.table.setRowCount(len(self.items))
        for r, c in enumerate(self.items):
            name = c.name + ("" if c.complete else " (incomplete)")
            kind = getattr(c, "kind", "") or "GGUF conversion"
            for col, text in enumerate((name, human_bytes(c.size_bytes), c.source or "?", kind)):
                item = QTableWidgetItem(text)
                if col == 1:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(r, col, item)
        self.table.resizeColumnsToContents()
        self.total.setText(
            f"{len(self.items)} converted model(s), {human_bytes(sum(c.size_bytes for c in self.items))}. "
            "A cleared model is converted (or quantised) again the next time it is opened."
        )
        self.clear_all.setEnabled(bool(self.items))
        self.clear_one.setEnabled(bool(self.items))

    def _clear_selected(self) -> None:
        from attnscope.core.loading.conversion_cache import clear_converted

        rows = sorted({i.row() for i in self.table.selectedIndexes()})
        for r in rows:
            clear_converted(self.items[r].name)
        self.refresh()

    def _clear_all(self) -> None:
        from attnscope.core.loading.conversion_cache import clear_converted

        clear_converted()
        self.refresh()
