"""Decode side panel: sampling settings and the top-10 next-token probabilities at the current step.

The numbers come from :func:`attnscope.core.analysis.timeline.next_tokens` (engine thread): ``p_model`` is the
model's softmax (temperature 1), ``p_sampled`` the distribution the sampler draws from after
temperature, top-k and top-p (:func:`attnscope.core.sampling.filtered_probs`). The panel only draws them.
"""

from __future__ import annotations

import math

from attnscope.core.analysis.timeline import NextTokenTable
from attnscope.core.sampling import Sampling
from attnscope.core.tokens import UNKNOWN_ID_NOTE, is_unknown
from PySide6.QtCore import QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QPainter
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)


class SamplingControls(QGroupBox):
    """Greedy / sample, temperature, top-k, top-p, seed. Emits ``samplingChanged(Sampling)``."""

    samplingChanged = Signal(object)

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Sampling", parent)
        form = QFormLayout(self)
        form.setContentsMargins(6, 6, 6, 6)
        self.mode_combo = QComboBox()
        self.mode_combo.addItems(["Greedy", "Sample"])
        self.mode_combo.setToolTip(
            "Greedy takes the most likely token; Sample draws from the filtered distribution"
        )
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.05, 5.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setValue(1.0)
        self.temperature.setToolTip("Divide the logits by T before the softmax (< 1 sharpens, > 1 flattens)")
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1_000_000)
        self.top_k.setSpecialValueText("off")
        self.top_k.setToolTip("Keep only the k most likely tokens (0 = off)")
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.01, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_p.setValue(1.0)
        self.top_p.setToolTip(
            "Nucleus: keep the smallest set of likely tokens whose mass reaches p (1 = off)"
        )
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.seed.setToolTip(
            "Random seed of the sampler. A sampled token depends only on the seed and its\n"
            "position: stepping back and again, or a reopened session, draws the same token."
        )
        form.addRow("Mode", self.mode_combo)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-k", self.top_k)
        form.addRow("Top-p", self.top_p)
        form.addRow("Seed", self.seed)
        for w in (self.temperature, self.top_p):
            w.valueChanged.connect(self._changed)
        for box in (self.top_k, self.seed):
            box.valueChanged.connect(self._changed)
        self.mode_combo.currentIndexChanged.connect(self._changed)
        self._sync_enabled()

    def sampling(self) -> Sampling:
        """The settings as a :class:`attnscope.core.sampling.Sampling` (temperature 0 = greedy)."""
        greedy = self.mode_combo.currentIndex() == 0
        return Sampling(
            temperature=0.0 if greedy else float(self.temperature.value()),
            top_k=int(self.top_k.value()),
            top_p=float(self.top_p.value()),
            seed=int(self.seed.value()),
        )

    def set_sampling(self, s: Sampling) -> None:
        """Show ``s`` without emitting (e.g. the session's settings after load)."""
        for w in (self.mode_combo, self.temperature, self.top_k, self.top_p, self.seed):
            w.blockSignals(True)
        self.mode_combo.setCurrentIndex(0 if s.greedy else 1)
        if not s.greedy:
            self.temperature.setValue(s.temperature)
        self.top_k.setValue(s.top_k)
        self.top_p.setValue(s.top_p)
        self.seed.setValue(s.seed)
        for w in (self.mode_combo, self.temperature, self.top_k, self.top_p, self.seed):
            w.blockSignals(False)
        self._sync_enabled()

    def _sync_enabled(self) -> None:
        sample = self.mode_combo.currentIndex() == 1
        for w in (self.temperature, self.top_k, self.top_p, self.seed):
            w.setEnabled(sample)

    def _changed(self, *_):
        self._sync_enabled()
        self.samplingChanged.emit(self.sampling())


#: drawn for a space at either end of a candidate's text: " is" and "is" are different tokens
SPACE_MARK = "\u2423"  # ␣ OPEN BOX, as tokenizer viewers show it


def candidate_label(text: str, width: int = 11) -> str:
    """A candidate token's label: its (already visible, :func:`attnscope.core.tokens.visible_text`)
    text with each space at its start or end drawn as ``␣``, cut to ``width`` characters with ``…``;
    ``∅`` for an empty text. Inner spaces stay spaces.

    >>> candidate_label(" is"), candidate_label("is"), candidate_label("  "), candidate_label("New York ")
    ('␣is', 'is', '␣␣', 'New York␣')
    """
    if not text:
        return "\u2205"
    core = text.strip(" ")
    if not core:
        label = SPACE_MARK * len(text)
    else:
        lead = len(text) - len(text.lstrip(" "))
        trail = len(text) - len(text.rstrip(" "))
        label = SPACE_MARK * lead + core + SPACE_MARK * trail
    return label if len(label) <= width else label[: width - 1] + "…"


class TopTokenBars(QWidget):
    """Horizontal bars: one row per candidate, the model's probability and the sampler's."""

    ROW = 24
    LABEL_W = 96

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.table: NextTokenTable | None = None
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Minimum)
        self.setMinimumWidth(230)

    def sizeHint(self) -> QSize:
        n = len(self.table.rows) if self.table else 10
        legend = len(self._legend(self.table)) if self.table else 1
        return QSize(260, 10 + n * self.ROW + 16 * legend)

    def minimumSizeHint(self) -> QSize:
        return QSize(200, 120)

    #: what the empty panel says (the window says the prefill runs while it does)
    PLACEHOLDER = "Run a prompt to see the next-token distribution."
    placeholder = PLACEHOLDER

    def set_table(self, table: NextTokenTable | None) -> None:
        self.table = table
        # an id the tokenizer does not know reads <id N>: the legend says so in short, the tooltip in full
        self.setToolTip(UNKNOWN_ID_NOTE if table is not None and self.has_unknown(table) else "")
        self.stale = False
        self.updateGeometry()
        self.update()

    @staticmethod
    def has_unknown(t: NextTokenTable) -> bool:
        """Whether a candidate is an id the tokenizer does not know (:func:`attnscope.core.tokens.is_unknown`)."""
        return any(is_unknown(r.raw, r.id) for r in t.rows)

    #: True while the table shown is of an earlier run or step (drawn faded, :meth:`DecodePanel.mark_stale`)
    stale = False

    def set_placeholder(self, text: str | None = None) -> None:
        """What the empty panel says (None: :data:`PLACEHOLDER`)."""
        self.placeholder = text or self.PLACEHOLDER
        self.update()

    def paintEvent(self, _e) -> None:
        p = QPainter(self)
        p.fillRect(self.rect(), Qt.GlobalColor.white)
        if self.table is None or not self.table.rows:
            p.setPen(Qt.GlobalColor.darkGray)
            p.drawText(
                self.rect(),
                Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap,
                self.placeholder,
            )
            return
        t = self.table
        w = self.width()
        if self.stale:  # an earlier run's or step's numbers: faded, the header says why
            p.setOpacity(0.4)
        bar_x, bar_w = self.LABEL_W + 6, max(40, w - self.LABEL_W - 6 - 58)
        mono = QFont("monospace")
        mono.setStyleHint(QFont.StyleHint.Monospace)
        small = QFont(self.font())
        small.setPointSizeF(max(7.0, small.pointSizeF() - 1.5))
        sampling = not t.sampling.greedy
        for i, r in enumerate(t.rows):
            y = 4 + i * self.ROW
            chosen = t.chosen_id is not None and r.id == t.chosen_id
            if chosen:
                p.fillRect(QRect(0, y, w, self.ROW - 2), QColor(255, 243, 205))
            f = QFont(mono)
            f.setBold(chosen)
            p.setFont(f)
            p.setPen(QColor(20, 20, 20))
            label = candidate_label(r.text)
            p.drawText(
                QRect(2, y, self.LABEL_W, self.ROW - 2),
                Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignRight,
                label,
            )
            h_main = self.ROW - 10 if sampling else self.ROW - 6
            p.fillRect(QRect(bar_x, y + 2, bar_w, h_main), QColor(236, 239, 244))
            # NaN logits (a forward that overflowed, attnscope.core.trace.finite): no bar, "NaN"
            pm = r.p_model if math.isfinite(r.p_model) else 0.0
            ps = r.p_sampled if math.isfinite(r.p_sampled) else 0.0
            p.fillRect(QRect(bar_x, y + 2, max(1, round(bar_w * pm)), h_main), QColor(59, 82, 139))
            if sampling:
                p.fillRect(
                    QRect(bar_x, y + 2 + h_main + 1, max(0, round(bar_w * ps)), 4),
                    QColor(230, 120, 20),
                )
            p.setFont(small)
            p.drawText(
                QRect(bar_x + bar_w + 4, y, 56, self.ROW - 2),
                Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft,
                f"{100 * r.p_model:.1f}%",
            )
        y = 6 + len(t.rows) * self.ROW
        p.setFont(small)
        p.setPen(QColor(90, 90, 90))
        for line in self._legend(t):
            p.drawText(
                QRect(4, y, w - 8, 16), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, line
            )
            y += 16
        p.end()

    @staticmethod
    def _legend(t: NextTokenTable) -> list[str]:
        lines = ["blue: the model's p (temperature 1)"]
        if any(SPACE_MARK in candidate_label(r.text) for r in t.rows):
            lines.append(f'{SPACE_MARK} marks a space: {SPACE_MARK}is is " is"')
        if TopTokenBars.has_unknown(t):
            lines.append("<id N>: an id with no text (padded vocab)")
        if not t.sampling.greedy:
            lines.append("orange: p after temperature, top-k, top-p")
        if t.chosen_id is not None:
            lines.append("yellow row: the token generated here")
        return lines


class DecodePanel(QScrollArea):
    """Sampling controls over the next-token bars (the main window's right-hand side); scrolls
    rather than imposing its height on the window."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QScrollArea.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        inner = QWidget()
        self.setWidget(inner)
        self.setMinimumWidth(215)
        lay = QVBoxLayout(inner)
        lay.setContentsMargins(4, 0, 0, 0)
        self.controls = SamplingControls()
        self.samplingChanged = self.controls.samplingChanged
        lay.addWidget(self.controls)
        box = QGroupBox("Next token")
        bl = QVBoxLayout(box)
        bl.setContentsMargins(4, 4, 4, 4)
        self.header = QLabel("—")
        self.header.setWordWrap(True)
        bl.addWidget(self.header)
        self.bars = TopTokenBars()
        bl.addWidget(self.bars)
        lay.addWidget(box)
        lay.addStretch(1)
        # never narrower than its content (no horizontal scroll bar: it would clip the numbers)
        self.setMinimumWidth(
            max(215, inner.minimumSizeHint().width() + self.verticalScrollBar().sizeHint().width())
        )

    def sampling(self) -> Sampling:
        """The settings the controls show (:meth:`SamplingControls.sampling`)."""
        return self.controls.sampling()

    def set_sampling(self, s: Sampling) -> None:
        """Show ``s`` without emitting: a reopened session's or a reloaded model's settings."""
        self.controls.set_sampling(s)

    def set_table(self, table: NextTokenTable | None) -> None:
        """Show ``table`` (None: the empty panel); clears a stale mark."""
        self.bars.set_table(table)
        self.stale_reason = ""
        if table is None:
            self.header.setText("—")
            return
        where = "after prefill" if table.step == 0 else f"after decode step {table.step}"
        self.header.setText(
            f"Top {len(table.rows)} at position {table.position} ({where}) · entropy {table.entropy:.2f} nats"
        )

    stale_reason = ""

    def show_prefilling(self, on: bool) -> None:
        """A prompt runs (``on``, the state's ``prefilling``) or ended: what the empty bars say."""
        self.bars.set_placeholder(
            "The prompt is running (prefill)… the next-token distribution comes when it ends." if on else None
        )

    def mark_stale(self, why: str) -> None:
        """Say that the table shown is not of the sequence that now runs (a new Run, a decode): the
        header leads with ``why`` in red and the bars fade, until the next :meth:`set_table`. Nothing
        is marked when no table is shown."""
        if self.bars.table is None:
            return
        header = self.header.text()
        if self.stale_reason:
            header = header.split("<br>", 1)[-1]
        self.stale_reason = why
        self.header.setText(f"<span style='color:#b02a2a'>{why}</span><br>{header}")
        self.bars.stale = True
        self.bars.update()
