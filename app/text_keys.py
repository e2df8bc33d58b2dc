"""Keys that move through the maps (``PgUp``/``PgDown`` for the layer, ``[``/``]`` for the head) belong
to a text box while it has the keyboard focus.

The four are window shortcuts (View menu), so they work wherever the focus is in the window, except
in a text box (the prompt, a line edit), where a key does what it does in any editor: ``[`` and ``]``
type a bracket (a prompt may hold one), ``PgUp``/``PgDown`` move the cursor a page. Qt already gave
the bracket to the editor (a printable key overrides a shortcut there) but let ``PgDown`` through to
the layer, so in the prompt ``]`` typed while ``PgDown`` changed the layer (seen in a new-user trial).
The menu entries themselves always act, whatever has the focus; their text says "outside text boxes".

:func:`keep_keys_in_text_boxes` installs one event filter on every text box of the window, now and as
the focus reaches new ones (``QApplication.focusChanged``): on ``ShortcutOverride`` for one of the keys
it accepts the event, which tells Qt the focused widget wants the key itself.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QAbstractSpinBox, QApplication, QLineEdit, QPlainTextEdit, QTextEdit, QWidget

#: the map-navigation shortcuts (View menu) that a focused text box keeps for itself
MAP_KEYS = ("PgUp", "PgDown", "[", "]")
OUTSIDE_TEXT = "outside text boxes"  # what the View menu's entries say of their keys


def is_text_box(widget) -> bool:
    """True for a widget the user types text into: an editable plain or rich text edit, or a line
    edit that is not a spin box's (the layer and head spin boxes take numbers: the keys act there)."""
    if isinstance(widget, (QPlainTextEdit, QTextEdit)):
        return not widget.isReadOnly()
    if isinstance(widget, QLineEdit):
        parent = widget.parentWidget()
        return not widget.isReadOnly() and not isinstance(parent, QAbstractSpinBox)
    return False


class TextBoxKeys(QObject):
    """Event filter: a focused text box keeps the keys ``keys`` (QKeySequence strings) for itself."""

    def __init__(self, keys=MAP_KEYS, parent: QObject | None = None):
        super().__init__(parent)
        combos = [QKeySequence(k)[0] for k in keys]  # type: ignore[index]  # QKeyCombination (its stubs lack __getitem__)
        self._keys = {(c.key(), c.keyboardModifiers()) for c in combos}

    def wants(self, event) -> bool:
        mods = event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier  # PgDown on the keypad too
        return (Qt.Key(event.key()), mods) in self._keys

    def eventFilter(self, obj, event) -> bool:
        if event.type() == QEvent.Type.ShortcutOverride and is_text_box(obj) and self.wants(event):
            event.accept()  # the text box takes the key: no shortcut fires, the key press reaches it
            return True
        return False

    def on_focus(self, _old, new) -> None:
        """``QApplication.focusChanged``: a text box of this window that gets the focus is watched."""
        win = self.parent()
        if new is not None and isinstance(win, QWidget) and win.isAncestorOf(new):
            self.watch(new)

    def watch(self, widget) -> None:
        """Install on ``widget`` once (idempotent)."""
        if is_text_box(widget) and not widget.property("attnscopeTextKeys"):
            widget.installEventFilter(self)
            widget.setProperty("attnscopeTextKeys", True)


def keep_keys_in_text_boxes(win, keys=MAP_KEYS) -> TextBoxKeys:
    """Make every text box inside ``win`` (now, and any that gets the focus later) keep ``keys``.
    The filter is a child of ``win``: it goes with the window (and so does its focus connection)."""
    keeper = TextBoxKeys(keys, win)
    for w in win.findChildren(QWidget):
        keeper.watch(w)
    app = QApplication.instance()
    if isinstance(app, QApplication):  # (a QCoreApplication has no focus)
        app.focusChanged.connect(keeper.on_focus)
    return keeper
