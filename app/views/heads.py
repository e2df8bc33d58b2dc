"""Which heads matter: the layers × heads grid of a head's effect on a target (ablation, activation
patching, or its direct logit attribution), the KV-head columns, the direct logit attribution bars, and
the logit-lens grid (:mod:`attnscope.core.analysis.head_effects`).

Each computation runs on the engine thread when the user asks for it (Run: the ablation sweep; Patch:
activation patching against the corrupted prompt, :mod:`attnscope.app.views.heads_patch`; Lens: the
logit lens at the positions in view, :mod:`attnscope.app.views.heads_lens`), reports progress, can be
cancelled (Esc / Cancel), and serves the other views' requests between heads so the window stays
responsive. Results are keyed to the sequence they were computed for and marked out of date when it
changes. Click a cell or a row to select the head; double-click to open its map.
"""

from __future__ import annotations

import json

import numpy as np
from attnscope.app.engine import CancelledMessage, Request
from attnscope.app.flow import FlowLayout
from attnscope.app.tabs import FollowsPage, PageLayout
from attnscope.app.views.head_rows import HEAD_ROLE, HeadRows, NumericItem
from attnscope.app.views.heads_export import csv_text, lens_from_json, result_from_json, same_json
from attnscope.app.views.heads_lens import LensPanel, lens_job, parse_positions
from attnscope.app.views.heads_patch import (
    PatchForm,
    agreement_line,
    length_job,
    patch_from_json,
    patch_job,
    patch_to_json,
    swap_words,
)
from attnscope.app.views.heads_plots import EMPTY_BARS, EMPTY_GRID, EMPTY_KV, EffectPlots
from attnscope.app.views.saved_controls import SavedControls
from PySide6.QtCore import QEvent, QPoint, Qt, QTimer
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSplitter,
    QTableWidget,
    QWidget,
)

COLUMNS = ("Layer", "Head", "KV head", "Effect", "Direct", "Denoise", "Noise", "Denoise ≈", "Noise ≈")
#: what the tab's grid (and the Head grid's effect frames) colour by: label, key
SHOWS = (
    ("ablation effect", "query"),
    ("GQA group ablation (per head)", "kv"),
    ("K/V-side ablation (per head)", "kv_side"),
    ("direct logit attribution", "dla"),
    ("patching: denoise", "denoise"),
    ("patching: noise", "noise"),
)
METRICS = (("log-prob of the target", "logprob"), ("logit difference", "logit_diff"), ("KL divergence", "kl"))
METHODS = (("zero", "zero"), ("mean over positions", "mean"), ("resample (corrupted prompt)", "resample"))
SCOPES = (("at the read-out position", "readout"), ("at every position", "everywhere"))
STOPPED = "stopped"  # what the job returns when the sweep was cancelled
NOTE = (
    "Exact: each effect is a forward with that head's output replaced (a KV head: its whole group of "
    "query heads). Negative: the target falls without the head. Patching: the fraction of the clean − "
    "corrupted difference a head's patch restores (denoise) or breaks (noise)."
)


NO_SEQUENCE_HINT = "Run a prompt, then press Run to find the heads the prediction depends on."
READY_HINT = "Press Run to find the heads the prediction of the target depends on."


def _effects_job(ids: tuple, kind: str, token: str, other: str, method: str, scope: str, source: str = ""):
    """Engine job: target, ablation sweep and direct logit attribution for the sequence ``ids``
    (``source``: the resample prompt)."""

    def job(ctx):
        from attnscope.core.analysis.head_effects import head_effects, logit_attribution, make_target
        from attnscope.core.errors import Cancelled, UnsupportedModelError

        s = ctx.require()
        if tuple(getattr(s, "ids", ids)) != ids:
            return None
        local = getattr(s, "remote_call", None) is None

        def cancelled() -> bool:
            if local:
                ctx.serve_views()
            return ctx.cancelled()

        def progress(i: int, n: int) -> None:
            ctx.progress(f"Ablating heads {i}/{n}", i / n)

        t = make_target(s, kind, None, token or None, other or None)
        src = source if method == "resample" else None
        try:
            eff = head_effects(s, t, method, scope, source=src, progress=progress, cancelled=cancelled)
        except Cancelled:  # Esc (Engine.cancel) or Cancel: the tab says so and can run again
            return STOPPED
        try:
            dla, note = logit_attribution(s, t), ""
        except UnsupportedModelError as e:
            dla, note = None, str(e)
        from attnscope.core.analysis.head_effects import provenance

        text = s.tokenizer.decode
        prov = provenance(s, t, method=method, scope=scope, source=src)
        return eff, dla, note, text([t.token]), text([t.other]) if t.other >= 0 else "", prov

    return job


def per_head(values: np.ndarray, n_heads: int) -> np.ndarray:
    """A KV-head array ``(L, n_kv_heads)`` spread onto the query heads of each group ``(L, n_heads)``."""
    g = n_heads // max(1, values.shape[1])
    return np.repeat(values, g, axis=1)


class HeadsView(FollowsPage, QWidget, SavedControls, HeadRows):
    """The "Which heads matter" tab."""

    STATE_CONTROLS = (
        "target_edit",
        "other_edit",
        "metric_combo",
        "method_combo",
        "scope_combo",
        "show_combo",
        "corrupt_edit",
        "swap_a",
        "swap_b",
        "site_combo",
        "patch_method_combo",
        "positions_edit",
        "k_spin",
    )

    def __init__(self, state, engine, parent: QWidget | None = None):
        super().__init__(parent)
        self.state, self.engine = state, engine
        self.result: tuple | None = None  # the ablation sweep's (HeadEffects, LogitAttribution, …)
        self.result_key: tuple | None = None
        self.patch: dict | None = None  # heads_patch.patch_job's dict
        self.patch_key: tuple | None = None
        self.lens: tuple | None = None  # heads_lens.lens_job's (LogitLens, texts, position texts, prov)
        self.lens_key: tuple | None = None
        self._busy: set[str] = set()
        self._running = False
        self.on_effects = None  # callback(values (L, H) | None, label): the Head grid's effect frames

        self.target_edit = QLineEdit()
        self.target_edit.setMaximumWidth(120)
        self.target_edit.setPlaceholderText("next token")
        self.target_edit.setToolTip(
            "The token whose prediction is measured: a text that is one token (' Mary') or an id. "
            "Empty: the token the sequence holds next, or the model's top token after the last position."
        )
        self.other_edit = QLineEdit()
        self.other_edit.setMaximumWidth(120)
        self.other_edit.setPlaceholderText("(none)")
        self.other_edit.setToolTip("A second token: the target becomes logit(target) − logit(other)")
        self.metric_combo = QComboBox()
        for label, key in METRICS:
            self.metric_combo.addItem(label, key)
        self.method_combo = QComboBox()
        for label, key in METHODS:
            self.method_combo.addItem(label, key)
        self.method_combo.setToolTip(
            "Zero; the head's mean over this prompt's positions; or its output on the corrupted prompt "
            "(resample ablation: type or Swap it below)"
        )
        self.scope_combo = QComboBox()
        for label, key in SCOPES:
            self.scope_combo.addItem(label, key)
        self.scope_combo.setToolTip(
            "Read-out position: the head's output is removed (or patched) only where the target is read (the "
            "prefix's KV cache is reused: one decode step per head). Every position: one forward per head."
        )
        self.run_button = QPushButton("Run")
        self.run_button.setToolTip("Ablate every head and every GQA group at the last position")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop the sweep running (Esc)")
        self.cancel_button.setEnabled(False)

        # the target row wraps (a label stays with its control) instead of cutting its combos when the
        # tab is narrow (the Why panel docked beside it): tests/app/test_why_dock_layout_gui.py
        self.target_row = QWidget()
        top = FlowLayout(self.target_row)
        top.add_unit(QLabel("Target"), self.target_edit)
        top.add_unit(QLabel("vs"), self.other_edit)
        top.add_unit(self.metric_combo)
        top.add_unit(QLabel("Ablate"), self.method_combo)
        top.add_unit(self.scope_combo)
        top.add_unit(self.run_button, self.cancel_button)

        self.patch_form = PatchForm()
        form = self.patch_form
        self.corrupt_edit, self.swap_a, self.swap_b = form.corrupt_edit, form.swap_a, form.swap_b
        self.swap_button, self.site_combo = form.swap_button, form.site_combo
        self.patch_method_combo, self.patch_button = form.patch_method_combo, form.patch_button

        second = form.controls  # the patching row goes on with what the grid shows and the export
        self.show_combo = QComboBox()
        for label, key in SHOWS:
            self.show_combo.addItem(label, key)
        self.show_combo.setToolTip(
            "What the grid here, and the frames around the Head grid's thumbnails, are coloured by (a GQA "
            "group's or KV head's value is given to each query head of the group)"
        )
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip(
            "Write the effects, the patching fractions and the logit lens (JSON; CSV: one row per head) with "
            "what they were computed on: model, both prompts and their ids, target, method, scope and site"
        )
        self.export_button.setEnabled(False)
        second.add_unit(QLabel("Colour by"), self.show_combo)
        second.add_unit(self.export_button)
        self.patch_summary = QLabel("")
        self.patch_summary.setStyleSheet("color:#335;")
        self.patch_summary.setWordWrap(True)
        self.patch_summary.hide()

        self.summary = QLabel(NO_SEQUENCE_HINT)
        self.summary.setWordWrap(True)
        self.summary.setStyleSheet("color:#335;")

        self.plots = EffectPlots()
        self.plot, self.image = self.plots.grid, self.plots.image
        self.image.mouseClickEvent = self._on_image_click

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        for col, tip in (
            (3, "target with the head ablated − target of the clean run"),
            (
                4,
                "direct logit attribution: the head's output through W_O and the final norm (scale frozen) "
                "onto the target's unembedding",
            ),
            (5, "exact patching: the fraction of clean − corrupted the head's clean value restores"),
            (6, "exact patching: the fraction of clean − corrupted the head's corrupted value breaks"),
            (7, "attribution patching's estimate of Denoise (one forward and backward for every head)"),
            (8, "attribution patching's estimate of Noise"),
        ):
            item = self.table.horizontalHeaderItem(col)
            if item is not None:  # (each column has one: setHorizontalHeaderLabels)
                item.setToolTip(tip)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(20)
        header = self.table.horizontalHeader()
        # every number whole (a narrow window scrolls the table sideways, never elides "+0.3…")
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.table.setSortingEnabled(True)

        self.lens_panel = LensPanel()
        self.positions_edit, self.k_spin = self.lens_panel.positions_edit, self.lens_panel.k_spin
        self.lens_button, self.lens_table = self.lens_panel.lens_button, self.lens_panel.table

        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.plots)
        split.addWidget(self.table)
        split.setSizes([640, 420])
        vsplit = QSplitter(Qt.Orientation.Vertical)
        vsplit.addWidget(split)
        vsplit.addWidget(self.lens_panel)
        vsplit.setStretchFactor(0, 3)
        vsplit.setStretchFactor(1, 2)
        vsplit.setSizes([600, 330])
        self.plots.setMinimumHeight(self.PLOTS_LEAST_HEIGHT)
        split.setMinimumHeight(self.PLOTS_MIN_HEIGHT)  # (:meth:`fit_to_page` lowers it to fit)
        self.plots_row = split
        self.splitter = vsplit

        self.note = QLabel(NOTE)
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color:#555;")

        self._layout = lay = PageLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.setSpacing(3)
        lay.addWidget(self.target_row)
        lay.addWidget(self.patch_form)
        lay.addWidget(self.summary)
        lay.addWidget(self.patch_summary)
        lay.addWidget(vsplit, 1)
        lay.addWidget(self.note)

        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.cancel)
        self.patch_button.clicked.connect(self.run_patch)
        self.swap_button.clicked.connect(self.swap)
        self.lens_button.clicked.connect(self.run_lens)
        self.other_edit.textChanged.connect(self._on_other)
        self.table.cellClicked.connect(self._on_clicked)
        self.table.cellDoubleClicked.connect(self._on_activated)
        self.show_combo.currentIndexChanged.connect(lambda _i: self._draw())
        state.events.snapshot.connect(lambda _snap: self._drop_frames_if_stale())
        state.events.snapshot.connect(lambda _snap: self._hint())
        self.export_button.clicked.connect(self._export_dialog)
        for wrapped in (self.summary, self.patch_summary):  # (a wrapped line more moves the plots down)
            wrapped.installEventFilter(self)

    # -- fitting the page ---------------------------------------------------------------------------------
    PLOTS_MIN_HEIGHT = 230  # px: the plots' height when the page has room (1400 x 900)
    PLOTS_LEAST_HEIGHT = 150  # px: never below this (ticks, axis titles and a few rows of heads)

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 (Qt's name)
        if event.type() == QEvent.Type.Resize and obj in (self.summary, self.patch_summary):
            self.page_resized()  # a wrapped line more or less moves the plots
        return super().eventFilter(obj, event)

    def page_resized(self) -> None:
        QTimer.singleShot(0, self.fit_to_page)

    def fit_to_page(self) -> None:
        """The plots' least height such that, with the page scrolled to the top, they end at the
        visible page's bottom edge: at 1000 x 650 the page is ~360 px tall and the plots (230 px
        below ~170 px of controls) had their x tick labels and axis titles below it. Between
        :data:`PLOTS_LEAST_HEIGHT` and :data:`PLOTS_MIN_HEIGHT`; the logit lens below is reached by
        scrolling (tests/app/test_heads_empty_gui.py)."""
        viewport = self._page_viewport
        if viewport is None or not self.isVisible():
            return
        top = self.plots.mapTo(self, QPoint(0, 0)).y()
        room = viewport.height() - top - self._layout.contentsMargins().bottom()
        h = max(self.PLOTS_LEAST_HEIGHT, min(self.PLOTS_MIN_HEIGHT, room))
        if self.plots_row.minimumHeight() != h:
            self.plots_row.setMinimumHeight(h)
        # the page layout's minimum counts the wrapped rows above (the target controls, the summary) at
        # fewer lines than they take, so it squeezed the splitter below its minimum (the plots' x axes
        # cut off): the view asks for what its rows take now
        m, note = self._layout.contentsMargins(), self.note
        need = (
            self.splitter.y()
            + self.splitter.minimumSizeHint().height()
            + self._layout.spacing()
            + (note.heightForWidth(note.width()) if note.isVisible() else 0)
            + m.bottom()
        )
        if self.minimumHeight() != need:
            self.setMinimumHeight(need)

    # -- running ------------------------------------------------------------------------------------------
    def _on_other(self, text: str) -> None:
        if text.strip() and self.metric_combo.currentData() == "logprob":
            self.metric_combo.setCurrentIndex(1)

    def refresh(self) -> None:
        """Mark a result of another sequence as out of date (each computation runs only when asked)."""
        key = self.state.sequence_key
        if self.result is not None and self.result_key != key:
            self.summary.setText("Out of date: the sequence changed since these effects; press Run again.")
        if self.patch is not None and self.patch_key != key:
            self.patch_summary.setText("Patching out of date: the sequence changed; press Patch again.")
        if self.lens is not None and self.lens_key != key:
            self.lens_panel.caption.setText("Out of date: the sequence changed; press Lens again.")

    def _hint(self) -> None:
        """Before the first sweep, the line above the plots says what to do now: run a prompt while no
        sequence exists, press Run once one does (tests/app/test_heads_empty_gui.py)."""
        if self.result is not None or self._running:
            return
        snap = self.state.snapshot
        has_seq = snap is not None and bool(snap.seq_len)
        text = self.summary.text()
        if text in (NO_SEQUENCE_HINT, READY_HINT):
            self.summary.setText(READY_HINT if has_seq else NO_SEQUENCE_HINT)

    def _drop_frames_if_stale(self) -> None:
        """A new sequence: the Head grid's effect frames go (they were this result's)."""
        key = self.state.sequence_key
        mine = [
            (r, k) for r, k in ((self.result, self.result_key), (self.patch, self.patch_key)) if r is not None
        ]
        if mine and all(k != key for _r, k in mine) and self.on_effects:
            self.on_effects(None, "")

    def _target_args(self) -> tuple[str, str, str] | None:
        """``(kind, token, other)`` from the target controls, or None after saying what is missing."""
        kind = self.metric_combo.currentData()
        other = self.other_edit.text()
        if kind == "logit_diff" and not other.strip():
            self.state.fail("A logit difference needs a second token: type it in the 'vs' box.")
            return None
        return kind, self.target_edit.text(), other if kind == "logit_diff" else ""

    def _ids(self) -> tuple | None:
        snap = self.state.snapshot
        if snap is None or not snap.seq_len:
            self.state.fail("Run a prompt before asking which heads matter.")
            return None
        return tuple(t.id for t in snap.tokens)

    def _start(self, what: str) -> None:
        self._busy.add(what)
        self._running = True
        {"heads": self.run_button, "patch": self.patch_button, "lens": self.lens_button}[what].setEnabled(
            False
        )
        self.cancel_button.setEnabled(True)
        self.note.setText(NOTE)
        self.note.setStyleSheet("color:#555;")

    def run(self) -> None:
        """Ablate every head (the method, scope and target of the controls) on the engine thread."""
        ids, args = self._ids(), self._target_args()
        if ids is None or args is None:
            return
        method = self.method_combo.currentData()
        source = self.corrupt_edit.text()
        if method == "resample" and not source.strip():
            self._error("heads", "resample ablation needs a second prompt: type it in 'Corrupted' (or Swap)")
            return
        key = self.state.sequence_key
        self._start("heads")
        self.summary.setText(f"Ablating every head of {len(ids)} tokens…")
        self.engine.submit(
            "heads",
            Request(
                _effects_job(ids, *args, method, self.scope_combo.currentData(), source),
                lambda r: self.set_result(r, key),
                "which heads matter",
                on_error=lambda m: self._on_error(m, "heads"),
            ),
        )

    def run_patch(self) -> None:
        """Patch every head between the sequence's prompt and the corrupted prompt (engine thread)."""
        ids, args = self._ids(), self._target_args()
        if ids is None or args is None:
            return
        corrupt = self.corrupt_edit.text()
        if not corrupt.strip():
            self._error(
                "patch", "patching needs a corrupted prompt: type it in 'Corrupted', or Swap two words"
            )
            return
        key = self.state.sequence_key
        self._start("patch")
        self.patch_summary.setText("Patching every head…")
        self.patch_summary.show()
        self.engine.submit(
            "heads_patch",
            Request(
                patch_job(
                    ids,
                    *args,
                    corrupt,
                    self.site_combo.currentData(),
                    self.patch_method_combo.currentData(),
                    self.scope_combo.currentData(),
                ),
                lambda r: self.set_patch(r, key),
                "activation patching",
                on_error=lambda m: self._on_error(m, "patch"),
            ),
        )

    def run_lens(self) -> None:
        """The logit lens at the positions the control names (default the last 16), on the engine thread."""
        ids = self._ids()
        if ids is None:
            return
        try:
            positions = parse_positions(self.positions_edit.text(), len(ids))
        except ValueError as e:
            self._error("lens", str(e))
            return
        key = self.state.sequence_key
        self._start("lens")
        self.lens_panel.caption.setText(f"Reading {len(positions)} positions…")
        self.engine.submit(
            "heads_lens",
            Request(
                lens_job(ids, positions, self.k_spin.value()),
                lambda r: self.set_lens(r, key),
                "logit lens",
                on_error=lambda m: self._on_error(m, "lens"),
            ),
        )

    def swap(self) -> None:
        """Build the corrupted prompt from the clean one with the two Swap words exchanged; say in one line
        when it does not keep the token count."""
        snap = self.state.snapshot
        if snap is None or not snap.prompt:
            self._error("patch", "Run a prompt before swapping its words")
            return
        try:
            text = swap_words(snap.prompt, self.swap_a.text(), self.swap_b.text())
        except ValueError as e:
            self._error("patch", str(e))
            return
        self.corrupt_edit.setText(text)
        self.engine.submit("heads_length", length_job(snap.n_prompt, text), self._on_length)

    def _on_length(self, message: str | None) -> None:
        """The swap's token count checked (engine thread's answer): a different length is one line."""
        if message:
            self._error("patch", message)

    def cancel(self) -> None:
        """Stop what runs (Esc does the same through the engine); each result shown stays."""
        busy = set(self._busy)
        self.engine.cancel()
        self._done()
        if "heads" in busy or not busy:
            self.summary.setText("Stopped: press Run to start again.")
        if "patch" in busy:
            self.patch_summary.setText("Patching stopped: press Patch to start again.")
        if "lens" in busy:
            self.lens_panel.caption.setText("Stopped: press Lens to start again.")

    def _done(self, what: str | None = None) -> None:
        self._busy = set() if what is None else self._busy - {what}
        self._running = bool(self._busy)
        self.run_button.setEnabled("heads" not in self._busy)
        self.patch_button.setEnabled("patch" not in self._busy)
        self.lens_button.setEnabled("lens" not in self._busy)
        self.cancel_button.setEnabled(bool(self._busy))

    def _error(self, what: str, message: str) -> None:
        """A one-line error in the tab's note (and the status bar)."""
        self.note.setText(f"Could not run: {message}")
        self.note.setStyleSheet("color:#a00;")
        if what == "heads":
            self.summary.setText(f"Could not run: {message}")
        self.state.fail(f"Which heads matter: {message}")

    def _on_error(self, message: str, what: str = "heads") -> None:
        self._done(what)
        if isinstance(message, CancelledMessage):
            self.summary.setText("Stopped: press Run to start again.")
            return
        self._error(what, message)

    # -- results ------------------------------------------------------------------------------------------
    def set_result(self, result, key: tuple | None = None) -> None:
        """Show ``(HeadEffects, LogitAttribution | None, note, target text, other text)`` (GUI thread)."""
        self._done("heads")
        if isinstance(result, str) and result == STOPPED:
            self.summary.setText("Stopped: press Run to start again.")
            return
        if result is None:
            self.summary.setText("The sequence changed before the sweep ran: press Run again.")
            return
        self.result, self.result_key = result, self.state.sequence_key if key is None else key
        eff, dla, note, tok, other = result[:5]
        self.plots.show_bars(dla, f"No direct logit attribution: {note}" if note else EMPTY_BARS)
        self._draw()
        self._fill()
        self.export_button.setEnabled(True)
        if hasattr(self, "push_settings"):
            self.push_settings()  # the result goes into the session file with the controls
        top = eff.top(3)
        names = ", ".join(f"L{a}H{b} ({e:+.3f})" for a, b, e in top)
        kv = np.nan_to_num(eff.kv)
        kl, kk = np.unravel_index(int(np.argmax(np.abs(kv))), kv.shape)
        method = "resample" if eff.method == "resample" else eff.method
        dla_sum = f" · DLA parts sum to {dla.total:.3f} (logit {dla.logit:.3f})" if dla is not None else ""
        self.summary.setText(
            f"{self._what(eff.target, tok, other)} at position {eff.target.position} = {eff.clean:.4f} · "
            f"{method} ablation {'at the read-out position' if eff.scope == 'readout' else 'at every position'}"
            f" · largest: {names} · GQA group L{kl} KV{kk}: {kv[kl, kk]:+.3f}{dla_sum}"
            + (f" · {note}" if note else "")
        )
        self.state.say("Which heads matter: ready", 3000)

    @staticmethod
    def _what(t, tok: str, other: str) -> str:
        return {"logprob": f"log p({tok!r})", "logit_diff": f"logit({tok!r}) − logit({other!r})", "kl": "KL"}[
            t.kind
        ]

    def set_patch(self, result, key: tuple | None = None) -> None:
        """Show a patching result (:func:`attnscope.app.views.heads_patch.patch_job`'s dict; GUI thread)."""
        self._done("patch")
        self.patch_summary.show()
        if isinstance(result, str) and result == STOPPED:
            self.patch_summary.setText("Patching stopped: press Patch to start again.")
            return
        if result is None:
            self.patch_summary.setText("The sequence changed before patching ran: press Patch again.")
            return
        self.patch, self.patch_key = result, self.state.sequence_key if key is None else key
        pr = result["exact"] if result["exact"] is not None else result["attribution"]
        if self.show_combo.currentData() not in ("denoise", "noise"):
            self.show_combo.setCurrentIndex(self.show_combo.findData("denoise"))  # draws
        else:
            self._draw()
        self._fill()
        self.export_button.setEnabled(True)
        if hasattr(self, "push_settings"):
            self.push_settings()
        d = pr.denoise if pr.site != "kv" else pr.denoise_kv
        best = np.unravel_index(int(np.nanargmax(np.nan_to_num(d, nan=-np.inf))), d.shape)
        unit = f"L{best[0]}H{best[1]}" if pr.site != "kv" else f"L{best[0]} KV{best[1]}"
        agree = agreement_line(result["agreement"])
        self.patch_summary.setText(
            f"Patching ({pr.method if result['exact'] is None or result['attribution'] is None else 'both'}, "
            f"{pr.site}): {self._what(pr.target, result['target_text'], result['other_text'])} clean "
            f"{pr.clean:.3f}, corrupted {pr.corrupt:.3f} · most restored by {unit} ({d[best]:+.2f})"
            + (f" · attribution vs exact: {agree}" if agree else "")
        )
        self.state.say("Activation patching: ready", 3000)

    def set_lens(self, result, key: tuple | None = None) -> None:
        """Show a logit-lens result (:func:`attnscope.app.views.heads_lens.lens_job`'s tuple; GUI thread)."""
        self._done("lens")
        if result is None:
            self.lens_panel.caption.setText("The sequence changed before the lens ran: press Lens again.")
            return
        self.lens, self.lens_key = result, self.state.sequence_key if key is None else key
        lens, texts, pos_texts = result[:3]
        self.lens_panel.show_lens(lens, texts, pos_texts)
        fid = int(lens.final_ids[-1])
        ranks = lens.final_rank[:, -1]
        first = int(np.argmax(ranks == 0)) if (ranks == 0).any() else -1
        self.lens_panel.caption.setText(
            f"positions {int(lens.positions[0])}–{int(lens.positions[-1])} · final prediction at "
            f"{int(lens.positions[-1])}: {texts.get(fid, str(fid))!r}"
            + (f", top from layer {first} on" if first >= 0 else "")
            + " · each cell: the top token after the layer (darker: more probable; hover: the top tokens)"
        )
        self.export_button.setEnabled(True)
        if hasattr(self, "push_settings"):
            self.push_settings()

    # -- drawing ------------------------------------------------------------------------------------------
    def _shape(self) -> tuple[int, int, int] | None:
        """``(n_layers, n_heads, n_kv_heads)`` of the results held, None without any."""
        if self.result is not None:
            eff = self.result[0]
            return eff.query.shape[0], eff.query.shape[1], eff.kv.shape[1]
        if self.patch is not None:
            pr = self.patch["exact"] if self.patch["exact"] is not None else self.patch["attribution"]
            return pr.denoise.shape[0], pr.denoise.shape[1], pr.denoise_kv.shape[1]
        return None

    def _patch_arrays(self, which: str = "") -> tuple:
        """``(per head (L, H), per KV head (L, n_kv), PatchResult)`` of direction ``which`` (default: what
        Colour by shows, else denoise) of the exact patch, else the estimate; ``(None, None, None)``
        without one."""
        if self.patch is None:
            return None, None, None
        pr = self.patch["exact"] if self.patch["exact"] is not None else self.patch["attribution"]
        which = which or (
            self.show_combo.currentData() if self.show_combo.currentData() == "noise" else "denoise"
        )
        q, kv = getattr(pr, which), getattr(pr, f"{which}_kv")
        if pr.site == "kv":
            q = per_head(kv, pr.denoise.shape[1])
        return q, kv, pr

    def shown_values(self) -> tuple[np.ndarray | None, str]:
        """``((L, H) float array | None, label)``: what "Colour by" picks from the results."""
        key = self.show_combo.currentData()
        if key in ("denoise", "noise"):
            q, _kv, pr = self._patch_arrays(key)
            if q is None:
                return None, "patching (press Patch)"
            site = {"output": "", "query": ", queries", "kv": ", keys and values"}[pr.site]
            return q, f"patching {key} ({pr.method}{site})"
        if self.result is None:
            return None, ""
        eff, dla = self.result[0], self.result[1]
        H = eff.query.shape[1]
        if key == "dla":
            if dla is None:
                return None, "direct logit attribution (not defined for this model)"
            return dla.heads, "direct logit attribution"
        if key == "kv":
            return per_head(eff.kv, H), f"{eff.method} ablation of the GQA group"
        if key == "kv_side":
            if eff.kv_side is None:
                return None, "K/V-side ablation (the layers have no separate k/v projections)"
            return per_head(eff.kv_side, H), f"{eff.method} ablation of the KV head's keys and values"
        return eff.query, f"{eff.method} ablation effect"

    def kv_values(self) -> tuple[np.ndarray | None, list[str], str]:
        """The KV-head columns for the Colour by choice, their labels and their axis title: ablation: each
        GQA group's effect, then each KV head's K/V side's; patching: each group's (or, site kv, each KV
        head's) fraction."""
        key = self.show_combo.currentData()
        if key in ("denoise", "noise"):
            _q, kv, pr = self._patch_arrays(key)
            if kv is None:
                return None, [], ""
            title = "KV head (keys and values)" if pr.site == "kv" else "GQA group"
            return kv, [str(k) for k in range(kv.shape[1])], title
        if self.result is None or key == "dla":
            return None, [], ""
        eff = self.result[0]
        n = eff.kv.shape[1]
        if eff.kv_side is None:
            return eff.kv, [str(k) for k in range(n)], "GQA group"
        return (
            np.concatenate([eff.kv, eff.kv_side], axis=1),
            [str(k) for k in range(n)] * 2,
            "group | K/V side",
        )

    def _draw(self) -> None:
        """The tab's grid, KV columns (and the Head grid's frames) for the results and "Colour by"."""
        shape = self._shape()
        if shape is None:
            return
        L, H, n_kv = shape
        q, label = self.shown_values()
        if q is None:
            q = np.full((L, H), np.nan)
        self.plots.show_heads(q, n_kv, f"Nothing to show yet: {label}" if label else EMPTY_GRID)
        kv, labels, blocks = self.kv_values()
        dla = self.show_combo.currentData() == "dla"
        self.plots.show_kv(kv, labels, blocks, "No KV-head columns for this choice" if dla else EMPTY_KV)
        if self.on_effects is not None:
            self.on_effects(q if np.isfinite(q).any() else None, label)

    # -- export and session -------------------------------------------------------------------------------
    def _ablation_json(self) -> dict:
        if self.result is None:
            return {}
        eff, dla, note = self.result[:3]
        prov = self.result[5] if len(self.result) > 5 else {}
        return {
            **prov,
            **eff.to_json(),
            "direct_logit_attribution": dla.to_json() if dla is not None else None,
            "direct_logit_attribution_note": note,
        }

    def _lens_json(self) -> dict:
        if self.lens is None:
            return {}
        lens, texts, pos_texts, prov = self.lens
        return {
            **prov,
            **lens.to_json(),
            "texts": {str(k): v for k, v in texts.items()},
            "position_texts": list(pos_texts),
        }

    def export_data(self) -> dict:
        """The results with their provenance (JSON-ready): what Export… writes. The ablation sweep's at the
        top level (model, prompt, ids, target, method, scope, effects, direct logit attribution); the
        patching result under ``"patching"`` (with the corrupted prompt and its ids, site, method, the
        exact and estimated fractions and their agreement); the logit lens under ``"logit_lens"``."""
        out = self._ablation_json()
        if self.patch is not None:
            out["patching"] = patch_to_json(self.patch)
        if self.lens is not None:
            out["logit_lens"] = self._lens_json()
        return out

    def export(self, path: str) -> None:
        """Write the results to ``path``: CSV (one row per head and group, provenance in ``#`` lines) when
        it ends in ``.csv``, else JSON (:meth:`export_data`)."""
        from pathlib import Path

        data = self.export_data()
        if not data:
            raise ValueError("nothing to export: press Run, Patch or Lens first")
        if not str(path).lower().endswith(".csv"):
            Path(path).write_text(json.dumps(data, indent=1, allow_nan=True), encoding="utf-8")
            return
        shape = self._shape()
        if shape is None:
            raise ValueError("nothing to export as CSV: the logit lens exports as JSON")
        layers = self.result[0].layers if self.result is not None else self._patch_arrays()[2].layers
        Path(path).write_text(csv_text(data, self.result, self.patch, shape, layers), encoding="utf-8")

    def _export_dialog(self) -> None:
        from PySide6.QtWidgets import QFileDialog

        path, _ = QFileDialog.getSaveFileName(
            self, "Export head effects", "head_effects.json", "JSON (*.json);;CSV (*.csv)"
        )
        if not path:
            return
        try:
            self.export(path)
        except (OSError, ValueError) as e:
            self.state.fail(f"Could not export: {e}")
            return
        self.state.say(f"Wrote {path}", 4000)

    def view_state(self) -> dict:
        """The controls, and the results with their provenance (a session file keeps them)."""
        out = super().view_state()
        if self.result is not None:
            out["result"] = self._ablation_json()
        if self.patch is not None:
            out["patch"] = patch_to_json(self.patch)
        if self.lens is not None:
            out["lens"] = self._lens_json()
        return out

    def _key_for(self, data: dict) -> tuple | None:
        """The sequence key when ``data`` (a saved result) was computed on the sequence on screen."""
        snap = self.state.snapshot
        ids = tuple(t.id for t in snap.tokens) if snap is not None else ()
        return self.state.sequence_key if tuple(data.get("ids", ())) == ids and ids else None

    def restore_view_state(self, state: dict) -> None:
        if getattr(self, "_restoring", False):
            return  # (showing a restored result pushes the settings, which would restore it again)
        self._restoring = True
        try:
            self._restore(state)
        finally:
            self._restoring = False

    def _restore(self, state: dict) -> None:
        super().restore_view_state(state)
        if not isinstance(state, dict):
            return
        saved = state.get("result")
        if isinstance(saved, dict) and not (
            self.result is not None and same_json(self._ablation_json(), saved)
        ):
            try:
                result = result_from_json(saved)
            except (KeyError, TypeError, ValueError):
                result = None  # an old or hand-edited session: the controls are restored, the result is not
            if result is not None:
                key = self._key_for(saved)
                self.set_result(result, key)
                if key is None:
                    self.summary.setText(
                        "From the session file, for another sequence: press Run to recompute."
                    )
        saved = state.get("patch")
        if isinstance(saved, dict) and not (
            self.patch is not None and same_json(patch_to_json(self.patch), saved)
        ):
            try:
                patch = patch_from_json(saved)
            except (KeyError, TypeError, ValueError):
                patch = None
            if patch is not None:
                key = self._key_for(saved)
                self.set_patch(patch, key)
                if key is None:
                    self.patch_summary.setText("Patching from the session file, for another sequence.")
        saved = state.get("lens")
        if isinstance(saved, dict) and not (self.lens is not None and same_json(self._lens_json(), saved)):
            try:
                lens = lens_from_json(saved)
            except (KeyError, TypeError, ValueError):
                lens = None
            if lens is not None:
                key = self._key_for(saved)
                self.set_lens(lens, key)
                if key is None:
                    self.lens_panel.caption.setText("Logit lens from the session file, for another sequence.")

    def _fill(self) -> None:
        """The table: a row per query head and per GQA group, with every number the results have."""
        shape = self._shape()
        if shape is None:
            return
        L, H, n_kv = shape
        g = H // max(1, n_kv)
        nan_q, nan_kv = np.full((L, H), np.nan), np.full((L, n_kv), np.nan)
        eff = self.result[0] if self.result is not None else None
        dla = self.result[1] if self.result is not None else None
        ex = self.patch["exact"] if self.patch is not None else None
        ap = self.patch["attribution"] if self.patch is not None else None

        def arr(obj, name, kv=False):
            return (nan_kv if kv else nan_q) if obj is None else getattr(obj, name)

        heads_cols = [
            arr(eff, "query"),
            arr(dla, "heads"),
            arr(ex, "denoise"),
            arr(ex, "noise"),
            arr(ap, "denoise"),
            arr(ap, "noise"),
        ]
        kv_cols = [
            arr(eff, "kv", True),
            nan_kv,
            arr(ex, "denoise_kv", True),
            arr(ex, "noise_kv", True),
            arr(ap, "denoise_kv", True),
            arr(ap, "noise_kv", True),
        ]
        layers = eff.layers if eff is not None else self._patch_arrays()[2].layers
        rows = [(layer, h, h // g, [c[layer, h] for c in heads_cols]) for layer in layers for h in range(H)]
        rows += [(layer, -1, k, [c[layer, k] for c in kv_cols]) for layer in layers for k in range(n_kv)]
        self.table.setSortingEnabled(False)
        self.table.clearContents()
        self.table.setRowCount(len(rows))
        for r, (layer, h, k, vals) in enumerate(rows):
            cells = [(str(layer), layer), ("group" if h < 0 else str(h), h), (str(k), k)]
            cells += [("" if np.isnan(v) else f"{v:+.3f}", float(v)) for v in vals]
            for c, (text, val) in enumerate(cells):
                it = NumericItem(text)
                it.setData(Qt.ItemDataRole.UserRole, val)
                it.setData(HEAD_ROLE, (layer, h if h >= 0 else k * g))
                it.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                self.table.setItem(r, c, it)
        self.table.setSortingEnabled(True)
        for c in range(3, len(COLUMNS)):  # only the columns the results fill
            self.table.setColumnHidden(c, all(np.isnan(r[3][c - 3]) for r in rows))
        if eff is not None:
            self.table.sortItems(3, Qt.SortOrder.AscendingOrder)  # the heads whose removal costs most first
        else:
            self.table.sortItems(5 if ex is not None else 7, Qt.SortOrder.DescendingOrder)  # most restored
        self.table.scrollToTop()

    def _on_image_click(self, ev) -> None:
        shape = self._shape()
        if shape is None:
            return
        p = ev.pos()
        layer, head = int(round(p.y())), int(round(p.x()))
        if 0 <= layer < shape[0] and 0 <= head < shape[1]:
            self.state.select(layer, head)
            if ev.double():
                self.state.tab = "heatmap"


def install_view(window) -> HeadsView:
    """Create the "Which heads matter" tab and register it with ``window.add_view("heads", ...)``; its
    "Colour by" choice frames the Head grid's thumbnails too (:meth:`attnscope.app.views.head_grid.HeadGridView.set_effects`)."""
    view = HeadsView(window.state, window.engine)
    window.add_view("heads", "Which heads matter", view)
    grid = getattr(window, "grid", None)
    if grid is not None and hasattr(grid, "set_effects"):
        view.on_effects = grid.set_effects
    return view
