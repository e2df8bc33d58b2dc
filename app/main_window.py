"""AttnScope's main window: the composition root. It builds the widgets, the view state, the
engine, the controllers and the tabs, and wires them; it holds no logic of its own.

* :class:`attnscope.app.state.ViewState` (``win.state``): model, sequence and step, layer, head,
  tab, colours, each tab's settings; widgets bind to it (:mod:`attnscope.app.bind`), views listen.
* :class:`attnscope.app.engine.Engine` (``win.engine``): the engine thread; views ask it for data
  with ``engine.submit(channel, Request(...))``.
* Controllers: :class:`attnscope.app.commands.Commands` (load, Run, Step, Back, backend),
  :class:`attnscope.app.maps.MapPanel` (heatmap, head grid, token strip),
  :class:`attnscope.app.status.StatusLine`, :class:`attnscope.app.session_files.SessionFiles` (sessions),
  :class:`attnscope.app.export_actions.ExportController` (exports); menus in :mod:`attnscope.app.menus`.

A tab is a widget built with ``(state, engine)`` and registered with :meth:`MainWindow.add_view`;
it listens to the state's events and may implement ``refresh()`` (called when it is shown or the
sequence or step changes) and ``view_state()`` / ``restore_view_state()`` (its settings).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from attnscope.app.bind import bind
from attnscope.app.commands import Commands, window_wording
from attnscope.app.controls import WIDGETS, Controls
from attnscope.app.engine import Engine
from attnscope.app.export_actions import ExportController
from attnscope.app.maps import MapPanel
from attnscope.app.menus import about_text, add_view_action, build_menus
from attnscope.app.session_files import SessionFiles
from attnscope.app.state import ViewState
from attnscope.app.status import APP_NAME, StatusLine
from attnscope.app.tabs import EmptyOverlay, ViewTabs
from attnscope.app.timeline_bar import LiveSequenceNote, TimelineBar
from attnscope.app.token_strip import TokenStrip
from attnscope.app.views.gqa import GqaView
from attnscope.app.views.head_grid import HeadGridView
from attnscope.app.views.heatmap import HeatmapView
from attnscope.app.views.mask import MaskView
from attnscope.app.views.next_token import DecodePanel
from attnscope.core import backend_registry as registry
from attnscope.core.io.colormaps import ASSETS
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import (
    QBoxLayout,
    QCheckBox,
    QFileDialog,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

if TYPE_CHECKING:
    from attnscope.app.connect import EngineConnector

__all__ = ["APP_NAME", "MainWindow", "window_wording"]

#: panels that need no sequence, never covered by the "Run a prompt" overlay
NO_OVERLAY = ("heatmap", "kv")
#: tabs that compute on the live sequence (every position), not on the timeline's step
LIVE_SEQUENCE_VIEWS = ("kv", "roles", "experiments", "compare")


def _delegate(owner: str, name: str, doc: str = "") -> property:
    """A window attribute that is ``self.<owner>.<name>`` (read and write)."""
    return property(
        lambda self: getattr(getattr(self, owner), name),
        lambda self, v: setattr(getattr(self, owner), name, v),
        doc=doc,
    )


REMOTE_PATH_REFUSAL = (
    "Connected to an engine: a folder or file on this machine cannot load there. "
    "Choose one of the engine's models with File → Open model…"
)


class MainWindow(QMainWindow):
    """The AttnScope window. ``model=None`` loads the embedded default on start."""

    selectionChanged = Signal(int, int)
    snapshotChanged = Signal(object)

    # set in __init__ from self.controls (app/controls.py WIDGETS) and by app/connect.py's install():
    # declared here for the type checker
    prompt_edit: QPlainTextEdit
    run_button: QPushButton
    chat_check: QCheckBox
    back_button: QPushButton
    step_button: QPushButton
    steps_spin: QSpinBox
    stepn_button: QPushButton
    engine_connector: EngineConnector

    # what tests and scripts read off the window, kept where it lives
    snapshot = property(lambda self: self.state.snapshot, doc="The engine's last Snapshot (None: no model).")
    layer = property(lambda self: self.state.layer)
    head = property(lambda self: self.state.head)
    visible_len = property(lambda self: self.state.visible_len, doc="Positions shown at the timeline's step.")
    query_row = _delegate("state", "query_row")
    device = _delegate("state", "device")
    dtype = _delegate("state", "dtype")
    quantize = _delegate("state", "quantize")
    device_map = _delegate("state", "device_map")
    weights = _delegate("maps", "weights")
    weights_key = _delegate("maps", "weights_key")
    map_key = _delegate("maps", "map_key")
    last_error = _delegate("status", "last_error")

    def __init__(
        self,
        model: str | None = None,
        backend: str = registry.DEFAULT,
        device: str | None = None,
        dtype: str = "auto",
        autoload: bool = True,
        quantize: str = "none",
        device_map: str | None = None,
    ):
        super().__init__()
        self.setWindowTitle(APP_NAME)
        icon = ASSETS / "icons" / "attnscope.png"
        if icon.is_file():
            self.setWindowIcon(QIcon(str(icon)))
        self.setAcceptDrops(True)
        self.state = ViewState(
            model=model,
            backend=backend,
            device=device,
            dtype=dtype,
            quantize=quantize,
            device_map=device_map or "none",
        )
        self.engine = Engine(self, state=self.state)
        self.views: dict[str, QWidget] = {}
        self._empty_overlays: dict[str, EmptyOverlay] = {}
        self.status = StatusLine(self, self.state, self.engine)
        for name in ("model_label", "seq_label", "kv_label", "progress", "cancel_button"):
            setattr(self, name, getattr(self.status, name))
        self._build_ui()
        self.maps = MapPanel(self.state, self.engine, self.heatmap, self.grid, self.token_strip)
        self.commands = Commands(self)
        self.exports = ExportController(self)
        self.sessions = SessionFiles(self)
        self._bind()
        self.add_view("heatmap", "Heatmap", self.heatmap)
        self.add_view("grid", "Head grid", self.grid)
        self.add_view("gqa", "GQA groups", GqaView(self.state, self.engine))
        self.add_view("mask", "Mask", MaskView(self.state, self.engine))
        from attnscope.app.views import compare, experiments, heads, kv, roles, sinks

        for mod in (sinks, kv, roles, experiments, compare, heads):
            mod.install_view(self)
        for key in LIVE_SEQUENCE_VIEWS:  # their header says so while the timeline is at an earlier step
            lay = self.views[key].layout() if key in self.views else None
            if isinstance(lay, QBoxLayout):  # (each one's is a QVBoxLayout)
                lay.insertWidget(0, LiveSequenceNote(self.state))
        build_menus(self)
        from attnscope.app.views import why

        why.install(self)  # the Why panel, a dock beside the heatmap (View → Why this score)
        from attnscope.app.connect import install as install_engine_connector

        install_engine_connector(self)  # File → Connect to engine… (the remote engine, app/connect.py)
        self.set_running(False)
        if autoload:
            self.load_model(model)

    # -- UI ------------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        central = QWidget()
        outer = QVBoxLayout(central)
        outer.setContentsMargins(6, 6, 6, 2)

        self.controls = Controls(self.state)
        for name in WIDGETS:
            setattr(self, name, getattr(self.controls, name))
        outer.addLayout(self.controls.prompt_row)
        outer.addLayout(self.controls.selection_row)
        self.timeline = TimelineBar()
        outer.addWidget(self.timeline)

        # views
        split = QSplitter(Qt.Orientation.Vertical)
        self.tabs = ViewTabs()
        self.heatmap = HeatmapView()
        self.grid = HeadGridView()
        self.decode_panel = DecodePanel()
        hsplit = QSplitter(Qt.Orientation.Horizontal)
        hsplit.addWidget(self.tabs)
        hsplit.addWidget(self.decode_panel)
        hsplit.setStretchFactor(0, 5)
        hsplit.setStretchFactor(1, 1)
        hsplit.setSizes([1100, 270])
        split.addWidget(hsplit)
        self.token_strip = TokenStrip()
        split.addWidget(self.token_strip)
        split.setStretchFactor(0, 4)
        split.setStretchFactor(1, 1)
        split.setSizes([700, 150])
        outer.addWidget(split, 1)
        self.setCentralWidget(central)
        self.splitters = (split, hsplit)  # the layout the window remembers (app/window_settings.py)

    def _bind(self) -> None:
        """Widgets ⇄ state, and who hears what."""
        st, cmd = self.state, self.commands
        bind(
            st,
            "step",
            self.timeline,
            self.timeline.stepChanged,
            lambda: self.timeline.step,
            self.timeline.set_step,
        )
        bind(
            st,
            "tab",
            self.tabs,
            self.tabs.currentChanged,
            self._tab_key,
            lambda key: self.tabs.setCurrentWidget(self.views[key]) if key in self.views else None,
        )
        st.events.selection.connect(lambda sel: self.selectionChanged.emit(*sel))
        st.events.snapshot.connect(self._on_snapshot)
        st.events.next_table.connect(self.decode_panel.set_table)
        st.events.stale.connect(self._on_stale)
        st.events.prefilling.connect(self._on_prefilling)
        st.events.changed.connect(self._on_changed)
        st.events.tab.connect(lambda _key: self.refresh_current_view())
        self.run_button.clicked.connect(cmd.run_prompt)
        self.step_button.clicked.connect(lambda: cmd.step(1))
        self.stepn_button.clicked.connect(lambda: cmd.step(self.steps_spin.value()))
        self.back_button.clicked.connect(lambda: cmd.step_back(1))
        self.grid.headClicked.connect(self._on_grid_click)
        self.decode_panel.samplingChanged.connect(cmd.set_sampling)

    def _tab_key(self) -> str:
        w = self.tabs.currentWidget()
        return next((k for k, v in self.views.items() if v is w), "heatmap")

    def add_view(self, key: str, title: str, widget: QWidget) -> None:
        """Register a view as a tab (a widget built with ``(state, engine)``; optional ``refresh()``)."""
        self.views[key] = widget
        self.tabs.addTab(widget, title)
        if hasattr(widget, "bind_settings"):  # its saved controls live in state.settings[key]
            widget.bind_settings(self.state, key)
        if hasattr(self, "view_menu"):
            add_view_action(self, key, title)

    def show_view(self, key: str) -> None:
        """Bring view ``key`` to front. Raises ValueError for an unknown view."""
        if key not in self.views:
            raise ValueError(f"unknown view {key!r}; choose one of {', '.join(self.views)}")
        self.state.tab = key
        self.tabs.setCurrentWidget(self.views[key])

    def refresh_current_view(self) -> None:
        """Ask the tab on screen for its data (the head grid, or the view's ``refresh()``)."""
        w = self.tabs.currentWidget()
        if w is self.grid:
            self.maps.request_grid()
        elif w is not None and hasattr(w, "refresh"):
            w.refresh()

    _refresh_current_view = refresh_current_view  # the name tests have used

    # -- state -----------------------------------------------------------------------------------
    def select(self, layer: int, head: int) -> None:
        """Show ``(layer, head)``. Raises IndexError when out of range for the loaded model."""
        self.state.select(layer, head)

    def cancel_token(self, channel: str):
        """A ``cancelled()`` callable for a view job on ``channel`` (:meth:`Engine.cancel_token`)."""
        return self.engine.cancel_token(channel)

    def set_overlay_text(self, text: str = "") -> None:
        """What the covers of the panels that need a sequence say (``""``: "Run a prompt to see this
        panel."); while a prompt runs they say so, never the words of the state before it."""
        self._overlay_text = text or EmptyOverlay.TEXT
        for overlay in self._empty_overlays.values():
            overlay.setText(self._overlay_text)

    def _on_stale(self, what) -> None:
        why, heatmap, table = what
        if heatmap:
            self.heatmap.mark_stale(why)
        if table:
            self.decode_panel.mark_stale(why)

    def _on_prefilling(self, on: bool) -> None:
        """A prompt runs (state ``prefilling``) or ended: decoding off, every empty panel says it."""
        self.controls.set_prefilling(on)
        self.heatmap.show_prefilling(on)
        self.timeline.show_running("prefill running…" if on else "")
        self.set_overlay_text("The prompt is running (prefill)… this panel fills when it ends." if on else "")
        self.decode_panel.show_prefilling(on)

    def _on_snapshot(self, snap) -> None:
        self.snapshotChanged.emit(snap)
        # panels that need a sequence are covered until there is one
        for key, view in self.views.items():
            if key in NO_OVERLAY:
                continue
            overlay = self._empty_overlays.get(key)
            if overlay is None:
                page = self.tabs.page_of(view)
                if page is None:
                    continue
                overlay = self._empty_overlays[key] = EmptyOverlay(page)
                overlay.setText(getattr(self, "_overlay_text", EmptyOverlay.TEXT))
            overlay.set_shown(snap is None or snap.seq_len == 0)

    def _on_changed(self, names) -> None:
        """The timeline moved (alone: a new snapshot asks by itself): crop every view to the positions
        of that step (no recompute of the model)."""
        st = self.state
        if "step" not in names or "snapshot" in names:
            return
        if st.query_row is not None and st.query_row >= st.visible_len:
            st.query_row = None
        self.commands.after_step()

    def _on_grid_click(self, layer: int, head: int) -> None:
        self.select(layer, head)
        self.show_view("heatmap")

    # -- commands, done by the controllers (the names tests and scripts use) ---------------------
    load_model = property(lambda self: self.commands.load_model)
    run_prompt = property(lambda self: self.commands.run_prompt)
    step = property(lambda self: self.commands.step)
    step_back = property(lambda self: self.commands.step_back)
    set_backend = property(lambda self: self.commands.set_backend)
    set_running = property(lambda self: self.controls.set_running)
    request_weights = property(lambda self: self.maps.request_weights)
    show_error = property(lambda self: self.status.show_error, doc="Status bar line (+ dialog when shown).")
    _show_token_strip = property(lambda self: self.maps.show_token_strip)
    export_heatmap_png = property(lambda self: self.maps.save_png)
    export_heatmap_data = property(lambda self: self.maps.save_data)

    # -- files -------------------------------------------------------------------------------------
    def open_model_dialog(self) -> None:
        from attnscope.app import remote_picker
        from attnscope.app.model_picker import ModelPickerDialog

        st = self.state
        session = self.engine.session
        remote = remote_picker.is_remote(session)  # list and load the engine's models, not this machine's
        dlg = ModelPickerDialog(
            self,
            backend=st.backend,
            device=st.device,
            dtype=st.dtype,
            quantize=st.quantize,
            device_map=st.device_map,
            **(remote_picker.picker_options(session) if remote else {}),
        )
        if remote:
            remote_picker.adapt(dlg, session)
        if dlg.exec() and dlg.selected_path():
            st.update(
                backend=dlg.backend.currentText(),
                device=dlg.device.currentText(),
                dtype=dlg.dtype.currentText(),
                quantize=dlg.quantize.currentText(),
                device_map=dlg.device_map.currentText(),
            )
            self.load_model(dlg.selected_path())

    def _engine_path_refused(self) -> bool:
        """While connected to an engine a path on this machine means nothing there: say so, load nothing."""
        from attnscope.app import remote_picker

        if not remote_picker.is_remote(self.engine.session):
            return False
        self.status.say(REMOTE_PATH_REFUSAL, 15000)
        return True

    def open_folder_dialog(self) -> None:
        if self._engine_path_refused():
            return
        path = QFileDialog.getExistingDirectory(self, "Open Hugging Face model folder", str(Path.home()))
        if path:
            self.load_model(path)

    # drag and drop a model folder or .gguf
    def dragEnterEvent(self, e) -> None:
        urls = e.mimeData().urls() if e.mimeData().hasUrls() else []
        if len(urls) == 1 and urls[0].isLocalFile():
            p = Path(urls[0].toLocalFile())
            if p.is_dir() or p.suffix.lower() == ".gguf":
                e.acceptProposedAction()

    def dropEvent(self, e) -> None:
        if not self._engine_path_refused():
            self.load_model(e.mimeData().urls()[0].toLocalFile())

    def about_text(self) -> str:
        """Help → About: the version, the model that runs and its backend, device, dtype."""
        return about_text(self.snapshot)

    def about(self) -> None:
        QMessageBox.about(self, f"About {APP_NAME}", self.about_text())

    def closeEvent(self, e) -> None:
        self.engine.shutdown()
        super().closeEvent(e)
