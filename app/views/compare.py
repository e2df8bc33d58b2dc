"""Compare tab: run B next to the window's run A, head by head (:mod:`attnscope.core.analysis.compare_runs`).

Run A is the window's session as it is (prompt + decode steps). Run B is chosen here: another
model sharing the tokenizer, the same model at another precision, on the other backend, or on an
edited prompt. B is loaded and run where A's model is, from the engine thread (a second session
held next to A by :mod:`attnscope.core.analysis.compare_run_b`: in this process, or on the remote
engine the window is connected to; never on the GUI side; the previous B is dropped first), then
fed A's generated tokens, so a decode lines up too. A's per-position logits are kept by re-running A's sequence once when the window's
prefill did not keep them (same ops, same numbers).

The panel draws only: the layers × heads table of Jensen–Shannon distances (sortable, most
changed first), the logits' KL(A‖B) and top-1 agreement per position, and for the selected head
A, B and A − B side by side (A − B on a diverging map centred on 0 with a symmetric range). Maps longer than :data:`MAX_CELLS`
are shown like the heatmap's long maps: an overview (A and B max-pooled, A − B by the signed
max-|A − B| per block, :mod:`attnscope.core.analysis.compare_overview`, so a changed sink column or diagonal survives), and
on zoom an exact tile of all three for the visible region, computed on the engine thread from both
runs' exact weights; the three views are linked. Hover reads both weights; a click on a row plots
A's and B's rows as lines.

The parts live beside this module: the engine jobs in :mod:`attnscope.app.views.compare_jobs`, the run-B
form in :mod:`attnscope.app.views.compare_form`, the table in :mod:`attnscope.app.views.compare_table`, the
three linked maps in :mod:`attnscope.app.views.compare_maps`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyqtgraph as pg
from attnscope.app.tabs import PageLayout
from attnscope.app.views.compare_form import RunBFormMixin
from attnscope.app.views.compare_jobs import run_a_key, run_b_job
from attnscope.app.views.compare_maps import CompareMapsMixin
from attnscope.app.views.compare_table import CompareTableMixin
from attnscope.app.views.heads_plots import Placeholder, show_placeholder
from attnscope.app.views.saved_controls import SavedControls
from attnscope.app.views.sinks import SpacedTicksAxis, set_short_title, style_plot
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFileDialog,
    QLabel,
    QSizePolicy,
    QSplitter,
    QWidget,
)

if TYPE_CHECKING:
    from attnscope.core.analysis.compare_runs import CompareResult


#: the KL plot's placeholder until a comparison has run (hidden axes, not bare 0..1 ones)
KL_EMPTY = "KL(A‖B) per position, after Run B & compare"
#: the summary line before any prompt has run (run A is the window's sequence)
HINT_NO_RUN_A = "Run a prompt (run A), choose run B, then press Run B & compare."


class CompareView(RunBFormMixin, CompareTableMixin, CompareMapsMixin, QWidget, SavedControls):
    """The Compare tab, built with the :class:`attnscope.app.state.ViewState` (run A is its sequence)
    and the :class:`attnscope.app.engine.Engine`."""

    # saved in session files (B's prompt too: docs/tabs/compare.md)
    STATE_CONTROLS = ("kind_combo", "dtype_combo", "backend_combo", "weighting_combo", "prompt_edit")

    def __init__(self, state, engine, parent: QWidget | None = None):
        super().__init__(parent)
        self.state, self.engine = state, engine
        state.events.snapshot.connect(self.on_snapshot)
        state.events.selection.connect(lambda sel: self.on_selection(*sel))
        self.result: CompareResult | None = None
        self.labels: tuple[list[str], list[str]] = ([], [])
        # Every map, tile and row request carries the generation it was made for (Request.key): a new
        # comparison, Run B & compare and run A going out of date each bump it, so nothing computed for
        # an older comparison is ever drawn over a newer one.
        self._gen = 0
        self._a_key: tuple | None = None  # run A as compared (run_a_key)
        self._reloaded = False  # a model load since the comparison: its B is gone for good
        self.stale: str | None = None  # why the comparison shown no longer matches run A (None: it does)
        self._summary_text = ""
        state.events.colour.connect(lambda spec: self.set_colormap(spec.cmap))
        state.events.loaded.connect(lambda _snap: self.on_model_loaded())

        top, prow = self._build_form()  # run B: attnscope.app.views.compare_form

        self._busy = False  # run B and its comparison are running on the engine
        self.summary = QLabel(HINT_NO_RUN_A)
        self.summary.setStyleSheet("color:#335;")
        # word-wrapped, so no line is cut at any width (its PageLayout fills the tab page: no scrolling)
        self.summary.setWordWrap(True)
        self.summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Minimum)
        self.summary.setMinimumHeight(2 * self.summary.fontMetrics().lineSpacing() + 4)

        self._build_table()  # attnscope.app.views.compare_table
        mapbox = self._build_maps()  # attnscope.app.views.compare_maps: A, B, A − B, hover, rows

        # -- plots: logits
        # labelled ticks never crowded: the plot is ~40 px tall in a 1000 x 650 window
        self.logit_plot = pg.PlotWidget(background="w", axisItems={"left": SpacedTicksAxis("left")})
        style_plot(self.logit_plot)
        lp = self.logit_plot.getPlotItem()
        # no bottom axis title ("per position" is in the title): its room goes to the ticks
        lp.setLabel("left", "KL, bits")  # short: the title says KL(A‖B)
        lp.getAxis("left").enableAutoSIPrefix(False)
        # no legend: in a plot this narrow it covered the curve; the title says what the marks are
        set_short_title(lp, "KL(A‖B) of the logits per position · × top-1 differs")
        self.kl_curve = lp.plot(
            [],
            [],
            pen=pg.mkPen("#3b6fb6", width=1.5),
            symbol="o",
            symbolSize=4,
            symbolBrush="#3b6fb6",
            symbolPen=None,
            name="KL(A‖B)",
        )
        self.disagree = lp.plot(
            [],
            [],
            pen=None,
            symbol="x",
            symbolSize=9,
            symbolBrush="#b02a2a",
            symbolPen=pg.mkPen("#b02a2a"),
            name="top-1 differs",
        )
        self.kl_placeholder = Placeholder(lp)
        show_placeholder(lp, self.kl_placeholder, KL_EMPTY)

        for w, h in (
            (self.maps_widget, 160),
            (self.row_plot, 110),
            (self.logit_plot, 110),
            (self.table, 120),
        ):
            w.setMinimumHeight(h)
        left = QSplitter(Qt.Orientation.Vertical)  # table over the logits
        left.addWidget(self.table)
        left.addWidget(self.logit_plot)
        left.setSizes([380, 200])
        right = QSplitter(Qt.Orientation.Vertical)  # maps over the clicked rows
        right.addWidget(mapbox)
        right.addWidget(self.row_plot)
        right.setSizes([400, 180])
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(1, 3)
        split.setSizes([380, 1000])

        lay = PageLayout(self)  # fills the tab page; wrapped labels never make it scroll
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(top)
        lay.addLayout(prow)
        lay.addWidget(self.summary)
        lay.addWidget(split, 1)

        self.kind_combo.currentIndexChanged.connect(self._on_kind)
        self.browse_button.clicked.connect(self._browse)
        self.run_button.clicked.connect(self.run_b)
        self.table.itemSelectionChanged.connect(self._on_table_selection)
        self.export_table_button.clicked.connect(self._export_table_dialog)
        self.export_maps_button.clicked.connect(self._export_maps_dialog)
        self._on_kind()
        # the summary says what is left to do while no comparison is shown: it follows run B's controls
        self.kind_combo.currentIndexChanged.connect(self.show_hint)
        self.model_edit.textChanged.connect(self.show_hint)
        self.dtype_combo.currentTextChanged.connect(self.show_hint)
        self.backend_combo.currentTextChanged.connect(self.show_hint)
        self.prompt_edit.textChanged.connect(self.show_hint)

    # -- state ------------------------------------------------------------------------------------
    def on_snapshot(self, snap) -> None:
        # every command that changes run A (Run, step, step back, a reopened session, another model,
        # a failed load) ends in a new snapshot: check the comparison shown against it first
        self.check_current()
        if snap is not None:
            if not self.prompt_edit.text() or self.kind_combo.currentData() != "prompt":
                self.prompt_edit.setText(snap.prompt or "")
            self._on_kind()
        self.show_hint()

    def hint(self) -> str:
        """What is left to do before a comparison can be shown (one or two sentences): run a prompt while
        run A has not run; once it has, what run B is as the controls say and what B still needs."""
        snap = self.state.snapshot
        if snap is None or snap.seq_len == 0:
            return HINT_NO_RUN_A
        i = snap.info
        a = f"Run A: {snap.seq_len} tokens on {i.name} · {i.dtype} · {snap.backend}."
        spec = self.spec()
        press = "press Run B & compare."
        if spec.kind == "model":
            if not spec.model:
                return f"{a} Choose run B's model (a folder or .gguf sharing A's tokenizer), then {press}"
            b = f"Run B: {spec.model} · {spec.dtype} · {spec.backend}"
        elif spec.kind == "dtype":
            if spec.dtype == i.dtype:
                return f"{a} Choose run B's precision (A runs at {i.dtype}), then {press}"
            b = f"Run B: the same model at {spec.dtype}"
        elif spec.kind == "backend":
            if spec.backend == snap.backend:
                return f"{a} Choose run B's backend (A runs on {snap.backend}), then {press}"
            b = f"Run B: the same model on {spec.backend}"
        else:
            if not spec.prompt.strip():
                return f"{a} Type run B's prompt, then {press}"
            if spec.prompt == snap.prompt:
                return f"{a} Edit run B's prompt (it is A's now), then {press}"
            b = "Run B: the same model on the edited prompt"
        return f"{a} {b}: {press}"

    def show_hint(self, *_) -> None:
        """While no comparison is shown and none is running, the summary says what is left to do
        (:meth:`hint`); a comparison's own summary, or the line of one running, is kept."""
        if self.result is not None or self._busy:
            return
        self.summary.setStyleSheet("color:#335;")
        self.summary.setText(self.hint())
        self.summary.setToolTip("")

    def on_selection(self, layer: int, head: int) -> None:
        if self.result is not None and (layer, head) != self.map_key:
            self.request_maps(layer, head)

    # -- is the comparison still of run A? ---------------------------------------------------------
    def on_model_loaded(self) -> None:
        """A model was loaded (another one, the same one again, a reopened session on another model, a
        connection): B went with the old model (dropped with A's session here; a remote engine drops
        it before it loads), so the comparison shown can never be current again, not even once the
        same prompt has run on the same model (a remote session object outlives the load)."""
        if self.result is not None:
            self._reloaded = True
            self.check_current()

    def why_stale(self) -> str | None:
        """Why the comparison shown is no longer of the window's run A (one phrase), None while it is."""
        if self.result is None or self._a_key is None:
            return None
        snap = self.state.snapshot
        now = run_a_key(snap, self.engine.session)
        old = self._a_key
        if now == old and not self._reloaded:
            return None
        if snap is None or now is None:  # (run_a_key is None exactly without a snapshot)
            return "no model is loaded any more"
        if self._reloaded or now[:4] != old[:4]:
            i = snap.info
            return (
                f"run A was reloaded ({i.name} · {i.dtype} · {snap.backend}), and run B went with the old one"
            )
        if now[4] != old[4]:
            return "run A's chat-template setting changed"
        n_old, n_new = len(old[5]), snap.seq_len
        return f"run A's sequence changed ({n_old} tokens compared, {n_new} now)"

    def check_current(self) -> None:
        """Mark the comparison out of date when run A changed under it (or current again when A is back
        to the compared sequence, e.g. a step back and the same greedy step): an out-of-date table is
        greyed, its maps, row plot and hover line are cleared, and no map is computed from it."""
        why = self.why_stale()
        if why == self.stale:
            return
        self.stale = why
        self._gen += 1
        self.clear_maps()
        if why is None:
            self.table.setEnabled(True)
            self.summary.setStyleSheet("color:#335;")
            self.summary.setText(self._summary_text)
            self._on_table_selection()
        else:
            self.table.setEnabled(False)
            self.summary.setStyleSheet("color:#a02020;")
            self.summary.setText(
                f"Out of date: {why}. Press Run B & compare again.\n"
                f"The greyed table is the old comparison's ({(self._summary_text.splitlines() or [''])[0]})"
            )
            self.hover.setText("Out of date: run A changed since this comparison; no maps are drawn from it.")
        self.summary.setToolTip(self.summary.text())

    def _clear_result(self) -> None:
        """No comparison shown: empty table and logits, cleared maps (B is about to be replaced)."""
        self.result, self._a_key, self.stale, self._reloaded = None, None, None, False
        self._gen += 1
        self.table.setRowCount(0)
        self.table.setEnabled(True)
        self.kl_curve.setData([], [])
        self.disagree.setData([], [])
        self.logit_plot.getPlotItem().enableAutoRange()
        show_placeholder(self.logit_plot.getPlotItem(), self.kl_placeholder, KL_EMPTY)
        self.clear_maps()

    def refresh(self) -> None:
        pass

    def run_b(self) -> int | None:
        """Submit run B + the comparison to the engine thread. Returns the job id (None when refused)."""
        snap = self.state.snapshot
        if snap is None or snap.seq_len == 0:
            self.summary.setText("Run a prompt first: run A is the window's sequence.")
            return None
        spec = self.spec()
        if spec.kind == "model" and not spec.model:
            self.summary.setText("Choose run B's model (a folder or .gguf sharing A's tokenizer).")
            return None
        if not spec.prompt.strip():
            self.summary.setText("Run B's prompt is empty: type some text.")
            return None
        self._clear_result()  # the job drops the B held so far first: the comparison shown goes with it
        self.summary.setStyleSheet("color:#335;")
        self.summary.setText("Running B and comparing every head…")
        self.run_button.setEnabled(False)
        self._busy = True
        return self.engine.enqueue(run_b_job(spec), self.set_result, self._on_failed, label="compare")

    def _on_failed(self, message: str) -> None:
        self._busy = False
        self.run_button.setEnabled(True)
        self.summary.setText(f"Compare stopped: {message}")
        self.state.say(f"Compare: {message}", 8000)

    def set_result(self, payload) -> None:
        """Show a :class:`attnscope.core.analysis.compare_runs.CompareResult` (GUI thread)."""
        res, labels = payload
        self._busy = False
        self.run_button.setEnabled(True)
        self._clear_result()  # the maps, row plot and hover line of the previous comparison go
        a, b, al = res.run_a, res.run_b, res.alignment
        if res.nothing_to_compare() is not None:  # all zero by construction: not a result to show
            k = res.same_by_construction()
            self.summary.setStyleSheet("color:#a02020;")
            self.summary.setText(
                f"Nothing to compare: B's prompt differs from position {k} on ({al.n_a} tokens in A, "
                f"{al.n_b} in B), and a causal model's first {k} positions are the same in both runs.\n"
                f"Only positions ≥ {k} can differ, and there the sequences do not line up. To compare "
                "the positions after an edit, keep the token count (swap a word for one of as many tokens)."
            )
            self.summary.setToolTip(res.nothing_to_compare())
            self.hover.setText("Nothing to compare: see the line above.")
            return
        self.result, self.labels = res, labels
        self._a_key = run_a_key(self.state.snapshot, self.engine.session, ids=a.ids)
        ranked = res.ranked()
        self._fill_table(ranked)
        agree = f"{res.top1_agree.mean():.0%}" if len(res.top1_agree) else "n/a"
        klm = f"{res.kl.mean():.3g}" if len(res.kl) else "n/a"
        k = res.same_by_construction()
        same = f" (rows 0..{k - 1} precede it: equal by construction)" if k else ""
        self._summary_text = (
            f"A: {a.label()} · B: {b.label()} · {al.description}{same}\n"
            f"compared: {res.weighting} · most changed: L{ranked[0].layer} H{ranked[0].head} "
            f"(JS mean {ranked[0].js_mean:.3g}) · logits: mean KL(A‖B) {klm} bits, top-1 agreement {agree}"
        )
        self.summary.setStyleSheet("color:#335;")
        self.summary.setText(self._summary_text)
        self.summary.setToolTip(self.summary.text())
        self._draw_logits()
        self.check_current()  # run A may have changed while B ran
        if self.stale is None:
            self.request_maps(ranked[0].layer, ranked[0].head)  # a new comparison shows its rank-1 head

    def _draw_logits(self) -> None:
        res = self.result
        if res is None:
            return
        x = np.arange(len(res.kl)).astype(float)
        show_placeholder(self.logit_plot.getPlotItem(), self.kl_placeholder, "")
        self.kl_curve.setData(x, res.kl)
        bad = ~res.top1_agree
        self.disagree.setData(x[bad], res.kl[bad])

    # -- export -------------------------------------------------------------------------------------
    def _export_table_dialog(self) -> None:
        if self.result is None:
            self.summary.setText("Nothing to export yet: run B first.")
            return
        path, _ = QFileDialog.getSaveFileName(
            self, "Export comparison table", "compare.csv", "CSV (*.csv);;JSON (*.json)"
        )
        if path:
            self.export_table(path)

    def export_table(self, path) -> Path:
        """The ranked table as CSV (+ the full JSON as ``<file>.json`` sidecar), or JSON (by suffix).

        Raises:
            ValueError: another suffix, or no comparison yet. OSError: could not write.
        """
        from attnscope.core.io.data_writers import write_compare_csv as write_csv
        from attnscope.core.io.provenance import sidecar_path

        path = Path(path)
        if path.suffix.lower() not in (".csv", ".json"):
            raise ValueError(f"choose a .csv or .json file, not {path.name!r}")
        if self.result is None:
            raise ValueError("nothing to export yet: run B first")
        data = self.result.to_json()
        if path.suffix.lower() == ".json":
            path.write_text(json.dumps(data, indent=1), encoding="utf-8")
        else:
            write_csv(self.result, path)
            sidecar_path(path).write_text(json.dumps(data, indent=1), encoding="utf-8")
        self.state.say(f"Wrote {path}", 6000)
        return path

    def _export_maps_dialog(self) -> None:
        if self.maps is None or self.map_key is None:
            self.summary.setText("Nothing to export yet: run B and select a head first.")
            return
        layer, head = self.map_key
        path, _ = QFileDialog.getSaveFileName(
            self,
            "Export A, B and A − B",
            f"compare_L{layer}_H{head}.png",
            "PNG (*.png);;SVG (*.svg);;PDF (*.pdf)",
        )
        if path:
            self.export_maps(path)

    def export_maps(self, path) -> list[Path]:
        """The three maps as drawn (PNG/SVG/PDF by suffix) and a JSON sidecar naming both runs
        (model, sha256, dtype, backend, prompt, ids), the head, the alignment and the weighting.
        Raises ValueError when no head's maps are shown yet."""
        from attnscope.app.paint import render_widget
        from attnscope.core.io.provenance import sidecar_path, write_json

        res = self.result
        if res is None or self.map_key is None:
            raise ValueError("nothing to export yet: run B and select a head first")
        out = render_widget(self.maps_widget, path, title="AttnScope · Compare")
        layer, head = self.map_key
        d = next(x for x in res.ranked() if (x.layer, x.head) == (layer, head))
        meta = {
            "kind": "compare maps",
            "layer": layer,
            "head": head,
            "weighting": res.weighting,
            "maps": ["A", "B", "A - B"],
            "pooled": self.pool,
            "pooling": (
                None
                if self.overview is None
                else "A, B: block max; A - B: signed max-|A - B| per block"
                + ("; exact tile in view" if self.tile is not None else "")
            ),
            "colormap": self.cmap,
            "diverging": "A - B on CET-D1, symmetric range centred on 0",
            "js_mean": d.js_mean,
            "js_max": d.js_max,
            "alignment": res.alignment.to_json(),
            "run_a": res.run_a.to_json(),
            "run_b": res.run_b.to_json(),
            "image": out.name,
        }
        side = write_json(sidecar_path(out), meta)
        self.state.say(f"Wrote {out} and {side.name}", 6000)
        return [out, side]


def install_view(window) -> CompareView:
    """Create the Compare tab and register it with ``window.add_view("compare", ...)``."""
    view = CompareView(window.state, window.engine)
    window.add_view("compare", "Compare", view)
    return view
