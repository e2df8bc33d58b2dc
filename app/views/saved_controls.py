"""A view's own controls as its settings in the :class:`attnscope.app.state.ViewState`.

:meth:`SavedControls.bind_settings` keeps ``state.settings[key]`` equal to what the controls show
(``view_state()``), and applies a new entry set from outside (a reopened session) through
``restore_view_state()``. Session files store ``state.settings`` under ``"views"``.
"""

from __future__ import annotations

from PySide6.QtWidgets import QAbstractButton, QComboBox, QDoubleSpinBox, QLineEdit, QSpinBox


class SavedControls:
    """Mixin for a view: its controls named in ``STATE_CONTROLS`` (attribute names, restored in that
    order) are saved and restored. A combo box is saved by its text, a spin box by its value, a
    check box by its state, a line edit by its text. Restoring skips missing names, unknown texts and bad values: an old or
    hand-edited session never breaks the window."""

    STATE_CONTROLS: tuple[str, ...] = ()

    def bind_settings(self, state, key: str) -> None:
        """Keep ``state.settings[key]`` on this view's controls, both ways and without loops: a
        control's change writes the state; a state entry that differs from the controls is restored
        into them. The state starts with the controls' values."""
        self._settings_key = key

        def push(*_args) -> None:
            state.set_tab_settings(key, self.view_state())

        for name in self.STATE_CONTROLS:
            w = getattr(self, name)
            if isinstance(w, QComboBox):
                w.currentTextChanged.connect(push)
            elif isinstance(w, (QSpinBox, QDoubleSpinBox)):
                w.valueChanged.connect(push)
            elif isinstance(w, QAbstractButton):
                w.toggled.connect(push)
            elif isinstance(w, QLineEdit):
                w.textChanged.connect(push)

        def pull(settings: dict) -> None:
            want = settings.get(key)
            if want is not None and want != self.view_state():
                self.restore_view_state(want)

        state.events.settings.connect(pull)
        self.push_settings = push  # for a view that sets its controls with their signals blocked
        push()

    def view_state(self) -> dict:
        state: dict[str, str | int | float | bool] = {}
        for name in self.STATE_CONTROLS:
            w = getattr(self, name)
            if isinstance(w, QComboBox):
                state[name] = w.currentText()
            elif isinstance(w, (QSpinBox, QDoubleSpinBox)):
                state[name] = w.value()
            elif isinstance(w, QAbstractButton):
                state[name] = w.isChecked()
            elif isinstance(w, QLineEdit):
                state[name] = w.text()
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
                elif isinstance(w, QLineEdit) and isinstance(v, str):
                    w.setText(v)
            except (TypeError, ValueError, OverflowError):
                continue
