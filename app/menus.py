"""The window's menus and shortcuts, built in one place (File, Export, Run, View, Backend, Help).

:func:`build_menus` is the seam for a new command: add its action to the menu it belongs to here.
View → Show <tab> entries are added by :func:`add_view_action` as tabs are registered.
"""

from __future__ import annotations

from attnscope.app.text_keys import MAP_KEYS, OUTSIDE_TEXT, keep_keys_in_text_boxes
from attnscope.core import backend_registry as registry
from attnscope.core.io import formats
from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence


def backend_items() -> tuple[tuple[str, str], ...]:
    """(name, menu text) for each registered backend (:mod:`attnscope.core.backend_registry`):
    ``("mlx", "&MLX (Apple silicon; slow CPU build on Linux)")``."""
    return tuple(
        (spec.name, f"&{spec.title} ({spec.summary})" if spec.summary else f"&{spec.title}")
        for spec in registry.SPECS.values()
    )


def action(win, menu, text: str, slot, shortcut=None) -> QAction:
    """An action in ``menu`` (and on the window, so its shortcut works everywhere in it)."""
    a = QAction(text, win)
    if shortcut is not None:
        a.setShortcut(QKeySequence(shortcut))
        a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
    a.triggered.connect(slot)
    menu.addAction(a)
    win.addAction(a)
    return a


def build_menus(win) -> None:
    """Menus of :class:`attnscope.app.main_window.MainWindow` ``win``; sets ``win.menus`` (name ->
    QMenu), ``win.open_action``, ``win.view_menu`` and ``win.backend_actions`` (name -> checkable
    action, kept on ``state.backend``)."""
    mb, ex, cmd = win.menuBar(), win.exports, win.commands
    menus = win.menus = {}
    file_menu = menus["file"] = mb.addMenu("&File")
    win.open_action = action(
        win, file_menu, "&Open model…", win.open_model_dialog, QKeySequence.StandardKey.Open
    )
    action(win, file_menu, "Open model &folder…", win.open_folder_dialog)
    action(win, file_menu, "Load &default model", lambda: cmd.load_model(None))
    file_menu.addSeparator()
    action(win, file_menu, "&Save session…", win.sessions.save_session_dialog, "Ctrl+S")
    action(win, file_menu, "Open s&ession…", win.sessions.open_session_dialog, "Ctrl+Shift+O")
    file_menu.addSeparator()
    action(win, file_menu, "&Quit", win.close, QKeySequence.StandardKey.Quit)

    export_menu = menus["export"] = mb.addMenu("&Export")
    images = "/".join(s.upper() for s in formats.IMAGE_FORMATS)
    action(win, export_menu, f"Export &view as {images}…", ex.export_view_dialog, "Ctrl+E")
    action(
        win,
        export_menu,
        f"Export &data ({formats.listing('data')} + JSON)…",
        ex.export_data_dialog,
        "Ctrl+Shift+E",
    )
    action(win, export_menu, "&Batch export…", ex.batch_export_dialog, "Ctrl+Shift+B")

    run_menu = menus["run"] = mb.addMenu("&Run")
    action(win, run_menu, "&Run prompt", cmd.run_prompt, "Ctrl+Return")
    action(win, run_menu, "&Step", lambda: cmd.step(1), "F10")
    action(win, run_menu, "Step ×&N", lambda: cmd.step(win.steps_spin.value()), "Ctrl+F10")
    action(win, run_menu, "Step &back", lambda: cmd.step_back(1), "Shift+F10")
    action(win, run_menu, "&Cancel", win.engine.cancel, "Esc")

    view_menu = win.view_menu = menus["view"] = mb.addMenu("&View")
    # the keys act outside text boxes: in the prompt, ] types a bracket and PgDown moves a page
    # (attnscope.app.text_keys); the entries themselves act wherever the focus is
    for text, spin, step, key in (
        ("Next layer", "layer_spin", 1, "PgDown"),
        ("Previous layer", "layer_spin", -1, "PgUp"),
        ("Next head", "head_spin", 1, "]"),
        ("Previous head", "head_spin", -1, "["),
    ):
        a = action(
            win,
            view_menu,
            f"{text} ({OUTSIDE_TEXT})",
            lambda _c=False, s=spin, d=step: getattr(win, s).stepBy(d),
            key,
        )
        a.setToolTip(
            f"{text} ({key}). In a text box such as the prompt the key stays the text box's: click the map first."
        )
    view_menu.setToolTipsVisible(True)
    keep_keys_in_text_boxes(win, MAP_KEYS)
    view_menu.addSeparator()
    for i, key in enumerate(win.views):  # tabs registered before the menu existed
        add_view_action(win, key, win.tabs.tabText(i))

    backend_menu = menus["backend"] = mb.addMenu("&Backend")
    group = QActionGroup(win)
    group.setExclusive(True)
    win.backend_actions = {}
    for name, label in backend_items():
        a = QAction(label, win, checkable=True)
        a.triggered.connect(lambda _checked=False, n=name: cmd.set_backend(n))
        group.addAction(a)
        backend_menu.addAction(a)
        win.backend_actions[name] = a

    def check_backend(name: str) -> None:
        if name in win.backend_actions:
            win.backend_actions[name].setChecked(True)

    win.state.events.backend.connect(check_backend)
    check_backend(win.state.backend)

    help_menu = menus["help"] = mb.addMenu("&Help")
    action(win, help_menu, "&About AttnScope", win.about)


def add_view_action(win, key: str, title: str) -> None:
    """View → Show <title>, with Ctrl+1…Ctrl+9 for the first nine tabs and Ctrl+0 for the tenth."""
    idx = list(win.views).index(key)
    # (QAction.triggered passes `checked`: the lambda takes it first, or it would become the key)
    action(
        win,
        win.view_menu,
        f"Show {title}",
        lambda _checked=False, k=key: win.show_view(k),
        f"Ctrl+{idx + 1}" if idx < 9 else "Ctrl+0" if idx == 9 else None,
    )


def about_text(snap) -> str:
    """Help → About for snapshot ``snap`` (None: no model yet): the version, the model that runs
    (name, source) and the backend, device, dtype, the quantisation (the file's and the runtime's)
    and the device map with its placement, as the status bar's model line has them."""
    from attnscope.app.status import APP_NAME
    from attnscope.core import __version__

    lines = [
        f"{APP_NAME} {__version__}",
        "Step through decode and inspect every attention head.",
        "Weights are exact recomputations from captured queries, cached keys and LSE.",
    ]
    if snap is None:
        lines.append("Model: none loaded yet")
    else:
        lines.append(f"Model: {snap.info.name} ({snap.info.architecture}) from {snap.info.source}")
        from attnscope.core.loading.device_map import describe_info

        info = snap.info
        lines.append(f"Backend: {snap.backend} on {snap.device}, {info.dtype}")
        quant = "; ".join(  # attnscope.core.loading.quantize.record
            q
            for q in (
                f"file {info.quantization_file}" if getattr(info, "quantization_file", "") else "",
                getattr(info, "quantization_runtime", ""),
            )
            if q
        )
        lines.append(f"Quantisation: {quant or 'none'}")
        lines.append(f"Device map: {describe_info(info).removeprefix('device map ') or 'none (one device)'}")
    return "\n".join(lines)
