"""AttnScope's main window: prompt, Run / Step, layer and head choice, views, status bar.

The window only paints. Every computation is a job on the engine thread (:mod:`attnscope.app.engine`) that
returns numpy arrays or frozen dataclasses (:class:`attnscope.core.session.Snapshot`).

Views are tabs registered with :meth:`MainWindow.add_view`; a view may implement
``on_snapshot(snapshot)``, ``on_selection(layer, head)`` and ``refresh()`` (called when it becomes
visible or the sequence changes) and asks the engine for data with
``window.engine.submit(channel, fn, on_done)``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from attnscope.app.engine import CancelledMessage, Engine
from attnscope.app.head_grid import HeadGridCanvas, HeadGridView
from attnscope.app.heatmap import HeatmapView
from attnscope.app.timeline import TimelineBar
from attnscope.app.token_strip import TokenStrip
from attnscope.app.views.gqa import GqaView
from attnscope.app.views.mask import MaskView
from attnscope.app.views.next_token import DecodePanel
from attnscope.core.io.colormaps import ASSETS
from attnscope.core.session import Snapshot
from PySide6.QtCore import QEvent, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)
from superqt import QElidingLabel

APP_NAME = "AttnScope"


def human_bytes(n: int) -> str:
    """``1428480`` → ``'1.43 MB'`` (decimal units, as the handbook's KV-cache table; :func:`attnscope.core.units.format_bytes`)."""
    from attnscope.core.units import format_bytes

    return format_bytes(n)


def window_wording(message: str) -> str:
    """A core message in the window's words: command-line advice (``use --backend torch``) becomes
    the menu that does it."""
    for flag, menu in (
        ("use --backend torch", "choose Backend → torch"),
        ("use --backend mlx", "choose Backend → MLX"),
        ("--no-chat-template", "the Chat template box"),
    ):
        message = message.replace(flag, menu)
    return message


def sample_prompts() -> list[str]:
    try:
        lines = (ASSETS / "prompts.txt").read_text(encoding="utf-8").splitlines()
    except OSError:
        return ["The quick brown fox jumps over the lazy dog."]
    return [ln.replace("\\n", "\n") for ln in lines if ln.strip()]


# -- jobs (run on the engine thread; they see ctx.session) ------------------------------------------
def _load_job(model, backend, device, dtype, sampling=None, quantize="none"):
    """Load a model; the new session samples with ``sampling`` (the panel's settings), so the
    controls on screen are what runs from the first step."""

    def job(ctx):
        from attnscope.core.errors import Cancelled
        from attnscope.core.session import Session

        def progress(message, fraction):
            # Loading is not chunked: cancel takes effect at the next stage (read, convert, save, load).
            if ctx.cancelled():
                raise Cancelled("loading cancelled; the previous model is still loaded")
            ctx.progress(message, fraction)

        s = Session.load(
            model, backend=backend, device=device, dtype=dtype, progress=progress, quantize=quantize
        )
        if ctx.cancelled():
            raise Cancelled("loading cancelled; the previous model is still loaded")
        if sampling is not None:
            s.set_sampling(sampling)
        ctx.session = s  # replaced only on success: a failed load keeps the previous model
        return s.snapshot()

    return job


def _prefill_job(prompt, chat):
    def job(ctx):
        s = _require(ctx)

        def prog(done, total):
            ctx.progress(f"Prefill {done}/{total} tokens", done / max(1, total))

        s.prefill(prompt, chat_template=chat, progress=prog, cancelled=ctx.cancelled)
        return s.snapshot()

    return job


def _step_job(n):
    def job(ctx):
        s = _require(ctx)
        for i in range(n):
            if ctx.cancelled():
                break
            s.step(1)
            if n > 1:
                ctx.progress(f"Decode {i + 1}/{n}", (i + 1) / n)
        return s.snapshot()

    return job


def _sync_job(ctx):
    """The session's snapshot as it is now (None without a model): what the window shows after a
    command failed or was cancelled, so every control agrees with what the engine holds."""
    return None if ctx.session is None else ctx.session.snapshot()


def _switch_backend_job(backend, device, dtype, view):
    """Reload the running model on ``backend`` and replay the current sequence there (prompt, then
    the generated ids fed one by one, as a reopened session is: :func:`attnscope.core.io.sessionfile.replay`).
    Returns ``(snapshot, warnings)``; the old session stays when anything fails or is cancelled."""

    def job(ctx):
        from dataclasses import replace

        from attnscope.core.errors import Cancelled
        from attnscope.core.io import sessionfile

        old = _require(ctx)
        if old.seq_len == 0:
            raise ValueError("nothing to replay")  # the caller only queues this job after a run
        sf = replace(sessionfile.SessionFile.from_session(old, view=view), backend=backend, dtype=dtype)

        def progress(message, fraction):
            if ctx.cancelled():
                raise Cancelled("switching backend cancelled; the previous backend and run stay")
            ctx.progress(message, fraction)

        s, warnings = sessionfile.replay(
            sf, session=None, device=device, progress=progress, cancelled=ctx.cancelled
        )
        if ctx.cancelled():
            raise Cancelled("switching backend cancelled; the previous backend and run stay")
        ctx.session = s
        return s.snapshot(), [w for w in warnings if "saved on" not in w and "running on" not in w]

    return job


def _back_job(n):
    def job(ctx):
        s = _require(ctx)
        s.step_back(n)
        return s.snapshot()

    return job


LONG_JOBS = (
    "loading model",
    "prefill",
    "decode",
    "open session",
    "batch export",
    "switch backend",
    "compare",
)  # get Cancel + status text


def _percent_progress(ctx, what: str):
    """A ``progress(done, total)`` that reports to the status bar at most once per whole percent."""
    last = [-1]

    def progress(done: int, total: int) -> None:
        pct = 100 * done // max(total, 1)
        if pct != last[0]:
            last[0] = pct
            ctx.progress(f"{what}: {done}/{total}", done / max(total, 1))

    return progress


def _map_job(layer, head, mode, n, shared, cancelled, out=None, weighting="attention"):
    """The heatmap's data for positions ``0..n-1``: exact map, or pooled overview when long.

    ``weighting="value-weighted"``: the row-normalised value-weighted map (:mod:`attnscope.core.analysis.value_weighted`)
    for maps up to ``LONG_PROMPT`` tokens; long overviews stay attention (the title says so).

    ``out`` = ``(columns, rows)`` of a long map's overview (the plot's pixels); while it is computed,
    coarse-to-fine partial overviews go to ``ctx.partial`` as ``(key, PooledMap, auto_max)``.
    """

    def job(ctx):
        from attnscope.core.analysis import aggregate as agg

        s = _require(ctx)
        shared_max = agg.layer_robust_max(s, layer, n, cancelled=cancelled) if shared else None
        progress = _percent_progress(ctx, "Averaging heads") if mode in ("layer", "all") else None
        if n > agg.LONG_PROMPT:
            cols, rows = out or (agg.OVERVIEW, agg.OVERVIEW)

            def partial(pm):
                ctx.partial(((layer, head, mode, n), pm, agg.robust_max(pm.image)))

            pm = agg.pooled_map(
                s,
                layer,
                head,
                mode,
                n,
                out=rows,
                out_cols=cols,
                cancelled=cancelled,
                progress=progress,
                partial=partial,
            )
            return (layer, head, mode, n), None, pm, agg.robust_max(pm.image), shared_max
        if weighting == "value-weighted":
            from attnscope.core.analysis.value_weighted import value_weighted_tile

            w = value_weighted_tile(s, layer, head, mode, slice(0, n), slice(0, n), cancelled=cancelled)
        else:
            w = agg.map_at(s, layer, head, mode, n, cancelled=cancelled, progress=progress)
        return (layer, head, mode, n), w, None, agg.robust_max(w), shared_max

    return job


def _tile_job(key, rows, cols, cancelled):
    def job(ctx):
        from attnscope.core.analysis.aggregate import map_tile

        layer, head, mode, _n = key
        return key, rows.start, cols.start, map_tile(_require(ctx), layer, head, mode, rows, cols, cancelled)

    return job


def _row_job(key, row):
    def job(ctx):
        from attnscope.core.analysis.aggregate import map_tile

        layer, head, mode, n = key
        return key, row, map_tile(_require(ctx), layer, head, mode, slice(row, row + 1), slice(0, n))[0]

    return job


def _next_job(step):
    def job(ctx):
        from attnscope.core.analysis.timeline import next_tokens

        return next_tokens(_require(ctx), step, k=10)

    return job


def _sampling_job(sampling):
    def job(ctx):
        _require(ctx).set_sampling(sampling)
        return sampling

    return job


def _grid_job(size, n, cancelled, weighting="attention"):
    """Every head's max-pooled map over the first ``n`` positions (the timeline's step): ``(n,
    weighting, thumbs)``; ``weighting="value-weighted"``: of the row-normalised value-weighted maps
    (:func:`attnscope.core.analysis.value_weighted_grid.value_weighted_thumbnails`). Partials: ``(n, weighting, thumbs, frac)``."""

    def job(ctx):
        from attnscope.core.analysis.aggregate import thumbnails
        from attnscope.core.analysis.value_weighted_grid import value_weighted_thumbnails

        fn = value_weighted_thumbnails if weighting == "value-weighted" else thumbnails
        return (
            n,
            weighting,
            fn(
                _require(ctx),
                n,
                size=size,
                cancelled=cancelled,
                progress=_percent_progress(ctx, "Head grid thumbnails"),
                partial=lambda th, frac: ctx.partial((n, weighting, th, frac)),
            ),
        )

    return job


def _require(ctx):
    from attnscope.core.errors import SessionError

    if ctx.session is None:
        raise SessionError("no model loaded")
    return ctx.session


class _ViewPage(QScrollArea):
    """A tab page that scrolls its view when the window is smaller than the view's minimum size."""


class _EmptyOverlay(QLabel):
    """Covers a tab page while there is no sequence (a new model, nothing run yet), so that a panel
    never shows the previous model's or prompt's results as if they were current."""

    def __init__(self, page: QWidget):
        super().__init__("Run a prompt to see this panel.", page)
        self.setAlignment(Qt.AlignCenter)
        self.setStyleSheet("background: rgba(255, 255, 255, 240); color: #666; font-size: 13pt;")
        page.installEventFilter(self)
        self.hide()

    def eventFilter(self, obj, event) -> bool:
        if event.type() == QEvent.Resize:
            self.setGeometry(obj.rect())
        return False

    def set_shown(self, on: bool) -> None:
        if on:
            self.setGeometry(self.parentWidget().rect())
            self.raise_()
        self.setVisible(on)


class ViewTabs(QTabWidget):
    """Tabs whose pages scroll, so that no panel forces a large minimum window size.

    ``currentWidget()`` / ``setCurrentWidget()`` speak of the views themselves, not their pages.
    Views that scroll or scale by themselves (pyqtgraph plots, scroll areas) are added as they are.
    """

    def addTab(self, widget: QWidget, title: str) -> int:
        page = widget
        if not isinstance(widget, (QScrollArea, HeatmapView)):
            page = _ViewPage()
            page.setWidgetResizable(True)
            page.setFrameShape(QFrame.NoFrame)
            page.setWidget(widget)
        return super().addTab(page, title)

    def currentWidget(self) -> QWidget:
        w = super().currentWidget()
        return w.widget() if isinstance(w, _ViewPage) else w

    def setCurrentWidget(self, widget: QWidget) -> None:
        page = self.page_of(widget)
        if page is not None:
            self.setCurrentIndex(self.indexOf(page))

    def page_of(self, widget: QWidget) -> QWidget | None:
        """The tab page holding view ``widget`` (the view itself, or its scrolling page)."""
        for i in range(self.count()):
            page = self.widget(i)
            if page is widget or (isinstance(page, _ViewPage) and page.widget() is widget):
                return page
        return None


class MainWindow(QMainWindow):
    """The AttnScope window. ``model=None`` loads the embedded default on start."""

    selectionChanged = Signal(int, int)
    snapshotChanged = Signal(object)

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
        self.engine = Engine(self)
        self.backend_name, self.device, self.dtype = backend, device, dtype
        self.quantize = (
            quantize  # --quantize none|int8|int4 for the next load (attnscope.core.loading.quantize)
        )
        self.model_ref: str | None = model
        self.snapshot: Snapshot | None = None
        self._notices_shown: tuple[str, ...] = ()  # Snapshot.notices already said in the status bar
        self.weights: np.ndarray | None = None
        self.weights_key: tuple[int, int] | None = None
        self.map_key: tuple[int, int, str, int] | None = None  # (layer, head, aggregate, n) shown now
        self.query_row: int | None = None
        self._generations: dict[str, int] = {}
        self.last_error: str | None = None
        self.views: dict[str, QWidget] = {}
        self._empty_overlays: dict[str, _EmptyOverlay] = {}
        self._build_ui()
        self._build_actions()
        self._install_inspector_views()
        self.engine.progress.connect(self._on_progress)
        self.engine.busy.connect(self._on_busy)
        self.engine.error.connect(self.show_error)
        self._set_running(False)
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
        from attnscope.core.io.colormaps import COLORMAPS

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
        self.add_view("heatmap", "Heatmap", self.heatmap)
        self.add_view("grid", "Head grid", self.grid)
        self.add_view("gqa", "GQA groups", GqaView(self))
        self.add_view("mask", "Mask", MaskView(self))
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

        # status bar
        sb = self.statusBar()
        self.model_label = QElidingLabel("No model")  # a long model line ends in "…", never clipped mid-word
        self.model_label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.seq_label = QLabel("seq_len 0")
        self.kv_label = QLabel("KV cache 0 B")
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(180)
        self.progress.setTextVisible(False)
        self.progress.hide()
        self.cancel_button = QToolButton()
        self.cancel_button.setText("Cancel")
        self.cancel_button.setToolTip("Stop the running prefill or decode (Esc)")
        self.cancel_button.hide()
        sb.addWidget(self.model_label, 1)
        sb.addPermanentWidget(self.progress)
        sb.addPermanentWidget(self.cancel_button)
        sb.addPermanentWidget(self.seq_label)
        sb.addPermanentWidget(self.kv_label)

        # signals
        self.run_button.clicked.connect(self.run_prompt)
        self.step_button.clicked.connect(lambda: self.step(1))
        self.stepn_button.clicked.connect(lambda: self.step(self.steps_spin.value()))
        self.back_button.clicked.connect(lambda: self.step_back(1))
        self.cancel_button.clicked.connect(self.engine.cancel)
        self.layer_spin.valueChanged.connect(self._on_selection_spin)
        self.head_spin.valueChanged.connect(self._on_selection_spin)
        self.grid.headClicked.connect(self._on_grid_click)
        # one scale for the heatmap and the grid: either combo sets both (the thumbnail clicked opens a map
        # on the scale it showed)
        self.grid.weightingChanged.connect(self._on_grid_weighting)
        self.heatmap.weighting_combo.currentIndexChanged.connect(self._on_heatmap_weighting)
        self.tabs.currentChanged.connect(lambda _i: self._refresh_current_view())
        self.cmap_combo.currentTextChanged.connect(self._on_cmap)
        self.heatmap.rowClicked.connect(self._on_heatmap_row)
        self.heatmap.optionsChanged.connect(self.request_weights)
        self.heatmap.tileWanted.connect(self._request_tile)
        self.token_strip.tokenClicked.connect(self._on_heatmap_row)
        self.timeline.stepChanged.connect(self._on_step_changed)
        self.decode_panel.samplingChanged.connect(self._on_sampling)

    def _install_inspector_views(self) -> None:
        """Sinks, KV cache, head roles and experiments tabs (issue 4 part B): each module's install_view."""
        from attnscope.app.views import compare, experiments, kv, roles, sinks

        for mod in (sinks, kv, roles, experiments, compare):
            mod.install_view(self)

    def _build_actions(self) -> None:
        mb = self.menuBar()
        file_menu = mb.addMenu("&File")
        self.open_action = self._action(file_menu, "&Open model…", self.open_model_dialog, QKeySequence.Open)
        self._action(file_menu, "Open model &folder…", self.open_folder_dialog)
        self._action(file_menu, "Load &default model", lambda: self.load_model(None))
        file_menu.addSeparator()
        from attnscope.app.export import ExportController

        self.exports = ExportController(self)
        self._action(file_menu, "&Save session…", self.exports.save_session_dialog, "Ctrl+S")
        self._action(file_menu, "Open s&ession…", self.exports.open_session_dialog, "Ctrl+Shift+O")
        file_menu.addSeparator()
        self._action(file_menu, "&Quit", self.close, QKeySequence.Quit)

        export_menu = mb.addMenu("&Export")
        self._action(export_menu, "Export &view as PNG/SVG/PDF…", self.exports.export_view_dialog, "Ctrl+E")
        self._action(
            export_menu,
            "Export &data (.npy, .csv, .safetensors + JSON)…",
            self.exports.export_data_dialog,
            "Ctrl+Shift+E",
        )
        self._action(export_menu, "&Batch export…", self.exports.batch_export_dialog, "Ctrl+Shift+B")

        run_menu = mb.addMenu("&Run")
        self._action(run_menu, "&Run prompt", self.run_prompt, "Ctrl+Return")
        self._action(run_menu, "&Step", lambda: self.step(1), "F10")
        self._action(run_menu, "Step ×&N", lambda: self.step(self.steps_spin.value()), "Ctrl+F10")
        self._action(run_menu, "Step &back", lambda: self.step_back(1), "Shift+F10")
        self._action(run_menu, "&Cancel", self.engine.cancel, "Esc")

        view_menu = mb.addMenu("&View")
        self._action(view_menu, "Next layer", lambda: self.layer_spin.stepBy(1), "PgDown")
        self._action(view_menu, "Previous layer", lambda: self.layer_spin.stepBy(-1), "PgUp")
        self._action(view_menu, "Next head", lambda: self.head_spin.stepBy(1), "]")
        self._action(view_menu, "Previous head", lambda: self.head_spin.stepBy(-1), "[")
        view_menu.addSeparator()
        self.view_menu = view_menu
        for i, key in enumerate(self.views):  # tabs registered before the menu existed
            self._add_view_action(key, self.tabs.tabText(i))

        backend_menu = mb.addMenu("&Backend")
        group = QActionGroup(self)
        group.setExclusive(True)
        self.backend_actions: dict[str, QAction] = {}
        for name, label in (
            ("torch", "&torch (CUDA when available, else CPU)"),
            ("mlx", "&MLX (Apple silicon; slow CPU build on Linux)"),
        ):
            a = QAction(label, self, checkable=True)
            a.setChecked(name == self.backend_name)
            a.triggered.connect(lambda _checked=False, n=name: self.set_backend(n))
            group.addAction(a)
            backend_menu.addAction(a)
            self.backend_actions[name] = a

        help_menu = mb.addMenu("&Help")
        self._action(help_menu, "&About AttnScope", self._about)

    def _action(self, menu, text, slot, shortcut=None) -> QAction:
        a = QAction(text, self)
        if shortcut is not None:
            a.setShortcut(QKeySequence(shortcut))
            a.setShortcutContext(Qt.WindowShortcut)
        a.triggered.connect(slot)
        menu.addAction(a)
        self.addAction(a)
        return a

    def add_view(self, key: str, title: str, widget: QWidget) -> None:
        """Register a view as a tab. Optional hooks: on_snapshot, on_selection, refresh."""
        self.views[key] = widget
        self.tabs.addTab(widget, title)
        if hasattr(self, "view_menu"):
            self._add_view_action(key, title)

    def _add_view_action(self, key: str, title: str) -> None:
        """View → Show <title>, with Ctrl+1…Ctrl+9 for the first nine tabs."""
        idx = list(self.views).index(key)
        # (QAction.triggered passes `checked`: the lambda takes it first, or it would become the key)
        self._action(
            self.view_menu,
            f"Show {title}",
            lambda _checked=False, k=key: self.show_view(k),
            f"Ctrl+{idx + 1}" if idx < 9 else None,
        )

    def show_view(self, key: str) -> None:
        """Bring view ``key`` to front. Raises ValueError for an unknown view."""
        if key not in self.views:
            raise ValueError(f"unknown view {key!r}; choose one of {', '.join(self.views)}")
        self.tabs.setCurrentWidget(self.views[key])

    # -- state ---------------------------------------------------------------------------------
    @property
    def layer(self) -> int:
        return self.layer_spin.value()

    @property
    def head(self) -> int:
        return self.head_spin.value()

    @property
    def visible_len(self) -> int:
        """Positions shown at the timeline's step: ``n_prompt + step`` (:mod:`attnscope.core.analysis.timeline`)."""
        return self.timeline.visible_len

    def submit_view(self, channel: str, fn, on_done, label: str = "updating", on_partial=None) -> int:
        """Submit a view request; a newer one on ``channel`` replaces it (and stops it, see cancel_token).

        A request stopped because a newer one superseded it reports nothing (no error, no callback).
        """
        from attnscope.core.errors import Cancelled

        superseded = object()
        # the sequence this request was made for; if the engine holds another one when it runs (a
        # prefill was cancelled, a step ran in between), it is stale: dropped, the newer state asks again
        expected = None if self.snapshot is None else tuple(t.id for t in self.snapshot.tokens)

        def run(ctx):
            s = ctx.session
            if expected is not None and s is not None and tuple(getattr(s, "ids", expected)) != expected:
                return superseded
            try:
                return fn(ctx)
            except Cancelled:
                return superseded

        def done(result):
            if result is not superseded:
                on_done(result)

        return self.engine.submit(channel, run, done, label=label, on_partial=on_partial)

    def cancel_views(self) -> None:
        """Stop every running or queued view job now (a new prompt makes them all stale): each one's
        ``cancelled()`` turns true, and the blocked aggregates check it before every block."""
        for channel in list(self._generations):
            self._generations[channel] = self._generations[channel] + 1

    def cancel_token(self, channel: str):
        """A ``cancelled()`` callable for a view job: true once a newer request on ``channel`` exists."""
        gen = self._generations.get(channel, 0) + 1
        self._generations[channel] = gen
        return lambda: self._generations.get(channel) != gen

    def _set_running(self, has_model: bool) -> None:
        ran = self.snapshot is not None and self.snapshot.seq_len > 0
        self.run_button.setEnabled(has_model)
        for w in (self.step_button, self.stepn_button):
            w.setEnabled(has_model and ran)
        self.back_button.setEnabled(has_model and ran and self.snapshot.n_generated > 0)

    def select(self, layer: int, head: int) -> None:
        """Show ``(layer, head)``. Raises IndexError when out of range for the loaded model."""
        if self.snapshot is not None:
            info = self.snapshot.info
            if not 0 <= layer < info.n_layers:
                raise IndexError(f"layer {layer} out of range 0..{info.n_layers - 1}")
            if not 0 <= head < info.n_heads:
                raise IndexError(f"head {head} out of range 0..{info.n_heads - 1}")
        for spin, v in ((self.layer_spin, layer), (self.head_spin, head)):
            spin.blockSignals(True)
            spin.setValue(v)
            spin.blockSignals(False)
        self._on_selection_spin()

    def _on_selection_spin(self, *_):
        self._update_group_label()
        self.grid.canvas.set_selected(self.layer, self.head)
        self.selectionChanged.emit(self.layer, self.head)
        for view in self.views.values():
            if hasattr(view, "on_selection"):
                view.on_selection(self.layer, self.head)
        self.request_weights()

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

    def _on_cmap(self, name: str) -> None:
        self.heatmap.set_colormap(name)
        for view in self.views.values():
            if view is not self.heatmap and hasattr(view, "set_colormap"):
                view.set_colormap(name)
        self.grid.canvas.cmap = name
        if self.grid.canvas.thumbs is not None:
            self.grid.canvas.set_thumbnails(self.grid.canvas.thumbs, self.grid.canvas.group_size)
        self._show_token_strip()

    # -- commands ------------------------------------------------------------------------------
    def set_backend(self, name: str) -> None:
        """Switch the compute backend ("torch" or "mlx") and reload the current model on it."""
        import importlib.util

        if name == self.backend_name:
            return
        if name == "mlx" and importlib.util.find_spec("mlx") is None:
            self.show_error("MLX is not installed: pip install 'attnscope[mlx]' (mlx[cpu] on Linux).")
            self.backend_actions[self.backend_name].setChecked(True)
            return
        self.backend_name = name
        if self.snapshot is None or self.snapshot.seq_len == 0:
            self.load_model(self.model_ref)
            return
        # keep the run: reload the model on the new backend and replay the prompt and every generated
        # token there (the old backend and run stay if that fails or is cancelled)
        snap = self.snapshot
        self.statusBar().showMessage(
            f"Switching to {name}: reloading the model and replaying "
            f"{snap.n_prompt} prompt + {snap.n_generated} generated tokens…"
        )
        self.engine.enqueue(
            _switch_backend_job(name, self.device, self.dtype, self.exports.view_state()),
            self._on_backend_switched,
            self._on_backend_switch_failed,
            label="switch backend",
        )

    def _on_backend_switched(self, result) -> None:
        snap, warnings = result
        view = self.exports.view_state()
        sampling = self.decode_panel.sampling()
        self._on_loaded(snap)
        self.prompt_edit.setPlainText(snap.prompt or self.prompt_edit.toPlainText())
        self.chat_check.setChecked(snap.chat_template)
        self.decode_panel.set_sampling(sampling)  # the replayed session kept these settings
        self._on_ran(snap)
        self.exports.restore_view(view)
        msg = f"Now on {snap.backend}: replayed {snap.n_prompt} prompt + {snap.n_generated} generated tokens."
        self.statusBar().showMessage(msg + (" · " + " · ".join(warnings) if warnings else ""), 12000)

    def _on_backend_switch_failed(self, message: str) -> None:
        self._on_load_failed(message)

    def load_model(self, model: str | None) -> None:
        """Load ``model`` (None = embedded default) on the engine thread; the old one stays on failure.

        :attr:`model_ref` changes only once the model is loaded (:meth:`_on_loaded`), from the path
        the loaded model records (:func:`attnscope.core.loading.resolve.model_source`), so a failed or cancelled load
        leaves every control on the model that runs."""
        name = "the default model" if model is None or str(model) == "default" else Path(str(model)).name
        self.statusBar().showMessage(f"Loading {name}…")
        self.engine.enqueue(
            _load_job(
                model, self.backend_name, self.device, self.dtype, self.decode_panel.sampling(), self.quantize
            ),
            self._on_loaded,
            self._on_load_failed,
            label="loading model",
        )

    def _on_loaded(self, snap: Snapshot) -> None:
        from attnscope.core.loading.resolve import is_default_source

        info = snap.info
        self.snapshot = snap
        self.last_error = None
        self.model_ref = None if is_default_source(info.source) else info.source
        self.backend_name = snap.backend
        self.backend_actions[self.backend_name].setChecked(True)
        self.layer_spin.setRange(0, info.n_layers - 1)
        self.head_spin.setRange(0, info.n_heads - 1)
        self.chat_check.setEnabled(info.has_chat_template)
        self.chat_check.setChecked(info.has_chat_template)
        self.model_label.setText(
            f"{info.name} · {info.architecture} · {info.n_layers} layers · {info.n_heads} query heads / "
            f"{info.n_kv_heads} KV heads · head_dim {info.head_dim} · {snap.backend} {snap.device}"
        )
        self.model_label.setToolTip(getattr(info, "dtype_reason", "") or info.dtype)
        why = getattr(
            info, "dtype_reason", ""
        )  # attnscope.core.loading.precision: why this dtype ("float32: ... no fast bf16 ...")
        quant = "; ".join(
            q
            for q in (
                f"file {info.quantization_file}" if info.quantization_file else "",
                info.quantization_runtime,
            )
            if q
        )  # attnscope.core.loading.quantize.record
        if info.quantization_runtime:  # "int8 weight-only (torchao 0.18.0, ...)" -> "int8 weight-only"
            self.model_label.setText(
                self.model_label.text() + f" · {info.quantization_runtime.split(' (')[0]}"
            )
        self.statusBar().showMessage(
            f"{info.name} ready{f' at {why}' if why else ''}{f' ({quant})' if quant else ''}. "
            "Type a prompt and press Run (Ctrl+Enter).",
            8000,
        )
        for view in self.views.values():
            if hasattr(view, "on_model_loaded"):
                view.on_model_loaded()
        self._show_empty(snap)

    def _show_empty(self, snap: Snapshot, why: str = "") -> None:
        """The clear empty state (a new model, or a cancelled prefill): no map, no tokens, no next-token
        table, the timeline at 0 / 0, Step and Back off, the panels covered until Run."""
        self.query_row = None
        self.heatmap.clear()
        if why:
            self.heatmap.plot.setTitle(why)
        self.map_key = self.weights_key = None
        self.weights = None
        self.grid.canvas.thumbs = None
        self.grid.canvas._image = None
        self.grid.canvas.set_placeholder(HeadGridCanvas.PLACEHOLDER)
        self.token_strip.clear()
        self.decode_panel.set_table(None)
        self._apply_snapshot(snap)
        self._set_running(True)

    def _on_load_failed(self, message: str) -> None:
        if self.snapshot is not None:  # the previous model (its backend, device and dtype) stays
            self.backend_name = self.snapshot.backend
            self.device, self.dtype = self.snapshot.device, self.snapshot.info.dtype
            self.backend_actions[self.backend_name].setChecked(True)
        if isinstance(message, CancelledMessage):
            self.show_error(message)  # "loading cancelled; the previous model is still loaded"
        else:
            self.show_error(f"Could not load the model: {window_wording(message)}")
        self._set_running(self.snapshot is not None)

    def run_prompt(self) -> None:
        prompt = self.prompt_edit.toPlainText()
        if not prompt.strip():
            self.show_error("The prompt is empty: type some text first.")
            return
        self.cancel_views()  # the old prompt's maps are stale: stop computing them now, not after
        self.heatmap.mark_stale("stale: previous prompt (running the new one…)")
        self.engine.enqueue(
            _prefill_job(prompt, self.chat_check.isChecked() and self.chat_check.isEnabled()),
            self._on_ran,
            self._on_command_failed,
            label="prefill",
        )

    def step(self, n: int = 1) -> None:
        if self.snapshot is None or self.snapshot.seq_len == 0:
            self.show_error("Run a prompt before stepping.")
            return
        want = self.snapshot.n_generated + n

        def done(snap: Snapshot) -> None:
            self._on_ran(snap)
            if snap.n_generated < want and snap.seq_len:  # cancelled part-way: the tokens made so far stay
                self.show_error(
                    CancelledMessage(
                        f"decode cancelled after {n - (want - snap.n_generated)} of {n} "
                        "tokens; the tokens made so far stay"
                    )
                )

        self.engine.enqueue(_step_job(n), done, self._on_command_failed, label="decode")

    def step_back(self, n: int = 1) -> None:
        if self.snapshot is None or self.snapshot.n_generated < n:
            self.statusBar().showMessage("Nothing to step back: no generated token.", 4000)
            return
        self.engine.enqueue(_back_job(n), self._on_ran, self._on_command_failed, label="step back")

    def _on_command_failed(self, message: str) -> None:
        """A prefill, decode or replay failed or was cancelled: say so, then show what the engine holds
        now (a cancelled prefill leaves the session empty: the clear empty state, never the old map
        with controls that no longer match it)."""
        self.show_error(message)
        self.engine.enqueue(_sync_job, lambda snap: self._on_synced(snap, message), label="sync")

    def _on_synced(self, snap: Snapshot | None, why: str = "") -> None:
        if snap is None:
            return
        if snap.seq_len == 0:
            cancelled = isinstance(why, CancelledMessage)
            self._show_empty(
                snap,
                "Cancelled: no sequence now. Press Run (Ctrl+Enter) to start again."
                if cancelled
                else "No sequence now: press Run (Ctrl+Enter).",
            )
            if why:
                self.statusBar().showMessage(
                    f"{why[:1].upper()}{why[1:]}: no sequence now; press Run (Ctrl+Enter).", 15000
                )
        else:
            self._on_ran(snap)

    def _on_ran(self, snap: Snapshot) -> None:
        self.query_row = None
        self._apply_snapshot(snap)
        self._set_running(True)
        self.request_weights()
        self.request_next_tokens()
        self._refresh_current_view()

    def _on_step_changed(self, _step: int) -> None:
        """Timeline moved: crop every view to the positions of that step (no recompute of the model)."""
        if self.query_row is not None and self.query_row >= self.visible_len:
            self.query_row = None
        self.request_weights()
        self.request_next_tokens()
        self._refresh_current_view()

    def _on_sampling(self, sampling) -> None:
        self.engine.enqueue(_sampling_job(sampling), lambda _s: self.request_next_tokens(), label="sampling")

    def request_next_tokens(self) -> None:
        if self.snapshot is None or self.snapshot.seq_len == 0:
            return
        self.submit_view("next", _next_job(self.timeline.step), self._on_next, label="next token")

    def _on_next(self, table) -> None:
        if table.step == self.timeline.step:
            self.decode_panel.set_table(table)

    def _apply_snapshot(self, snap: Snapshot) -> None:
        from attnscope.core.analysis.kv_formula import (
            dtype_bytes,  # the KV view then shows what the model needs (sliding windows)
        )

        self.snapshot = snap
        self._update_group_label()
        self.seq_label.setText(
            f"seq_len {snap.seq_len}  ({snap.n_prompt} prompt + {snap.n_generated} generated)"
        )
        info = snap.info
        self.kv_label.setText(f"KV cache {human_bytes(snap.kv_cache_bytes)} ({snap.kv_cache_bytes:,} bytes)")
        self.kv_label.setToolTip(
            f"2 × {info.n_layers} layers × {info.n_kv_heads} KV heads × {info.head_dim} head_dim × "
            f"{snap.seq_len} tokens × {dtype_bytes(info.dtype)} bytes = {snap.kv_cache_bytes:,} bytes"
        )
        self.timeline.set_range(snap.n_prompt, snap.n_generated)
        self.snapshotChanged.emit(snap)
        for view in self.views.values():
            if hasattr(view, "on_snapshot"):
                view.on_snapshot(snap)
        # panels that need a sequence are covered until there is one (the heatmap has its own
        # placeholder; the KV calculator works without a run)
        for key, view in self.views.items():
            if key in ("heatmap", "kv"):
                continue
            overlay = self._empty_overlays.get(key)
            if overlay is None:
                page = self.tabs.page_of(view)
                if page is None:
                    continue
                overlay = self._empty_overlays[key] = _EmptyOverlay(page)
            overlay.set_shown(snap.seq_len == 0)
        # what the engine did by itself (a lossy tokenization, a RoPE cache re-run): said once each
        new = [n for n in snap.notices if n not in self._notices_shown]
        self._notices_shown = tuple(snap.notices)
        if new:
            self.statusBar().showMessage("Note: " + " · ".join(new), 20000)

    # -- view requests ---------------------------------------------------------------------------
    def request_weights(self) -> None:
        if self.snapshot is None or self.snapshot.seq_len == 0:
            return
        hm = self.heatmap
        job = _map_job(
            self.layer,
            self.head,
            hm.aggregate,
            self.visible_len,
            hm.range_mode == "shared",
            self.cancel_token("heatmap"),
            out=hm.overview_pixels(),
            weighting=getattr(hm, "weighting", "attention"),
        )
        if self.map_key is not None and self.map_key != self._wanted_key():
            hm.mark_stale("stale: computing the map for this selection…")
        self.submit_view(
            "heatmap", job, self._on_weights, label="weights", on_partial=self._on_weights_partial
        )

    def _wanted_key(self) -> tuple[int, int, str, int]:
        return self.layer, self.head, self.heatmap.aggregate, self.visible_len

    def _on_weights(self, result) -> None:
        key, w, pooled, auto_max, shared_max = result
        if self.snapshot is None or key != self._wanted_key():
            return  # stale: the selection or the sequence changed since the request
        from attnscope.core.analysis.aggregate import describe

        layer, head, mode, n = key
        prev = self.map_key
        reset = prev is None or prev[3] != n
        self.map_key = key
        self.weights_key = (layer, head)
        toks = list(self.snapshot.tokens)[:n]
        step = self.timeline.step
        when = "" if self.timeline.at_latest else f" · step {step} of {self.snapshot.n_generated}"
        title = f"{describe(self.snapshot.info, layer, head, mode)} · seq_len {n}{when}"
        title += f" · {self.heatmap.apply_length_defaults(n)}"
        if getattr(self.heatmap, "weighting", "attention") == "value-weighted":
            title += (
                " · value-weighted α·‖v W_O‖, row-normalised"
                if pooled is None
                else " · value-weighted needs ≤ 1024 tokens: attention shown"
            )
        if pooled is None:
            self.weights = w
            self.heatmap.set_weights(
                w, toks, toks, title=title, reset_view=reset, auto_max=auto_max, shared_max=shared_max
            )
        else:
            self.weights = None  # long map: never held whole on the GUI side
            self.heatmap.set_overview(
                pooled,
                toks,
                title=title + " · overview: max-pooled",
                reset_view=reset,
                auto_max=auto_max,
                shared_max=shared_max,
            )
            self.heatmap.show_status(title + f" · overview: {pooled.pooling}-pooled")
        self._show_token_strip()

    def _on_weights_partial(self, result) -> None:
        """A coarse-to-fine overview of a long map while it is computed: shown at once, said partial."""
        key, pooled, auto_max = result
        if self.snapshot is None or key != self._wanted_key():
            return
        from attnscope.core.analysis.aggregate import describe

        layer, head, mode, n = key
        reset = self.map_key is None or self.map_key[3] != n
        self.map_key = None  # not final: the finished map replaces it (and tiles wait for it)
        self.weights = None
        toks = list(self.snapshot.tokens)[:n]
        title = f"{describe(self.snapshot.info, layer, head, mode)} · seq_len {n}"
        title += f" · {self.heatmap.apply_length_defaults(n)} · overview: {pooled.pooling}-pooled"
        self.heatmap.set_overview(pooled, toks, title=title, reset_view=reset, auto_max=auto_max)
        self.heatmap.show_status(title, f"partial: {pooled.done:.0%} of rows, refining")

    def _request_tile(self, r0: int, r1: int, c0: int, c1: int) -> None:
        if self.map_key is None:
            return
        job = _tile_job(self.map_key, slice(r0, r1), slice(c0, c1), self.cancel_token("heatmap-tile"))
        self.submit_view("heatmap-tile", job, self._on_tile, label="exact tile")

    def _on_tile(self, result) -> None:
        key, r0, c0, tile = result
        if key == self.map_key and self.heatmap.pooled is not None:
            self.heatmap.set_tile(tile, r0, c0)

    def _show_token_strip(self) -> None:
        if self.snapshot is None:
            return
        n = self.visible_len
        toks = list(self.snapshot.tokens)[:n]
        row = n - 1 if self.query_row is None else self.query_row
        self.heatmap.mark_row(self.query_row)  # outlined only once the user picked a row
        if self.weights is not None and self.weights.shape[0] == n:
            self.token_strip.show_tokens(toks, self.weights[row], row, self.cmap_combo.currentText())
        elif self.heatmap.pooled is not None and self.map_key is not None:
            self.token_strip.show_tokens(toks, None, row)
            self.submit_view("strip-row", _row_job(self.map_key, row), self._on_strip_row, label="query row")
        else:
            self.token_strip.show_tokens(toks)

    def _on_strip_row(self, result) -> None:
        key, row, w = result
        if key != self.map_key:
            return
        toks = list(self.snapshot.tokens)[: key[3]]
        self.token_strip.show_tokens(toks, w, row, self.cmap_combo.currentText())

    def _on_heatmap_row(self, row: int) -> None:
        if 0 <= row < self.visible_len:
            self.query_row = row
            self._show_token_strip()

    def _refresh_current_view(self) -> None:
        w = self.tabs.currentWidget()
        if w is self.grid:
            self.request_grid()
        elif hasattr(w, "refresh"):
            w.refresh()

    def request_grid(self) -> None:
        if self.snapshot is None or self.snapshot.seq_len == 0:
            return
        self.grid.canvas.set_placeholder("Computing every head's thumbnail…")
        self.grid.show_scale()
        self.submit_view(
            "grid",
            _grid_job(40, self.visible_len, self.cancel_token("grid"), self.grid.weighting),
            self._on_grid,
            label="head grid",
            on_partial=self._on_grid_partial,
        )

    def _on_grid_weighting(self, weighting: str) -> None:
        combo = self.heatmap.weighting_combo
        combo.setCurrentIndex(combo.findData(weighting))  # -> _on_heatmap_weighting

    def _on_heatmap_weighting(self, _i) -> None:
        self.grid.set_weighting(self.heatmap.weighting)
        if self.tabs.currentWidget() is self.grid:
            self.request_grid()
        else:
            self.grid.show_scale()

    def _on_grid_partial(self, result) -> None:
        n, weighting, thumbs, frac = result
        if self.snapshot is None or n != self.visible_len or weighting != self.grid.weighting:
            return
        self.grid.canvas.cmap = self.cmap_combo.currentText()
        self.grid.canvas.set_thumbnails(thumbs, self.snapshot.info.group_size, weighting)
        self.grid.canvas.set_note(f"partial: {frac:.0%} of layers")
        self.grid.show_scale()

    def _on_grid(self, result) -> None:
        n, weighting, thumbs = result
        if self.snapshot is None or n != self.visible_len or weighting != self.grid.weighting:
            return  # stale: the step or the scale changed since the request
        self.grid.canvas.set_note("")
        self.grid.canvas.cmap = self.cmap_combo.currentText()
        self.grid.canvas.set_thumbnails(thumbs, self.snapshot.info.group_size, weighting)
        self.grid.canvas.set_selected(self.layer, self.head)
        self.grid.show_scale()

    # -- progress / errors -----------------------------------------------------------------------
    def _on_progress(self, message: str, fraction: float) -> None:
        self._busy_message = message
        self.statusBar().showMessage(message)
        if fraction < 0:
            self.progress.setRange(0, 0)
        else:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(fraction * 1000))

    def _on_busy(self, on: bool, label: str) -> None:
        long_job = label in LONG_JOBS
        self.progress.setVisible(on)
        self.cancel_button.setVisible(on and long_job)
        if on:
            self.progress.setRange(0, 0)
            if long_job:
                self._busy_message = f"{label.capitalize()}…"
                self.statusBar().showMessage(self._busy_message)
        else:
            # clear our own progress text, never an error or result message shown since
            if self.statusBar().currentMessage() == getattr(self, "_busy_message", None):
                self.statusBar().clearMessage()
            self._busy_message = None

    def show_error(self, message: str) -> None:
        """Show ``message`` in the status bar and, when the window is visible, a dialog."""
        self.last_error = message
        self.statusBar().showMessage(message, 15000)
        if isinstance(message, CancelledMessage):
            return  # the user asked for it: the status line says what stopped, no dialog
        if self.isVisible() and QApplication.platformName() not in ("offscreen", "minimal"):
            QMessageBox.warning(self, APP_NAME, message)

    # -- files -------------------------------------------------------------------------------------
    def open_model_dialog(self) -> None:
        picker = _model_picker_class()
        if picker is not None:
            dlg = picker(
                self, backend=self.backend_name, device=self.device, dtype=self.dtype, quantize=self.quantize
            )
            if dlg.exec() and dlg.selected_path():
                self.backend_name = dlg.backend.currentText()
                self.device = dlg.device.currentText()
                self.dtype = dlg.dtype.currentText()
                self.quantize = dlg.quantize.currentText()
                self.backend_actions[self.backend_name].setChecked(True)
                self.load_model(dlg.selected_path())
            return
        path, _ = QFileDialog.getOpenFileName(
            self, "Open GGUF model", str(Path.home()), "GGUF models (*.gguf)"
        )
        if path:
            self.load_model(path)

    def open_folder_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open Hugging Face model folder", str(Path.home()))
        if path:
            self.load_model(path)

    def export_image_dialog(self) -> None:
        if self.weights is None:
            self.show_error("Nothing to export yet: run a prompt first.")
            return
        layer, head = self.weights_key
        path, _ = QFileDialog.getSaveFileName(
            self, "Export heatmap image", f"attn_L{layer}_H{head}.png", "PNG (*.png)"
        )
        if path:
            self.export_heatmap_png(path)

    def export_data_dialog(self) -> None:
        if self.weights is None:
            self.show_error("Nothing to export yet: run a prompt first.")
            return
        layer, head = self.weights_key
        path, _ = QFileDialog.getSaveFileName(
            self, "Export heatmap data", f"attn_L{layer}_H{head}.npy", "NumPy (*.npy);;CSV (*.csv)"
        )
        if path:
            self.export_heatmap_data(path)

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

    def _about(self) -> None:
        QMessageBox.about(self, f"About {APP_NAME}", self.about_text())

    def closeEvent(self, e) -> None:
        self.engine.shutdown()
        super().closeEvent(e)


def _model_picker_class():
    try:
        from attnscope.app.model_picker import ModelPickerDialog
    except ImportError:
        return None
    return ModelPickerDialog


# -- entry points -------------------------------------------------------------------------------------
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
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName(APP_NAME)
    app.setOrganizationName(APP_NAME)
    win = MainWindow(
        model=args.model,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        quantize=getattr(args, "quantize", "none"),
    )
    win.resize(*size)
    if args.prompt is not None:
        win.prompt_edit.setPlainText(args.prompt)
    if not args.screenshot:
        win.show()
        if args.prompt is not None:
            QTimer.singleShot(0, lambda: _after_load(win, args))
        return app.exec()
    return _screenshot(app, win, args)


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
        win._refresh_current_view()
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
    app.sendPostedEvents(None, QEvent.DeferredDelete)
    app.processEvents()


QSettings.setDefaultFormat(QSettings.IniFormat)
