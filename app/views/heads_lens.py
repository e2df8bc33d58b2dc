"""The "Which heads matter" tab's logit-lens grid: layers × the positions in view, each cell the top
token after that layer (the residual stream through the final norm and the unembedding,
:func:`attnscope.core.analysis.head_effects.logit_lens`) coloured by its probability; the tooltip gives
the top tokens and the rank and probability of the token the model finally predicts there.

Computed on demand for the positions asked for only (default: the last 16): all positions × all layers ×
the vocabulary is far more than a screen shows.
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

DEFAULT_LAST = 16


def parse_positions(text: str, seq_len: int) -> list[int]:
    """The positions a lens range names: empty → the last 16; ``"a-b"`` / ``"a..b"`` (inclusive), single
    positions and commas (``"0, 4-7"``); ``"last N"`` the last N.

    Raises:
        ValueError: text that is none of these, or a position outside ``0 .. seq_len - 1`` (one line)."""
    t = text.strip().lower()
    if not t:
        return list(range(max(0, seq_len - DEFAULT_LAST), seq_len))
    if t.startswith("last"):
        n = t[4:].strip()
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"positions {text!r}: 'last N' needs a whole number N >= 1")
        return list(range(max(0, seq_len - int(n)), seq_len))
    out: list[int] = []
    for part in t.replace("..", "-").split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise ValueError(
                f"positions {text!r}: give a range like 40-55, positions like 3, 7, or 'last 16'"
            ) from None
        for x in (a, b):
            if not 0 <= x < seq_len:
                raise ValueError(f"position {x} is outside the sequence 0..{seq_len - 1}")
        out += range(min(a, b), max(a, b) + 1)
    return sorted(set(out))


def lens_job(ids: tuple, positions: list[int], k: int):
    """Engine job: the logit lens at ``positions`` for the sequence ``ids``, with the texts the grid shows.

    Returns ``(LogitLens, {id: text}, [position token texts], provenance dict)``, or None when the sequence
    changed."""

    def job(ctx):
        from attnscope.core.analysis.logit_lens import logit_lens

        s = ctx.require()
        if tuple(getattr(s, "ids", ids)) != ids:
            return None
        ctx.progress(f"Logit lens at {len(positions)} positions", -1.0)
        lens = logit_lens(s, positions, k)
        dec = s.tokenizer.decode
        want = set(np.asarray(lens.top_ids).ravel().tolist()) | set(np.asarray(lens.final_ids).tolist())
        texts = {int(i): dec([int(i)]) for i in want}
        pos_texts = [dec([int(s.ids[p])]) for p in positions]
        prov = {
            "model": s.info.name,
            "prompt": s.prompt,
            "chat_template": bool(s.chat_template),
            "ids": [int(i) for i in s.ids],
            "positions": list(positions),
            "k": k,
        }
        return lens, texts, pos_texts, prov

    return job


def shown(text: str) -> str:
    """A token's text as a cell shows it: a leading space as ␣, a newline as ⏎."""
    return text.replace("\n", "⏎").replace(" ", "␣", 1) if text.startswith(" ") else text.replace("\n", "⏎")


def prob_colour(p: float) -> QColor:
    """White at probability 0 to a deep blue at 1 (a sequential map)."""
    x = float(np.clip(p, 0.0, 1.0))
    return QColor(*(int(round(255 + (c - 255) * x)) for c in (70, 110, 220)))


class LensPanel(QWidget):
    """The positions, the number of top tokens, Lens, and the grid (a table: rows are layers)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(QLabel("Logit lens at positions"))
        self.positions_edit = QLineEdit()
        self.positions_edit.setPlaceholderText(f"last {DEFAULT_LAST}")
        self.positions_edit.setToolTip(
            "The positions to read (only these are projected onto the vocabulary): empty for the last "
            f"{DEFAULT_LAST}, a range like 40-55, positions like 3, 7, or 'last N'"
        )
        self.positions_edit.setMaximumWidth(90)
        row.addWidget(self.positions_edit)
        row.addWidget(QLabel("top"))
        self.k_spin = QSpinBox()
        self.k_spin.setRange(1, 20)
        self.k_spin.setValue(5)
        self.k_spin.setToolTip("How many top tokens each cell's tooltip lists")
        row.addWidget(self.k_spin)
        self.lens_button = QPushButton("Lens")
        self.lens_button.setToolTip(
            "Read each layer's residual stream through the final norm and the unembedding"
        )
        row.addWidget(self.lens_button)
        self.caption = QLabel("Press Lens to see each layer's top token at these positions.")
        self.caption.setStyleSheet("color:#555;")
        self.caption.setWordWrap(True)  # (a long line must not widen the tab)
        row.addWidget(self.caption, 1)
        self.table = QTableWidget(0, 0)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setDefaultSectionSize(18)
        self.table.horizontalHeader().setDefaultSectionSize(64)
        self.table.setMinimumHeight(90)  # (the header and two rows: the plots above keep their 230 px)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(row)
        lay.addWidget(self.table, 1)

    def show_lens(self, lens, texts: dict, pos_texts: list[str]) -> None:
        """Fill the grid: cell ``(layer, j)`` is the top token after ``layer`` at ``lens.positions[j]``."""
        L, P = lens.top_ids.shape[:2]
        t = self.table
        t.clear()
        t.setRowCount(L)
        t.setColumnCount(P)
        t.setHorizontalHeaderLabels(
            [f"{p}\n{shown(pt)}" for p, pt in zip(lens.positions, pos_texts, strict=True)]
        )
        t.setVerticalHeaderLabels([f"L{i}" for i in range(L)])
        for i in range(L):
            for j in range(P):
                tid, p = int(lens.top_ids[i, j, 0]), float(lens.top_probs[i, j, 0])
                it = QTableWidgetItem(shown(texts.get(tid, str(tid))))
                it.setData(Qt.ItemDataRole.UserRole, tid)
                it.setBackground(prob_colour(p))
                if p > 0.55:
                    it.setForeground(QColor("white"))
                tops = "\n".join(
                    f"  {texts.get(int(x), str(int(x)))!r}  {float(q):.3f}"
                    for x, q in zip(lens.top_ids[i, j], lens.top_probs[i, j], strict=True)
                )
                fid = int(lens.final_ids[j])
                it.setToolTip(
                    f"after layer {i}, position {int(lens.positions[j])}:\n{tops}\n"
                    f"final prediction {texts.get(fid, str(fid))!r}: rank {int(lens.final_rank[i, j]) + 1}, "
                    f"p = {float(lens.final_prob[i, j]):.3f}"
                )
                t.setItem(i, j, it)
        t.scrollToBottom()
