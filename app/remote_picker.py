"""File → Open model… while the window drives a remote engine: the picker lists the *engine's* models.

:func:`picker_options` gives :class:`attnscope.app.model_picker.ModelPickerDialog` a scanner that
asks the engine (:meth:`attnscope.core.remote.client.RemoteSession.models`, which runs
:func:`attnscope.core.loading.catalog.scan` on the engine's machine) instead of scanning this one,
and :func:`adapt` turns the dialog to the engine: its title names the engine, the Device box offers
the engine's devices, and the buttons that change *this* machine's catalog (Add folder…, Add
.gguf…, Remove, Converted cache…) are off. The chosen ``model_ref`` is a path on the engine's
machine; :func:`attnscope.app.jobs.load_job` loads it there (the session stays remote).

The scan runs on the picker's worker thread over its own short-lived connection (a ZeroMQ socket
belongs to one thread; the engine thread keeps the session's), so the window never waits on it. The
Fit column counts the engine machine's free memory (``RemoteSession.free_memory``, measured there
during the scan), never this machine's.
"""

from __future__ import annotations

from collections.abc import Callable

from attnscope.core import backend_registry as registry

#: seconds the picker waits for the engine's list (a scan reads metadata only)
SCAN_TIMEOUT_S = 60.0
#: seconds between asks while the engine says it is busy (a prefill or a load for the window)
BUSY_RETRY_S = 0.25


def is_remote(session) -> bool:
    """True when ``session`` is a :class:`~attnscope.core.remote.client.RemoteSession`."""
    return session is not None and getattr(session, "remote_call", None) is not None


def engine_devices(session) -> list[str]:
    """The Device box's choices on ``session``'s engine: ``cpu`` and the kind of device it runs on."""
    device = str(session.backend.device) if session.backend is not None else "cpu"
    kind = device.split(":")[0]
    return ["cpu"] + ([kind] if kind != "cpu" else [])


def engine_scanner(session, timeout: float = SCAN_TIMEOUT_S, free: dict | None = None) -> Callable[[], list]:
    """A scanner (``() -> list[CatalogEntry]``) that lists the models on ``session``'s engine.

    It opens its own connection with the session's address and token each time it runs (it runs
    on a worker thread) and closes it after. ``free``: a dict it fills with the engine machine's
    free memory, ``(backend, device) -> (bytes | None, label)``, for torch and mlx on each of
    :func:`engine_devices`. While the engine is busy with the window's own long request (a prefill,
    a load) it asks again every :data:`BUSY_RETRY_S` until ``timeout``. Raises what
    :meth:`~attnscope.core.remote.client.RemoteSession.models` raises (EngineLost, Refused; Busy
    still after ``timeout``), one line each; the picker shows it as "Scanning failed: …".
    """
    address, token = session.engine, session.token
    devices = engine_devices(session)
    host = session.backend.host if session.backend is not None else address

    def scan() -> list:
        import time

        from attnscope.core.remote.client import Busy, RemoteSession

        deadline = time.monotonic() + timeout

        def when_idle(fn, *args):  # the engine answers one request at a time: wait out a prefill
            while True:
                try:
                    return fn(*args)
                except Busy:
                    if time.monotonic() + BUSY_RETRY_S > deadline:
                        raise
                    time.sleep(BUSY_RETRY_S)

        r = RemoteSession(address, token=token, timeout=timeout)
        r._open()
        try:
            entries = list(when_idle(r.models))
            if free is not None:
                for backend in registry.names():
                    for device in devices:
                        got, label = when_idle(r.free_memory, backend, device)
                        free[(backend, device)] = (got, f"{label} on the engine ({host})")
            return entries
        finally:
            r.close()

    return scan


def picker_options(session) -> dict:
    """Keyword arguments for ``ModelPickerDialog`` on a remote ``session``: the engine's scanner,
    and the engine machine's free memory for the Fit column (measured there during the scan)."""
    free: dict = {}

    def free_memory_fn(backend: str, device: str) -> tuple[int | None, str]:
        # read on the GUI thread after the scan filled it; never this machine's memory
        return free.get((backend, device), (0, "on the engine (not measured: Rescan)"))

    return {"scanner": engine_scanner(session, free=free), "free_memory_fn": free_memory_fn}


def adapt(dlg, session) -> None:
    """Turn a ``ModelPickerDialog`` to ``session``'s engine (title, devices, local-only buttons off)."""
    backend = session.backend
    where = backend.host if backend is not None else session.engine
    dlg.setWindowTitle(f"Open model on the engine at {session.engine} ({where})")
    device = str(backend.device) if backend is not None else "cpu"
    dlg.device.blockSignals(True)
    dlg.device.clear()
    dlg.device.addItems(engine_devices(session))
    dlg.device.setCurrentText(device.split(":")[0])
    dlg.device.blockSignals(False)
    why = f"the models listed are on the engine's machine ({where}); add them there"
    for b in (dlg.add_folder_btn, dlg.add_gguf_btn, dlg.remove_btn, dlg.cache_btn):
        b.setEnabled(False)
        b.setToolTip(why)
    dlg._free.clear()  # what the dialog measured before the scan is not the engine's

    def remeasure() -> None:  # the scan has just measured the engine's free memory
        dlg._free.clear()
        dlg.update_fits()

    dlg.scanFinished.connect(remeasure)
    dlg.setAcceptDrops(False)  # a dropped folder is on this machine, not the engine's
    dlg.drop_hint.setText(f"models on {where}: give them to attnscope serve --model there")
    dlg.drop_hint.setToolTip(why)
    dlg.remote_engine = session.engine
