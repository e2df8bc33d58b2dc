"""The engine thread (app/engine.py) on its own, with trivial jobs: ordering, supersede, cancel, and
where garbage collection and Qt object destruction happen (a GC pass on the engine thread that frees a
Qt object deadlocks against the GUI thread; it hung CI once)."""

from __future__ import annotations

import gc
import threading
import weakref

from attnscope.app.engine import Engine, collect_garbage_on_gui_thread
from attnscope.core.errors import Cancelled
from PySide6.QtCore import QObject


def test_commands_run_in_order_and_views_supersede(qtbot):
    e = Engine()
    try:
        got: list = []
        gate = threading.Event()
        e.enqueue(lambda ctx: gate.wait(10), label="block")  # holds the worker while we queue
        for i in range(3):
            e.enqueue(lambda ctx, i=i: i, got.append)
        for i in range(5):
            e.submit("view", lambda ctx, i=i: 100 + i, got.append)
        gate.set()
        assert e.wait_idle(30)
        # commands in order, and only the newest not-yet-started view request
        assert got == [0, 1, 2, 104]
    finally:
        e.shutdown()


def test_cancel_reaches_running_and_queued_jobs_only(qtbot):
    e = Engine()
    try:
        errors: list[str] = []
        done: list = []
        started = threading.Event()

        def long_job(ctx):
            started.set()
            for _ in range(1000):
                if ctx.cancelled():
                    raise Cancelled("prefill cancelled")
                threading.Event().wait(0.01)
            return "finished"

        def queued_job(ctx):
            if ctx.cancelled():
                raise Cancelled("step cancelled")
            return "queued"

        e.enqueue(long_job, done.append, errors.append)
        e.enqueue(queued_job, done.append, errors.append)
        assert started.wait(10)
        e.cancel()
        e.enqueue(lambda ctx: "after", done.append, errors.append)
        assert e.wait_idle(30)
        # the running job stops at its checkpoint, the queued one sees the cancel, a later one runs
        assert errors == ["prefill cancelled", "step cancelled"]
        assert done == ["after"]
    finally:
        e.shutdown()


def test_garbage_is_collected_on_the_gui_thread_only(qtbot):
    e = Engine()
    assert collect_garbage_on_gui_thread() is not None
    assert not gc.isenabled()
    threads: list[str] = []

    def on_gc(phase, info):
        if phase == "start":
            threads.append(threading.current_thread().name)

    gc.callbacks.append(on_gc)
    try:
        # A Python-owned QObject in a reference cycle: only the cyclic GC can free it.
        obj = QObject()
        obj.cycle = obj
        ref = weakref.ref(obj)
        del obj

        def churn(ctx):  # allocates far past every generation threshold
            keep = [[i] for i in range(300_000)]
            return len(keep)

        e.enqueue(churn)
        assert e.wait_idle(60)
        qtbot.wait(700)  # at least one tick of the GUI-thread collector
        collect_garbage_on_gui_thread().check()
        gc.collect()
        assert threads, "no collection ran at all"
        assert set(threads) == {threading.main_thread().name}
        assert ref() is None
    finally:
        gc.callbacks.remove(on_gc)
        e.shutdown()


def test_callbacks_never_travel_to_the_engine_thread(qtbot):
    """The worker gets the job without its callbacks, so it can never drop the last reference to a
    widget a callback holds."""
    e = Engine()
    try:
        seen: list = []
        e.enqueue(lambda ctx: 7, seen.append)
        assert e.wait_idle(30)
        assert seen == [7]
        queued = []
        gate = threading.Event()
        e.enqueue(lambda ctx: gate.wait(10))
        e.enqueue(lambda ctx: 1, seen.append)
        with e.worker._lock:
            queued = list(e.worker._queue)
        gate.set()
        assert queued and all(j.on_done is None and j.on_error is None for j in queued)
        assert e.wait_idle(30)
        assert seen == [7, 1]
    finally:
        e.shutdown()


def test_a_request_after_shutdown_is_dropped_quietly(qtbot):
    """A view timer that fires after the window closed (the heatmap's exact-tile timer did) must not
    reach the worker, whose Qt object is gone: no 'Signal source has been deleted', nothing runs."""
    e = Engine()
    ran = []
    e.shutdown()
    qtbot.wait(20)
    e.submit("heatmap-tile", lambda ctx: ran.append(1), lambda r: ran.append(2))
    e.enqueue(lambda ctx: ran.append(3))
    qtbot.wait(50)
    assert ran == []
