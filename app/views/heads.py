"""Which heads matter: the layers × heads grid of ablation effects on a target, with each head's direct
logit attribution, and the GQA groups' effects (:mod:`attnscope.core.analysis.head_effects`).

The sweep runs on the engine thread when the user presses Run (it costs a decode step per head at the
read-out scope, a forward per head everywhere), reports progress, can be cancelled (Esc / Cancel), and
serves the other views' requests between heads so the window stays responsive. Results are keyed to the
sequence they were computed for and marked out of date when it changes. Click a cell or a row to select
the head; double-click to open its map.
"""

from __future__ import annotations

import json

import numpy as np
import pyqtgraph as pg
from attnscope.app.engine import CancelledMessage, Request
from attnscope.app.views.head_rows import HEAD_ROLE, HeadRows, NumericItem
from attnscope.app.views.saved_controls import SavedControls
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSplitter,
    QTableWidget,
    QVBoxLayout,
    QWidget,
)

COLUMNS = ("Layer", "Head", "KV head", "Effect", "Direct")
#: what the tab's grid (and the Head grid's effect frames) colour by: label, key
SHOWS = (
    ("ablation effect", "query"),
    ("direct logit attribution", "dla"),
)
METRICS = (("log-prob of the target", "logprob"), ("logit difference", "logit_diff"), ("KL divergence", "kl"))
METHODS = (("zero", "zero"), ("mean over positions", "mean"))
SCOPES = (("at the read-out position", "readout"), ("at every position", "everywhere"))
STOPPED = "stopped"  # what the job returns when the sweep was cancelled


def _effects_job(ids: tuple, kind: str, token: str, other: str, method: str, scope: str):
    """Engine job: target, ablation sweep and direct logit attribution for the sequence ``ids``."""

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
        try:
            eff = head_effects(s, t, method, scope, progress=progress, cancelled=cancelled)
        except Cancelled:  # Esc (Engine.cancel) or Cancel: the tab says so and can run again
            return STOPPED
        try:
            dla, note = logit_attribution(s, t), ""
        except UnsupportedModelError as e:
            dla, note = None, str(e)
        from attnscope.core.analysis.head_effects import provenance

        text = s.tokenizer.decode
        prov = provenance(s, t, method=method, scope=scope)
        return eff, dla, note, text([t.token]), text([t.other]) if t.other >= 0 else "", prov

    return job


class HeadsView(QWidget, SavedControls, HeadRows):
    """The "Which heads matter" tab."""

    STATE_CONTROLS = (
        "target_edit",
        "other_edit",
        "metric_combo",
        "method_combo",
        "scope_combo",
        "show_combo",
    )

    def __init__(self, state, engine, parent: QWidget | None = None):
        super().__init__(parent)
        self.state, self.engine = state, engine
        self.result: tuple | None = None
        self.result_key: tuple | None = None
        self._running = False
        self.on_effects = None  # callback(values (L, H) | None, label): the Head grid's effect frames

        top = QHBoxLayout()
        top.addWidget(QLabel("Target"))
        self.target_edit = QLineEdit()
        self.target_edit.setPlaceholderText("next token")
        self.target_edit.setToolTip(
            "The token whose prediction is measured: a text that is one token (' Mary') or an id. "
            "Empty: the token the sequence holds next, or the model's top token after the last position."
        )
        top.addWidget(self.target_edit)
        top.addWidget(QLabel("vs"))
        self.other_edit = QLineEdit()
        self.other_edit.setPlaceholderText("(none)")
        self.other_edit.setToolTip("A second token: the target becomes logit(target) − logit(other)")
        top.addWidget(self.other_edit)
        self.metric_combo = QComboBox()
        for label, key in METRICS:
            self.metric_combo.addItem(label, key)
        top.addWidget(self.metric_combo)
        top.addWidget(QLabel("Ablate"))
        self.method_combo = QComboBox()
        for label, key in METHODS:
            self.method_combo.addItem(label, key)
        top.addWidget(self.method_combo)
        self.scope_combo = QComboBox()
        for label, key in SCOPES:
            self.scope_combo.addItem(label, key)
        self.scope_combo.setToolTip(
            "Read-out position: the head's output is removed only where the target is read (the prefix's "
            "KV cache is reused: one decode step per head). Every position: one forward per head."
        )
        top.addWidget(self.scope_combo)
        self.run_button = QPushButton("Run")
        self.run_button.setToolTip("Ablate every head and every GQA group at the last position")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        top.addWidget(self.run_button)
        top.addWidget(self.cancel_button)
        top.addStretch(1)
        second = QHBoxLayout()  # what the grid shows and the export: a row of their own (the first is full)
        second.addWidget(QLabel("Colour by"))
        self.show_combo = QComboBox()
        for label, key in SHOWS:
            self.show_combo.addItem(label, key)
        self.show_combo.setToolTip(
            "What the grid here, and the frames around the Head grid's thumbnails, are coloured by"
        )
        second.addWidget(self.show_combo)
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip(
            "Write the effects (JSON or CSV) with what they were computed on: model, prompt and ids, "
            "target, method and scope"
        )
        self.export_button.setEnabled(False)
        second.addWidget(self.export_button)
        second.addStretch(1)

        self.summary = QLabel("Run a prompt, then press Run to find the heads the prediction depends on.")
        self.summary.setWordWrap(True)
        self.summary.setStyleSheet("color:#335;")

        self.plot = pg.PlotWidget()
        self.plot.setBackground("w")
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.getPlotItem().invertY(True)
        self.plot.setLabel("left", "layer")
        self.plot.setLabel("bottom", "query head (grouped by KV head)")
        self.image = pg.ImageItem(axisOrder="row-major")  # rows = layers, columns = heads
        self.plot.addItem(self.image)
        self.bar = pg.ColorBarItem(colorMap=pg.colormap.get("CET-D1"), interactive=False, width=12)
        self.bar.setImageItem(self.image, insert_in=self.plot.getPlotItem())
        self.image.mouseClickEvent = self._on_image_click
        self._group_lines: list = []

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        for col, tip in (
            (3, "target with the head ablated − target of the clean run"),
            (
                4,
                "direct logit attribution: the head's output through W_O and the final norm (scale frozen) "
                "onto the target's unembedding",
            ),
        ):
            item = self.table.horizontalHeaderItem(col)
            if item is not None:  # (each column has one: setHorizontalHeaderLabels)
                item.setToolTip(tip)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(22)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.setSortingEnabled(True)

        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.plot)
        split.addWidget(self.table)
        split.setSizes([600, 400])

        self.note = QLabel(
            "Exact: each effect is a forward with that head's output replaced (a KV head: its whole group of "
            "query heads). Negative: the target falls without the head."
        )
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color:#555;")

        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(top)
        lay.addLayout(second)
        lay.addWidget(self.summary)
        lay.addWidget(split, 1)
        lay.addWidget(self.note)

        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.cancel)
        self.other_edit.textChanged.connect(self._on_other)
        self.table.cellClicked.connect(self._on_clicked)
        self.table.cellDoubleClicked.connect(self._on_activated)
        self.show_combo.currentIndexChanged.connect(lambda _i: self._draw())
        state.events.snapshot.connect(lambda _snap: self._drop_frames_if_stale())
        self.export_button.clicked.connect(self._export_dialog)

    # -- running ------------------------------------------------------------------------------------------
    def _on_other(self, text: str) -> None:
        if text.strip() and self.metric_combo.currentData() == "logprob":
            self.metric_combo.setCurrentIndex(1)

    def refresh(self) -> None:
        """Mark a result of another sequence as out of date (the sweep runs only on Run)."""
        if self.result is not None and self.result_key != self.state.sequence_key:
            self.summary.setText("Out of date: the sequence changed since these effects; press Run again.")

    def _drop_frames_if_stale(self) -> None:
        """A new sequence: the Head grid's effect frames go (they were this result's)."""
        if self.result is not None and self.result_key != self.state.sequence_key and self.on_effects:
            self.on_effects(None, "")

    def run(self) -> None:
        snap = self.state.snapshot
        if snap is None or not snap.seq_len:
            self.state.fail("Run a prompt before asking which heads matter.")
            return
        kind = self.metric_combo.currentData()
        other = self.other_edit.text()
        if kind == "logit_diff" and not other.strip():
            self.state.fail("A logit difference needs a second token: type it in the 'vs' box.")
            return
        ids = tuple(t.id for t in snap.tokens)
        key = self.state.sequence_key
        self._running = True
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.summary.setText(f"Ablating every head of {snap.seq_len} tokens…")
        self.engine.submit(
            "heads",
            Request(
                _effects_job(
                    ids,
                    kind,
                    self.target_edit.text(),
                    other if kind == "logit_diff" else "",
                    self.method_combo.currentData(),
                    self.scope_combo.currentData(),
                ),
                lambda r: self.set_result(r, key),
                "which heads matter",
                on_error=self._on_error,
            ),
        )

    def cancel(self) -> None:
        self.engine.cancel()
        self._done()
        self.summary.setText("Stopped: press Run to start again.")

    def _done(self) -> None:
        self._running = False
        self.run_button.setEnabled(True)
        self.cancel_button.setEnabled(False)

    def _on_error(self, message: str) -> None:
        self._done()
        if isinstance(message, CancelledMessage):
            self.summary.setText("Stopped: press Run to start again.")
            return
        self.summary.setText(f"Could not run: {message}")
        self.state.fail(f"Which heads matter: {message}")

    # -- drawing ------------------------------------------------------------------------------------------
    def set_result(self, result, key: tuple | None = None) -> None:
        """Show ``(HeadEffects, LogitAttribution | None, note, target text, other text)`` (GUI thread)."""
        self._done()
        if isinstance(result, str) and result == STOPPED:
            self.summary.setText("Stopped: press Run to start again.")
            return
        if result is None:
            self.summary.setText("The sequence changed before the sweep ran: press Run again.")
            return
        self.result, self.result_key = result, self.state.sequence_key if key is None else key
        eff = result[0]
        self._draw()
        H = eff.query.shape[1]
        L = eff.query.shape[0]
        self.plot.getAxis("bottom").setTicks([[(h, f"H{h}") for h in range(H)]])
        step = max(1, L // 15)
        self.plot.getAxis("left").setTicks([[(i, str(i)) for i in range(0, L, step)]])
        self.plot.setXRange(-0.5, H - 0.5, padding=0)
        self.plot.setYRange(-0.5, L - 0.5, padding=0)
        eff, dla, note, tok, other = result[:5]
        self._fill(eff, dla)
        self.export_button.setEnabled(True)
        if hasattr(self, "push_settings"):
            self.push_settings()  # the result goes into the session file with the controls
        what = {"logprob": f"log p({tok!r})", "logit_diff": f"logit({tok!r}) − logit({other!r})", "kl": "KL"}[
            eff.target.kind
        ]
        top = eff.top(3)
        names = ", ".join(f"L{a}H{b} ({e:+.3f})" for a, b, e in top)
        kv = np.nan_to_num(eff.kv)
        kl, kk = np.unravel_index(int(np.argmax(np.abs(kv))), kv.shape)
        self.summary.setText(
            f"{what} at position {eff.target.position} = {eff.clean:.4f} · {eff.method} ablation "
            f"{'at the read-out position' if eff.scope == 'readout' else 'at every position'} · "
            f"largest: {names} · GQA group L{kl} KV{kk}: {kv[kl, kk]:+.3f}" + (f" · {note}" if note else "")
        )
        self.state.say("Which heads matter: ready", 3000)

    def shown_values(self) -> tuple[np.ndarray | None, str]:
        """``((L, H) float array | None, label)``: what "Colour by" picks from the result."""
        if self.result is None:
            return None, ""
        eff, dla = self.result[0], self.result[1]
        key = self.show_combo.currentData()
        if key == "dla":
            if dla is None:
                return None, "direct logit attribution (not defined for this model)"
            return dla.heads, "direct logit attribution"
        return eff.query, f"{eff.method} ablation effect"

    def _draw(self) -> None:
        """The tab's grid (and the Head grid's frames) for the result and the "Colour by" choice."""
        if self.result is None:
            return
        eff = self.result[0]
        q, label = self.shown_values()
        if q is None:
            q = np.full(eff.query.shape, np.nan)
        lim = float(np.nanmax(np.abs(q))) if np.isfinite(q).any() else 1.0
        self.image.setImage(np.nan_to_num(q), levels=(-lim or -1, lim or 1))
        self.bar.setLevels((-lim or -1, lim or 1))
        L, H = q.shape
        self.image.setRect(-0.5, -0.5, H, L)
        for line in self._group_lines:
            self.plot.removeItem(line)
        g = H // max(1, eff.kv.shape[1])
        self._group_lines = [
            pg.InfiniteLine(pos=k * g - 0.5, angle=90, pen=pg.mkPen("#444", width=1))
            for k in range(1, eff.kv.shape[1])
        ]
        for line in self._group_lines:
            self.plot.addItem(line)
        if self.on_effects is not None:
            self.on_effects(q, label)

    # -- export and session -------------------------------------------------------------------------------
    def export_data(self) -> dict:
        """The result with its provenance (JSON-ready): what Export… writes and a session file keeps."""
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

    def export(self, path: str) -> None:
        """Write the result to ``path``: CSV (one row per head and group, provenance in ``#`` lines) when
        it ends in ``.csv``, else JSON."""
        from pathlib import Path

        data = self.export_data()
        if not data or self.result is None:
            raise ValueError("nothing to export: press Run first")
        if str(path).lower().endswith(".csv"):
            import csv
            import io

            eff, dla = self.result[0], self.result[1]
            buf = io.StringIO()
            for k in ("model", "prompt", "target", "target_text", "other_text", "method", "scope"):
                if k in data:
                    buf.write(f"# {k}: {json.dumps(data[k], ensure_ascii=False)}\n")
            w = csv.writer(buf)
            w.writerow(["layer", "head", "kv_head", "effect", "direct_logit_attribution"])
            H, n_kv = eff.query.shape[1], eff.kv.shape[1]
            g = H // max(1, n_kv)
            for layer in eff.layers:
                for h in range(H):
                    d = "" if dla is None else f"{dla.heads[layer, h]:.7g}"
                    w.writerow([layer, h, h // g, f"{eff.query[layer, h]:.7g}", d])
                for kv in range(n_kv):
                    w.writerow([layer, "group", kv, f"{eff.kv[layer, kv]:.7g}", ""])
            Path(path).write_text(buf.getvalue(), encoding="utf-8")
        else:
            Path(path).write_text(json.dumps(data, indent=1, allow_nan=True), encoding="utf-8")

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
        """The controls, and the result with its provenance (a session file keeps both)."""
        out = super().view_state()
        if self.result is not None:
            out["result"] = self.export_data()
        return out

    def restore_view_state(self, state: dict) -> None:
        super().restore_view_state(state)
        if not isinstance(state, dict) or not isinstance(state.get("result"), dict):
            return
        if self.result is not None and self.export_data() == state["result"]:
            return
        try:
            result = result_from_json(state["result"])
        except (KeyError, TypeError, ValueError):
            return  # an old or hand-edited session: the controls are restored, the result is not
        snap = self.state.snapshot
        ids = tuple(t.id for t in snap.tokens) if snap is not None else ()
        key = self.state.sequence_key if tuple(state["result"].get("ids", ())) == ids else None
        self.set_result(result, key)
        if key is None:
            self.summary.setText("From the session file, for another sequence: press Run to recompute.")

    def _fill(self, eff, dla) -> None:
        self.table.setSortingEnabled(False)
        H, n_kv = eff.query.shape[1], eff.kv.shape[1]
        g = H // max(1, n_kv)
        rows = [
            (layer, h, h // g, eff.query[layer, h], dla.heads[layer, h] if dla is not None else np.nan)
            for layer in eff.layers
            for h in range(H)
        ]
        rows += [(layer, -1, k, eff.kv[layer, k], np.nan) for layer in eff.layers for k in range(n_kv)]
        self.table.setRowCount(len(rows))
        for r, (layer, h, k, e, d) in enumerate(rows):
            cells = [
                (str(layer), layer),
                ("group" if h < 0 else str(h), h),
                (str(k), k),
                (f"{e:+.4f}", float(e)),
                ("" if np.isnan(d) else f"{d:+.4f}", float(d)),
            ]
            for c, (text, val) in enumerate(cells):
                it = NumericItem(text)
                it.setData(Qt.ItemDataRole.UserRole, val)
                it.setData(HEAD_ROLE, (layer, h if h >= 0 else k * g))
                it.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                self.table.setItem(r, c, it)
        self.table.setSortingEnabled(True)
        self.table.sortItems(3, Qt.SortOrder.AscendingOrder)  # the heads whose removal costs most first
        self.table.scrollToTop()

    def _on_image_click(self, ev) -> None:
        if self.result is None:
            return
        p = ev.pos()
        layer, head = int(p.y()), int(p.x())
        q = self.result[0].query
        if 0 <= layer < q.shape[0] and 0 <= head < q.shape[1]:
            self.state.select(layer, head)
            if ev.double():
                self.state.tab = "heatmap"


def result_from_json(data: dict) -> tuple:
    """The tab's result tuple rebuilt from :meth:`HeadsView.export_data` (a session file's copy).

    Raises:
        KeyError, TypeError, ValueError: a dict that is not such an export."""
    from attnscope.core.analysis.head_effects import HeadEffects, LogitAttribution, Target

    t = Target(**{k: data["target"][k] for k in ("kind", "position", "token", "other")})
    arr = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    eff = HeadEffects(
        arr(data["query_heads"]),
        arr(data["kv_heads"]),
        float(data["clean"]),
        t,
        str(data["method"]),
        str(data["scope"]),
        tuple(int(i) for i in data["layers"]),
        kv_side=arr(data["kv_side"]) if data.get("kv_side") is not None else None,
    )
    d = data.get("direct_logit_attribution")
    dla = None
    if isinstance(d, dict):
        dla = LogitAttribution(
            arr(d["heads"]),
            arr(d["attn_bias"]),
            arr(d["mlp"]),
            float(d["embedding"]),
            float(d["constant"]),
            float(d["logit"]),
            t,
            0.0,
        )
    prov = {
        k: v
        for k, v in data.items()
        if k not in ("query_heads", "kv_heads", "kv_side", "direct_logit_attribution")
    }
    return (
        eff,
        dla,
        str(data.get("direct_logit_attribution_note", "")),
        data.get("target_text") or "",
        data.get("other_text") or "",
        prov,
    )


def install_view(window) -> HeadsView:
    """Create the "Which heads matter" tab and register it with ``window.add_view("heads", ...)``; its
    "Colour by" choice frames the Head grid's thumbnails too (:meth:`attnscope.app.views.head_grid.HeadGridView.set_effects`)."""
    view = HeadsView(window.state, window.engine)
    window.add_view("heads", "Which heads matter", view)
    grid = getattr(window, "grid", None)
    if grid is not None and hasattr(grid, "set_effects"):
        view.on_effects = grid.set_effects
    return view
