"""The engine thread: one long-lived QThread owns the Session (model, KV cache, Trace).

The GUI thread never touches the model. It submits *jobs*, plain functions ``fn(ctx) -> result``
that run on the engine thread with ``ctx.session`` (the current :class:`attnscope.core.session.Session`);
their results (numpy arrays, frozen dataclasses) come back through a queued signal and are handed
to the job's callback on the GUI thread.

* ``enqueue(...)``: commands (load, prefill, step) run in order, none is dropped.
* ``submit(channel, request)``: view requests (:class:`Request`); a newer request on the same channel
  replaces one that has not started yet and cancels a running one (napari's "a newer request cancels
  a stale one"); a result whose state key no longer matches the :class:`attnscope.app.state.ViewState`
  is dropped; with no sequence to look at, nothing is submitted.
* ``cancel()``: sets a flag long jobs check between chunks (prefill, batch export).

MLX streams belong to the thread that made them, so the MLX backend is created and used here too.
"""

from __future__ import annotations

import itertools
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from attnscope.core.errors import AttnScopeError, Cancelled
from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot


class CancelledMessage(str):
    """The message of a job that stopped because the user cancelled it: worth a status line, not a
    warning dialog (:meth:`attnscope.app.main_window.MainWindow.show_error`)."""


class EngineLostMessage(str):
    """The message of a job that failed because the remote engine is gone (it stopped, or the network
    dropped): the status bar's lasting "engine … lost" label says it, so a status line, never a
    dialog (one per key press while the engine is away). ``from_view``: a view's request failed
    (not a command the user gave): once the loss was said, it adds nothing."""

    from_view = False


def lost_engine(e: BaseException) -> bool:
    """True for the remote client's ``EngineLost`` (named, not imported: the remote stack stays off
    the window's start-up path)."""
    return any(c.__name__ == "EngineLost" for c in type(e).__mro__)


@dataclass
class Job:
    fn: Callable[[JobContext], Any]
    on_done: Callable[[Any], None] | None
    on_error: Callable[[str], None] | None
    channel: str | None
    label: str
    id: int = 0
    token: Callable[[], bool] | None = None  # a view request's cancel token (Engine.cancel_token)


@dataclass(frozen=True)
class Request:
    """A view's request for data: the job, where its result goes, and the state it is for.

    ``job(ctx)`` runs on the engine thread; ``ctx.cancelled()`` turns true once a newer request on the
    same channel (or a new sequence) makes it stale, and ``ctx.require()`` is the session.
    ``key()`` (GUI thread) reads the state the result depends on, e.g. ``(state.layer, state.head,
    state.visible_len)``: it is read when submitted and again when the result (or a partial one)
    arrives, and the result is dropped if it changed. ``needs``: ``"sequence"`` (the default) submits
    only while the state has a sequence (a prompt ran), ``"model"`` only while a model is loaded,
    ``"nothing"`` always.
    """

    job: Callable[[JobContext], Any]
    on_done: Callable[[Any], None]
    label: str = "updating"
    key: Callable[[], Any] | None = None
    on_partial: Callable[[Any], None] | None = None
    on_error: Callable[[str], None] | None = None
    needs: str = "sequence"


@dataclass
class JobContext:
    """What a job sees on the engine thread."""

    worker: EngineWorker
    session: Any = None
    job_id: int = 0  # the job running now
    cancel_upto: int = 0  # every job with an id <= this was cancelled (set from the GUI thread)
    token: Callable[[], bool] | None = None  # the running view request's cancel token

    def progress(self, message: str, fraction: float = -1.0) -> None:
        """Report progress (fraction in [0, 1], or -1 when unknown) to the GUI."""
        self.worker.progress.emit(message, float(fraction))

    def cancelled(self) -> bool:
        """True once the user cancelled this job (while it ran or while it waited in the queue), or a
        newer request superseded this view request."""
        return self.job_id <= self.cancel_upto or (self.token is not None and self.token())

    def require(self):
        """The session. Raises :class:`attnscope.core.errors.SessionError` ("no model loaded") without one."""
        if self.session is None:
            from attnscope.core.errors import SessionError

            raise SessionError("no model loaded")
        return self.session

    def serve_views(self) -> int:
        """Between the chunks of a long optional job: run the view requests waiting now
        (:meth:`EngineWorker.serve_views`), so the views on screen never queue behind it. Only for a
        job that leaves the session's own sequence, cache and Trace alone while it runs."""
        return self.worker.serve_views()

    def partial(self, result) -> None:
        """Hand an intermediate result (a coarse overview, the layers done so far) to the job's
        ``on_partial`` callback on the GUI thread (progressive display); dropped if it has none."""
        self.worker.partial.emit(self.job_id, result)


class EngineWorker(QObject):
    """Lives on the engine thread; runs jobs one at a time."""

    finished = Signal(object, object)  # (job, result)
    failed = Signal(object, object)  # (job, one-line message: str, or CancelledMessage)
    progress = Signal(str, float)
    partial = Signal(int, object)  # (job id, intermediate result): JobContext.partial
    busy = Signal(bool, str)
    _wake = Signal()

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        self._queue: deque[Job] = deque()
        self.ctx = JobContext(self)
        self._wake.connect(self._drain)

    def put(self, job: Job) -> list[Job]:
        """Queue ``job``; returns the jobs it superseded (dropped unstarted)."""
        dropped: list[Job] = []
        with self._lock:
            if job.channel is not None:
                dropped = [j for j in self._queue if j.channel == job.channel]
                self._queue = deque(j for j in self._queue if j.channel != job.channel)
            self._queue.append(job)
        self._wake.emit()  # queued: the worker's thread runs _drain
        return dropped

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    @Slot()
    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    return
                job = self._queue.popleft()
            self.busy.emit(True, job.label)
            try:
                self._run(job)
            finally:
                self.busy.emit(False, job.label)

    def serve_views(self) -> int:
        """Run the view requests waiting in the queue now, inside the running job (engine thread).

        A long optional job (the Experiments tab's runs) calls this between its chunks
        (:meth:`JobContext.serve_views`), so that the map, the next-token table and the tab on screen
        never wait minutes behind it; commands (prefill, step, load) keep their order and are never
        run here. The running job's id and cancel token are restored afterwards. Returns how many ran.
        """
        ran = 0
        while True:
            with self._lock:
                job = next((j for j in self._queue if j.channel is not None), None)
                if job is None:
                    return ran
                self._queue.remove(job)
            saved = self.ctx.job_id, self.ctx.token
            try:
                self._run(job)
            finally:
                self.ctx.job_id, self.ctx.token = saved
            ran += 1

    def _run(self, job: Job) -> None:
        """Run one job and report its result or its one-line failure (engine thread)."""
        try:
            self.ctx.job_id, self.ctx.token = job.id, job.token
            result = job.fn(self.ctx)
        except Cancelled as e:
            self.failed.emit(job, CancelledMessage(str(e) or "cancelled"))
        except (AttnScopeError, ValueError, IndexError, OSError) as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.failed.emit(job, EngineLostMessage(msg) if lost_engine(e) else msg)
        except Exception as e:  # a bug: keep the app alive, say what happened
            traceback.print_exc()
            self.failed.emit(job, f"internal error: {type(e).__name__}: {e}")
        else:
            self.finished.emit(job, result)


_GC_GUARD = None
#: the label of the job that loads a model (attnscope.app.commands): the GUI's collector pauses meanwhile
LOAD_LABEL = "loading model"


def _pause_collector(pause: bool) -> None:
    """Stop (or restart) the GUI thread's collection timer while a model loads on the engine thread.

    The imports and the load allocate millions of long-lived objects, and each timed collection
    walks them only to find them alive, on the GUI thread, holding the GIL the load needs
    (docs/benchmarks.md, "Start-up"; :meth:`attnscope.core.session.Session.load` pauses the
    collector the same way on the main thread). The first check after the load collects."""
    timer = getattr(_GC_GUARD, "timer", None)
    if timer is None:
        return
    if pause:
        timer.stop()
    else:
        timer.start()


def collect_garbage_on_gui_thread():
    """Run Python's cyclic garbage collector only on the GUI thread, from a timer.

    With automatic collection on, a collection can start on the engine thread in the middle of a
    job and free a Qt object (an old window, a closed dialog) there; its destructor then takes Qt's
    signal lock and waits for the GIL while the GUI thread, holding the GIL, waits for that lock:
    a deadlock (seen in the test suite). pyqtgraph's ``GarbageCollector`` disables automatic
    collection and collects by generation thresholds from a 0.5 s timer on the calling (GUI) thread.
    Idempotent; returns the collector (its ``check()`` collects what is due now).
    """
    global _GC_GUARD
    if _GC_GUARD is None and threading.current_thread() is threading.main_thread():
        from attnscope.core import memory
        from pyqtgraph.util.garbage_collector import GarbageCollector

        _GC_GUARD = GarbageCollector(interval=0.5)
        memory.set_gui_collector(_GuiCollector().collect)  # core's explicit collections come here too
    return _GC_GUARD


class _GuiCollector(QObject):
    """Runs ``gc.collect()`` on the GUI thread for another thread (:mod:`attnscope.core.memory`)."""

    requested = Signal(object)

    def __init__(self):
        super().__init__()
        self.requested.connect(self._run, Qt.ConnectionType.QueuedConnection)

    def _run(self, done: threading.Event) -> None:
        import gc

        gc.collect()
        done.set()

    def collect(self, timeout: float) -> bool:
        done = threading.Event()
        self.requested.emit(done)
        return done.wait(timeout)


class Engine(QObject):
    """GUI-side handle of the engine thread."""

    progress = Signal(str, float)
    busy = Signal(bool, str)
    error = Signal(object)  # a one-line message: str, CancelledMessage or EngineLostMessage (kept)
    idle = Signal()

    def __init__(self, parent: QObject | None = None, state=None):
        super().__init__(parent)
        collect_garbage_on_gui_thread()
        self.state = state  # the ViewState requests are checked against (None: no state keys)
        self._generations: dict[str, int] = {}  # channel -> newest request's generation
        self._ids = itertools.count(1)
        self._shut_down = False  # set by shutdown(): later submissions are dropped
        self._outstanding: set[int] = set()  # submitted, not yet reported back
        self._callbacks: dict[int, tuple] = {}  # job id -> (on_done, on_error), GUI thread only
        self._partials: dict[
            int, Callable
        ] = {}  # job id -> on_partial (progressive results), GUI thread only
        self._last_id = 0
        # not ``self.thread``: that would shadow QObject.thread() (the thread an object lives in)
        self._thread = QThread()
        self._thread.setObjectName("attnscope-engine")
        self.worker = EngineWorker()
        self.worker.moveToThread(self._thread)
        self.worker.finished.connect(self._on_finished)
        self.worker.failed.connect(self._on_failed)
        self.worker.progress.connect(self.progress)
        self.worker.partial.connect(self._on_partial)
        self.worker.busy.connect(self._on_busy)
        self._thread.finished.connect(self.worker.deleteLater)  # the standard QThread worker teardown
        self._thread.start()

    # -- submitting ------------------------------------------------------------------------------
    def enqueue(self, fn, on_done=None, on_error=None, label: str = "working") -> int:
        """Run a command in order after everything already queued. Returns the job id."""
        return self._put(Job(fn, on_done, on_error, None, label))

    def submit(
        self, channel: str, request, on_done=None, on_error=None, label: str = "updating", on_partial=None
    ) -> int | None:
        """Run a view request on ``channel``: a :class:`Request`, or a bare job ``fn(ctx)`` with its
        callbacks (no state key). Returns the job id, or None when the request needs a sequence and
        the state has none.

        A newer request on the same channel replaces this one if it has not started, and turns its
        ``ctx.cancelled()`` true if it has; a request stopped that way, one that ran against another
        sequence than the one it was made for, and one whose ``key()`` changed meanwhile report
        nothing (no error, no callback). ``on_partial(result)`` (GUI thread) receives what the job
        hands to ``ctx.partial`` while it runs.
        """
        if not isinstance(request, Request):
            request = Request(
                request, on_done, label=label, on_partial=on_partial, on_error=on_error, needs="nothing"
            )
        state = self.state
        if state is not None and (
            (request.needs == "sequence" and not state.has_sequence)
            or (request.needs == "model" and not state.has_model)
        ):
            return None  # "no model loaded" / "run a prompt first": nothing to ask for yet
        token = self.cancel_token(channel)
        key = None if request.key is None else request.key()
        # the sequence this request was made for; if the engine holds another one when it runs (a
        # prefill was cancelled, a step ran in between), it is stale: dropped, the newer state asks again
        expected = None
        if state is not None and state.snapshot is not None:
            expected = tuple(t.id for t in state.snapshot.tokens)
        superseded = object()
        job_fn = request.job  # only the job travels to the engine thread, never the callbacks

        def run(ctx):
            s = ctx.session
            if expected is not None and s is not None and tuple(getattr(s, "ids", expected)) != expected:
                return superseded
            try:
                return job_fn(ctx)
            except Cancelled:  # superseded, or the user's Cancel: a view says nothing either way
                return superseded

        def current() -> bool:
            return not token() and (request.key is None or request.key() == key)

        def done(result):
            if result is not superseded and current():
                request.on_done(result)

        def partial(result):
            if current():
                request.on_partial(result)

        job_id = self._put(Job(run, done, request.on_error, channel, request.label, token=token))
        if request.on_partial is not None and job_id in self._outstanding:
            self._partials[job_id] = partial
        return job_id

    def cancel_token(self, channel: str) -> Callable[[], bool]:
        """A ``cancelled()`` callable for a view job on ``channel``: true once a newer request on that
        channel exists (or :meth:`cancel_views` ran)."""
        gen = self._generations.get(channel, 0) + 1
        self._generations[channel] = gen
        return lambda: self._generations.get(channel) != gen

    def cancel_views(self) -> None:
        """Stop every running or queued view job now (a new prompt makes them all stale): each one's
        ``ctx.cancelled()`` turns true, and the blocked aggregates check it before every block."""
        for channel in list(self._generations):
            self._generations[channel] += 1

    def _put(self, job: Job) -> int:
        job.id = self._last_id = next(self._ids)
        if self._shut_down:  # a timer firing after the window closed: nothing runs, nothing is reported
            return job.id
        self._outstanding.add(job.id)
        # The callbacks stay on this (GUI) thread: they often hold widgets, and the engine thread must
        # never drop the last reference to a Qt object (its destructor would run there).
        self._callbacks[job.id] = (job.on_done, job.on_error)
        for old in self.worker.put(replace(job, on_done=None, on_error=None)):
            self._outstanding.discard(old.id)
            self._callbacks.pop(old.id, None)
            self._partials.pop(old.id, None)
        return job.id

    def cancel(self) -> None:
        """Ask the running command to stop at its next checkpoint."""
        # Cancels the running job and every job queued so far; jobs submitted later run normally.
        self.worker.ctx.cancel_upto = self._last_id

    @property
    def session(self):
        """The current session object (read-only use from the GUI: info and simple attributes)."""
        return self.worker.ctx.session

    def is_idle(self) -> bool:
        """True when every submitted job has reported back to the GUI thread."""
        return not self._outstanding

    def wait_idle(self, timeout: float = 120.0) -> bool:
        """Process events until no job is queued or running (for tests and --screenshot)."""
        from PySide6.QtCore import QCoreApplication

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            QCoreApplication.processEvents()
            if self.is_idle():
                return True
            time.sleep(0.005)
        return False

    def shutdown(self, timeout_ms: int = 5000) -> None:
        """Stop the engine thread (after the running job, which is asked to cancel). Idempotent."""
        self._shut_down = True
        if not self._thread.isRunning():
            return
        self.cancel()
        self._thread.quit()
        self._thread.wait(timeout_ms)

    # -- results (GUI thread) -------------------------------------------------------------------
    @Slot(object, object)
    def _on_finished(self, job: Job, result) -> None:
        on_done, _ = self._callbacks.pop(job.id, (None, None))
        try:
            if on_done is not None:
                on_done(result)
        finally:
            self._report(job)

    @Slot(object, object)
    def _on_failed(self, job: Job, message: str) -> None:
        _, on_error = self._callbacks.pop(job.id, (None, None))
        if job.channel is not None and isinstance(message, EngineLostMessage):
            message = EngineLostMessage(message)
            message.from_view = True
        try:
            if on_error is not None:
                on_error(message)
            else:
                self.error.emit(message)
        finally:
            self._report(job)

    @Slot(int, object)
    def _on_partial(self, job_id: int, result) -> None:
        cb = self._partials.get(job_id)
        if cb is not None and job_id in self._outstanding:
            cb(result)

    def _report(self, job: Job) -> None:
        self._outstanding.discard(job.id)
        self._callbacks.pop(job.id, None)
        self._partials.pop(job.id, None)
        if not self._outstanding:
            self.idle.emit()

    @Slot(bool, str)
    def _on_busy(self, on: bool, label: str) -> None:
        if label == LOAD_LABEL:
            _pause_collector(on)
        self.busy.emit(on, label)
