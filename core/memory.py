"""Collecting cyclic garbage from any thread without freeing a GUI object off its own thread.

Core code collects garbage explicitly where a model was just dropped (Compare's run B, a released
model) so its memory is back before the next one loads. In the desktop app that code runs on the
engine thread, and a collection there may free a Qt object (a window or dialog of the GUI thread
left in a reference cycle): its C++ destructor then runs on the engine thread, takes Qt's locks and
waits for the GIL the GUI thread holds, a deadlock (seen in the test suite: a remote engine's
thread freeing an earlier test's window). The app keeps automatic collection on the GUI thread
(:func:`attnscope.app.engine.collect_garbage_on_gui_thread`) and registers here a function that
runs a collection there; :func:`collect` uses it from any other thread. Without a GUI (the CLI,
``attnscope serve``, notebooks) it is plain :func:`gc.collect`.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

#: ``(timeout seconds) -> bool``: run ``gc.collect()`` on the GUI thread, wait up to ``timeout``;
#: True when it ran. Set by the app; None without a GUI.
_on_gui_thread: Callable[[float], bool] | None = None


def set_gui_collector(fn: Callable[[float], bool] | None) -> None:
    """Register (or, with None, remove) the function that collects on the GUI thread."""
    global _on_gui_thread
    _on_gui_thread = fn


def collect(timeout: float = 5.0) -> bool:
    """Collect cyclic garbage now: here on the main thread or without a GUI; from another thread,
    on the GUI thread, waiting up to ``timeout`` seconds (a busy GUI thread's own 0.5 s timer then
    collects it soon after). Returns True when a collection ran."""
    fn = _on_gui_thread
    if fn is None or threading.current_thread() is threading.main_thread():
        gc.collect()
        return True
    return bool(fn(timeout))
