"""Mask panel: for the selected layer, head and step, the mask that was applied, the scaled scores
before softmax, the weights after it, and each row's entropy.

Step 0 is prefill (``L = S = n_prompt``); step ``t`` is decode step ``t`` (``L = 1`` query over
``S = n_prompt + t`` keys), where the L ≠ S offset of the bottom-right aligned causal mask,
``tril(ones(L, S), k = S − L)``, is written out with its numbers. Data: :mod:`attnscope.core.analysis.maskview`.

A soft-capped layer (Gemma 2) shows the scores the softmax saw, ``cap·tanh(s/cap)``, or the raw
``q·kᵀ·scale`` (the "Scores" box); the readout gives both. A model with learned sinks (gpt-oss) says
each row's share on the sink slot (its weights then sum to less than 1).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pyqtgraph as pg
from attnscope.app.engine import Request
from attnscope.app.figure import token_label
from attnscope.app.tabs import FollowsPage, PageLayout
from attnscope.app.views.heatmap import qt_colormap
from attnscope.app.views.sinks import WrappedLabel
from attnscope.core.io.colormaps import to_rgb
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QSizePolicy, QWidget

if TYPE_CHECKING:
    from attnscope.core.analysis.maskview import MaskReport
    from attnscope.core.loading.model_info import ModelInfo

BLOCKED_RGB = (215, 215, 215)
ALLOWED_RGB = (70, 130, 180)


TIPS = (
    "The boolean mask the attention applied: blue = the query may attend the key, grey = blocked "
    "(causal tril(k = S − L), plus the sliding window if the model has one)",
    "Scaled scores q·kᵀ·scale before the softmax; masked cells are −∞ (grey)",
    "Attention weights after the softmax (exact, from the stored LSE); masked cells are 0 (grey)",
    "Entropy of each query row, −Σ w ln w in nats; the grey bar is the maximum, ln(number of allowed keys)",
)


# two short lines each: on one line the four titles were wider than a 1000 px window's tab (the
# entropy panel was cut off at the right); every title has two lines, so the rows stay aligned
TITLES = ("Mask<br>applied", "Scores<br>before softmax", "Weights<br>after softmax", "Row entropy<br>(nats)")
BOTTOM_LABELS = ("key", "key", "key", "H = −Σ w ln w")
TITLE_SIZE = "10pt"  # one size for every panel title (a smaller one moved that panel's rows down)
COLUMN_STRETCH = (3, 3, 3, 2)
#: the score bar's title: the first that fits the bar's width (the whole title ran into "weight" in a
#: narrow window); the last, on two lines, is the narrowest (the bar's minimum width holds it whole)
SCORE_BAR_LABELS = ("score (masked = −∞, grey)", "score (grey = −∞)", "score (grey:<br>masked, −∞)")
GLW_MIN = (360, 260)  # the plot area's least size in pixels, whatever its panels need


def _report_job(layer: int, head: int, step: int):
    def job(ctx):
        from attnscope.core.analysis.maskview import mask_report

        return mask_report(ctx.require(), layer, head, step)

    return job


class MaskView(FollowsPage, QWidget):
    """The Mask tab, built with the :class:`attnscope.app.state.ViewState` (selection, step, colours)
    and the :class:`attnscope.app.engine.Engine`."""

    KEY = "mask"

    def __init__(self, state, engine, parent: QWidget | None = None):
        super().__init__(parent)
        self.state, self.engine = state, engine
        self.report: MaskReport | None = None
        self.report_key: tuple | None = None
        self.report_tokens: list = []  # the tokens the report was computed with
        self.report_info: ModelInfo | None = None
        self.cmap = state.colormap
        state.events.selection.connect(self.on_selection)
        state.events.colour.connect(lambda spec: self.set_colormap(spec.cmap))
        state.events.changed.connect(self._on_changed)
        lay = PageLayout(self)  # fills the tab page: the wrapped header never makes it scroll
        lay.setContentsMargins(4, 4, 4, 4)
        self.header = WrappedLabel("Run a prompt to see the masks that were applied.")
        self.header.setTextFormat(Qt.TextFormat.RichText)
        lay.addWidget(self.header)
        # soft-capped layers (Gemma 2): which scores the middle panel shows
        self.cap_row = QWidget()
        cap_lay = QHBoxLayout(self.cap_row)
        cap_lay.setContentsMargins(0, 0, 0, 0)
        cap_lay.addWidget(QLabel("Scores"))
        self.cap_combo = QComboBox()
        self.cap_combo.addItem("capped: cap·tanh(s/cap), what the softmax saw", "capped")
        self.cap_combo.addItem("raw: q·kᵀ·scale before the cap", "raw")
        self.cap_combo.setToolTip(
            "This layer soft-caps its attention logits (Gemma 2): show the scores before or after the cap"
        )
        self.cap_combo.currentIndexChanged.connect(lambda _i: self.report is not None and self._draw())
        cap_lay.addWidget(self.cap_combo)
        cap_lay.addStretch(1)
        self.cap_row.hide()
        lay.addWidget(self.cap_row)
        # one layout for the four panels: their rows share one height and one top, so row i of the
        # mask, the scores, the weights and the entropy bars is on the same pixel row (prefill)
        self.glw = pg.GraphicsLayoutWidget()
        self.glw.setBackground("w")
        self.glw.setMinimumSize(*GLW_MIN)
        lay.addWidget(self.glw, 1)
        # wraps a long hover line at the page's width, with room for every line (never widens the page)
        self.readout = WrappedLabel("Hover a cell to read its mask, score and weight.")
        self.readout.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.readout)

        self.plots = []
        for i, t in enumerate(TITLES):
            p = self.glw.addPlot(row=0, col=i)
            p.setTitle(t, color="k", size=TITLE_SIZE)
            self._style(p)
            p.getAxis("left").enableAutoSIPrefix(False)
            p.getAxis("bottom").enableAutoSIPrefix(False)
            p.setLabel("bottom", BOTTOM_LABELS[i])  # every panel has one: the same height under each
            p.setToolTip(TIPS[i])
            self.plots.append(p)
        grid = self.glw.ci.layout
        for i, stretch in enumerate(COLUMN_STRETCH):
            grid.setColumnStretchFactor(i, stretch)
        self.ent_plot = self.plots.pop()
        self.images = [pg.ImageItem(axisOrder="row-major") for _ in range(3)]
        self.score_bar = pg.ColorBarItem(
            values=(0, 1),
            colorMap=qt_colormap(),
            interactive=False,
            width=10,
            orientation="horizontal",
            label=SCORE_BAR_LABELS[-1],  # (the narrowest: the bar's minimum width is set from it)
        )
        self.weight_bar = pg.ColorBarItem(
            values=(0, 1),
            colorMap=qt_colormap(),
            interactive=False,
            width=10,
            orientation="horizontal",
            label="weight",
        )
        for bar in (self.score_bar, self.weight_bar):
            bar.axis.enableAutoSIPrefix(False)  # scores in their own units, no "(x0.001)"
            label = bar.axis.label
            m = label.document().documentMargin()
            bar.setMinimumWidth(math.ceil(label.boundingRect().width() - 2 * m) + 4)  # its title whole
        self.glw.addItem(self.score_bar, row=1, col=1)
        self.glw.addItem(self.weight_bar, row=1, col=2)
        # decode: how many keys the query may attend, under the mask panel (beside the colour bars). Inside
        # the panel, under the strip, it was wider than a narrow panel's view box and cut at its edge
        self.mask_note = pg.LabelItem("", color=(20, 20, 20), justify="center")
        self.mask_note.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.glw.addItem(self.mask_note, row=1, col=0)
        grid.setAlignment(self.mask_note, Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop)
        grid.setRowStretchFactor(0, 1)  # the panels take the height; the bars and the note what they need
        grid.setRowStretchFactor(1, 0)
        self.glw.scene().sigMouseMoved.connect(self._on_scene_mouse)
        for p in self.plots + [self.ent_plot]:  # labels are thinned by pixel size: redo on resize
            p.getViewBox().sigResized.connect(self._update_ticks)
        # the panels' row is as wide as its items' minimum widths (axes sized to their tick labels as they
        # are painted, two-line titles, the note): the plot area asks for that much, so that a narrow tab
        # page (a 1000 px window with the Why dock, an 800 px window) scrolls sideways to it instead of
        # cutting the right-hand panels off (tests/app/test_mask_fits_gui.py)
        self._fit_timer = QTimer(self)
        self._fit_timer.setSingleShot(True)
        self._fit_timer.setInterval(0)
        self._fit_timer.timeout.connect(self.fit_plot_area)
        for p in self.plots + [self.ent_plot]:
            for item in (p, p.getAxis("left"), p.getAxis("bottom"), p.titleLabel):
                item.geometryChanged.connect(self._fit_timer.start)

    def fit_plot_area(self) -> None:
        """Give the plot area (``glw``) at least its panels' minimum size, in pixels: the narrowest the
        four panels, their axes' labels, titles and the note get without being cut. The tab's page
        scrolls when it is narrower than that (:class:`attnscope.app.tabs.ViewPage`)."""
        hint = self.glw.ci.effectiveSizeHint(Qt.SizeHint.MinimumSize)
        m = self.glw.contentsMargins()
        w = max(GLW_MIN[0], math.ceil(hint.width()) + m.left() + m.right())
        h = max(GLW_MIN[1], math.ceil(hint.height()) + m.top() + m.bottom())
        if (w, h) != (self.glw.minimumWidth(), self.glw.minimumHeight()):
            self.glw.setMinimumSize(w, h)

    def fit_to_page(self) -> None:
        """Wrap the header and the hover line at the visible width of the tab page, in pixels: when the
        panels' row is wider than the page (which then scrolls sideways), the text still reads without
        scrolling."""
        holder = self._page_viewport
        if holder is None:
            return
        lay = self.layout()
        m = lay.contentsMargins() if lay is not None else None
        room = max(100, holder.width() - (m.left() + m.right() if m is not None else 0))
        for label in (self.header, self.readout):
            if label.maximumWidth() != room:
                label.setMaximumWidth(room)

    @staticmethod
    def _style(p) -> None:
        p.setMenuEnabled(False)
        p.hideButtons()
        for ax in ("left", "bottom"):
            p.getAxis(ax).setPen("k")
            p.getAxis(ax).setTextPen("k")

    # -- hooks -----------------------------------------------------------------------------------
    def _key(self) -> tuple:
        """What a report is for: the sequence (its token ids), layer, head and timeline step. A result
        for another sequence with the same layer, head and step is stale too."""
        return self.state.sequence_key, self.state.layer, self.state.head, self.state.step

    def refresh(self) -> None:
        self.engine.submit(
            "mask", Request(_report_job(*self._key()[1:]), self._on_report, "mask", key=self._key)
        )

    def on_selection(self, _selection=None) -> None:
        if self.state.tab == self.KEY:
            self.refresh()

    def _on_changed(self, names) -> None:
        """A new sequence (shorter, longer, reopened) or another timeline step: the report shown is
        not this one's any more. It is dropped (the tab asks again when it is shown), never redrawn
        against the new tokens (that indexed a 47-token list at 3031 positions)."""
        if (
            self.report is not None
            and ("snapshot" in names or "step" in names)
            and self.report_key != self._key()
        ):
            self.clear()

    def clear(self) -> None:
        """No report: empty panels and the placeholder line."""
        self.report = self.report_key = self.report_info = None
        self.report_tokens = []
        self.mask_note.setText("")
        for p in self.plots + [self.ent_plot]:
            p.clear()
            p.getAxis("left").setTicks(None)
            p.getAxis("bottom").setTicks(None)
        self.header.setText(
            "Computing the masks of this step…"
            if self.state.has_sequence
            else "Run a prompt to see the masks that were applied."
        )

    def set_colormap(self, name: str) -> None:
        self.cmap = name
        if self.report is not None:
            self._draw()

    # -- drawing ----------------------------------------------------------------------------------
    def _on_report(self, r) -> None:
        # the report keeps the tokens and model it was computed with: any later redraw (colours,
        # resize) reads those, whatever the state holds by then
        self.report, self.report_key = r, self._key()
        self.report_tokens = list(self.state.snapshot.tokens)
        self.report_info = self.state.snapshot.info
        self._draw()

    def shown_scores(self) -> np.ndarray:
        """The scores the middle panel draws: the capped ones, or the raw ones when asked (capped layers)."""
        r = self.report
        assert r is not None  # drawn only once a report came (_on_report)
        if r.raw_scores is not None and self.cap_combo.currentData() == "raw":
            return r.raw_scores
        return r.scores

    def variant_note(self) -> str:
        """The header's words on soft-capping and learned sinks ("" for a plain softmax)."""
        r = self.report
        assert r is not None  # drawn only once a report came (_on_report)
        out = ""
        if r.softcap is not None and r.raw_scores is not None:
            fin = np.isfinite(r.raw_scores)
            raw = r.raw_scores[fin] if fin.any() else np.zeros(1)
            cap = r.scores[fin] if fin.any() else np.zeros(1)
            out += (
                f"<br><b>Soft-capped</b>: the softmax sees {r.softcap:g}·tanh(s/{r.softcap:g}) of the raw score "
                f"s = q·kᵀ·scale: raw [{raw.min():.3g}, {raw.max():.3g}] → capped [{cap.min():.3g}, {cap.max():.3g}]."
            )
        if r.learned_sink is not None and r.learned_share is not None:
            share = r.learned_share
            where = (
                f"{share[0]:.3f} of this row"
                if len(share) == 1
                else f"{float(share.mean()):.3f} of a row on average"
            )
            out += (
                f"<br><b>Learned sink</b>: logit {r.learned_sink:.3g} joins every row's softmax denominator and takes "
                f"{where} (it moves no value): the weights over the keys sum to 1 − that share."
            )
        return out

    def _draw(self) -> None:
        r = self.report
        assert r is not None  # drawn only once a report came (_on_report)
        info = self.report_info
        assert info is not None  # set with the report (_on_report)
        n_rows = r.row_stop - r.row_start
        self.cap_row.setVisible(r.raw_scores is not None)
        scores = self.shown_scores()
        raw = scores is not r.scores
        if r.kind == "decode":
            what = (
                f"<b>decode step {r.step}</b>: L = 1 new query (position {r.row_start}) over S = {r.S} "
                f"cached keys (positions 0..{r.S - 1})"
            )
            why = (
                f"The offset S − L = {r.offset} shifts the causal diagonal: the single query row i = 0 sees keys "
                f"j ≤ 0 + {r.offset}, i.e. every cached key. (tril with k = 0 would let it see key 0 only: the "
                f"classic decode bug.)"
            )
        else:
            what = f"<b>prefill</b> (step 0): L = {r.L} new queries over S = {r.S} keys"
            why = "L = S, so the offset is 0: the ordinary lower triangle, query i sees keys 0..i."
            if n_rows < r.L:
                why += f" Showing the last {n_rows} of {r.L} rows (they see the most keys)."
        window = r.window_note.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        self.header.setText(
            f"Layer {r.layer} · query head {r.head} (reads KV head {info.kv_head(r.head)}) · {what}.<br>"
            f"<tt>{r.formula.replace('<', '&lt;')}</tt><br>{why} {window} "
            f"Mask: <span style='color:#4682b4'>■</span> attend, <span style='color:#aaa'>■</span> blocked; "
            f"scores are q·kᵀ·scale, −∞ where blocked. "
            f"No padding: a single-sequence session (batch 1) has no pad tokens, so no padding mask. "
            f"scale = {r.scale:.4g} (1/√{info.head_dim} = {1 / math.sqrt(info.head_dim):.4g})."
            + self.variant_note()
        )
        capped = r.raw_scores is not None
        self.plots[1].setTitle(
            ("Scores, " + ("raw<br>before the cap" if raw else "capped<br>before softmax"))
            if capped
            else TITLES[1],
            color="k",
            size=TITLE_SIZE,
        )
        decode = n_rows == 1
        rect = (0, r.row_start, r.S, n_rows)
        finite = np.isfinite(scores)
        lo = float(scores[finite].min()) if finite.any() else 0.0
        hi = float(scores[finite].max()) if finite.any() else 1.0
        hi = hi if hi > lo else lo + 1.0
        cmap = qt_colormap(self.cmap)
        self.score_bar.setColorMap(cmap)
        self.score_bar.setLevels((lo, hi))
        self.weight_bar.setColorMap(cmap)
        self.weight_bar.setLevels((0.0, 1.0))
        for k, p in enumerate(self.plots + [self.ent_plot]):
            p.clear()
            p.invertY(not decode)
            p.setAspectLocked(False)
            if k:  # prefill: one row axis for all four (linked, labelled on the first panel only)
                p.setYLink(None if decode else self.plots[0])
                p.getAxis("left").setStyle(showValues=decode)
        m = np.where(r.allowed[..., None], np.array(ALLOWED_RGB, np.uint8), np.array(BLOCKED_RGB, np.uint8))
        self.images[0].setImage(m.astype(np.uint8), levels=(0, 255))
        if decode:
            # one query row: the mask as a strip, scores and weights as bars coloured like the maps
            self.plots[0].addItem(self.images[0])
            self.images[0].setRect(0, 0, r.S, 1)
            self.plots[0].setRange(xRange=(0, r.S), yRange=(-0.6, 1.6), padding=0.02)
            n_ok = int(r.allowed.sum())
            # (two lines no wider than the panel's own minimum: the key count, then the rule)
            self.mask_note.setText(f"{n_ok} of {r.S} keys<br>allowed (j ≤ 0 + {r.offset})")
            x = np.arange(r.S) + 0.5
            s = np.where(finite[0], scores[0], np.nan)
            sb = to_rgb(np.nan_to_num(s, nan=lo), self.cmap, lo, hi)
            self.plots[1].addItem(
                pg.BarGraphItem(
                    x=x[finite[0]],
                    height=s[finite[0]],
                    width=0.85,
                    brushes=[pg.mkBrush(*c) for c in sb[finite[0]]],
                    pen=None,
                )
            )
            self.plots[1].addItem(pg.InfiniteLine(0, angle=0, pen=pg.mkPen((120, 120, 120))))
            self.plots[1].setRange(xRange=(0, r.S), yRange=(min(lo, 0), max(hi, 0)), padding=0.05)
            wb = to_rgb(r.weights[0], self.cmap, 0.0, 1.0)
            self.plots[2].addItem(
                pg.BarGraphItem(
                    x=x, height=r.weights[0], width=0.85, brushes=[pg.mkBrush(*c) for c in wb], pen=None
                )
            )
            self.plots[2].setRange(
                xRange=(0, r.S), yRange=(0, max(float(r.weights.max()), 1e-3)), padding=0.05
            )
            self.plots[1].setLabel("left", "score")
            self.plots[2].setLabel("left", "weight")
        else:
            self.mask_note.setText("")
            self.plots[1].setLabel("left", "")
            self.plots[2].setLabel("left", "")
            rgb = to_rgb(np.where(finite, scores, lo), self.cmap, lo, hi)
            rgb[~finite] = BLOCKED_RGB
            self.images[1].setImage(rgb, levels=(0, 255))
            wr = to_rgb(r.weights, self.cmap, 0.0, 1.0)
            wr[~r.allowed] = BLOCKED_RGB
            self.images[2].setImage(wr, levels=(0, 255))
            for p, img in zip(self.plots, self.images, strict=True):
                p.addItem(img)
                img.setRect(*rect)
                p.setRange(xRange=(0, r.S), yRange=(r.row_start, r.row_stop), padding=0.02)
        self._update_ticks()
        # entropy bars, one per row, against ln(allowed keys)
        e = self.ent_plot
        y = np.arange(r.row_start, r.row_stop) + 0.5 if not decode else np.array([0.5])
        e.addItem(
            pg.BarGraphItem(
                x0=0,
                y=y,
                height=0.8,
                width=r.max_entropy,
                brush=(225, 228, 235),
                pen=pg.mkPen((170, 170, 180)),
            )
        )
        e.addItem(pg.BarGraphItem(x0=0, y=y, height=0.8, width=r.entropy, brush=(59, 82, 139), pen=None))
        e.setXRange(0, max(float(r.max_entropy.max()), 1e-3), padding=0.05)
        if decode:
            e.setYRange(-0.6, 1.6, padding=0.02)
            e.setTitle(
                f"Row entropy<br>H = {r.entropy[0]:.3f} / {r.max_entropy[0]:.2f}", color="k", size=TITLE_SIZE
            )
        else:
            e.setYRange(r.row_start, r.row_stop, padding=0.02)
            e.setTitle(TITLES[3], color="k", size=TITLE_SIZE)
        self._fit_timer.start()  # new titles and labels: the axes' widths settle as they are painted

    def _update_ticks(self, *_):
        r = self.report
        if r is None:
            return
        toks = self.report_tokens
        decode = r.row_stop - r.row_start == 1
        for p in self.plots:
            self._ticks(p, toks, r, decode)
        e = self.ent_plot.getAxis("left")
        if decode:
            e.setTicks([[(0.5, f"{r.row_start} {token_label(toks[r.row_start].text)}")], []])
        else:
            e.setTicks(self._row_ticks(self.ent_plot, toks, r))
        self.ent_plot.getAxis("bottom").setTicks(None)  # entropy in nats, not key tokens
        fm, room = QFontMetrics(self.score_bar.axis.label.font()), self.score_bar.axis.geometry().width()
        want = next(t for t in SCORE_BAR_LABELS if "<br>" in t or fm.horizontalAdvance(t) + 8 <= room)
        if self.score_bar.axis.labelText != want:
            self.score_bar.axis.setLabel(want)
        for bar in (self.score_bar, self.weight_bar):
            _space_bar_ticks(bar)

    def _ticks(self, p, toks, r, decode: bool) -> None:
        axis = p.getAxis("bottom")
        labels = [token_label(toks[j].text) for j in range(r.S)]
        stride = _label_stride(axis, labels, p.getViewBox().width(), r.S, horizontal=True)
        axis.setTicks([[(j + 0.5, labels[j]) for j in range(0, r.S, stride)], []])
        if decode:
            left = (
                [[(0.5, f"{r.row_start} {token_label(toks[r.row_start].text)}")], []]
                if p is self.plots[0]
                else None
            )
            p.getAxis("left").setTicks(left)
        else:
            p.getAxis("left").setTicks(self._row_ticks(p, toks, r))

    @staticmethod
    def _row_ticks(p, toks, r):
        n_rows = r.row_stop - r.row_start
        rs = _label_stride(p.getAxis("left"), ["0"], p.getViewBox().height(), n_rows, horizontal=False)
        return [
            [(i + 0.5, f"{i} {token_label(toks[i].text)}") for i in range(r.row_start, r.row_stop, rs)],
            [],
        ]

    def _on_scene_mouse(self, pos) -> None:
        for k, p in enumerate(self.plots):
            if p.getViewBox().sceneBoundingRect().contains(pos):
                self._on_mouse(k, pos)
                return

    def _on_mouse(self, k: int, pos) -> None:
        r = self.report
        if r is None or k >= 3:
            return
        p = self.plots[k]
        pt = p.getViewBox().mapSceneToView(pos)
        j = int(np.floor(pt.x()))
        i = r.row_start if r.row_stop - r.row_start == 1 else int(np.floor(pt.y()))
        if r.row_start <= i < r.row_stop and 0 <= j < r.S:
            a = i - r.row_start
            toks = self.report_tokens
            ok = bool(r.allowed[a, j])
            s = r.scores[a, j]
            score = "−∞" if not np.isfinite(s) else f"{s:.4f}"
            if r.raw_scores is not None and np.isfinite(s):
                score = f"raw {r.raw_scores[a, j]:.4f} → capped {s:.4f}"
            sink = ""
            if r.learned_share is not None:
                sink = f"; the learned sink takes {r.learned_share[a]:.4f} of this row"
            self.readout.setText(
                f"query {toks[i].text!r} #{i} → key {toks[j].text!r} #{j}: "
                f"{'attend' if ok else 'blocked'}, score {score}, "
                f"weight {r.weights[a, j]:.4f}; row entropy {r.entropy[a]:.3f} nats{sink}"
            )


def _space_bar_ticks(bar) -> None:
    """Space the tick labels of a horizontal pyqtgraph ColorBarItem ``bar`` so that no two touch: the
    major step pyqtgraph picks, or the next 1, 2 or 5 × 10^k (in the bar's units) whose labels, as
    pyqtgraph writes them, fit between two ticks with a gap. pyqtgraph always draws at least 2.25
    intervals: a 160 px bar at 1000 x 650 wrote "-0.06-0.04-0.02" as one word."""
    axis = bar.axis
    axis.setTickSpacing()  # pyqtgraph's own choice first (where its labels fit, nothing changes)
    lo, hi = (float(v) for v in bar.levels())
    px = axis.geometry().width()
    levels = axis.tickSpacing(lo, hi, px) if hi > lo and px > 20 else []
    if not levels:  # not laid out yet: redone on the next resize
        return
    fm = QFontMetrics(axis.style["tickFont"] or axis.font())
    step = levels[0][0]
    for _ in range(12):
        k = np.arange(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1)
        values = [float(v) for v in k * step]  # (0 is 0, not 1e-17: its label is "0")
        texts = axis.tickStrings(values, 1.0, step) if values else []
        widest = max((fm.horizontalAdvance(t) for t in texts), default=0)
        if widest + 8 <= step / (hi - lo) * px:
            break
        p10 = 10.0 ** math.floor(math.log10(step) + 1e-9)
        step = next(f * p10 for f in (2, 5, 10, 20) if f * p10 > step * (1 + 1e-9))
    if step != levels[0][0]:
        axis.setTickSpacing(levels=[(step, 0.0)])  # one level: a minor level adds labels of its own


def _label_stride(axis, labels: list[str], px: float, n: int, horizontal: bool) -> int:
    """Every how many of ``n`` evenly spaced cells ``axis`` (a pyqtgraph AxisItem ``px`` pixels long) can
    label without two labels touching: the widest of ``labels`` (horizontal) or one text line (vertical)
    plus a gap. The key axes' labels overlapped at 1000 x 650 ("trainedjumps"), the plots' width having
    been taken as at least 200 px (tests/app/test_map_labels_fit_gui.py)."""
    if n <= 0:
        return 1
    fm = QFontMetrics(axis.style["tickFont"] or axis.font())
    need = (
        (max((fm.horizontalAdvance(t) for t in labels), default=0) + 10) if horizontal else fm.height() * 1.25
    )
    px = px if px > 20 else 200.0  # not laid out yet: redone on the view box's first resize
    return max(1, math.ceil(need * n / px))
