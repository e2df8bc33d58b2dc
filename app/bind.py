"""Two-way bindings between Qt widgets and :class:`attnscope.app.state.ViewState` fields.

A bound widget writes the state from its own change signal; the state's event writes the widget
back with the widget's signals blocked, and only when the widget shows another value, so neither
side echoes the other (napari: "model → widget updates block the widget's own signals").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QSignalBlocker
from PySide6.QtWidgets import QComboBox, QSpinBox


def bind(
    state,
    field: str,
    widget,
    signal,
    get: Callable[[], Any],
    put: Callable[[Any], None],
    to_state: Callable[[Any], Any] = lambda v: v,
    from_state: Callable[[Any], Any] = lambda v: v,
) -> None:
    """Keep ``state.<field>`` and a widget in step. ``get()``/``put(v)`` read and write the widget;
    ``to_state``/``from_state`` convert between the widget's value and the field's. The widget is
    set from the state once now."""

    def on_widget(*_args) -> None:
        setattr(state, field, to_state(get()))

    def on_state(value) -> None:
        v = from_state(value)
        if get() != v:
            blocker = QSignalBlocker(widget)
            try:
                put(v)
            finally:
                blocker.unblock()
            if get() != v:  # the widget refused it (a spin box clamps to its range): follow the widget
                on_widget()

    signal.connect(on_widget)
    getattr(state.events, field).connect(on_state)
    on_state(getattr(state, field))


def bind_spin(state, field: str, spin: QSpinBox) -> None:
    """``state.<field>`` (int) ⇄ ``spin``'s value."""
    bind(state, field, spin, spin.valueChanged, spin.value, spin.setValue)


def bind_colour_combo(state, combo: QComboBox) -> None:
    """``state.colour.cmap`` ⇄ the colour map combo's text."""
    from dataclasses import replace

    bind(
        state,
        "colour",
        combo,
        combo.currentTextChanged,
        combo.currentText,
        combo.setCurrentText,
        to_state=lambda text: replace(state.colour, cmap=text),
        from_state=lambda spec: spec.cmap,
    )
