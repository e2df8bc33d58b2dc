"""The decode timeline: a slider over steps ``0 .. n_generated``.

Step ``t`` shows the session as it was after ``t`` decode steps: the maps' first
``n_prompt + t`` rows and columns, exact because with a causal mask earlier rows never change
(:mod:`attnscope.core.analysis.timeline`). Nothing is recomputed or stored per step; dragging the slider only crops.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSlider, QToolButton, QWidget


class TimelineBar(QWidget):
    """``Timeline [----o----] step t / N`` plus a "Latest" button.

    The slider follows new steps while it sits at the latest step; moved back, it stays where
    the user put it. Emits ``stepChanged(step)``.
    """

    stepChanged = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(QLabel("Timeline"))
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(0, 0)
        self.slider.setPageStep(1)
        self.slider.setTickPosition(QSlider.TickPosition.TicksBelow)
        self.slider.setToolTip("Replay the weights as they were after each decode step (0 = after prefill)")
        lay.addWidget(self.slider, 1)
        self.label = QLabel("step 0 / 0")
        self.label.setFixedWidth(250)
        lay.addWidget(self.label)
        self.latest_button = QToolButton()
        self.latest_button.setText("Latest »")
        self.latest_button.setToolTip("Jump to the newest step and follow new ones")
        lay.addWidget(self.latest_button)
        self.n_prompt = 0
        self.slider.valueChanged.connect(self._on_value)
        self.latest_button.clicked.connect(lambda: self.slider.setValue(self.slider.maximum()))

    @property
    def step(self) -> int:
        return self.slider.value()

    @property
    def n_generated(self) -> int:
        return self.slider.maximum()

    @property
    def at_latest(self) -> bool:
        return self.slider.value() == self.slider.maximum()

    @property
    def visible_len(self) -> int:
        """Tokens shown at the current step: ``n_prompt + step``."""
        return self.n_prompt + self.step

    def set_range(self, n_prompt: int, n_generated: int) -> None:
        """New sequence state; keeps the chosen step unless it was the latest (then follows)."""
        follow = self.at_latest or self.slider.value() > n_generated
        self.n_prompt = n_prompt
        self.slider.blockSignals(True)
        self.slider.setRange(0, n_generated)
        if follow:
            self.slider.setValue(n_generated)
        self.slider.blockSignals(False)
        self._update_label()

    def set_step(self, step: int) -> None:
        """Move to ``step``. Raises IndexError outside ``0 .. n_generated``."""
        if not 0 <= step <= self.slider.maximum():
            raise IndexError(f"step {step} out of range 0..{self.slider.maximum()}")
        self.slider.setValue(step)

    def show_running(self, text: str) -> None:
        """While a prompt runs with no sequence shown yet: ``text`` instead of "no sequence yet: run a
        prompt" (``""``: back to the label of the range)."""
        self._running_text = text
        self._update_label()

    def _on_value(self, v: int) -> None:
        self._update_label()
        self.stepChanged.emit(v)

    def _text(self, t: int, N: int) -> str:
        what = "after prefill" if t == 0 else f"after {t} decode step{'s' if t > 1 else ''}"
        return f"step {t} / {N} · {what} · positions 0..{self.n_prompt + t - 1}"

    def _update_label(self) -> None:
        t, N = self.step, self.slider.maximum()
        if self.n_prompt + t == 0:
            self.label.setText(getattr(self, "_running_text", "") or "no sequence yet: run a prompt")
        else:
            self.label.setText(self._text(t, N))
        # one width for the whole range (its widest label), so the slider keeps its length while
        # it is dragged; it changes only with the range (a new token)
        fm = self.label.fontMetrics()
        widest = max(fm.horizontalAdvance(self._text(N, N)), fm.horizontalAdvance(self.label.text()))
        self.label.setFixedWidth(max(250, widest + 8))
        self.latest_button.setEnabled(t != N)


class LiveSequenceNote(QLabel):
    """The header line of a tab that computes on the live sequence (every position, the newest
    included) rather than on the timeline's step: shown while the timeline sits at an earlier step,
    saying which positions the tab shows; hidden at the newest step, where both agree.

    ``state`` is the window's :class:`attnscope.app.state.ViewState` (its ``snapshot`` and ``step``)."""

    def __init__(self, state, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.setWordWrap(True)
        self.setStyleSheet("color:#7a4a00; background:#fff6e0; padding:3px;")
        state.events.changed.connect(
            lambda names: self.update_text() if {"step", "snapshot"} & names else None
        )
        self.update_text()

    def update_text(self) -> None:
        s = self.state
        snap = s.snapshot
        if snap is None or snap.seq_len == 0 or s.at_latest:
            self.setText("")
            self.hide()
            return
        n = snap.seq_len
        self.setText(
            f"Live sequence: this tab shows all {n} positions (0..{n - 1}), not the timeline's step "
            f"{s.step} of {snap.n_generated} (positions 0..{s.visible_len - 1}) that Heatmap, Head grid, Mask, Sinks "
            "and GQA show. Latest » lines them up."
        )
        self.show()
