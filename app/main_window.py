"""AttnScope's main window: the composition root. It builds the widgets, the view state, the
engine, the controllers and the tabs, and wires them; it holds no logic of its own.

* :class:`attnscope.app.state.ViewState` (``win.state``): model, sequence and step, layer, head,
  tab, colours, each tab's settings; widgets bind to it (:mod:`attnscope.app.bind`), views listen.
* :class:`attnscope.app.engine.Engine` (``win.engine``): the engine thread; views ask it for data
  with ``engine.submit(channel, Request(...))``.
* Controllers: :class:`attnscope.app.commands.Commands` (load, Run, Step, Back, backend),
  :class:`attnscope.app.maps.MapPanel` (heatmap, head grid, token strip),
  :class:`attnscope.app.status.StatusLine`, :class:`attnscope.app.export.ExportController` (sessions,
  exports); menus in :mod:`attnscope.app.menus`.

A tab is a widget built with ``(state, engine)`` and registered with :meth:`MainWindow.add_view`;
it listens to the state's events and may implement ``refresh()`` (called when it is shown or the
sequence or step changes) and ``view_state()`` / ``restore_view_state()`` (its settings).
"""

from __future__ import annotations

import os
from pathlib import Path

from attnscope.app.bind import bind, bind_colour_combo, bind_spin
from attnscope.app.commands import Commands, window_wording
from attnscope.app.engine import Engine
from attnscope.app.export import ExportController
from attnscope.app.head_grid import HeadGridView
from attnscope.app.heatmap import HeatmapView
from attnscope.app.maps import MapPanel
from attnscope.app.menus import add_view_action, build_menus
from attnscope.app.state import ViewState
from attnscope.app.status import APP_NAME, StatusLine
from attnscope.app.tabs import EmptyOverlay, ViewTabs
from attnscope.app.timeline import TimelineBar
from attnscope.app.token_strip import TokenStrip
from attnscope.app.views.gqa import GqaView
from attnscope.app.views.mask import MaskView
from attnscope.app.views.next_token import DecodePanel
from attnscope.core.io.colormaps import ASSETS, COLORMAPS
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

__all__ = ["APP_NAME", "MainWindow", "human_bytes", "window_wording"]

#: panels that need no sequence, never covered by the "Run a prompt" overlay
NO_OVERLAY = ("heatmap", "kv")


def human_bytes(n: int) -> str:
    """``1428480`` → ``'1.43 MB'`` (decimal units, as the handbook's KV-cache table; :func:`attnscope.core.units.format_bytes`)."""
    from attnscope.core.units import format_bytes

    return format_bytes(n)


def sample_prompts() -> list[str]:
    try:
        lines = (ASSETS / "prompts.txt").read_text(encoding="utf-8").splitlines()
    except OSError:
        return ["The quick brown fox jumps over the lazy dog."]
    return [ln.replace("\\n", "\n") for ln in lines if ln.strip()]


def _delegate(owner: str, name: str, doc: str = "") -> property:
    """A window attribute that is ``self.<owner>.<name>`` (read and write)."""
    return property(
        lambda self: getattr(getattr(self, owner), name),
        lambda self, v: setattr(getattr(self, owner), name, v),
        doc=doc,
    )


class MainWindow(QMainWindow):
    """The AttnScope window. ``model=None`` loads the embedded default on start."""

    selectionChanged = Signal(int, int)
    snapshotChanged = Signal(object)

    # what tests and scripts read off the window, kept where it lives
    snapshot = property(lambda self: self.state.snapshot, doc="The engine's last Snapshot (None: no model).")
    layer = property(lambda self: self.state.layer)
    head = property(lambda self: self.state.head)
    visible_len = property(lambda self: self.state.visible_len, doc="Positions shown at the timeline's step.")
    query_row = _delegate("state", "query_row")
    model_ref = _delegate("state", "model")
    backend_name = _delegate("state", "backend")
    device = _delegate("state", "device")
    dtype = _delegate("state", "dtype")
    quantize = _delegate("state", "quantize")
    weights = _delegate("maps", "weights")
    weights_key = _delegate("maps", "weights_key")
    map_key = _delegate("maps", "map_key")
    last_error = _delegate("status", "last_error")

    def __init__(
        self,
        model: str | None = None,
        backend: str = "torch",
        device: str | None = None,
        dtype: str = "auto",
        autoload: bool = True,
        quantize: str = "none",
    ):
        super().__init__()
        self.setWindowTitle(APP_NAME)
        icon = ASSETS / "icons" / "attnscope.png"
        if icon.is_file():
            self.setWindowIcon(QIcon(str(icon)))
        self.setAcceptDrops(True)
        self.state = ViewState(model=model, backend=backend, device=device, dtype=dtype, quantize=quantize)
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
        self._bind()
        self.add_view("heatmap", "Heatmap", self.heatmap)
        self.add_view("grid", "Head grid", self.grid)
        self.add_view("gqa", "GQA groups", GqaView(self.state, self.engine))
        self.add_view("mask", "Mask", MaskView(self.state, self.engine))
        from attnscope.app.views import compare, experiments, kv, roles, sinks

        for mod in (sinks, kv, roles, experiments, compare):
            mod.install_view(self)
        build_menus(self)
        self.set_running(False)
        if autoload:
            self.load_model(model)

    # -- UI ------------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        central = QWidget()
        outer = QVBoxLayout(central)
        outer.setContentsMargins(6, 6, 6, 2)

        # prompt row
        prompt_row = QHBoxLayout()
        self.prompt_edit = QPlainTextEdit()
        self.prompt_edit.setPlaceholderText("Type a prompt, then Run (Ctrl+Enter)")
        self.prompt_edit.setPlainText(sample_prompts()[0])
        self.prompt_edit.setFixedHeight(58)
        prompt_row.addWidget(self.prompt_edit, 1)
        buttons = QVBoxLayout()
        self.run_button = QPushButton("Run")
        self.run_button.setToolTip("Prefill the prompt (Ctrl+Enter)")
        self.chat_check = QCheckBox("Chat template")
        self.chat_check.setChecked(True)
        self.chat_check.setToolTip("Wrap the prompt in the model's chat template (instruct models)")
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.chat_check)
        prompt_row.addLayout(buttons)
        outer.addLayout(prompt_row)

        # controls row
        ctl = QHBoxLayout()
        self.back_button = QPushButton("◀ Back")
        self.back_button.setToolTip("Undo one decode step: the KV cache is truncated (Shift+F10)")
        self.step_button = QPushButton("Step ▶")
        self.step_button.setToolTip("Decode one token (F10)")
        self.steps_spin = QSpinBox()
        self.steps_spin.setRange(1, 4096)
        self.steps_spin.setValue(8)
        self.steps_spin.setToolTip("Tokens for Step ×N")
        self.stepn_button = QPushButton("Step ×N")
        self.stepn_button.setToolTip("Decode N tokens (Ctrl+F10)")
        for w in (self.back_button, self.step_button, QLabel("N"), self.steps_spin, self.stepn_button):
            ctl.addWidget(w)
        ctl.addSpacing(18)
        ctl.addWidget(QLabel("Layer"))
        self.layer_spin = QSpinBox()
        self.layer_spin.setToolTip("Layer, 0-based (Page Up / Page Down)")
        ctl.addWidget(self.layer_spin)
        ctl.addWidget(QLabel("Head"))
        self.head_spin = QSpinBox()
        self.head_spin.setToolTip("Query head, 0-based ([ and ])")
        ctl.addWidget(self.head_spin)
        self.group_label = QLabel("")
        self.group_label.setStyleSheet("color:#335;")
        ctl.addWidget(self.group_label)
        ctl.addStretch(1)
        ctl.addWidget(QLabel("Colours"))
        self.cmap_combo = QComboBox()
        self.cmap_combo.addItems(COLORMAPS)
        ctl.addWidget(self.cmap_combo)
        outer.addLayout(ctl)
        self.timeline = TimelineBar()
        outer.addWidget(self.timeline)

        # views
        split = QSplitter(Qt.Vertical)
        self.tabs = ViewTabs()
        self.heatmap = HeatmapView()
        self.grid = HeadGridView()
        self.decode_panel = DecodePanel()
        hsplit = QSplitter(Qt.Horizontal)
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

    def _bind(self) -> None:
        """Widgets ⇄ state, and who hears what."""
        st, cmd = self.state, self.commands
        bind_spin(st, "layer", self.layer_spin)
        bind_spin(st, "head", self.head_spin)
        bind_colour_combo(st, self.cmap_combo)
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
        st.events.selection.connect(self._on_selection)
        st.events.snapshot.connect(self._on_snapshot)
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
        elif hasattr(w, "refresh"):
            w.refresh()

    _refresh_current_view = refresh_current_view  # the name tests have used

    # -- state -----------------------------------------------------------------------------------
    def select(self, layer: int, head: int) -> None:
        """Show ``(layer, head)``. Raises IndexError when out of range for the loaded model."""
        self.state.select(layer, head)

    def cancel_token(self, channel: str):
        """A ``cancelled()`` callable for a view job on ``channel`` (:meth:`Engine.cancel_token`)."""
        return self.engine.cancel_token(channel)

    def _on_selection(self, selection) -> None:
        self._update_group_label()
        self.selectionChanged.emit(*selection)

    def _on_snapshot(self, snap) -> None:
        self._update_group_label()
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

    def _update_group_label(self) -> None:
        if self.snapshot is None:
            return
        g = self.snapshot.info.group_size
        kv = self.head // g
        members = ", ".join(f"q{h}" for h in range(kv * g, (kv + 1) * g))
        self.group_label.setText(f"reads KV head {kv}  (GQA group: {members})")

    def _on_grid_click(self, layer: int, head: int) -> None:
        self.select(layer, head)
        self.show_view("heatmap")

    def set_running(self, has_model: bool) -> None:
        """Enable Run once a model is loaded; Step once a prompt ran; Back once a token was generated."""
        snap = self.snapshot
        ran = snap is not None and snap.seq_len > 0
        self.run_button.setEnabled(has_model)
        for w in (self.step_button, self.stepn_button):
            w.setEnabled(has_model and ran)
        self.back_button.setEnabled(has_model and ran and snap.n_generated > 0)

    # -- commands (Commands does them) -----------------------------------------------------------
    def load_model(self, model: str | None) -> None:
        self.commands.load_model(model)

    def run_prompt(self) -> None:
        self.commands.run_prompt()

    def step(self, n: int = 1) -> None:
        self.commands.step(n)

    def step_back(self, n: int = 1) -> None:
        self.commands.step_back(n)

    def set_backend(self, name: str) -> None:
        self.commands.set_backend(name)

    def request_weights(self) -> None:
        self.maps.request_weights()

    def show_error(self, message: str) -> None:
        """Show ``message`` in the status bar and, when the window is visible, a dialog."""
        self.status.show_error(message)

    def _show_token_strip(self) -> None:  # the name tests have used
        self.maps.show_token_strip()

    # -- files -------------------------------------------------------------------------------------
    def open_model_dialog(self) -> None:
        from attnscope.app.model_picker import ModelPickerDialog

        st = self.state
        dlg = ModelPickerDialog(
            self, backend=st.backend, device=st.device, dtype=st.dtype, quantize=st.quantize
        )
        if dlg.exec() and dlg.selected_path():
            st.update(
                backend=dlg.backend.currentText(),
                device=dlg.device.currentText(),
                dtype=dlg.dtype.currentText(),
                quantize=dlg.quantize.currentText(),
            )
            self.load_model(dlg.selected_path())

    def open_folder_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open Hugging Face model folder", str(Path.home()))
        if path:
            self.load_model(path)

    def export_heatmap_png(self, path: str | os.PathLike) -> Path:
        """Save the heatmap as shown (labels, colour bar) to a PNG. Raises OSError on failure."""
        path = Path(path)
        if not self.heatmap.glw.grab().save(str(path), "PNG"):
            raise OSError(f"could not write {path}")
        self.statusBar().showMessage(f"Saved {path}", 5000)
        return path

    def export_heatmap_data(self, path: str | os.PathLike) -> Path:
        """Save the current head's weights as .npy or .csv (by suffix)."""
        from attnscope.core.cli.commands.export import write_weights

        path = Path(path)
        try:
            write_weights(self.weights, path)
        except (OSError, ValueError) as e:
            self.show_error(str(e))
            raise
        self.statusBar().showMessage(f"Saved {path}", 5000)
        return path

    # drag and drop a model folder or .gguf
    def dragEnterEvent(self, e) -> None:
        urls = e.mimeData().urls() if e.mimeData().hasUrls() else []
        if len(urls) == 1 and urls[0].isLocalFile():
            p = Path(urls[0].toLocalFile())
            if p.is_dir() or p.suffix.lower() == ".gguf":
                e.acceptProposedAction()

    def dropEvent(self, e) -> None:
        self.load_model(e.mimeData().urls()[0].toLocalFile())

    def about_text(self) -> str:
        """Help → About: the version, the model that runs (name, source) and the backend, device, dtype."""
        from attnscope.core import __version__

        lines = [
            f"{APP_NAME} {__version__}",
            "Step through decode and inspect every attention head.",
            "Weights are exact recomputations from captured queries, cached keys and LSE.",
        ]
        snap = self.snapshot
        if snap is None:
            lines.append("Model: none loaded yet")
        else:
            lines.append(f"Model: {snap.info.name} ({snap.info.architecture}) from {snap.info.source}")
            lines.append(f"Backend: {snap.backend} on {snap.device}, {snap.info.dtype}")
        return "\n".join(lines)

    def about(self) -> None:
        QMessageBox.about(self, f"About {APP_NAME}", self.about_text())

    def closeEvent(self, e) -> None:
        self.engine.shutdown()
        super().closeEvent(e)
