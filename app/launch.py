"""Entry points of the window: ``attnscope gui`` (open it) and ``--screenshot`` (render it offscreen to a PNG)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from attnscope.app import qt_options
from attnscope.app.main_window import APP_NAME, MainWindow
from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication


def _parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--size must look like 1400x900, got {text!r}") from None
    if w < 200 or h < 200:
        raise ValueError(f"--size too small: {text}")
    return w, h


def _quiet_offscreen_warnings() -> None:
    """Drop the offscreen platform plugin's harmless "does not support propagateSizeHints()" lines."""
    from PySide6.QtCore import qInstallMessageHandler

    def handler(_mode, _context, message):
        if "propagateSizeHints" not in message:
            print(message, file=sys.stderr)

    qInstallMessageHandler(handler)


def run_gui(args) -> int:
    """Open the window (or, with ``--screenshot``, render it offscreen to a PNG and exit)."""
    if args.screenshot:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        _quiet_offscreen_warnings()
        out = Path(args.screenshot)
        if out.suffix.lower() != ".png":
            raise ValueError(f"--screenshot must name a .png file, got {out.name!r}")
        if not out.parent.exists():
            raise FileNotFoundError(f"folder {out.parent} does not exist")
        if args.prompt is not None and not args.prompt.strip():
            raise ValueError("the prompt is empty: give some text with --prompt")
    size = _parse_size(args.size)
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)  # configuration at the entry point, not at import
    qt_options.configure()  # pyqtgraph: row-major images, no antialiasing
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName(APP_NAME)
    app.setOrganizationName(APP_NAME)
    win = MainWindow(
        model=args.model,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        quantize=getattr(args, "quantize", "none"),
        device_map=getattr(args, "device_map", None),
        autoload=False,  # loaded below: once the window is drawn (--engine: the model is the engine's)
    )
    win.resize(*size)
    if not args.screenshot:  # the last prompt, colours and layout (a screenshot is of the defaults)
        from attnscope.app import window_settings

        window_settings.restore(win, prompt=args.prompt is None)
        app.aboutToQuit.connect(lambda: window_settings.save(win))
    if not getattr(args, "engine", None):
        if args.screenshot:
            win.load_model(args.model)
        else:  # the window comes first; the model (torch, transformers, the weights) loads under it
            _load_after_first_paint(win, args.model)

    def put_prompt() -> None:  # after the engine's run (with its own prompt) is shown, on --engine
        if args.prompt is not None:
            win.prompt_edit.setPlainText(args.prompt)
            if not args.screenshot:
                _after_load(win, args)

    if getattr(args, "engine", None):
        from attnscope.core.remote.client import read_token

        if args.prompt is not None:  # kept if the connection fails
            win.prompt_edit.setPlainText(args.prompt)
        # as File → Connect: the engine's run, if any, with its prompt; then --prompt replaces it
        win.engine_connector.connect(
            args.engine, read_token(getattr(args, "token_file", None)), then=put_prompt
        )
    elif args.prompt is not None:
        win.prompt_edit.setPlainText(args.prompt)
        if not args.screenshot:
            QTimer.singleShot(0, lambda: _after_load(win, args))
    if not args.screenshot:
        if os.environ.get(STARTUP_PROBE):
            _probe_startup(app, win)
        win.show()
        return app.exec()
    return _screenshot(app, win, args)


#: environment variable: ``attnscope`` opens the window, prints when it was drawn and when the model
#: was ready (:data:`STARTUP_LINE`), then quits (``attnscope bench --startup``, core/bench/startup.py)
STARTUP_PROBE = "ATTNSCOPE_STARTUP_PROBE"
STARTUP_LINE = "attnscope-startup"


def _probe_startup(app, win: MainWindow) -> None:
    """Print ``attnscope-startup {"shown": s, "ready": s, "error": …}`` (seconds on the clock of
    ``time.time()``) once the window was first painted and the model was loaded, then quit."""
    import json
    import time

    from PySide6.QtCore import QEvent, QObject

    marks: dict = {}

    def finish(error: str | None = None) -> None:
        if "done" in marks:
            return
        marks["done"] = True
        marks.setdefault("ready", time.time())
        out = {"shown": marks.get("shown"), "ready": marks["ready"], "error": error}
        print(f"{STARTUP_LINE} {json.dumps(out)}", flush=True)
        QTimer.singleShot(0, app.quit)

    class FirstPaint(QObject):
        def eventFilter(self, obj, event) -> bool:
            if event.type() == QEvent.Type.Paint and "shown" not in marks:
                marks["shown"] = time.time()
            return False

    painted = FirstPaint(win)
    win.installEventFilter(painted)

    def loaded(_snap) -> None:
        marks["ready"] = time.time()
        marks.setdefault("shown", marks["ready"])
        finish()

    win.state.events.loaded.connect(loaded)
    failed = QTimer(win)  # a failed load is the status line's error
    failed.timeout.connect(lambda: finish(str(win.last_error)) if win.last_error else None)
    failed.start(200)
    QTimer.singleShot(600_000, lambda: finish("no model after 600 s"))


def _load_after_first_paint(win: MainWindow, model: str | None) -> None:
    """Queue the model's load once the window has been painted (or after 0.5 s at the latest), so
    the engine thread's imports never hold up the first frame (docs/benchmarks.md)."""
    from PySide6.QtCore import QEvent, QObject

    started: list[bool] = []

    def start() -> None:
        if not started:
            started.append(True)
            win.load_model(model)

    class FirstPaint(QObject):
        def eventFilter(self, obj, event) -> bool:
            if event.type() == QEvent.Type.Paint and not started:
                QTimer.singleShot(0, start)  # after this paint
            return False

    win.installEventFilter(FirstPaint(win))
    QTimer.singleShot(500, start)


def _after_load(win: MainWindow, args) -> None:
    win.chat_check.setChecked(args.chat_template and win.chat_check.isEnabled())
    win.run_prompt()
    if args.steps:
        win.step(args.steps)


def _screenshot(app, win: MainWindow, args) -> int:
    win.show()

    def settle(what: str) -> None:
        if not win.engine.wait_idle(timeout=600):
            raise RuntimeError(f"timed out while {what}")
        if win.last_error:
            raise ValueError(win.last_error)

    try:
        settle("loading the model")
        win.chat_check.setChecked(args.chat_template and win.chat_check.isEnabled())
        if args.prompt is not None:
            win.run_prompt()
            settle("running the prompt")
            if args.steps:
                win.step(args.steps)
                settle("decoding")
        win.select(
            args.layer if args.layer is not None else win.layer,
            args.head if args.head is not None else win.head,
        )
        win.show_view(args.view)
        win.refresh_current_view()
        settle("drawing")
        for _ in range(5):
            app.processEvents()
        if not win.grab().save(str(args.screenshot), "PNG"):
            raise OSError(f"could not write {args.screenshot}")
        print(f"saved {args.screenshot}")
        return 0
    except RuntimeError as e:
        raise ValueError(str(e)) from None
    finally:
        win.close()
        _dispose(app, win)


def _dispose(app, win: MainWindow) -> None:
    """Delete the window while the QApplication still exists (avoids a crash at interpreter exit)."""
    from PySide6.QtCore import QEvent

    win.deleteLater()
    app.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    app.processEvents()
