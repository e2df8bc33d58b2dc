"""Head roles panel: every head's role scores and automatic label, in a sortable table.

Scores and labels are :class:`attnscope.core.analysis.roles.RoleTable` (engine thread; definitions in
:mod:`attnscope.core.analysis.roles`): previous-token, sink/delimiter and positional/local on the session's
sequence, induction on a repeated random-token probe run in a separate KV cache (computed once
per model). Click a header to sort; click a row to select the head, double-click (or Enter) to
open it in the heatmap. The label threshold re-labels at once; the local window recomputes. The last
column is each head's positional share on this sequence (:func:`attnscope.core.analysis.explain.positional_share_grid`:
near 1 the score varies with position, near 0 with content; docs "Why a head attends").
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from attnscope.app.engine import Request
from attnscope.app.tabs import PageLayout
from attnscope.app.views.head_rows import HEAD_ROLE, HeadRows, NumericItem
from attnscope.app.views.saved_controls import SavedControls
from attnscope.app.views.sinks import WrappedLabel
from attnscope.core.analysis.roles import DEFAULT_THRESHOLD, DEFAULT_WINDOW, ROLE_TITLES, ROLES, RoleTable
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDoubleSpinBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QSpinBox,
    QTableWidget,
    QWidget,
)

COLUMNS = ("Layer", "Head", "KV head", "Label", *(ROLE_TITLES[r] for r in ROLES), "positional share")


def header_text(title: str) -> str:
    """A column title on two lines at its hyphen, slash or space ("positional/\nlocal"), so that nine
    columns' headers are whole in a 1000 px window (on one line they were cut at both ends)."""
    for sep in ("/", "-", " "):
        if sep in title:
            a, b = title.split(sep, 1)
            return f"{a}{sep if sep != ' ' else ''}\n{b}"
    return title


SHARE_TIP = (
    "share of the head's score variance over this sequence's map carried by the rotary bands turning "
    "faster than every 64 tokens: near 1 by position (previous-token, local), near 0 by content (induction)"
)
ROLE_COLOURS = {
    "previous_token": "#d6eaf8",
    "induction": "#fdebd0",
    "sink": "#e5e7e9",
    "local": "#d5f5e3",
    "mixed": "#ffffff",
}
SCORE_TIPS = {
    "previous_token": "mean over rows i ≥ 2 of the weight on key i−1 (this sequence)",
    "induction": "repeated random tokens [bos] r r: mean over the second copy's rows of the weight on "
    "key i−R+1, the token after the previous occurrence (Olsson et al. 2022)",
    "sink": "mean over rows i ≥ 1 of the weight on token 0 and delimiter/special tokens (this sequence)",
    "local": "mean over rows i ≥ 1 of the weight on the `window` most recent keys, without i−1 and token 0",
}


def _roles_job(window: int):
    def job(ctx):
        from attnscope.core.analysis.roles import role_table

        return role_table(ctx.require(), window=window, cancelled=ctx.cancelled, progress=ctx.progress)

    return job


def _score_colour(v: float) -> QColor:
    """White → blue as the score goes 0 → 1 (readable black text throughout)."""
    if np.isnan(v):
        return QColor("#f4f4f4")
    t = float(np.clip(v, 0, 1))
    return QColor(int(255 - 120 * t), int(255 - 80 * t), 255)


class RolesView(QWidget, SavedControls, HeadRows):
    """The Head roles tab."""

    STATE_CONTROLS = ("threshold_spin", "window_spin", "filter_combo")  # saved in session files

    def __init__(self, state, engine, parent: QWidget | None = None):
        super().__init__(parent)
        self.state, self.engine = state, engine
        self.table_data: RoleTable | None = None
        self.table_key: tuple | None = None  # the state's sequence_key the table was computed for
        self.shares: np.ndarray | None = None  # (L, H) positional shares, for shares_key
        self.shares_key: tuple | None = None
        self.share_column = 4 + len(ROLES)
        state.events.selection.connect(lambda sel: self.on_selection(*sel))

        top = QHBoxLayout()
        top.addWidget(QLabel("Label threshold"))
        self.threshold_spin = QDoubleSpinBox()
        self.threshold_spin.setRange(0.0, 1.0)
        self.threshold_spin.setSingleStep(0.05)
        self.threshold_spin.setValue(DEFAULT_THRESHOLD)
        self.threshold_spin.setToolTip(
            "A head gets the best of previous-token / induction / local at or above "
            "this score; else sink/delimiter if that reaches it; else mixed"
        )
        top.addWidget(self.threshold_spin)
        top.addSpacing(10)
        top.addWidget(QLabel("Local window"))
        self.window_spin = QSpinBox()
        self.window_spin.setRange(2, 64)
        self.window_spin.setValue(DEFAULT_WINDOW)
        self.window_spin.setToolTip(
            "Keys counted by the positional/local score: the w most recent (recomputes)"
        )
        top.addWidget(self.window_spin)
        top.addSpacing(10)
        top.addWidget(QLabel("Show"))
        self.filter_combo = QComboBox()
        self.filter_combo.addItem("all heads", None)
        for r in (*ROLES, "mixed"):
            self.filter_combo.addItem(ROLE_TITLES[r], r)
        top.addWidget(self.filter_combo)
        top.addStretch(1)
        # under the controls, the tab's whole width (beside them, a narrow column of three lines)
        self.summary = WrappedLabel("Run a prompt to label the heads.")
        self.summary.setStyleSheet("color:#335;")

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels([header_text(c) for c in COLUMNS])
        for i, r in enumerate(ROLES):
            header = self.table.horizontalHeaderItem(4 + i)
            assert header is not None  # setHorizontalHeaderLabels made one per column
            header.setToolTip(SCORE_TIPS[r])
        share_header = self.table.horizontalHeaderItem(self.share_column)
        assert share_header is not None
        share_header.setToolTip(SHARE_TIP)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        for c in range(4):  # layer, head, KV head, label: as wide as their text; the scores share the rest
            self.table.horizontalHeader().setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(0, Qt.SortOrder.AscendingOrder)
        self.table.setToolTip(
            "Click a header to sort · click: select the head · double-click: open it in the heatmap"
        )

        self.note = WrappedLabel(
            "Scores are mean attention weights in [0, 1]. Previous-token, sink/delimiter and local are measured on "
            "this sequence; induction on repeated random tokens (computed once per model). Hover a header for its "
            "definition."
        )
        self.note.setStyleSheet("color:#555;")

        lay = PageLayout(self)  # fills the tab page: the wrapped labels never make it scroll
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(top)
        lay.addWidget(self.summary)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.note)

        self.threshold_spin.valueChanged.connect(self._on_threshold)
        self.window_spin.valueChanged.connect(lambda _v: self._request())
        self.filter_combo.currentIndexChanged.connect(lambda _i: self._apply_filter())
        self.table.cellClicked.connect(self._on_clicked)
        self.table.cellDoubleClicked.connect(self._on_activated)
        self.table.cellActivated.connect(self._on_activated)
        # a sort the user asks for shows the top of the new order (Qt keeps the scroll offset, so the
        # best-scoring heads would sit out of view); after the table's own sort, hence the 0 ms timer
        self.table.horizontalHeader().sectionClicked.connect(self._on_header_clicked)
        self._sorted_by = 0  # the column sorted by; a score column's first click sorts highest first

    #: columns holding scores: a first click on one sorts it descending (the strongest heads on top)
    SCORE_COLUMNS = frozenset(range(4, 5 + len(ROLES)))  # the role scores and the positional share

    def _on_header_clicked(self, col: int) -> None:
        if col != self._sorted_by and col in self.SCORE_COLUMNS:
            self.table.sortByColumn(col, Qt.SortOrder.DescendingOrder)
        self._sorted_by = col
        QTimer.singleShot(0, self.table.scrollToTop)

    # -- state ------------------------------------------------------------------------------------------
    def on_selection(self, layer: int, head: int) -> None:
        """Highlight the main window's head in the table (without re-selecting it)."""
        row = self.row_of(layer, head)
        if row is None or self.table.currentRow() == row:
            return
        self.table.blockSignals(True)
        self.table.setCurrentCell(row, 0)
        self.table.blockSignals(False)
        item = self.table.item(row, 0)
        if item is not None:
            self.table.scrollToItem(item, QAbstractItemView.ScrollHint.PositionAtCenter)

    def row_of(self, layer: int, head: int) -> int | None:
        """Table row showing ``(layer, head)`` (after sorting), or None."""
        for row in range(self.table.rowCount()):
            if self.head_at(row) == (layer, head):
                return row
        return None

    def refresh(self) -> None:
        if self.table_data is None or self.table_key != self.state.sequence_key:
            self._request()

    def _request(self) -> None:
        if not self.state.has_sequence:
            return
        self.summary.setText("Computing role scores (the induction probe runs once per model)…")
        key = self.state.sequence_key
        self.engine.submit(
            "roles",
            Request(
                _roles_job(self.window_spin.value()),
                lambda t: self.set_table(t, key),
                "head roles",
                key=lambda: self.state.sequence_key,
            ),
        )
        from attnscope.app.jobs import share_grid_job

        self.engine.submit(
            "roles-share",
            Request(
                share_grid_job(),
                lambda g: self.set_shares(g, key),
                "positional share",
                key=lambda: self.state.sequence_key,
                on_error=lambda _m: self.set_shares(None, key),
            ),
        )

    def set_shares(self, shares, key: tuple | None = None) -> None:
        """The positional-share column (``(L, H)``, or None where the model has none to give: "—")."""
        self.shares = None if shares is None else np.asarray(shares, dtype=np.float32)
        self.shares_key = self.state.sequence_key if key is None else key
        if self.table_data is not None:
            self._fill()

    # -- drawing -----------------------------------------------------------------------------------------
    def set_table(self, table: RoleTable, key: tuple | None = None) -> None:
        """Show ``table`` (GUI thread), labelled with the threshold shown; computed for the state's
        ``sequence_key`` ``key`` (default: now)."""
        self.table_key = self.state.sequence_key if key is None else key
        self.state.say("Head roles ready", 3000)
        if abs(table.threshold - self.threshold_spin.value()) > 1e-9:
            table = table.relabel(self.threshold_spin.value())
        self.table_data = table
        self._fill()

    def _on_threshold(self, value: float) -> None:
        if self.table_data is not None:
            self.table_data = self.table_data.relabel(value)
            self._fill()

    def _fill(self) -> None:
        t = self.table_data
        assert t is not None  # filled only once a table came (set_table, _on_threshold)
        sort_col = self.table.horizontalHeader().sortIndicatorSection()
        sort_order = self.table.horizontalHeader().sortIndicatorOrder()
        self.table.setSortingEnabled(False)
        no_map = set(getattr(t, "no_map", ()))  # a hybrid model's layers with no map: not listed
        layers = [layer for layer in range(t.n_layers) if layer not in no_map]
        self.table.setRowCount(len(layers) * t.n_heads)
        row = 0
        for layer in layers:
            for head in range(t.n_heads):
                label = str(t.labels[layer, head])
                bg = QBrush(QColor(ROLE_COLOURS.get(label, "#ffffff")))
                cells = [
                    (str(layer), layer),
                    (str(head), head),
                    (str(t.kv_head(head)), t.kv_head(head)),
                    (ROLE_TITLES[label], None),
                ]
                for c, (text, val) in enumerate(cells):
                    it = NumericItem(text)
                    it.setData(Qt.ItemDataRole.UserRole, val if val is not None else text)
                    it.setData(HEAD_ROLE, (layer, head))
                    it.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                    it.setBackground(bg)
                    self.table.setItem(row, c, it)
                for i, r in enumerate(ROLES):
                    v = float(t.scores[r][layer, head])
                    it = NumericItem("—" if np.isnan(v) else f"{v:.3f}")
                    it.setData(Qt.ItemDataRole.UserRole, v)
                    it.setData(HEAD_ROLE, (layer, head))
                    it.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                    it.setBackground(QBrush(_score_colour(v)))
                    if label == r:
                        f = it.font()
                        f.setBold(True)
                        it.setFont(f)
                    self.table.setItem(row, 4 + i, it)
                have = self.shares is not None and self.shares_key == self.table_key
                v = float(self.shares[layer, head]) if have and self.shares is not None else float("nan")
                it = NumericItem("—" if np.isnan(v) else f"{v:.3f}")
                it.setData(Qt.ItemDataRole.UserRole, v)
                it.setData(HEAD_ROLE, (layer, head))
                it.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                it.setBackground(QBrush(_score_colour(v)))
                self.table.setItem(row, self.share_column, it)
                row += 1
        self.table.setSortingEnabled(True)
        if sort_col >= 0:
            self.table.sortItems(sort_col, sort_order)
        self.on_selection(self.state.layer, self.state.head)
        counts = Counter(str(t.labels[la, h]) for la in layers for h in range(t.n_heads))
        parts = [f"{ROLE_TITLES[k]} {counts[k]}" for k in (*ROLES, "mixed") if counts[k]]
        ind = t.heads_with("induction")[:4]
        ind_text = (
            (
                "; induction heads: "
                + ", ".join(f"L{a}H{b} ({t.scores['induction'][a, b]:.2f})" for a, b in ind)
            )
            if ind
            else ""
        )
        skipped = f" · layers {', '.join(map(str, sorted(no_map)))}: no attention map" if no_map else ""
        self.summary.setText(
            f"{len(layers) * t.n_heads} heads at threshold {t.threshold:.2f}: "
            + ", ".join(parts)
            + ind_text
            + f" · local window {t.window} · seq_len {t.seq_len}"
            + skipped
        )
        self._apply_filter()

    def _apply_filter(self) -> None:
        want = self.filter_combo.currentData()
        for row in range(self.table.rowCount()):
            it = self.table.item(row, 3)
            label = it.data(Qt.ItemDataRole.UserRole) if it is not None else None
            self.table.setRowHidden(row, want is not None and label != ROLE_TITLES[want])


def install_view(window) -> RolesView:
    """Create the Head roles tab and register it with ``window.add_view("roles", ...)``."""
    view = RolesView(window.state, window.engine)
    window.add_view("roles", "Head roles", view)
    return view
