"""KV-cache panel: live bytes per layer and in total, growth with seq_len, schemes, a calculator.

* Live: the session's cache tensors as measured on the engine thread (:func:`attnscope.core.analysis.kv_live.kv_live`),
  per layer (bars) and in total, next to the formula ``2 × n_layers × n_kv_heads × head_dim ×
  seq_len × bytes`` (docs/tabs/kv.md).
* Growth: measured totals at every sequence length this panel has seen (prefill, each step)
  on the formula's line; and the projection of the same model under MHA / GQA / MQA up to the
  model's maximum context.
* Calculator: any configuration (layers, query heads, KV heads, head_dim, tokens, dtype, batch,
  sliding window and the layers that have it) through :mod:`attnscope.core.kv_formula`; the "Llama-2-70B" preset
  reproduces the handbook's table (80 layers, head_dim 128, 8192 tokens, bf16: MHA 21.5 GB,
  GQA-8 2.7 GB, MQA 0.34 GB).

Sliding windows (Gemma 3, Mistral, Qwen2 with windows): the model's cache needs only
``min(seq_len, W_l)`` tokens in a windowed layer; AttnScope keeps every key of every layer so that
every early row stays inspectable. Both figures are shown wherever they differ: the model's need
is the headline, the formula, the scheme comparison and the projection; the measured tensors are
what AttnScope keeps.

The plots do not zoom with the mouse wheel (it scrolls the page) and their ranges start at 0.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from attnscope.app.engine import Request
from attnscope.app.tabs import FollowsPage
from attnscope.app.views.saved_controls import SavedControls
from attnscope.app.views.sinks import style_plot
from attnscope.core.analysis.kv_live import KVLive
from attnscope.core.kv_formula import (
    KVConfig,
    compare_schemes,
    format_bytes,
    windows_from_spec,
    windows_spec,
)
from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QAbstractScrollArea,
    QApplication,
    QComboBox,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

STATE_COLOUR = "#9b7bb8"  # per-layer bars of a hybrid model's recurrent / convolution states
SCHEME_COLOURS = {"MHA": "#c0392b", "GQA": "#2e86c1", "MQA": "#27ae60", "MLA": "#8e44ad"}
CALC_DTYPES = ("bf16", "fp16", "fp32", "fp8")
PRESETS = {
    # name: (layers, query heads, KV heads, head_dim, tokens, dtype, batch[, window, sliding layers])
    "Llama-2-70B, 8192 tokens": (80, 64, 8, 128, 8192, "bf16", 1),
    "Llama-3-8B, 8192 tokens": (32, 32, 8, 128, 8192, "bf16", 1),
    "Mistral-7B, 32768 tokens": (32, 32, 8, 128, 32768, "bf16", 1),
    "Mistral-7B-v0.1, window 4096, 32768 tokens": (32, 32, 8, 128, 32768, "bf16", 1, 4096, "all"),
    "Gemma-3-270M, window 512 (5:1), 32768 tokens": (18, 4, 1, 256, 32768, "bf16", 1, 512, "5:1"),
}
MB = 1e6
KEPT_COLOUR = "#b9c7d6"  # what AttnScope keeps (every key), behind what the model needs
NEED_COLOUR = "#2e86c1"


class WheelToPage(QObject):
    """Event filter for a plot's viewport: the mouse wheel scrolls the scroll area the plot sits in
    (the tab's page) instead of zooming the plot."""

    def __init__(self, plot: QAbstractScrollArea):
        super().__init__(plot)
        self.plot = plot

    def eventFilter(self, obj, event) -> bool:
        if event.type() != QEvent.Type.Wheel:
            return False
        w = self.plot.parentWidget()
        while w is not None and not isinstance(w, QAbstractScrollArea):
            w = w.parentWidget()
        if w is not None:
            d = event.angleDelta()
            QApplication.sendEvent(
                w.horizontalScrollBar() if abs(d.x()) > abs(d.y()) else w.verticalScrollBar(), event
            )
        return True  # never to the plot


def freeze_plot(plot: pg.PlotWidget, x_min: float = 0.0) -> None:
    """No mouse zoom or pan (the wheel scrolls the page: :class:`WheelToPage`) and ranges that never
    go below ``x_min`` / 0."""
    vb = plot.getPlotItem().getViewBox()
    for name in ("left", "bottom"):  # the label carries the unit (kB, MB…): never pyqtgraph's "(x1e-09)"
        plot.getPlotItem().getAxis(name).enableAutoSIPrefix(False)
    vb.setMouseEnabled(x=False, y=False)
    vb.setLimits(xMin=x_min, yMin=0.0)
    plot.getPlotItem().hideButtons()
    plot.getPlotItem().setMenuEnabled(False)
    plot.viewport().installEventFilter(WheelToPage(plot))


def layer_formula(cfg: KVConfig, seq_len: int) -> str:
    """The per-layer sum with this run's numbers: ``"2 × 1 × 256 × (3 × 1,252 + 15 × 512) × 4 B"``."""
    elem = cfg.token_layer_bytes // max(1, cfg.elements_per_token_per_layer * cfg.batch)
    head = f"2 × {cfg.n_kv_heads} × {cfg.head_dim}"
    if cfg.windows is None:
        return f"{head} × {cfg.n_layers} layers × {seq_len:,} × {elem} B"
    counts: dict[int, int] = {}
    for t in cfg.layer_tokens(seq_len):
        counts[int(t)] = counts.get(int(t), 0) + 1
    terms = " + ".join(f"{c} × {t:,}" for t, c in sorted(counts.items(), reverse=True))
    return f"{head} × ({terms}) × {elem} B"


def unit_for(max_bytes: float, at_least: float = 2.0) -> tuple[str, float]:
    """The largest decimal unit in which ``max_bytes`` is ``>= at_least``: ``("MB", 1e6)`` etc.;
    terabytes from 1 TB (``1.37 TB``, never ``1374 GB``)."""
    if max_bytes >= 1e12:
        return "TB", 1e12
    for name, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if max_bytes >= at_least * size:
            return name, size
    return "bytes", 1.0


def fmt3(x: float) -> str:
    """3 significant digits without exponent: ``21.5``, ``2.68``, ``0.336``, ``1130``."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _kv_job(ctx):
    from attnscope.core.analysis.kv_live import kv_live

    return kv_live(ctx.require())


def _item(text: str, align=Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter) -> QTableWidgetItem:
    it = QTableWidgetItem(text)
    it.setFlags(Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsEnabled)
    it.setTextAlignment(align)
    return it


def fill_scheme_table(
    table: QTableWidget, rows_now, rows_max=None, max_context: int = 0, given: str = "this model"
) -> None:
    """Rows: scheme, KV heads, bytes now, (bytes at max context), × smaller than MHA.

    The whole table is printed in one decimal unit chosen by its largest entry, 3 significant
    digits (the handbook's "21.5 GB · 2.68 GB · 0.336 GB"); the exact bytes are the tooltip.
    """
    heads = ["Scheme", "KV heads", f"{rows_now[0].seq_len:,} tokens"]
    if rows_max is not None:
        heads.append(f"max {max_context:,}")
    heads.append("vs MHA")
    table.clear()
    table.setColumnCount(len(heads))
    table.setHorizontalHeaderLabels(heads)
    table.setRowCount(len(rows_now))
    columns = [rows_now] + ([rows_max] if rows_max is not None else [])
    unit, size = unit_for(max(r.total_bytes for rows in columns for r in rows), at_least=1.0)  # one unit
    for c, rows in enumerate(columns, start=2):
        for i, row in enumerate(rows):
            it = _item(f"{fmt3(row.total_bytes / size)} {unit}")
            cfg = row.config
            if cfg.windows is None:
                it.setToolTip(
                    f"{row.total_bytes:,} bytes = {cfg.elements_per_token_per_layer} elements × {cfg.n_layers} "
                    f"layers × {row.seq_len:,} tokens × batch {cfg.batch} × {cfg.dtype}"
                )
            else:
                kept = cfg.without_windows().total_bytes(row.seq_len)
                it.setToolTip(
                    f"{row.total_bytes:,} bytes = {cfg.elements_per_token_per_layer} elements × "
                    f"{int(cfg.layer_tokens(row.seq_len).sum()):,} layer-tokens (Σ min({row.seq_len:,}, W) "
                    f"over {cfg.n_layers} layers) × batch {cfg.batch} × {cfg.dtype}; "
                    f"every key kept: {kept:,} bytes"
                )
            table.setItem(i, c, it)
    for i, r in enumerate(rows_now):
        table.setItem(
            i,
            0,
            _item(
                r.label + (f"  ({given})" if r.is_given else ""),
                Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
            ),
        )
        table.setItem(i, 1, _item(str(r.config.n_kv_heads)))
        table.setItem(i, len(heads) - 1, _item("1×" if r.vs_mha == 1 else f"{r.vs_mha:.3g}× smaller"))
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    header.setStretchLastSection(True)
    table.verticalHeader().setDefaultSectionSize(22)
    table.setFixedHeight(26 + 22 * len(rows_now) + 4)


class KVView(FollowsPage, QWidget, SavedControls):
    """The KV cache tab, built with the :class:`attnscope.app.state.ViewState` and the
    :class:`attnscope.app.engine.Engine`. ``statusChanged(text, tooltip)``: the status bar's KV figure
    (what the model needs, and what AttnScope keeps)."""

    statusChanged = Signal(str, str)

    STATE_CONTROLS = (
        "preset_combo",
        "calc_layers",
        "calc_heads",
        "calc_kv",
        "calc_dim",
        "calc_tokens",
        "calc_batch",
        "calc_dtype",
        "calc_window",
        "calc_sliding",
    )  # saved in session files

    def __init__(self, state, engine, parent: QWidget | None = None):
        super().__init__(parent)
        self.state, self.engine = state, engine
        state.events.snapshot.connect(self.on_snapshot)
        state.events.loaded.connect(lambda _snap: self.on_model_loaded())
        self.live: KVLive | None = None
        self.history: dict[int, int] = {}  # seq_len -> measured bytes, for the current sequence
        self._run_key: tuple | None = None

        # live summary + per-layer bars
        live_box = QGroupBox("Live KV cache (measured tensors)")
        lb = QVBoxLayout(live_box)
        self.live_label = QLabel("Run a prompt to fill the cache.")
        self.live_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.live_label.setWordWrap(True)
        lb.addWidget(self.live_label)
        self.layer_plot = pg.PlotWidget(background="w")
        style_plot(self.layer_plot)
        pi = self.layer_plot.getPlotItem()
        pi.setLabel("bottom", "layer")
        pi.setLabel("left", "K + V (kB)")
        pi.showGrid(y=True, alpha=0.25)
        self.kept_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=KEPT_COLOUR)  # AttnScope keeps
        self.layer_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=NEED_COLOUR)  # the model needs
        # a hybrid model's linear-attention / Mamba / convolution layers: their fixed-size states (not KV)
        self.state_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=STATE_COLOUR)
        pi.addItem(self.kept_bars)
        pi.addItem(self.layer_bars)
        pi.addItem(self.state_bars)
        freeze_plot(self.layer_plot, x_min=-1.0)
        lb.addWidget(self.layer_plot, 1)

        # growth with seq_len (this run)
        self.growth_plot = pg.PlotWidget(background="w")
        style_plot(self.growth_plot)
        gp = self.growth_plot.getPlotItem()
        # titles on two short lines, legend names short: a 1000 px window's plots are ~230 px wide
        gp.setTitle("This run:<br>KV cache vs seq_len", color="#222", size="10pt")
        gp.setLabel("bottom", "seq_len (tokens)")
        gp.setLabel("left", "KV cache (MB)")
        gp.showGrid(x=True, y=True, alpha=0.25)
        gp.addLegend(offset=(10, 10), labelTextColor="#222")
        self.formula_curve = gp.plot([], [], pen=pg.mkPen("#2e86c1", width=2), name="formula (this model)")
        self.need_curve = gp.plot(
            [], [], pen=pg.mkPen("#1e8449", width=2, style=Qt.PenStyle.DashLine)
        )  # windows
        self.measured_points = gp.plot(
            [],
            [],
            pen=None,
            symbol="o",
            symbolSize=8,
            symbolBrush="#e67e22",
            symbolPen="#7f3f00",
            name="measured",  # after the prefill and each step
        )
        freeze_plot(self.growth_plot)

        # projection to max context, MHA / GQA / MQA
        self.proj_plot = pg.PlotWidget(background="w")
        style_plot(self.proj_plot)
        pp = self.proj_plot.getPlotItem()
        pp.setTitle("Projection to<br>max context", color="#222", size="10pt")
        pp.setLabel("bottom", "seq_len (tokens)")
        pp.setLabel("left", "KV cache (MB)")
        pp.showGrid(x=True, y=True, alpha=0.25)
        pp.addLegend(offset=(10, 10), labelTextColor="#222")
        self.proj_curves: dict[str, pg.PlotDataItem] = {}
        self.now_line = pg.InfiniteLine(
            angle=90,
            pen=pg.mkPen("#e67e22", width=1, style=Qt.PenStyle.DashLine),
            label="now",
            labelOpts={"position": 0.55, "color": "#a04000"},
        )
        pp.addItem(self.now_line)
        self.kept_curve: pg.PlotDataItem | None = None  # AttnScope keeps (windowed models only)
        freeze_plot(self.proj_plot)

        self.scheme_table = QTableWidget()
        self.scheme_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.scheme_table.verticalHeader().hide()

        # calculator
        calc = QGroupBox("Calculator")
        calc.setToolTip("KV cache = 2 × layers × KV heads × head_dim × tokens × batch × bytes per element")
        cl = QVBoxLayout(calc)
        form = QFormLayout()
        self.preset_combo = QComboBox()
        self.preset_combo.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.preset_combo.setMinimumContentsLength(20)
        self.preset_combo.addItem("This model", None)
        for name in PRESETS:
            self.preset_combo.addItem(name, name)
        self.preset_combo.addItem(self.CUSTOM, "custom")  # the fields as edited (restorable from a session)
        form.addRow("Preset", self.preset_combo)
        self.calc_layers = self._spin(1, 1000, 80, "Transformer layers with a KV cache")
        self.calc_heads = self._spin(1, 1024, 64, "Query heads (MHA caches one K/V head per query head)")
        self.calc_kv = self._spin(1, 1024, 8, "K/V heads (n_kv_heads)")
        self.calc_dim = self._spin(1, 4096, 128, "head_dim")
        self.calc_tokens = self._spin(0, 100_000_000, 8192, "Tokens cached (seq_len)")
        self.calc_batch = self._spin(1, 100_000, 1, "Sequences in the batch")
        self.calc_dtype = QComboBox()
        self.calc_dtype.addItems(CALC_DTYPES)
        self.calc_window = self._spin(
            0,
            100_000_000,
            0,
            "Sliding window in keys (0 = none): a windowed layer caches min(tokens, window) tokens",
        )
        self.calc_window.setSpecialValueText("none")
        self.calc_sliding = QComboBox()
        self.calc_sliding.setEditable(True)
        self.calc_sliding.addItems(["all", "5:1", "3:1", "1:1"])
        self.calc_sliding.setToolTip(
            "Layers with the window: all; S:G = S sliding layers then G global ones, "
            "repeated (Gemma 3: 5:1); or a list of layers such as 0-4,6-10"
        )
        self.calc_sliding.setMinimumContentsLength(6)
        self.calc_sliding.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        grid = QGridLayout()
        pairs = [
            ("Layers", self.calc_layers),
            ("Query heads", self.calc_heads),
            ("KV heads", self.calc_kv),
            ("head_dim", self.calc_dim),
            ("Tokens", self.calc_tokens),
            ("Batch", self.calc_batch),
            ("dtype", self.calc_dtype),
            ("Window", self.calc_window),
            ("Sliding layers", self.calc_sliding),
        ]
        # two pairs a row: three were wider than the tab beside the schemes table in a 1000 px window
        for i, (text, w) in enumerate(pairs):
            grid.addWidget(QLabel(text), i // 2, 2 * (i % 2), Qt.AlignmentFlag.AlignRight)
            grid.addWidget(w, i // 2, 2 * (i % 2) + 1)
        cl.addLayout(form)
        cl.addLayout(grid)
        self.calc_result = QLabel("")
        self.calc_result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.calc_result.setStyleSheet("font-weight:bold;")
        self.calc_result.setWordWrap(True)
        cl.addWidget(self.calc_result)
        self.calc_table = QTableWidget()
        self.calc_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.calc_table.verticalHeader().hide()
        cl.addWidget(self.calc_table)

        # the plots fill the tab page's visible height (PLOTS_MIN_HEIGHT at least), the tables and the
        # calculator below are reached by scrolling: at 1000 x 650 the plots were 611 px tall in a 361 px
        # page, their axis titles below its edge (:meth:`fit_to_page`)
        self.plots_box = QWidget()
        plots = QHBoxLayout(self.plots_box)
        plots.setContentsMargins(0, 0, 0, 0)
        plots.addWidget(live_box, 2)
        plots.addWidget(self.growth_plot, 3)
        plots.addWidget(self.proj_plot, 3)
        schemes = QGroupBox("This model under MHA / GQA / MQA")
        sl = QVBoxLayout(schemes)
        sl.addWidget(self.scheme_table)
        note = QLabel(
            "Layers, query heads, head_dim, dtype and sliding windows kept; only the KV heads change. "
            "Live: the bytes of the K and V tensors the session's cache holds now. For a plain cache they "
            "equal 2 × layers × KV heads × head_dim × seq_len × bytes per element. A layer with a "
            "sliding window of W keys needs only min(seq_len, W) of them: the model's cache (and this "
            "table) counts that; AttnScope still keeps every key so that every early row can be "
            "inspected. The cache grows linearly with the context (past the windows, only the global "
            "layers grow): the projection follows it to the model's maximum context. "
            "Hover a size for its exact bytes."
        )
        note.setWordWrap(True)
        note.setStyleSheet("color:#555;")
        sl.addWidget(note)
        sl.addStretch(1)
        bottom = QHBoxLayout()
        bottom.addWidget(schemes, 1)
        bottom.addWidget(calc, 1)
        self._layout = lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.plots_box, 1)
        lay.addLayout(bottom)

        self.preset_combo.currentIndexChanged.connect(self._on_preset)
        for w in (
            self.calc_layers,
            self.calc_heads,
            self.calc_kv,
            self.calc_dim,
            self.calc_tokens,
            self.calc_batch,
            self.calc_window,
        ):
            w.valueChanged.connect(lambda _v: self.recalculate())
        self.calc_dtype.currentIndexChanged.connect(lambda _i: self.recalculate())
        self.calc_sliding.currentTextChanged.connect(lambda _t: self.recalculate())
        self.preset_combo.setCurrentIndex(1)  # the handbook's table, until a model is loaded
        self._on_preset()

    PLOTS_MIN_HEIGHT = 240  # px: room for a plot's title, curves, ticks and axis titles

    def fit_to_page(self) -> None:
        """The plots' row as tall as the page's visible height (less the margins), at least
        :data:`PLOTS_MIN_HEIGHT`: their axis titles are on screen without scrolling."""
        viewport = self._page_viewport
        if viewport is None:
            return
        m = self._layout.contentsMargins()
        h = max(self.PLOTS_MIN_HEIGHT, viewport.height() - m.top() - m.bottom())
        if self.plots_box.height() != h or self.plots_box.minimumHeight() != h:
            self.plots_box.setFixedHeight(h)

    @staticmethod
    def _spin(lo: int, hi: int, value: int, tip: str) -> QSpinBox:
        s = QSpinBox()
        s.setRange(lo, hi)
        s.setValue(value)
        s.setToolTip(tip)
        s.setGroupSeparatorShown(True)
        return s

    # -- state ---------------------------------------------------------------------------------------
    def _measure(self) -> None:
        self.engine.submit("kv", Request(_kv_job, self.set_live, "KV cache", needs="model"))

    def on_snapshot(self, snap) -> None:
        if snap is None:
            return
        key = (snap.info.name, snap.prompt, snap.chat_template, snap.n_prompt)
        if key != self._run_key:
            self._run_key = key
            self.history = {}
        self.history = {n: b for n, b in self.history.items() if n <= snap.seq_len}
        self.update_status()  # the model's windows are known from the last measurement of this model
        if snap.seq_len > 0:  # cheap: sizes of the cache tensors
            self._measure()

    def on_model_loaded(self) -> None:
        """Measure the new model's (empty) cache: its windows feed the status bar from the first run."""
        self._calc_restored = False  # a new model: "This model" fills the calculator from it again
        self._measure()

    def restore_view_state(self, state: dict) -> None:
        """Restore the saved calculator; its values count as the user's: the next model's first
        measurement does not replace them with the model's own (the "This model" preset's fill)."""
        super().restore_view_state(state)
        if isinstance(state, dict) and any(name in state for name in self.STATE_CONTROLS[1:]):
            self._calc_restored = True

    def refresh(self) -> None:
        self._measure()

    # -- live ----------------------------------------------------------------------------------------
    def set_live(self, live: KVLive) -> None:
        """Show a measurement (GUI thread)."""
        first = self.live is None or self.live.config != live.config
        self.live = live
        if live.seq_len > 0:
            self.history[live.seq_len] = live.total_bytes
        cfg, kept = live.config, live.kept_config
        T = live.seq_len
        ok = live.total_bytes == live.formula_bytes
        check = (
            "<span style='color:#1e8449'>✓ equal</span>"
            if ok
            else "<span style='color:#b02a2a'>≠ measured</span>"
        )
        if live.windowed:
            self.live_label.setText(
                f"<b>Model needs {format_bytes(live.model_bytes)}</b> ({live.model_bytes:,} B) at seq_len {T:,}<br>"
                f"= {layer_formula(cfg, T)} ({cfg.dtype})<br>"
                f"<b>AttnScope keeps {format_bytes(live.total_bytes)}</b> ({live.total_bytes:,} B measured) "
                f"= {layer_formula(kept, T)} {check}<br>"
                f"{format_bytes(cfg.bytes_per_token)} per token until the windows fill, then "
                f"{format_bytes(cfg.steady_bytes_per_token)} · bars: <span style='color:{NEED_COLOUR}'>■</span> needed, "
                f"<span style='color:{KEPT_COLOUR}'>■</span> kept"
            )
            self.live_label.setToolTip(
                f"{cfg.describe_windows()}: those layers attend to the last W keys only, so the model's cache "
                f"needs min(seq_len, W) tokens there.\nAttnScope keeps every key of every layer, so that every "
                f"early row stays inspectable (the Mask and Heatmap tabs show the whole prompt)."
            )
        else:
            self.live_label.setText(
                f"<b>{format_bytes(live.total_bytes)}</b> ({live.total_bytes:,} bytes) at seq_len {T:,}<br>"
                f"formula {layer_formula(cfg, T)} ({cfg.dtype}) = {live.formula_bytes:,} {check}"
                f"<br>{format_bytes(cfg.bytes_per_token)} per token · "
                f"{format_bytes(int(live.layer_bytes.max()) if len(live.layer_bytes) else 0)} per layer"
            )
            self.live_label.setToolTip("")
        states = (
            np.asarray(live.state_layer_bytes, dtype=np.int64)
            if live.state_layer_bytes is not None
            else np.zeros(len(live.layer_bytes), np.int64)
        )
        if (
            states.any()
        ):  # a hybrid model: its other layers' states, counted apart (docs/how-it-works.md "Hybrid models")
            n_state = int(np.count_nonzero(states))
            self.live_label.setText(
                self.live_label.text()
                + f"<br><span style='color:{STATE_COLOUR}'>■</span> + <b>{format_bytes(live.state_bytes)}</b> "
                f"({live.state_bytes:,} B) of recurrent/conv states in {n_state} layers: fixed size, "
                f"not KV cache · KV in layers {', '.join(map(str, live.kv_layers))} only"
            )
        self.update_status()
        n = len(live.layer_bytes)
        if n == cfg.n_layers:
            need = cfg.layer_bytes(T).astype(float)
        elif live.kv_layers and len(live.kv_layers) == cfg.n_layers:  # hybrid: back to real layer indices
            need = np.zeros(n)
            need[list(live.kv_layers)] = cfg.layer_bytes(T).astype(float)
        else:
            need = live.layer_bytes.astype(float)
        lmax = float(max(live.layer_bytes.max(), states.max())) if n else 0.0
        # no sequence yet (0 bytes): the unit and range of one token's K + V in a layer, not 0..1e-9 bytes
        ltop = lmax or float(cfg.token_layer_bytes)
        lu, ls = unit_for(ltop)
        self.kept_bars.setOpts(x=np.arange(n), height=live.layer_bytes.astype(float) / ls, width=0.8)
        self.layer_bars.setOpts(x=np.arange(n), height=need / ls, width=0.8 if not live.windowed else 0.5)
        # narrow, so that a layer with both (Falcon-H1: attention + Mamba) shows its K + V bar around it
        self.state_bars.setOpts(x=np.arange(n), height=states.astype(float)[:n] / ls, width=0.35)
        lp = self.layer_plot.getPlotItem()
        if states.any():
            lp.setTitle(
                f"per layer ({n}): K + V, <span style='color:{STATE_COLOUR}'>■</span> state",
                color="#222",
                size="9pt",
            )
            lp.setLabel("left", f"K + V or state ({lu})")
        else:
            lp.setTitle(f"per layer ({n} layers)", color="#222", size="9pt")
            lp.setLabel("left", f"K + V ({lu})")
        lp.setXRange(-0.8, n - 0.2, padding=0)
        # layers are whole numbers: ticks every 1, 2, 5… layers, never "0.5"
        major = next(k for k in (1, 2, 5, 10, 20, 50, 100, 10**9) if max(n, 1) / k <= 8)
        lp.getAxis("bottom").setTickSpacing(major=major, minor=1)
        lp.setYRange(0, max(ltop / ls * 1.1, 1.0), padding=0)

        # this run: measured points on the formula line (what AttnScope keeps), and the model's need
        top = max(T, max(self.history, default=0), 1)
        xs = np.array([0, int(top * 1.15) + 1], dtype=np.int64)
        gy = kept.project(xs)
        gu, gs = unit_for(float(gy[-1]))
        self.formula_curve.setData(xs, gy / gs)
        gp = self.growth_plot.getPlotItem()
        if live.windowed:
            bx = cfg.breakpoints(int(xs[-1]))
            self.need_curve.setData(bx, cfg.project(bx) / gs)
        else:
            self.need_curve.setData([], [])
        legend = gp.legend
        legend.removeItem(self.formula_curve)
        legend.removeItem(self.need_curve)
        legend.addItem(
            self.formula_curve,
            "formula: AttnScope keeps" if live.windowed else "formula",
        )
        if live.windowed:
            legend.addItem(self.need_curve, "model needs (windows)")
        pts = sorted(self.history.items())
        self.measured_points.setData([p[0] for p in pts], [p[1] / gs for p in pts])
        gp.setLabel("left", f"KV cache ({gu})")
        gp.setXRange(0, int(xs[-1]), padding=0.02)
        gp.setYRange(0, float(gy[-1]) / gs, padding=0.05)

        # projection: MHA / GQA / MQA to max context (what the model needs), and what AttnScope keeps
        max_ctx = live.max_context or max(T, 1)
        pp = self.proj_plot.getPlotItem()
        xs = cfg.breakpoints(max_ctx)
        top_bytes = max(max(r.total_bytes for r in live.schemes_max), kept.total_bytes(max_ctx))
        pu, ps = unit_for(float(top_bytes))
        pp.setLabel("left", f"KV cache ({pu})")
        if first:
            for curve in list(self.proj_curves.values()) + (
                [self.kept_curve] if self.kept_curve is not None else []
            ):
                pp.removeItem(curve)
                pp.legend.removeItem(curve)
            self.proj_curves, self.kept_curve = {}, None
        for r in live.schemes_max:
            name = f"{r.label}: this model" if r.is_given else f"{r.label} ({r.config.n_kv_heads} KV heads)"
            curve = self.proj_curves.get(r.scheme)
            pen = pg.mkPen(
                SCHEME_COLOURS.get(r.scheme, "#555"),
                width=3 if r.is_given else 1.5,
                style=Qt.PenStyle.SolidLine if r.is_given else Qt.PenStyle.DashLine,
            )
            if curve is None:
                curve = pp.plot([], [], pen=pen, name=name)
                self.proj_curves[r.scheme] = curve
            curve.setData(xs, r.config.project(xs) / ps)
        if live.windowed:
            if self.kept_curve is None:
                self.kept_curve = pp.plot(
                    [],
                    [],
                    pen=pg.mkPen("#7f8c8d", width=1.5, style=Qt.PenStyle.DotLine),
                    name="AttnScope keeps",  # every key of this model
                )
            kx = np.array([0, max_ctx], dtype=np.int64)
            self.kept_curve.setData(kx, kept.project(kx) / ps)
        self.now_line.setValue(T)
        pp.setXRange(0, max_ctx, padding=0.02)
        pp.setYRange(0, top_bytes / ps, padding=0.05)
        pp.setTitle(f"Projection to max context<br>({max_ctx:,} tokens)", color="#222", size="10pt")
        fill_scheme_table(self.scheme_table, live.schemes_now, live.schemes_max, max_ctx)
        if first and self.preset_combo.currentData() is None and not getattr(self, "_calc_restored", False):
            self._on_preset()
        elif first:
            self._calc_restored = False  # kept once; a later model's first measurement fills it again

    def update_status(self) -> None:
        """The status bar's KV figure: what the model needs, and (if more) what AttnScope keeps."""
        live, snap = self.live, self.state.snapshot
        if live is None or snap is None or live.config.name != snap.info.name:
            return
        cfg = live.config
        T = snap.seq_len
        need, kept = cfg.total_bytes(T), cfg.without_windows().total_bytes(T)
        if cfg.windows is None:
            extra = f" + states {format_bytes(live.state_bytes)}" if live.state_bytes else ""
            self.statusChanged.emit(
                f"KV cache {format_bytes(need)} ({need:,} bytes){extra}",
                f"{layer_formula(cfg, T)} ({cfg.dtype}) = {need:,} bytes"
                + (
                    f"; the other layers' recurrent/conv states: {live.state_bytes:,} bytes (fixed size)"
                    if extra
                    else ""
                ),
            )
            return
        self.statusChanged.emit(
            f"KV cache {format_bytes(need)} (model) · {format_bytes(kept)} kept",
            f"The model needs {need:,} bytes: {layer_formula(cfg, T)} ({cfg.dtype}); "
            f"{cfg.describe_windows()}.\nAttnScope keeps every key of every layer, so that every "
            f"early row stays inspectable: {layer_formula(cfg.without_windows(), T)} = {kept:,} bytes",
        )

    # -- calculator ---------------------------------------------------------------------------------------
    def calc_windows(self) -> tuple[int | None, ...] | None:
        """Per-layer windows of the calculator (None without a window). Raises ValueError on a bad layer list."""
        return windows_from_spec(
            self.calc_window.value() or None, self.calc_sliding.currentText(), self.calc_layers.value()
        )

    def calc_config(self) -> KVConfig:
        """The calculator's configuration. Raises ValueError on a bad sliding-layer list."""
        return KVConfig(
            n_layers=self.calc_layers.value(),
            n_kv_heads=self.calc_kv.value(),
            head_dim=self.calc_dim.value(),
            n_heads=self.calc_heads.value(),
            dtype=self.calc_dtype.currentText(),
            batch=self.calc_batch.value(),
            windows=self.calc_windows(),
        )

    def _on_preset(self) -> None:
        values: tuple
        name = self.preset_combo.currentData()
        if name == "custom":  # the edited fields stay as they are
            self.recalculate()
            return
        if name is None:
            info = self.state.snapshot.info if self.state.snapshot is not None else None
            if info is None:
                return
            dtype = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(str(info.dtype), "bf16")
            ws = (
                self.live.config.windows
                if self.live is not None and self.live.config.name == info.name
                else None
            )
            window = max((w for w in ws or () if w is not None), default=0)
            values = (
                len(info.arch.attention_layers),  # a hybrid model: the layers with a KV cache
                info.n_heads,
                info.n_kv_heads,
                info.head_dim,
                int(info.max_context or 4096),
                dtype,
                1,
                window,
                windows_spec(ws) if ws else "all",
            )
        else:
            values = PRESETS[name]
        values = tuple(values) + (0, "all")[len(values) - 7 :]  # presets without a window
        widgets = (self.calc_layers, self.calc_heads, self.calc_kv, self.calc_dim, self.calc_tokens)
        for w, v in zip(widgets, values[:5], strict=True):
            w.blockSignals(True)
            w.setValue(int(v))
            w.blockSignals(False)
        box: QComboBox | QSpinBox
        for box, setter, v in (
            (self.calc_dtype, "setCurrentText", values[5]),
            (self.calc_batch, "setValue", values[6]),
            (self.calc_window, "setValue", values[7]),
            (self.calc_sliding, "setCurrentText", values[8]),
        ):
            box.blockSignals(True)
            getattr(box, setter)(v)
            box.blockSignals(False)
        self._preset_filled = self._calc_values()  # what an edit is told apart from
        if hasattr(self, "push_settings"):
            self.push_settings()  # set with the signals blocked: the state (and a saved session) follows
        self.recalculate()

    #: the preset entry for fields edited away from every preset
    CUSTOM = "Custom (edited)"

    def _calc_values(self) -> tuple:
        return (
            self.calc_layers.value(),
            self.calc_heads.value(),
            self.calc_kv.value(),
            self.calc_dim.value(),
            self.calc_tokens.value(),
            self.calc_dtype.currentText(),
            self.calc_batch.value(),
            self.calc_window.value(),
            self.calc_sliding.currentText(),
        )

    def _mark_custom(self) -> None:
        """Edited fields no longer match the preset shown (a named one, or "This model" as it filled
        them): the preset box says "Custom (edited)", so a preset's label never describes other numbers."""
        want = getattr(self, "_preset_filled", None)
        if self.preset_combo.currentData() == "custom" or want is None or self._calc_values() == want:
            return
        i = self.preset_combo.findData("custom")
        self.preset_combo.blockSignals(True)
        self.preset_combo.setCurrentIndex(i)
        self.preset_combo.blockSignals(False)
        if hasattr(self, "push_settings"):
            self.push_settings()

    def _calc_error(self, text: str) -> None:
        self.calc_result.setText(text)
        self.calc_result.setStyleSheet("font-weight:bold; color:#b02a2a;")
        self.calc_table.setRowCount(0)

    def recalculate(self) -> None:
        """Update the calculator's result and its MHA / GQA / MQA table."""
        heads, kv = self.calc_heads.value(), self.calc_kv.value()
        if heads % kv:
            self._calc_error(f"query heads ({heads}) must be a multiple of KV heads ({kv})")
            return
        try:
            cfg = self.calc_config()
        except ValueError as e:
            self._calc_error(str(e))
            return
        self.calc_result.setStyleSheet("font-weight:bold;")
        T = self.calc_tokens.value()
        total = cfg.total_bytes(T)
        self._mark_custom()
        b = cfg.batch
        per_token = f"{format_bytes(cfg.bytes_per_token)} per token"
        if b > 1:  # the formula's per-token bytes cover the whole batch: say both
            per_token = (
                f"{format_bytes(cfg.bytes_per_token // b)} per token per sequence ({per_token} × batch {b})"
            )
        text = f"KV cache: {format_bytes(total)}  ({total:,} bytes) · {per_token} · {cfg.scheme}"
        if cfg.windows is not None:
            kept = cfg.without_windows().total_bytes(T)
            text += (
                f"<br><span style='font-weight:normal'>{cfg.describe_windows()}; every key kept: "
                f"{format_bytes(kept)} ({kept:,} bytes)</span>"
            )
        self.calc_result.setText(text)
        rows = compare_schemes(cfg, T, gqa_kv_heads=kv if 1 < kv < heads else None)
        fill_scheme_table(self.calc_table, rows, given="your config")

    def calc_rows(self) -> list[tuple[str, int, int]]:
        """``(label, KV heads, bytes)`` of the calculator table (for tests)."""
        cfg = self.calc_config()
        kv, heads = self.calc_kv.value(), self.calc_heads.value()
        return [
            (r.label, r.config.n_kv_heads, r.total_bytes)
            for r in compare_schemes(
                cfg, self.calc_tokens.value(), gqa_kv_heads=kv if 1 < kv < heads else None
            )
        ]


def install_view(window) -> KVView:
    """Create the KV cache tab and register it with ``window.add_view("kv", ...)``; its figure goes to
    the status bar's KV label."""
    view = KVView(window.state, window.engine)
    window.add_view("kv", "KV cache", view)
    label = window.kv_label

    def set_label(text: str, tip: str) -> None:
        label.setText(text)
        label.setToolTip(tip)

    view.statusChanged.connect(set_label)
    return view
