"""Experiments panel: change the attention of every layer, compare with the unmodified run.

The runs are :func:`attnscope.core.analysis.experiments.run_experiments` jobs on the engine thread, in a separate KV
cache (the session's own sequence is untouched); each result row shows the effect on the
next-token distribution (KL(base ‖ exp) in nats, top-1 token before → after) and on the prompt's
perplexity. The plot shows, for the selected row, each position's negative log-likelihood of the
actual next token in both runs. Definitions: :mod:`attnscope.core.analysis.experiments`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg
from attnscope.app.engine import CancelledMessage
from attnscope.app.tabs import PageLayout
from attnscope.app.views.saved_controls import SavedControls
from attnscope.app.views.sinks import WrappedLabel, set_short_title, style_plot
from attnscope.core import backend_registry as registry
from attnscope.core.analysis.experiments import (
    KINDS,
    Experiment,
    ExperimentResult,
    default_experiments,
    default_params,
    param_fits,
)
from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

COLUMNS = (
    "Experiment",
    "Parameters",
    "T",
    "KL(base‖exp)\nnext token",
    "Top-1 next token\nbase → experiment",
    "p_exp of\nbase top-1",
    "Prompt perplexity\nbase → experiment",
    "Top-1 agreement\n(all positions)",
)
SHORT = {
    "evict_first": "Evict first k",
    "sinks_window": "Sinks + window",
    "no_causal_prefill": "No causal mask (prefill)",
    "decode_top_left": "Top-left mask (decode bug)",
    "no_scale": "No 1/√d scaling",
}
RUN_ALL_TIP = (
    "Run one of each experiment with the k, window and decode from shown (fitted to each new sequence)"
)
AUTO_RUN_MAX_TOKENS = 512  # the tab runs every experiment by itself for sequences up to this long
#: wall time of one experiment run of the sequence over the prefill of the same tokens, lowest and
#: highest seen on SmolLM2-135M, torch on 2 shared CPU cores: 1,483 tokens, prefill 31.2 s, Run all's
#: six runs (the unmodified one + five) 209.8 s: 1.1 × a run; 720 tokens in the window, prefill
#: 10.0 s, Run all 93.5 s: 1.6 ×; the same again on a quieter machine, prefill 1.7 s, Run all 69.7 s:
#: 6.7 × (the masked runs cannot use the fused kernel's causal path, and the prefill's own time
#: varies with the load): a range, never one figure that looks exact
RUN_OVER_PREFILL = (1.0, 7.0)
#: command labels (:mod:`attnscope.app.commands`) whose job replaces or changes the sequence
SEQUENCE_COMMANDS = frozenset(
    {"prefill", "decode", "step back", "open session", "restore run", "switch backend", "loading model"}
)


@dataclass(frozen=True)
class ExperimentsRun:
    """What an experiments job sends back: the results, the forwards' wall time in seconds (the views
    served between its chunks left out), the tokens those forwards fed (runs × seq_len) and the
    sequence's token ids they ran on."""

    results: list
    seconds: float
    tokens_fed: int
    ids: tuple[int, ...] = ()


def row_key(result: ExperimentResult, ids: tuple[int, ...]) -> tuple:
    """What makes two result rows the same row: the experiment's kind, the parameters it shows
    (``k``/``window`` only where the kind uses them) and its ``decode_from``, on the same sequence
    (its token ids). Running it again gives the same numbers, so the row is replaced, not repeated."""
    ex = result.experiment
    return ex.kind, ex.params, ex.decode_from, result.seq_len, ids


def _experiments_job(
    experiments: list[Experiment] | None,
    ids: tuple[int, ...],
    stop: Callable[[], bool],
    params: dict | None = None,
):
    """Run ``experiments`` (None: one of each kind, with ``params``, the ``k``, ``window`` and
    ``decode_from`` of :func:`attnscope.core.analysis.experiments.default_experiments`) on the
    sequence ``ids`` they were asked for.

    Returns None, at once, when the session holds another sequence by then (a prefill or step queued
    before it ran): nothing of the old sequence is run on the new one. Between forwards it serves the
    view requests waiting (:meth:`attnscope.app.engine.JobContext.serve_views`, in-process sessions
    only), so the map and the other views never queue behind it; ``stop()`` (a new Run) or the user's
    Cancel stops it with :class:`attnscope.core.errors.Cancelled`."""

    def job(ctx):
        from attnscope.core.analysis.experiments import run_experiments

        s = ctx.require()
        if tuple(getattr(s, "ids", ids)) != ids:
            return None
        local = getattr(s, "remote_call", None) is None  # a remote engine runs it all in one call
        served = [0.0]

        def cancelled() -> bool:
            if local:
                t = time.perf_counter()
                if ctx.serve_views():
                    served[0] += time.perf_counter() - t
            return ctx.cancelled() or stop()

        exps = (
            experiments
            if experiments is not None
            else default_experiments(len(ids), s.info.arch, **(params or {}))
        )
        t0 = time.perf_counter()
        results = run_experiments(s, exps, progress=ctx.progress, cancelled=cancelled)
        runs = len({r.experiment.decode_from for r in results}) + len(results)
        return ExperimentsRun(results, time.perf_counter() - t0 - served[0], runs * len(ids), ids)

    return job


def runs_of(n_experiments: int = len(KINDS)) -> int:
    """Forwards over the whole sequence that ``n_experiments`` with one ``decode_from`` take: the
    baseline once, then each experiment (:func:`attnscope.core.analysis.experiments.run_experiments`)."""
    return 1 + n_experiments


def format_estimate(seconds: tuple[float, float]) -> str:
    """``(8, 60)`` → ``'about 10 s to 1 min'``; one figure when both ends round alike."""
    lo, hi = (format_duration(x) for x in seconds)
    return lo if lo == hi else f"{lo} to {hi.removeprefix('about ')}"


def format_duration(seconds: float) -> str:
    """``8`` → ``'about 10 s'``, ``95`` → ``'about 2 min'``: a rounded estimate, never exact-looking."""
    if seconds < 60:
        return f"about {max(5, 5 * round(seconds / 5))} s"
    if seconds < 3600:
        return f"about {max(1, round(seconds / 60))} min"
    return f"about {seconds / 3600:.1f} h"


def _item(text: str, align=Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter) -> QTableWidgetItem:
    it = QTableWidgetItem(text)
    it.setFlags(Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsEnabled)
    it.setTextAlignment(align)
    return it


def _tok(t: tuple[int, str, float]) -> str:
    text = t[1].replace(" ", "␣") if t[1].strip() == "" else t[1]
    return f"{text!r} {t[2]:.2f}"


class SideLegend(pg.LegendItem):
    """A legend in a cell of its plot item's layout, right of the view box: never over the curves (in
    the view box of a 1000 x 650 window's ~90 px tall plot it covered half of them). Not draggable."""

    def updateSize(self) -> None:  # noqa: N802 (pyqtgraph's name)
        """Ask the plot's layout for the room the entries need, spacing included (pyqtgraph's own
        sets its geometry to its entries' widths plus 3 px, which a layout cell then overrides)."""
        self.layout.invalidate()
        size = self.layout.effectiveSizeHint(Qt.SizeHint.PreferredSize)
        self.setMinimumSize(size)
        self.setMaximumSize(size)
        self.updateGeometry()

    def mouseDragEvent(self, ev) -> None:  # noqa: N802 (Qt's name)
        ev.ignore()


def legend_name(ex: Experiment) -> str:
    """The experiment's legend entry: its short name, its parameters on a second line."""
    return SHORT[ex.kind] + (f"<br>{ex.params}" if ex.params else "")


class ExperimentsView(QWidget, SavedControls):
    """The Experiments tab."""

    STATE_CONTROLS = ("kind_combo", "k_spin", "window_spin", "from_spin")  # saved in session files

    def __init__(self, state, engine, parent: QWidget | None = None):
        super().__init__(parent)
        self.state, self.engine = state, engine
        state.events.snapshot.connect(self.on_snapshot)
        state.events.loaded.connect(lambda _snap: self.on_model_loaded())
        self.results: list[ExperimentResult] = []
        self._row_keys: list[tuple] = []  # row_key of each row of the table, in order
        self._run_key: tuple | None = None
        self._auto_done_for: tuple | None = None
        self._running = False
        self._busy: dict[str, float] = {}  # sequence commands running now -> when they started
        self._prefill_rate: tuple[int, float] | None = None  # (tokens, tokens/s) of the last prefill
        self._run_rate: tuple[int, float] | None = None  # (seq_len, tokens/s) of the last experiments
        self._stop = lambda: False  # the running job's stop token (a new Run makes it true)
        self._fitted_for: int | None = None  # the seq_len the k and window boxes were last fitted to
        engine.busy.connect(self._on_busy)

        top = QHBoxLayout()
        top.addWidget(QLabel("Experiment"))
        self.kind_combo = QComboBox()
        for key, title in KINDS.items():
            self.kind_combo.addItem(title, key)
        self.kind_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.kind_combo.setMinimumContentsLength(max(len(t) for t in KINDS.values()))
        # as wide as its longest title where there is room; a 1000 px window shrinks it (the closed
        # combo elides, its list and the help line below say it all) instead of scrolling the tab sideways
        self.kind_combo.setMinimumWidth(220)
        top.addWidget(self.kind_combo)
        self.k_label = QLabel("k")
        self.k_spin = QSpinBox()
        self.k_spin.setRange(0, 1_000_000)
        self.k_spin.setValue(4)
        self.window_label = QLabel("window")
        self.window_spin = QSpinBox()
        self.window_spin.setRange(1, 1_000_000)
        self.window_spin.setValue(16)
        self.window_spin.setToolTip("Most recent tokens kept in the cache (the row's own token included)")
        # what the app last put in the boxes (default_params of the sequence): a box that differs
        # holds the user's own value, kept while it fits the sequence
        self._fitted = {"k": self.k_spin.value(), "window": self.window_spin.value()}
        self.from_spin = QSpinBox()
        self.from_spin.setRange(0, 1_000_000)
        self.from_spin.setSpecialValueText("auto")
        self.from_spin.setToolTip(
            "Positions from here on are fed one token at a time through the KV cache (decode); "
            "auto = the prompt length, at most seq_len − 1, so the next token always comes "
            "from a decode step"
        )
        for w in (
            self.k_label,
            self.k_spin,
            self.window_label,
            self.window_spin,
            QLabel("decode from"),
            self.from_spin,
        ):
            top.addWidget(w)
        self.run_button = QPushButton("Run")
        self.run_button.setToolTip("Run the chosen experiment against the unmodified run of this sequence")
        self.run_all_button = QPushButton("Run all")
        self.run_all_button.setToolTip(RUN_ALL_TIP)
        self.clear_button = QPushButton("Clear")
        top.addStretch(1)

        self.help = WrappedLabel("")
        self.help.setStyleSheet("color:#335;")
        self.help.setMinimumWidth(200)
        second = QHBoxLayout()
        second.addWidget(self.help, 1)
        for button in (self.run_button, self.run_all_button, self.clear_button):
            # as wide as their words: the help line beside them gets the width (fewer lines)
            button.setMaximumWidth(button.fontMetrics().horizontalAdvance(button.text()) + 28)
            second.addWidget(button)
        # a sequence over AUTO_RUN_MAX_TOKENS: why nothing ran by itself, and what Run all will cost
        self.long_note = WrappedLabel("")
        self.long_note.setStyleSheet("color:#7a4a00; background:#fff6e0; padding:4px;")
        self.long_note.hide()

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().hide()
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        # every column as wide as its text ("sinks=4, window=16, decode from 184" was elided in a
        # stretched column), the last one too (stretched to what was left, its header was cut): a
        # narrow window scrolls the table sideways
        hh.setStretchLastSection(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.table.verticalHeader().setDefaultSectionSize(22)
        for col, tip in (
            (3, "Σ p_base · (log p_base − log p_exp) over the vocabulary, nats"),
            (2, "seq_len: tokens in the sequence (prompt + generated)"),
            (6, "exp(mean −log p(x_i | x_<i)) over the prompt's tokens 1..P−1"),
        ):
            item = self.table.horizontalHeaderItem(col)
            if item is not None:  # (each column has one: setHorizontalHeaderLabels)
                item.setToolTip(tip)

        self.plot = pg.PlotWidget(background="w")
        style_plot(self.plot)
        pi = self.plot.getPlotItem()
        # short axis titles: the view box of a 1000 x 650 window is ~90 px tall, and a rotated title
        # longer than its axis is cut at both ends (the tooltip and the title say the rest)
        pi.setLabel("bottom", "predicted position")
        pi.setLabel("left", "−log p (nats)")
        pi.getAxis("left").setToolTip("−log p(actual next token) of each position, in nats")
        pi.showGrid(x=True, y=True, alpha=0.25)
        pi.legend = SideLegend(labelTextColor="#222", brush=pg.mkBrush(255, 255, 255, 200))
        pi.layout.addItem(pi.legend, 2, 3)  # right of the view box (column 2 is the right axis)
        pi.layout.setAlignment(pi.legend, Qt.AlignmentFlag.AlignTop)
        self.base_curve = pi.plot(
            [],
            [],
            pen=pg.mkPen("#555", width=1.5),
            symbol="o",
            symbolSize=4,
            symbolBrush="#555",
            symbolPen=None,
            name="unmodified",
        )
        self.exp_curve = pi.plot(
            [],
            [],
            pen=pg.mkPen("#c0392b", width=1.5),
            symbol="o",
            symbolSize=4,
            symbolBrush="#c0392b",
            symbolPen=None,
            name="experiment",
        )
        self.decode_line = pg.InfiniteLine(
            angle=90,
            pen=pg.mkPen("#888", style=Qt.PenStyle.DotLine),
            label="decode rows →",
            labelOpts={"position": 0.95, "color": "#555"},
        )
        pi.addItem(self.decode_line)
        self.decode_line.hide()

        # the table shows its header and two rows (above its sideways scroll bar), the plot room for
        # its curves: a 1000 x 650 window holds both without scrolling (the splitter moves the rest)
        bar = self.table.horizontalScrollBar().sizeHint().height()
        self.table.setMinimumHeight(self.table.horizontalHeader().sizeHint().height() + 2 * 22 + bar + 2)
        # with these minimums a 1000 x 650 page holds the tab with a help line to spare: with 1 px to
        # spare, one transient scroll bar narrowed the help to five lines, whose height kept it for good
        self.plot.setMinimumHeight(150)
        split = QSplitter(Qt.Orientation.Vertical)
        split.setChildrenCollapsible(False)
        split.addWidget(self.table)
        split.addWidget(self.plot)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 1)
        split.setSizes([260, 300])
        lay = PageLayout(self)  # fills the tab page: the wrapped help line never makes it scroll
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(top)
        lay.addLayout(second)
        lay.addWidget(self.long_note)
        lay.addWidget(split, 1)

        self.kind_combo.currentIndexChanged.connect(lambda _i: self._sync_params())
        self.run_button.clicked.connect(self.run_selected)
        self.run_all_button.clicked.connect(self.run_all)
        self.clear_button.clicked.connect(self.clear)
        self.table.currentCellChanged.connect(lambda row, *_: self._show_result(row))
        self._sync_params()

    # -- parameters ---------------------------------------------------------------------------------------
    def _sync_params(self) -> None:
        kind = self.kind_combo.currentData()
        self.k_label.setText("sink tokens k" if kind == "sinks_window" else "evict first k")
        for w in (self.k_label, self.k_spin):
            w.setVisible(kind in ("evict_first", "sinks_window"))
        for w in (self.window_label, self.window_spin):
            w.setVisible(kind == "sinks_window")
        texts = {
            "evict_first": "Each row at position i ≥ k sees keys k..i: the first k tokens are gone from the KV cache "
            "(keys keep their positions). Token 0 is the attention sink: watch the perplexity.",
            "sinks_window": "StreamingLLM's cache: the row at i sees the first k tokens and the last `window` ones. "
            "k = 0 is plain window attention.",
            "no_causal_prefill": "Prefill without the causal mask: every prompt row also sees the future, so it can "
            "read the token it should predict (perplexity collapses).",
            "decode_top_left": "is_causal=True with a KV cache: the mask is aligned top-left, so a decode row "
            "(1 query, S keys) sees only token 0. Prefill (L = S) is unaffected.",
            "no_scale": "Scores q·k without 1/√head_dim: softmax saturates towards one-hot.",
        }
        self.help.setText(
            texts[kind] + "  Every run uses a separate KV cache: your sequence is not changed. "
            f"Opening this tab runs all five on sequences up to {AUTO_RUN_MAX_TOKENS} tokens."
        )

    def fit_params(self, seq_len: int) -> None:
        """A new sequence length: the k and window boxes take the values that fit it
        (:func:`attnscope.core.analysis.experiments.default_params`), except a value the user typed
        that still fits (:func:`attnscope.core.analysis.experiments.param_fits`); a decode-from past
        the sequence goes back to auto. Run all and the tab's own run read the boxes, so the rows
        show what the boxes show."""
        if seq_len < 2 or seq_len == self._fitted_for:
            return
        self._fitted_for = seq_len
        k, window = default_params(seq_len)
        for name, spin, fitted in (("k", self.k_spin, k), ("window", self.window_spin, window)):
            own = spin.value() != self._fitted[name]
            if not (own and param_fits(spin.value(), seq_len)):
                spin.setValue(fitted)
            self._fitted[name] = fitted
        if self.from_spin.value() >= seq_len:
            self.from_spin.setValue(0)

    def all_params(self) -> dict:
        """Run all's parameters: the boxes' ``k``, ``window`` and ``decode_from`` (None: auto)."""
        f = self.from_spin.value()
        return {
            "k": self.k_spin.value(),
            "window": self.window_spin.value(),
            "decode_from": f if f > 0 else None,
        }

    def experiment(self) -> Experiment:
        """The experiment described by the controls."""
        f = self.from_spin.value()
        return Experiment(
            self.kind_combo.currentData(),
            k=self.k_spin.value(),
            window=self.window_spin.value(),
            decode_from=f if f > 0 else None,
        )

    # -- state ---------------------------------------------------------------------------------------------
    def on_snapshot(self, snap) -> None:
        if snap is None:
            return
        key = (snap.info.name, snap.prompt, snap.chat_template, snap.n_prompt)
        if key != self._run_key:
            self._run_key = key
            self.clear()
        self.fit_params(snap.seq_len)
        enabled = snap.seq_len >= 2 and self._torch(snap)
        for b in (self.run_button, self.run_all_button):
            b.setEnabled(enabled)
        if not self._torch(snap):
            self.help.setText(
                f"Experiments change the attention function of the torch backend; this session runs "
                f"on {snap.backend}. Reload the model with the torch backend to run them."
            )
        self._update_long_note()

    @staticmethod
    def _torch(snap) -> bool:
        return snap.backend in registry.names() and registry.get(snap.backend).overrides

    def refresh(self) -> None:
        """Shown, or the sequence changed while shown: run all five by themselves on a sequence up to
        :data:`AUTO_RUN_MAX_TOKENS` tokens (never while a prefill or step is running: the sequence on
        screen is about to be replaced, and the run after it asks again); over it, say what Run all
        costs (:meth:`_update_long_note`)."""
        snap = self.state.snapshot
        self._update_long_note()
        if snap is None or snap.seq_len < 2 or self._running or not self._torch(snap) or self._busy:
            return
        key = (self._run_key, snap.seq_len)
        if (
            self._auto_done_for != key
            and snap.seq_len <= AUTO_RUN_MAX_TOKENS
            and not self._has_results_for(snap.seq_len)
        ):
            self._auto_done_for = key
            self.run_all()

    def _has_results_for(self, seq_len: int) -> bool:
        return any(r.seq_len == seq_len for r in self.results)

    # -- running -------------------------------------------------------------------------------------------
    def run_selected(self) -> None:
        try:
            ex = self.experiment()
        except ValueError as e:
            self.state.fail(str(e))
            return
        self.run([ex])

    def run_all(self) -> None:
        """Run one experiment of each kind with the parameters the boxes show (:meth:`all_params`),
        fitted to the sequence on screen first (:meth:`fit_params`)."""
        snap = self.state.snapshot
        if snap is not None:
            self.fit_params(snap.seq_len)
        self.run(None)

    def run(self, experiments: list[Experiment] | None) -> None:
        """Queue ``experiments`` (None: one of each kind with the boxes' parameters, :meth:`all_params`)
        on the engine, for the sequence on screen; a new Run
        (:meth:`attnscope.app.engine.Engine.cancel_views`) or Cancel stops them."""
        snap = self.state.snapshot
        if snap is None or snap.seq_len < 2:
            self.state.fail("Run a prompt of at least 2 tokens before an experiment.")
            return
        params = self.all_params() if experiments is None else None
        self._running = True
        self.run_button.setEnabled(False)
        self.run_all_button.setEnabled(False)
        self._stop = self.engine.cancel_token("experiments")
        ids = tuple(t.id for t in snap.tokens)
        self.engine.enqueue(
            _experiments_job(experiments, ids, self._stop, params),
            self._on_run,
            self._on_error,
            label="experiments",
        )

    def _on_run(self, run: ExperimentsRun | None) -> None:
        if run is None:  # the sequence changed before it ran: nothing added; the new one may auto-run
            self._done()
            self._auto_done_for = None
            if self.isVisible():
                self.refresh()
            return
        if run.seconds > 0 and run.tokens_fed and run.results:
            self._run_rate = run.results[0].seq_len, run.tokens_fed / run.seconds
        self.add_results(run.results, ids=run.ids)

    def _on_error(self, message: str) -> None:
        self._done()
        if isinstance(message, CancelledMessage):  # the user's Cancel, or a new Run: a status line
            why = "a new prompt runs" if self._stop() else "cancelled"
            self.state.say(f"Experiments stopped ({why}): no rows added; Run all starts them again.", 10000)
            return
        self.state.fail(f"Experiment failed: {message}")

    # -- long sequences ----------------------------------------------------------------------------------
    def _on_busy(self, on: bool, label: str) -> None:
        """The engine started or ended a job: note the sequence commands running (no auto-run then)
        and time each prefill, for the estimate of what Run all costs."""
        if label not in SEQUENCE_COMMANDS:
            return
        if on:
            self._busy[label] = time.monotonic()
            return
        started = self._busy.pop(label, None)
        snap = self.state.snapshot
        if label == "prefill" and started is not None and snap is not None and snap.n_prompt > 0:
            seconds = time.monotonic() - started
            if seconds > 0:
                self._prefill_rate = snap.n_prompt, snap.n_prompt / seconds
        if not self._busy and self.isVisible():  # a run, step or load ended: the tab may auto-run
            self.refresh()

    def estimate_seconds(self, seq_len: int, n_experiments: int = len(KINDS)) -> tuple[float, float] | None:
        """Wall time that Run all may take on ``seq_len`` tokens: the runs (:func:`runs_of`) at the
        speed of the last experiments' forwards (``(t, t)``), else at the last prefill's speed times
        each end of :data:`RUN_OVER_PREFILL` (``(low, high)`` seconds), each only when measured on at
        least half as many tokens (a short run's speed is its per-forward overhead: 7 tokens said
        "9.7 h" for 3,001); None without one."""
        tokens = runs_of(n_experiments) * seq_len
        if self._run_rate and 2 * self._run_rate[0] >= seq_len:
            t = tokens / self._run_rate[1]
            return t, t
        if self._prefill_rate and 2 * self._prefill_rate[0] >= seq_len:
            t = tokens / self._prefill_rate[1]
            return RUN_OVER_PREFILL[0] * t, RUN_OVER_PREFILL[1] * t
        return None

    def _update_long_note(self) -> None:
        """Over :data:`AUTO_RUN_MAX_TOKENS` tokens and no rows for this length yet: say why nothing
        ran by itself and what Run all costs, on the note and on the button."""
        snap = self.state.snapshot
        long = (
            snap is not None
            and snap.seq_len > AUTO_RUN_MAX_TOKENS
            and self._torch(snap)
            and not self._has_results_for(snap.seq_len)
        )
        if not long:
            self.long_note.hide()
            self.run_all_button.setText("Run all")
            self.run_all_button.setToolTip(RUN_ALL_TIP)
            return
        T = snap.seq_len
        est = self.estimate_seconds(T)
        cost = format_estimate(est) if est is not None else "minutes on a CPU (not measured yet)"
        self.long_note.setText(
            f"This sequence has {T:,} tokens, more than the {AUTO_RUN_MAX_TOKENS} that run by themselves. "
            f"Run all five reruns it {runs_of()} times in separate KV caches: {cost} here. "
            "The other views stay live meanwhile; Cancel (Esc) stops it."
        )
        self.long_note.show()
        self.run_all_button.setText(f"Run all five ({cost})")
        self.run_all_button.setToolTip(
            f"{runs_of()} runs of {T:,} tokens (the unmodified one and one per experiment)"
        )

    def _done(self) -> None:
        self._running = False
        snap = self.state.snapshot
        ok = snap is not None and snap.seq_len >= 2 and self._torch(snap)
        self.run_button.setEnabled(ok)
        self.run_all_button.setEnabled(ok)

    def on_model_loaded(self) -> None:
        """A new model (or backend): results of the previous one no longer apply."""
        self.clear()

    def clear(self) -> None:
        """No rows, and nothing of the rows that were: empty curves, no title, the legend's own names."""
        self.results = []
        self._row_keys = []
        self.table.setRowCount(0)
        self.base_curve.setData([], [])
        self.exp_curve.setData([], [])
        self.decode_line.hide()
        pi = self.plot.getPlotItem()
        pi.titleLabel.setText("")
        pi.setTitle(None)  # hidden, its row gone
        pi.legend.clear()
        pi.legend.addItem(self.base_curve, "unmodified")
        pi.legend.addItem(self.exp_curve, "experiment")
        self._update_long_note()

    # -- results ---------------------------------------------------------------------------------------------
    def add_results(self, results: list[ExperimentResult], ids: tuple[int, ...] | None = None) -> None:
        """Show result rows (GUI thread) of the sequence ``ids`` (None: the one on screen) and plot the
        first of them. A result of the same experiment, parameters and sequence as a row shown
        (:func:`row_key`) replaces that row in place: Run all again, or Run all after the tab's own run,
        gives the same table, not a doubled one; new parameters add rows of their own."""
        self._done()
        if ids is None:
            snap = self.state.snapshot
            ids = tuple(t.id for t in snap.tokens) if snap is not None else ()
        rows, replaced = [], 0
        for r in results:
            key = row_key(r, ids)
            if key in self._row_keys:
                i = self._row_keys.index(key)
                self.results[i] = r
                replaced += 1
            else:
                i = len(self.results)
                self.results.append(r)
                self._row_keys.append(key)
            rows.append(i)
        added = len(results) - replaced
        self.state.say(
            f"{len(results)} experiment(s) done"
            + (f": {replaced} row(s) updated, {added} added" if replaced else ""),
            4000,
        )
        self._update_long_note()
        self.table.setRowCount(len(self.results))
        for i in rows:
            r = self.results[i]
            ex = r.experiment
            changed = r.top1_changed
            cells = [
                _item(SHORT[ex.kind], Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter),
                _item(
                    ", ".join(p for p in (ex.params, f"decode from {ex.decode_from}") if p),
                    Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                ),
                _item(str(r.seq_len)),
                _item(f"{r.kl_next:.4f}"),
                _item(
                    f"{_tok(r.top1_base)} → {_tok(r.top1_exp)}" + ("  changed" if changed else "  same"),
                    Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                ),
                _item(f"{r.p_exp_of_base_top1:.3f}"),
                _item(
                    f"{r.ppl_base:.2f} → {r.ppl_exp:.2f}"
                    + (
                        f"  (×{r.ppl_exp / r.ppl_base:.2g})"
                        if np.isfinite(r.ppl_base) and r.ppl_base > 0
                        else ""
                    )
                ),
                _item(f"{100 * r.top1_agreement:.0f}%"),
            ]
            cells[0].setToolTip(ex.title)
            for c, it in enumerate(cells):
                if changed and c == 4:
                    it.setForeground(QBrush(QColor("#b02a2a")))
                self.table.setItem(i, c, it)
        if rows:
            self.table.setCurrentCell(rows[0], 0)
            self._show_result(rows[0])  # (also when that row was already current: its numbers are new)

    def _show_result(self, row: int) -> None:
        if not 0 <= row < len(self.results):
            return
        r = self.results[row]
        x = np.arange(1, len(r.nll_base) + 1)
        self.base_curve.setData(x, r.nll_base)
        self.exp_curve.setData(x, r.nll_exp)
        self.exp_curve.opts["name"] = r.experiment.title
        pi = self.plot.getPlotItem()
        pi.legend.clear()
        pi.legend.addItem(self.base_curve, "unmodified")
        pi.legend.addItem(self.exp_curve, legend_name(r.experiment))
        # short (a longer title was cut at both ends in a 1000 px window): the y axis says what is plotted
        set_short_title(pi, f"{r.experiment.title} · prompt = positions 1..{r.n_prompt - 1}")
        assert r.experiment.decode_from is not None  # run_experiments() fills it in
        self.decode_line.setValue(r.experiment.decode_from + 0.5)  # predicted by decode rows to the right
        self.decode_line.show()
        pi.enableAutoRange()


def install_view(window) -> ExperimentsView:
    """Create the Experiments tab and register it with ``window.add_view("experiments", ...)``."""
    view = ExperimentsView(window.state, window.engine)
    window.add_view("experiments", "Experiments", view)
    return view
