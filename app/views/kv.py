"""KV-cache panel: live bytes per layer and in total, growth with seq_len, schemes, a calculator.

* Live: the session's cache tensors as measured on the engine thread (:func:`core.kv_live.kv_live`),
  per layer (bars) and in total, next to the formula ``2 × n_layers × n_kv_heads × head_dim ×
  seq_len × bytes`` (handbook §7).
* Growth: measured totals at every sequence length this panel has seen (prefill, each step)
  on the formula's line; and the projection of the same model under MHA / GQA / MQA up to the
  model's maximum context.
* Calculator: any configuration (layers, query heads, KV heads, head_dim, tokens, dtype, batch)
  through :mod:`core.kv`; the "Llama-2-70B" preset reproduces the handbook's table (80 layers,
  head_dim 128, 8192 tokens, bf16: MHA 21.5 GB, GQA-8 2.7 GB, MQA 0.34 GB).
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
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

from app.views.sinks import style_plot
from app.views.state import SavedControls
from core.kv import KVConfig, compare_schemes, format_bytes
from core.kv_live import KVLive

SCHEME_COLOURS = {"MHA": "#c0392b", "GQA": "#2e86c1", "MQA": "#27ae60", "MLA": "#8e44ad"}
CALC_DTYPES = ("bf16", "fp16", "fp32", "fp8")
PRESETS = {
    # name: (layers, query heads, KV heads, head_dim, tokens, dtype, batch)
    "Llama-2-70B, 8192 tokens (handbook §7)": (80, 64, 8, 128, 8192, "bf16", 1),
    "Llama-3-8B, 8192 tokens": (32, 32, 8, 128, 8192, "bf16", 1),
    "Mistral-7B, 32768 tokens": (32, 32, 8, 128, 32768, "bf16", 1),
}
MB = 1e6


def unit_for(max_bytes: float, at_least: float = 2.0) -> tuple[str, float]:
    """The largest decimal unit in which ``max_bytes`` is ``>= at_least``: ``("MB", 1e6)`` etc."""
    for name, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if max_bytes >= at_least * size:
            return name, size
    return "bytes", 1.0


def fmt3(x: float) -> str:
    """3 significant digits without exponent: ``21.5``, ``2.68``, ``0.336``, ``1130``."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _kv_job(ctx):
    from core.errors import SessionError
    from core.kv_live import kv_live

    if ctx.session is None:
        raise SessionError("no model loaded")
    return kv_live(ctx.session)


def _item(text: str, align=Qt.AlignRight | Qt.AlignVCenter) -> QTableWidgetItem:
    it = QTableWidgetItem(text)
    it.setFlags(Qt.ItemIsSelectable | Qt.ItemIsEnabled)
    it.setTextAlignment(align)
    return it


def fill_scheme_table(table: QTableWidget, rows_now, rows_max=None, max_context: int = 0,
                      given: str = "this model") -> None:
    """Rows: scheme, KV heads, bytes now, (bytes at max context), × smaller than MHA.

    Each size column is printed in one decimal unit chosen by its largest entry, 3 significant
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
    for c, rows in enumerate(columns, start=2):
        unit, size = unit_for(max(r.total_bytes for r in rows), at_least=1.0)
        for i, row in enumerate(rows):
            it = _item(f"{fmt3(row.total_bytes / size)} {unit}")
            cfg = row.config
            it.setToolTip(f"{row.total_bytes:,} bytes = {cfg.elements_per_token_per_layer} elements × {cfg.n_layers} "
                          f"layers × {row.seq_len:,} tokens × batch {cfg.batch} × {cfg.dtype}")
            table.setItem(i, c, it)
    for i, r in enumerate(rows_now):
        table.setItem(i, 0, _item(r.label + (f"  ({given})" if r.is_given else ""), Qt.AlignLeft | Qt.AlignVCenter))
        table.setItem(i, 1, _item(str(r.config.n_kv_heads)))
        table.setItem(i, len(heads) - 1, _item("1×" if r.vs_mha == 1 else f"{r.vs_mha:.3g}× smaller"))
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeToContents)
    header.setStretchLastSection(True)
    table.verticalHeader().setDefaultSectionSize(22)
    table.setFixedHeight(26 + 22 * len(rows_now) + 4)


class KVView(QWidget, SavedControls):
    """The KV cache tab."""

    STATE_CONTROLS = ("preset_combo", "calc_layers", "calc_heads", "calc_kv", "calc_dim", "calc_tokens",
                      "calc_batch", "calc_dtype")  # saved in session files

    def __init__(self, main, parent: QWidget | None = None):
        super().__init__(parent)
        self.main = main
        self.live: KVLive | None = None
        self.history: dict[int, int] = {}  # seq_len -> measured bytes, for the current sequence
        self._run_key = None

        # live summary + per-layer bars
        live_box = QGroupBox("Live KV cache (measured tensors)")
        lb = QVBoxLayout(live_box)
        self.live_label = QLabel("Run a prompt to fill the cache.")
        self.live_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.live_label.setWordWrap(True)
        lb.addWidget(self.live_label)
        self.layer_plot = pg.PlotWidget(background="w")
        style_plot(self.layer_plot)
        pi = self.layer_plot.getPlotItem()
        pi.setLabel("bottom", "layer")
        pi.setLabel("left", "K + V (kB)")
        pi.showGrid(y=True, alpha=0.25)
        self.layer_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush="#2e86c1")
        pi.addItem(self.layer_bars)
        lb.addWidget(self.layer_plot, 1)

        # growth with seq_len (this run)
        self.growth_plot = pg.PlotWidget(background="w")
        style_plot(self.growth_plot)
        gp = self.growth_plot.getPlotItem()
        gp.setTitle("This run: KV cache vs seq_len", color="#222", size="10pt")
        gp.setLabel("bottom", "seq_len (tokens)")
        gp.setLabel("left", "KV cache (MB)")
        gp.showGrid(x=True, y=True, alpha=0.25)
        gp.addLegend(offset=(10, 10), labelTextColor="#222")
        self.formula_curve = gp.plot([], [], pen=pg.mkPen("#2e86c1", width=2), name="formula (this model)")
        self.measured_points = gp.plot([], [], pen=None, symbol="o", symbolSize=8, symbolBrush="#e67e22",
                                       symbolPen="#7f3f00", name="measured after prefill / step")

        # projection to max context, MHA / GQA / MQA
        self.proj_plot = pg.PlotWidget(background="w")
        style_plot(self.proj_plot)
        pp = self.proj_plot.getPlotItem()
        pp.setTitle("Projection to max context", color="#222", size="10pt")
        pp.setLabel("bottom", "seq_len (tokens)")
        pp.setLabel("left", "KV cache (MB)")
        pp.showGrid(x=True, y=True, alpha=0.25)
        pp.addLegend(offset=(10, 10), labelTextColor="#222")
        self.proj_curves: dict[str, pg.PlotDataItem] = {}
        self.now_line = pg.InfiniteLine(angle=90, pen=pg.mkPen("#e67e22", width=1, style=Qt.DashLine),
                                        label="now", labelOpts={"position": 0.55, "color": "#a04000"})
        pp.addItem(self.now_line)

        self.scheme_table = QTableWidget()
        self.scheme_table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.scheme_table.verticalHeader().hide()

        # calculator
        calc = QGroupBox("Calculator")
        calc.setToolTip("KV cache = 2 × layers × KV heads × head_dim × tokens × batch × bytes per element")
        cl = QVBoxLayout(calc)
        form = QFormLayout()
        self.preset_combo = QComboBox()
        self.preset_combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.preset_combo.setMinimumContentsLength(20)
        self.preset_combo.addItem("This model", None)
        for name in PRESETS:
            self.preset_combo.addItem(name, name)
        form.addRow("Preset", self.preset_combo)
        self.calc_layers = self._spin(1, 1000, 80, "Transformer layers with a KV cache")
        self.calc_heads = self._spin(1, 1024, 64, "Query heads (MHA caches one K/V head per query head)")
        self.calc_kv = self._spin(1, 1024, 8, "K/V heads (n_kv_heads)")
        self.calc_dim = self._spin(1, 4096, 128, "head_dim")
        self.calc_tokens = self._spin(0, 100_000_000, 8192, "Tokens cached (seq_len)")
        self.calc_batch = self._spin(1, 100_000, 1, "Sequences in the batch")
        self.calc_dtype = QComboBox()
        self.calc_dtype.addItems(CALC_DTYPES)
        grid = QGridLayout()
        pairs = [("Layers", self.calc_layers), ("Query heads", self.calc_heads), ("KV heads", self.calc_kv),
                 ("head_dim", self.calc_dim), ("Tokens", self.calc_tokens), ("Batch", self.calc_batch),
                 ("dtype", self.calc_dtype)]
        for i, (text, w) in enumerate(pairs):
            grid.addWidget(QLabel(text), i // 3, 2 * (i % 3), Qt.AlignRight)
            grid.addWidget(w, i // 3, 2 * (i % 3) + 1)
        cl.addLayout(form)
        cl.addLayout(grid)
        self.calc_result = QLabel("")
        self.calc_result.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.calc_result.setStyleSheet("font-weight:bold;")
        self.calc_result.setWordWrap(True)
        cl.addWidget(self.calc_result)
        self.calc_table = QTableWidget()
        self.calc_table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.calc_table.verticalHeader().hide()
        cl.addWidget(self.calc_table)

        plots = QHBoxLayout()
        plots.addWidget(live_box, 2)
        plots.addWidget(self.growth_plot, 3)
        plots.addWidget(self.proj_plot, 3)
        schemes = QGroupBox("This model under MHA / GQA / MQA")
        sl = QVBoxLayout(schemes)
        sl.addWidget(self.scheme_table)
        note = QLabel("Layers, query heads, head_dim and dtype kept; only the KV heads change. "
                      "Live: the bytes of the K and V tensors the session's cache holds now. For a plain cache they "
                      "equal 2 × layers × KV heads × head_dim × seq_len × bytes per element. The cache grows "
                      "linearly with the context: the projection is that line up to the model's maximum context. "
                      "Hover a size for its exact bytes.")
        note.setWordWrap(True)
        note.setStyleSheet("color:#555;")
        sl.addWidget(note)
        sl.addStretch(1)
        bottom = QHBoxLayout()
        bottom.addWidget(schemes, 1)
        bottom.addWidget(calc, 1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(plots, 1)
        lay.addLayout(bottom)

        self.preset_combo.currentIndexChanged.connect(self._on_preset)
        for w in (self.calc_layers, self.calc_heads, self.calc_kv, self.calc_dim, self.calc_tokens, self.calc_batch):
            w.valueChanged.connect(lambda _v: self.recalculate())
        self.calc_dtype.currentIndexChanged.connect(lambda _i: self.recalculate())
        self.preset_combo.setCurrentIndex(1)  # the handbook's table, until a model is loaded
        self._on_preset()

    @staticmethod
    def _spin(lo: int, hi: int, value: int, tip: str) -> QSpinBox:
        s = QSpinBox()
        s.setRange(lo, hi)
        s.setValue(value)
        s.setToolTip(tip)
        s.setGroupSeparatorShown(True)
        return s

    # -- main-window hooks ---------------------------------------------------------------------------
    def on_snapshot(self, snap) -> None:
        key = (snap.info.name, snap.prompt, snap.chat_template, snap.n_prompt)
        if key != self._run_key:
            self._run_key = key
            self.history = {}
        self.history = {n: b for n, b in self.history.items() if n <= snap.seq_len}
        if snap.seq_len > 0:  # cheap: sizes of the cache tensors
            self.main.engine.submit("kv", _kv_job, self.set_live, label="KV cache")

    def refresh(self) -> None:
        if self.main.snapshot is not None:
            self.main.engine.submit("kv", _kv_job, self.set_live, label="KV cache")

    # -- live ----------------------------------------------------------------------------------------
    def set_live(self, live: KVLive) -> None:
        """Show a measurement (GUI thread)."""
        first = self.live is None or self.live.config.name != live.config.name
        self.live = live
        if live.seq_len > 0:
            self.history[live.seq_len] = live.total_bytes
        cfg = live.config
        ok = live.total_bytes == live.formula_bytes
        elem = cfg.bytes_per_token // max(1, 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim)
        self.live_label.setText(
            f"<b>{format_bytes(live.total_bytes)}</b> ({live.total_bytes:,} bytes) at seq_len {live.seq_len:,}<br>"
            f"formula 2 × {cfg.n_layers} × {cfg.n_kv_heads} × {cfg.head_dim} × {live.seq_len:,} × {elem} B "
            f"({cfg.dtype}) = {live.formula_bytes:,} "
            + ("<span style='color:#1e8449'>✓ equal</span>" if ok else "<span style='color:#b02a2a'>≠ measured</span>")
            + f"<br>{format_bytes(cfg.bytes_per_token)} per token · "
            f"{format_bytes(int(live.layer_bytes.max()) if len(live.layer_bytes) else 0)} per layer")
        n = len(live.layer_bytes)
        lmax = float(live.layer_bytes.max()) if n else 0.0
        lu, ls = unit_for(lmax)
        self.layer_bars.setOpts(x=np.arange(n), height=live.layer_bytes.astype(float) / ls, width=0.8)
        lp = self.layer_plot.getPlotItem()
        lp.setTitle(f"per layer ({n} layers)", color="#222", size="9pt")
        lp.setLabel("left", f"K + V ({lu})")
        lp.setXRange(-0.8, n - 0.2, padding=0)
        lp.setYRange(0, max(lmax / ls * 1.1, 1e-9), padding=0)

        # this run: measured points on the formula line
        T = max(live.seq_len, max(self.history, default=0), 1)
        xs = np.array([0, int(T * 1.15) + 1], dtype=np.int64)
        gy = cfg.project(xs)
        gu, gs = unit_for(float(gy[-1]))
        self.formula_curve.setData(xs, gy / gs)
        pts = sorted(self.history.items())
        self.measured_points.setData([p[0] for p in pts], [p[1] / gs for p in pts])
        self.growth_plot.getPlotItem().setLabel("left", f"KV cache ({gu})")

        # projection: MHA / GQA / MQA to max context
        max_ctx = live.max_context or max(live.seq_len, 1)
        pp = self.proj_plot.getPlotItem()
        xs = np.array([0, max_ctx], dtype=np.int64)
        pu, ps = unit_for(float(max(r.total_bytes for r in live.schemes_max)))
        pp.setLabel("left", f"KV cache ({pu})")
        for r in live.schemes_max:
            name = f"{r.label} ({r.config.n_kv_heads} KV heads)" + (" · this model" if r.is_given else "")
            curve = self.proj_curves.get(r.scheme)
            pen = pg.mkPen(SCHEME_COLOURS.get(r.scheme, "#555"), width=3 if r.is_given else 1.5,
                           style=Qt.SolidLine if r.is_given else Qt.DashLine)
            if curve is None or first:
                if curve is not None:
                    pp.removeItem(curve)
                    pp.legend.removeItem(curve)
                curve = pp.plot([], [], pen=pen, name=name)
                self.proj_curves[r.scheme] = curve
            curve.setData(xs, r.config.project(xs) / ps)
        self.now_line.setValue(live.seq_len)
        pp.setXRange(0, max_ctx, padding=0.02)
        pp.setTitle(f"Projection to max context ({max_ctx:,} tokens)", color="#222", size="10pt")
        fill_scheme_table(self.scheme_table, live.schemes_now, live.schemes_max, max_ctx)
        if first and self.preset_combo.currentData() is None:
            self._on_preset()

    # -- calculator ---------------------------------------------------------------------------------------
    def calc_config(self) -> KVConfig:
        return KVConfig(n_layers=self.calc_layers.value(), n_kv_heads=self.calc_kv.value(),
                        head_dim=self.calc_dim.value(), n_heads=self.calc_heads.value(),
                        dtype=self.calc_dtype.currentText(), batch=self.calc_batch.value())

    def _on_preset(self) -> None:
        name = self.preset_combo.currentData()
        if name is None:
            info = self.main.snapshot.info if self.main.snapshot is not None else None
            if info is None:
                return
            dtype = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(str(info.dtype), "bf16")
            values = (info.n_layers, info.n_heads, info.n_kv_heads, info.head_dim,
                      int(info.max_context or 4096), dtype, 1)
        else:
            values = PRESETS[name]
        widgets = (self.calc_layers, self.calc_heads, self.calc_kv, self.calc_dim, self.calc_tokens)
        for w, v in zip(widgets, values[:5], strict=True):
            w.blockSignals(True)
            w.setValue(int(v))
            w.blockSignals(False)
        self.calc_dtype.blockSignals(True)
        self.calc_dtype.setCurrentText(values[5])
        self.calc_dtype.blockSignals(False)
        self.calc_batch.blockSignals(True)
        self.calc_batch.setValue(values[6])
        self.calc_batch.blockSignals(False)
        self.recalculate()

    def recalculate(self) -> None:
        """Update the calculator's result and its MHA / GQA / MQA table."""
        heads, kv = self.calc_heads.value(), self.calc_kv.value()
        if heads % kv:
            self.calc_result.setText(f"query heads ({heads}) must be a multiple of KV heads ({kv})")
            self.calc_result.setStyleSheet("font-weight:bold; color:#b02a2a;")
            self.calc_table.setRowCount(0)
            return
        self.calc_result.setStyleSheet("font-weight:bold;")
        cfg = self.calc_config()
        T = self.calc_tokens.value()
        total = cfg.total_bytes(T)
        self.calc_result.setText(f"KV cache: {format_bytes(total)}  ({total:,} bytes) · "
                                 f"{format_bytes(cfg.bytes_per_token)} per token · {cfg.scheme}")
        rows = compare_schemes(cfg, T, gqa_kv_heads=kv if 1 < kv < heads else None)
        fill_scheme_table(self.calc_table, rows, given="your config")

    def calc_rows(self) -> list[tuple[str, int, int]]:
        """``(label, KV heads, bytes)`` of the calculator table (for tests)."""
        cfg = self.calc_config()
        kv, heads = self.calc_kv.value(), self.calc_heads.value()
        return [(r.label, r.config.n_kv_heads, r.total_bytes)
                for r in compare_schemes(cfg, self.calc_tokens.value(), gqa_kv_heads=kv if 1 < kv < heads else None)]


def install_view(window) -> KVView:
    """Create the KV cache tab and register it with ``window.add_view("kv", ...)``."""
    view = KVView(window)
    window.add_view("kv", "KV cache", view)
    return view
