"""Core's explicit garbage collections (a dropped run B, a released model) never free a Qt object
off the GUI thread: from the engine thread they run on the GUI thread (attnscope.core.memory)."""

from __future__ import annotations

import threading
import weakref

import pytest

pytest.importorskip("pytestqt")


def test_a_collection_asked_for_on_a_worker_thread_frees_qt_objects_on_the_gui_thread(qtbot):
    from attnscope.app.engine import collect_garbage_on_gui_thread
    from attnscope.core import memory
    from PySide6.QtCore import QObject

    collect_garbage_on_gui_thread()  # what every Engine does (the app has one)
    freed_on: list[str] = []

    class Cyclic(QObject):  # a parentless Qt object left in a reference cycle, as old windows are
        pass

    obj = Cyclic()
    obj.me = obj
    weakref.finalize(obj, lambda: freed_on.append(threading.current_thread().name))
    del obj
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(ran=memory.collect(timeout=10)), name="engine")
    worker.start()
    qtbot.waitUntil(lambda: not worker.is_alive(), timeout=15000)  # the GUI thread serves the request
    assert result == {"ran": True}
    assert freed_on == [threading.main_thread().name]


def test_without_a_gui_a_collection_runs_where_it_is_asked_for():
    import gc

    from attnscope.core import memory

    saved = memory._on_gui_thread
    memory.set_gui_collector(None)
    try:
        freed_on: list[str] = []

        class Node:
            pass

        n = Node()
        n.me = n
        weakref.finalize(n, lambda: freed_on.append(threading.current_thread().name))
        del n
        was = gc.isenabled()
        gc.disable()  # only the explicit collection may free it
        try:
            t = threading.Thread(target=memory.collect, name="serve")
            t.start()
            t.join(10)
        finally:
            if was:
                gc.enable()
        assert freed_on == ["serve"]
    finally:
        memory.set_gui_collector(saved)
