"""Saving a view's own controls in a session file (``view_state`` / ``restore_view_state`` hooks).

:meth:`attnscope.app.export.ExportController.view_state` stores, under ``"views"``, what each tab returns from
``view_state()``; opening the session hands it back to ``restore_view_state()``.
"""

from __future__ import annotations

from PySide6.QtWidgets import QAbstractButton, QComboBox, QDoubleSpinBox, QSpinBox


class SavedControls:
    """Mixin for a view: its controls named in ``STATE_CONTROLS`` (attribute names, restored in that
    order) are saved and restored. A combo box is saved by its text, a spin box by its value, a
    check box by its state. Restoring skips missing names, unknown texts and bad values: an old or
    hand-edited session never breaks the window."""

    STATE_CONTROLS: tuple[str, ...] = ()

    def view_state(self) -> dict:
        state = {}
        for name in self.STATE_CONTROLS:
            w = getattr(self, name)
            if isinstance(w, QComboBox):
                state[name] = w.currentText()
            elif isinstance(w, (QSpinBox, QDoubleSpinBox)):
                state[name] = w.value()
            elif isinstance(w, QAbstractButton):
                state[name] = w.isChecked()
        return state

    def restore_view_state(self, state: dict) -> None:
        if not isinstance(state, dict):
            return
        for name in self.STATE_CONTROLS:
            if name not in state:
                continue
            w, v = getattr(self, name), state[name]
            try:
                if isinstance(w, QComboBox):
                    i = w.findText(str(v))
                    if i >= 0:
                        w.setCurrentIndex(i)
                elif isinstance(w, QDoubleSpinBox):
                    w.setValue(float(v))
                elif isinstance(w, QSpinBox):
                    w.setValue(int(v))
                elif isinstance(w, QAbstractButton):
                    w.setChecked(bool(v))
            except (TypeError, ValueError, OverflowError):
                continue
