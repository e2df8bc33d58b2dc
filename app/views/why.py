"""The "Why" panel: why the selected head gives the clicked cell its score (docs "Why a head attends").

A dock beside the heatmap (the map stays in view). A click on a heatmap cell asks the engine for
:func:`attnscope.core.analysis.explain.explain` of that cell for the selected query head (no forward:
the stored q row and the cached keys) and shows

* each rotary band's part of the cell's score as horizontal bars, labelled by its wavelength in words
  ("turns every 6–13 tokens"; fast bands orange, slow bands blue, dimensions the rotation leaves
  alone grey), then the same split of the row's weighted score;
* the row's weights beside its counterfactual with the rotation removed (a small line plot);
* the head's one-line summary, "positional ↔ content: 0.83 positional"
  (:func:`attnscope.core.analysis.explain.head_positional_share`).

The "By source" group box (:attr:`WhyPanel.sources_box`) follows once the bands are shown: the score split
by the components that wrote the query and the key (:func:`attnscope.core.analysis.qk_sources.source_split`,
one forward of the prefix on the engine thread, asked as its own request so the bands never wait for it),
its largest (query part × key part) pairs as bars, each side's largest totals, and the frozen-scale
approximation stated under them (:class:`attnscope.app.views.source_bars.SourceBars`).

The panel's visibility and clicked cell are kept in the view state's settings under ``"why"``
(``{"visible": bool, "query": int | None, "key": int | None}``), so session files keep them. Esc
inside the panel stops a computation that has not come back. *Export…* writes what the panel shows as
JSON with its provenance, the same keys as ``attnscope explain --json`` (plus ``"sources"`` once the
by-source split has come back).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
import pyqtgraph as pg
from attnscope.app import jobs
from attnscope.app.engine import Request
from attnscope.app.views.source_bars import draw_hbars, title_overhangs
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QDockWidget,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

if TYPE_CHECKING:
    from attnscope.app.views.source_bars import SourceBars

FAST_BRUSH = (230, 126, 34)  # bands shorter than the positional cut (orange)
SLOW_BRUSH = (52, 101, 164)  # the slower ones (blue)
FLAT_BRUSH = (150, 150, 150)  # dimensions the rotation leaves alone
SETTINGS_KEY = "why"
#: the dock's width when it opens: DOCK_SHARE of the window's, at least DOCK_OPEN_WIDTH px where the
#: window has room, at most DOCK_MAX_SHARE of it (a 504 px dock left the tabs of a 1400 px window too
#: narrow for the heatmap's and the heads tab's controls: tests/app/test_why_dock_layout_gui.py); it is
#: never narrower than DOCK_MIN_WIDTH (a 1000 px window squeezed it to 111 px, its text cut)
DOCK_SHARE, DOCK_MAX_SHARE, DOCK_OPEN_WIDTH, DOCK_MIN_WIDTH = 0.3, 0.45, 320, 250
HINT = "Click a cell of the heatmap to see why this head gives it its score."


def bar_rows(split, short_tokens: float = 64.0) -> list[tuple[str, float, tuple]]:
    """``[(label, part, rgb)]`` for a :class:`attnscope.core.analysis.explain.BandSplit`, top to bottom:
    the bands fastest first, then the unrotated part (when the model has one)."""
    rows = []
    for name, wl, part in zip(split.names, split.wavelengths, split.parts, strict=True):
        label = name if split.rope else "whole score (no RoPE)"
        rows.append((label, float(part), FAST_BRUSH if split.rope and wl < short_tokens else SLOW_BRUSH))
    if split.unrotated is not None:
        rows.append(("not rotated", float(split.unrotated), FLAT_BRUSH))
    return rows


class BandBars(pg.PlotWidget):
    """Horizontal bars of one band split, band names on the left axis, a zero line."""

    def setTitle(self, *args, **kw) -> None:  # noqa: N802 (pyqtgraph's name)
        self.getPlotItem().setTitle(*args, **kw)
        title_overhangs(self)

    def __init__(self, title: str, parent=None):
        super().__init__(parent, background="w")
        self.setMenuEnabled(False)
        self.setMouseEnabled(False, False)
        self.hideButtons()
        self.plot_title = title
        self.setTitle(title, color="#222", size="9pt")
        self.getPlotItem().invertY(True)
        self.getPlotItem().showGrid(x=True, y=False, alpha=0.2)
        self.addItem(pg.InfiniteLine(pos=0, angle=90, pen=pg.mkPen("#444", width=1)))
        self.bars: pg.BarGraphItem | None = None
        self.rows: list[tuple[str, float, tuple]] = []
        self.setMinimumHeight(150)

    def show_split(self, split, title: str | None = None) -> None:
        rows = bar_rows(split)
        self.rows = rows
        self.bars, parts = draw_hbars(self, self.bars, rows)
        lim = float(np.abs(parts).max()) if parts.size else 1.0
        self.setXRange(-lim * 1.05 if (parts < 0).any() else 0.0, lim * 1.05 if (parts > 0).any() else 0.0)
        self.setYRange(-0.6, len(rows) - 0.4, padding=0)
        self.setTitle(title or self.plot_title, color="#222", size="9pt")

    def clear_split(self) -> None:
        """No bars (the panel explains no cell)."""
        if self.bars is not None:
            self.removeItem(self.bars)
            self.bars = None
        self.rows = []
        self.getAxis("left").setTicks([[]])
        self.setTitle(self.plot_title, color="#222", size="9pt")

    def total(self) -> float:
        """The sum of the bars shown (the split's total)."""
        return float(sum(r[1] for r in self.rows))


class WhyPanel(QWidget):
    """The panel's contents (the window puts it in a dock: :func:`install`)."""

    def __init__(self, state, engine, parent: QWidget | None = None):
        super().__init__(parent)
        self.state, self.engine = state, engine
        self.cell: tuple[int, int] | None = None  # (query, key) positions clicked
        self.explanation = None
        self.share: float | None = None
        self.shown_for: tuple | None = None  # the request key of what is on screen
        self.provenance: dict = {}  # the shown explanation's (explain_job), for Export…
        self.sources_split = None  # the shown by-source split (a SourceSplit), for Export…

        self.header = QLabel(HINT)
        self.header.setWordWrap(True)
        self.score_label = QLabel("")
        self.score_label.setWordWrap(True)
        self.summary = QLabel("")
        self.summary.setWordWrap(True)
        self.summary.setStyleSheet("color:#335; font-weight:bold;")
        self.summary.setToolTip(
            "Share of the head's score variance over its map carried by the bands that turn faster than "
            "every 64 tokens: near 1 the head looks by position (previous-token, local), near 0 by content "
            "(induction)"
        )
        self.cell_bars = BandBars("This cell: score<br>by rotary band")
        self.row_bars = BandBars("This row: Σ weight × score,<br>by band")
        self.rows_plot = pg.PlotWidget(background="w")
        self.rows_plot.setMenuEnabled(False)
        self.rows_plot.setMinimumHeight(130)
        # two-line titles: one line set the plot's minimum width past a 260 px dock (its right side cut)
        self.rows_plot.setTitle("Row weights:<br>actual vs rotation removed", color="#222", size="9pt")
        title_overhangs(self.rows_plot)
        self.rows_plot.addLegend(
            offset=(45, 5), labelTextSize="8pt", labelTextColor="#222", brush=pg.mkBrush(255, 255, 255, 220)
        )
        self.rows_plot.setLabel("bottom", "key position")
        self.actual_curve = self.rows_plot.plot(
            [], [], pen=pg.mkPen(SLOW_BRUSH, width=2), name="actual", symbol="o", symbolSize=4
        )
        self.norope_curve = self.rows_plot.plot(
            [], [], pen=pg.mkPen(FAST_BRUSH, width=2, style=Qt.PenStyle.DashLine), name="no rotation"
        )
        self.cell_line = pg.InfiniteLine(
            angle=90, pen=pg.mkPen("#c0392b", width=1, style=Qt.PenStyle.DotLine)
        )
        self.rows_plot.addItem(self.cell_line)
        # filled by attnscope.core.analysis.qk_sources (the by-source split) through show_sources()
        self.sources_box = QGroupBox("By source")
        self.sources_layout = QVBoxLayout(self.sources_box)
        self.sources_status = QLabel("")
        self.sources_status.setWordWrap(True)
        self.sources_layout.addWidget(self.sources_status)
        self.source_bars: SourceBars | None = None  # made the first time a split arrives
        self.sources_box.hide()
        self.note = QLabel(
            "Exact, no forward: the bands add up to the score q·k·scale of the stored post-RoPE query and "
            "cached key. The counterfactual row uses the same q and k rotated back (pre-RoPE), same mask."
        )
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color:#555;")
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip(
            "Write this explanation as JSON, with the model and prompt it came from"
        )
        self.export_button.setEnabled(False)
        self.export_button.clicked.connect(self._export_dialog)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 4, 6, 4)
        top = QHBoxLayout()
        top.addWidget(self.header, 1)
        top.addWidget(self.export_button, 0, Qt.AlignmentFlag.AlignTop)
        lay.addLayout(top)
        for w in (self.score_label, self.summary):
            lay.addWidget(w)
        lay.addWidget(self.cell_bars, 3)
        lay.addWidget(self.row_bars, 3)
        lay.addWidget(self.rows_plot, 2)
        lay.addWidget(self.sources_box)
        lay.addWidget(self.note)
        lay.addStretch(0)  # (no cell explained, the plots hidden: the hint stays at the top)
        self.setMinimumWidth(DOCK_MIN_WIDTH - 20)  # (the scroll area's vertical bar takes the rest)
        self._show_plots(False)  # until a cell is explained: the hint alone, no empty axes
        esc = QShortcut(QKeySequence(Qt.Key.Key_Escape), self)
        esc.activated.connect(self.cancel)

        state.events.selection.connect(lambda _sel: self.request())
        state.events.snapshot.connect(self._on_snapshot)
        state.events.changed.connect(self._on_changed)
        state.events.settings.connect(self._on_settings)

    # -- state ----------------------------------------------------------------------------------------
    def request_key(self) -> tuple:
        st = self.state
        return (st.layer, st.head, self.cell, st.sequence_key, st.visible_len)

    def explain_cell(self, query: int, key: int) -> None:
        """Explain cell ``(query, key)`` (absolute positions) of the selected head."""
        self.cell = (int(query), int(key))
        self._save()
        self.request()

    def request(self) -> None:
        if self.cell is None:  # no cell (a reopened session without one): nothing of an old one stays
            if self.explanation is not None or self.shown_for is not None:
                self.engine.cancel_token("why")
                self.engine.cancel_token("why-sources")
            self.clear(HINT)
            return
        if not self.state.has_sequence:
            return
        q, k = self.cell
        if not (0 <= q < self.state.visible_len and 0 <= k < self.state.visible_len):
            self.clear(HINT)
            return
        st = self.state
        self.header.setText(f"L{st.layer} H{st.head}: computing query {q} → key {k}…")
        self.engine.submit(
            "why",
            Request(
                jobs.explain_job(st.layer, st.head, q, k),
                self.show_explanation,
                "why this score",
                key=self.request_key,
                on_error=self._on_error,
            ),
        )

    def cancel(self) -> None:
        """Stop a computation that has not come back (Esc): its result is dropped."""
        self.engine.cancel_token("why")
        self.engine.cancel_token("why-sources")
        self.header.setText("Stopped. " + HINT)

    def _on_error(self, message) -> None:
        self.clear(f"Cannot explain this cell: {message}")

    def _on_snapshot(self, snap) -> None:
        if snap is None or snap.seq_len == 0:
            self.clear(HINT)
        else:
            self.request()

    def _on_changed(self, names) -> None:
        if "step" in names and "snapshot" not in names:
            self.request()

    def _dock(self) -> QDockWidget | None:
        """The dock the panel sits in (through the scroll area that holds it), or None."""
        w = self.parentWidget()
        while w is not None and not isinstance(w, QDockWidget):
            w = w.parentWidget()
        return w

    def _save(self) -> None:
        q, k = self.cell if self.cell is not None else (None, None)
        dock = self._dock()
        visible = bool(dock.isVisible()) if isinstance(dock, QDockWidget) else self.isVisible()
        entry = {"visible": visible, "query": q, "key": k}
        if self.state.settings.get(SETTINGS_KEY) != entry:
            self.state.set_tab_settings(SETTINGS_KEY, entry)

    def forget_cell(self) -> None:
        """Drop the clicked cell and what the panel shows for it (File → Open session, before the
        session's own view, with its cell if it has one, is restored): a reopened session never shows
        the cell of the run it replaced."""
        self.cell = None
        self._save()
        self.request()

    def _on_settings(self, settings) -> None:
        """A reopened session's panel: its cell and visibility."""
        entry = (settings or {}).get(SETTINGS_KEY)
        if not isinstance(entry, dict):
            return
        q, k = entry.get("query"), entry.get("key")
        cell = (
            (q, k)
            if isinstance(q, int)
            and isinstance(k, int)
            and not isinstance(q, bool)
            and not isinstance(k, bool)
            else None
        )
        dock = self._dock()
        if isinstance(dock, QDockWidget) and isinstance(entry.get("visible"), bool):
            if dock.isVisible() != entry["visible"]:
                dock.setVisible(entry["visible"])
        if cell != self.cell:
            self.cell = cell
            self.request()

    # -- drawing ----------------------------------------------------------------------------------
    def clear(self, text: str = HINT) -> None:
        """No explanation: ``text`` in the header, empty bars, rows and by-source box."""
        self.explanation, self.share, self.shown_for = None, None, None
        self.provenance, self.sources_split = {}, None
        self.export_button.setEnabled(False)
        self.header.setText(text)
        self.score_label.setText("")
        self.summary.setText("")
        for bars in (self.cell_bars, self.row_bars):
            bars.clear_split()
        self.actual_curve.setData([], [])
        self.norope_curve.setData([], [])
        self.sources_box.hide()
        self._show_plots(False)

    def _show_plots(self, on: bool) -> None:
        """The bars, the row plot and the note (hidden while no cell is explained)."""
        for w in (self.cell_bars, self.row_bars, self.rows_plot, self.note):
            w.setVisible(on)

    def show_explanation(self, result) -> None:
        """Show an ``explain_job`` result ``(cell, Explanation, share[, provenance])`` (GUI thread)."""
        (layer, head, q, k), e, share = result[:3]
        self.explanation, self.share, self.shown_for = e, share, self.request_key()
        self.provenance = dict(result[3]) if len(result) > 3 else {}
        self.sources_split = None
        self.export_button.setEnabled(True)
        self._show_plots(True)
        snap = self.state.snapshot
        toks = list(snap.tokens) if snap is not None else []

        def tok(i: int) -> str:
            return repr(toks[i].text) if i < len(toks) else ""

        self.header.setText(f"L{layer} H{head} · query {q} {tok(q)} → key {k} {tok(k)}")
        masked = "" if e.allowed else " (masked: the softmax never sees it)"
        capped = f" · soft-capped at {e.capped:g} before the softmax" if e.capped else ""
        self.score_label.setText(f"score {e.score:+.4f} · weight {e.weight:.4f}{masked}{capped}")
        if not e.bands.rope:
            self.summary.setText(e.bands.note)
        elif share is None or not np.isfinite(share):
            self.summary.setText("positional ↔ content: —")
        else:
            self.summary.setText(f"positional ↔ content: {share:.2f} positional")
        self.cell_bars.show_split(e.bands, f"This cell: score {e.score:+.3f}<br>by rotary band")
        self.row_bars.show_split(
            e.row_bands, f"This row: Σ weight × score<br>= {e.row_bands.total:+.3f}, by band"
        )
        x = np.arange(len(e.row))
        self.actual_curve.setData(x, e.row)
        self.norope_curve.setData(x, e.no_rope_row)
        self.cell_line.setValue(k)
        if e.sources is not None:
            self.show_sources(e.sources)
        else:
            self.request_sources(layer, head, q, k)

    def request_sources(self, layer: int, head: int, query: int, key: int) -> None:
        """Ask the engine for the cell's by-source split (one forward of the prefix); the box says so meanwhile."""
        if key > query:
            self.show_sources(None)
            return
        self.sources_status.setText("By source: one forward of the prefix…")
        self.sources_box.show()
        self.engine.submit(
            "why-sources",
            Request(
                jobs.sources_job(layer, head, query, key),
                lambda res: self.show_sources(res[1]),
                "why: by source",
                key=self.request_key,
                on_error=lambda m: self.show_sources(f"Cannot split this score by source: {m}"),
            ),
        )

    def show_sources(self, split) -> None:
        """Show the by-source split of the cell in :attr:`sources_box` (GUI thread).

        Args:
            split: a :class:`attnscope.core.analysis.qk_sources.SourceSplit`; a message (``str``: the one
                line a refusal gave); or None (a key after the query: no score to split).
        """
        from attnscope.app.views.source_bars import SourceBars

        self.sources_box.show()
        self.sources_split = None if split is None or isinstance(split, str) else split
        if split is None or isinstance(split, str):
            self.sources_status.setText(
                split or "By source: the key comes after the query, no score to split."
            )
            if self.source_bars is not None:
                self.source_bars.hide()
            return
        if self.source_bars is None:
            self.source_bars = SourceBars()
            self.source_bars.setMinimumHeight(300)
            self.sources_layout.addWidget(self.source_bars)
        self.sources_status.setText(
            f"Which earlier components wrote this query and key: the {len(split.pairs)} largest "
            "(query part × key part) pairs of the score."
        )
        self.source_bars.show_split(split)
        self.source_bars.show()

    # -- export ---------------------------------------------------------------------------------------
    def export_data(self) -> dict:
        """What the panel shows, JSON-ready: the provenance (model, prompt, token ids, ``prompt_sha256``),
        ``kind: "explain"``, the positional share and :meth:`Explanation.to_dict`'s keys, with
        ``"sources"`` the by-source split when it has come back; ``{}`` before any explanation."""
        e = self.explanation
        if e is None:
            return {}
        out = {**self.provenance, **e.to_dict()}
        if self.sources_split is not None:
            out["sources"] = self.sources_split.to_dict()
        return out

    def export(self, path) -> None:
        """Write :meth:`export_data` to ``path`` as JSON (NaN allowed, as the CLI writes it).

        Raises:
            ValueError: nothing explained yet. OSError: the file cannot be written.
        """
        from pathlib import Path

        data = self.export_data()
        if not data:
            raise ValueError("nothing to export: click a cell of the heatmap first")
        Path(path).write_text(json.dumps(data, indent=1, allow_nan=True, default=_plain), encoding="utf-8")

    def _export_dialog(self) -> None:
        from PySide6.QtWidgets import QFileDialog

        path, _ = QFileDialog.getSaveFileName(self, "Export explanation", "explain.json", "JSON (*.json)")
        if not path:
            return
        try:
            self.export(path)
        except (OSError, ValueError) as e:
            self.state.fail(f"Could not export: {e}")
            return
        self.state.say(f"Wrote {path}", 4000)


def _plain(x):
    """numpy values in the payload as JSON numbers and lists."""
    return np.asarray(x).tolist()


def _wire_grid_shares(window) -> None:
    """The head grid's "Colour: positional share": every head's share from the engine, asked when the
    option is picked and again for each new sequence while it stays picked."""
    grid, st = window.grid, window.state

    def shown(g) -> None:
        grid.canvas.set_shares(g)
        grid.show_scale()

    def ask(*_args) -> None:
        if grid.canvas.colour_by != "share" or not st.has_sequence:
            return
        window.engine.submit(
            "grid-share",
            Request(
                jobs.share_grid_job(),
                shown,
                "positional share",
                key=lambda: st.sequence_key,
                on_error=lambda m: st.say(f"Positional share: {m}", 8000),
            ),
        )

    grid.colourByChanged.connect(ask)
    st.events.snapshot.connect(ask)


def dock_width(window_width: int) -> int:
    """The Why dock's width in px when it opens beside a ``window_width`` px window (:data:`DOCK_SHARE`)."""
    share = max(DOCK_OPEN_WIDTH, DOCK_SHARE * window_width)
    return int(min(share, max(DOCK_MIN_WIDTH, DOCK_MAX_SHARE * window_width)))


def _fit_dock(window, dock: QDockWidget) -> None:
    """Give the dock its opening width (:func:`dock_width`) when it sits beside the tabs."""
    if dock.isFloating() or not dock.isVisible():
        return
    if window.dockWidgetArea(dock) in (
        Qt.DockWidgetArea.LeftDockWidgetArea,
        Qt.DockWidgetArea.RightDockWidgetArea,
    ):
        window.resizeDocks([dock], [dock_width(window.width())], Qt.Orientation.Horizontal)


def install(window) -> WhyPanel:
    """Put the Why panel in a dock on the window's right (hidden until a heatmap cell is clicked, or
    View → Why this score), and wire the heatmap's cell clicks to it."""
    panel = WhyPanel(window.state, window.engine)
    dock = QDockWidget("Why this score", window)
    dock.setObjectName("why_dock")
    # the panel scrolls inside the dock: docked at its own minimum height it grew the window past the
    # screen (1400x900 became 1400x967, the status bar off a 900-px screen)
    scroll = QScrollArea()
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QFrame.Shape.NoFrame)
    scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    scroll.setWidget(panel)
    scroll.setMinimumWidth(DOCK_MIN_WIDTH)  # the panel whole, never squeezed under its own minimum
    dock.setWidget(scroll)
    area = Qt.DockWidgetArea
    dock.setAllowedAreas(area.RightDockWidgetArea | area.LeftDockWidgetArea | area.BottomDockWidgetArea)
    window.addDockWidget(area.RightDockWidgetArea, dock)
    dock.hide()
    dock.visibilityChanged.connect(lambda _v: panel._save() if window.isVisible() else None)
    # opened (a click, View → Why this score, a session): its share of the window, once it is laid out
    dock.visibilityChanged.connect(
        lambda v: QTimer.singleShot(0, lambda: _fit_dock(window, dock)) if v else None
    )
    window.why_panel, window.why_dock = panel, dock

    def on_cell(row: int, col: int) -> None:
        if not dock.isVisible():
            dock.show()
        panel.explain_cell(row, col)

    window.heatmap.cellClicked.connect(on_cell)
    _wire_grid_shares(window)
    menu = getattr(window, "view_menu", None)
    if menu is not None:
        act = dock.toggleViewAction()
        act.setText("Why this score (panel)")
        act.setShortcut(QKeySequence("Ctrl+Shift+Y"))
        menu.addAction(act)
    return panel
