"""All heads at a glance: layers × query heads, the query heads grouped under their shared KV head.

Each thumbnail is a max-pooled map (:func:`attnscope.core.analysis.aggregate.thumbnails`), of the attention weights or,
on the value-weighted scale, of the row-normalised ``α_ij ‖v_j W_O^h‖`` maps
(:func:`attnscope.core.analysis.value_weighted_grid.value_weighted_thumbnails`); the view's "Weights" combo and title
say which (the window keeps it the same choice as the heatmap's). Columns are laid out in
GQA groups of ``group_size`` query heads (query head ``h`` reads KV head ``h // group_size``), with a
gap and a shaded band per group and a header "KV head k". Clicking a thumbnail emits
``headClicked(layer, head)``.

The "Colour" combo can colour each head by its positional share instead
(:func:`attnscope.core.analysis.explain.positional_share_grid`, docs "Why a head attends"): one flat
colour per head from blue (0: the score varies with content) through white to orange (1: with position),
the value printed on it.
"""

from __future__ import annotations

import numpy as np
from attnscope.core.io.colormaps import to_rgb
from attnscope.core.io.render import HATCH_PERIOD, MASK_HATCH
from PySide6.QtCore import QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QImage, QPainter, QPen
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QScrollArea, QSizePolicy, QWidget

PENDING_RGB = (222, 222, 222)  # a layer not computed yet (a partial grid): flat light grey
NO_MAP_RGB = (246, 246, 246)  # a hybrid model's layer with no attention map: a near-white band, named
MASKED_LEGEND = "▨ masked (not a weight of 0)"
NONFINITE_LEGEND = "magenta: NaN/inf (the forward overflowed), not a weight"  # to_rgb's NONFINITE_RGB


def masked_blocks(n: int, p: int, window: int | None = None) -> np.ndarray:
    """Which blocks of an ``n × n`` map pooled to ``p × p`` near-equal blocks
    (:func:`attnscope.core.analysis.pooling.block_edges`) hold only masked cells: ``(p, p)`` bool,
    by the one mask rule (:func:`attnscope.core.attention.masks.hidden_blocks`). Such a block is
    drawn hatched, not as the colour of weight 0."""
    from attnscope.core.analysis.pooling import block_edges
    from attnscope.core.attention.masks import hidden_blocks

    e = block_edges(int(n), int(p))
    return hidden_blocks(e, e, window)


def hatch(h: int, w: int, pitch: int = HATCH_PERIOD) -> np.ndarray:
    """``(h, w, 3)`` uint8: the masked-cell hatch (grey diagonal lines on white)."""
    yy, xx = np.mgrid[0:h, 0:w]
    out = np.full((h, w, 3), 255, np.uint8)
    out[(xx + yy) % pitch == 0] = MASK_HATCH
    return out


class HeadGridCanvas(QWidget):
    headClicked = Signal(int, int)

    THUMB = 40
    GAP = 3
    GROUP_GAP = 18
    LEFT = 64
    TOP = 46

    PLACEHOLDER = "Run a prompt to see every head."

    def __init__(self, parent=None):
        super().__init__(parent)
        self.thumbs: np.ndarray | None = None  # (L, H, P, P)
        self.group_size = 1
        self.selected: tuple[int, int] | None = None
        self.cmap = "viridis"
        self.weighting = (
            "attention"  # what the thumbnails measure (attnscope.core.analysis.value_weighted.WEIGHTINGS)
        )
        self.pooling = "max"
        self.n: int | None = None  # tokens the thumbnails cover (chooses the colour scale)
        self.scale = (
            "linear"  # colour scale: the heatmap's (follow), else colour_scale.default_colour_scale(n)
        )
        self.follow: str | None = None  # the heatmap's scale, which the thumbnails follow (None: by length)
        self.gamma = 0.5  # the power scale's exponent, as the heatmap's
        # the heatmap's Range: "fixed" (``fixed_range``), "auto" (each thumbnail its own maximum) or "shared"
        # (one maximum per layer, over its heads), as the heatmap ranges one map or a layer's heads
        self.range_mode = "fixed"
        self.fixed_range: tuple[float, float] = (0.0, 1.0)
        self.windows: tuple[int | None, ...] | None = None  # per-layer sliding windows (None: causal only)
        # a hybrid model's layers with no map (NaN thumbnails, attnscope.core.trace.base): layer -> its line,
        # "layer 2: linear attention, no map", drawn across the row instead of thumbnails
        self.no_map: dict[int, str] = {}
        self.colour_by = "maps"  # or "share": each head one colour, its positional share
        self.shares: np.ndarray | None = None  # (L, H) positional shares (attnscope.core.analysis.explain)
        self._image: QImage | None = None
        # "Which heads matter" colours: (L, H) effects drawn as a frame around each thumbnail (None: none)
        self.effects: np.ndarray | None = None
        self.effects_label = ""
        self.placeholder = self.PLACEHOLDER
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        self.setMouseTracking(True)

    def set_thumbnails(
        self, thumbs: np.ndarray, group_size: int, weighting: str | None = None, n: int | None = None
    ) -> None:
        """Show ``thumbs (L, H, P, P)``; ``weighting`` (``"attention"`` / ``"value-weighted"``) says what
        they measure (``None``: unchanged); ``n``: the tokens they cover (``None``: unchanged), which
        chooses the colour scale like the heatmap's default (log over [1e-6, 1] from 2,048 tokens,
        where most block maxima are far below 1 and linear colours show one flat field) unless
        :attr:`follow` names the heatmap's scale, which wins."""
        from attnscope.core.io.colour_scale import default_colour_scale

        if weighting is not None:
            self.weighting = weighting
        if n is not None:
            self.n = int(n)
            self.scale = default_colour_scale(self.n)
        if self.follow is not None:  # the heatmap's Scale: one colour mapping on both tabs
            self.scale = self.follow
        self.thumbs = np.asarray(thumbs, dtype=np.float32)
        self.group_size = max(1, group_size)
        self._image = self._compose()
        self.setFixedSize(self.sizeHint())
        self.update()

    def set_shares(self, shares: np.ndarray | None) -> None:
        """The heads' positional shares ``(L, H)`` in [0, 1] (NaN: none), drawn while :attr:`colour_by`
        is ``"share"``."""
        self.shares = None if shares is None else np.asarray(shares, dtype=np.float32)
        if self.shares is not None and self.thumbs is None:  # no thumbnails yet: the grid's geometry only
            L, H = self.shares.shape
            self.thumbs = np.zeros((L, H, 4, 4), dtype=np.float32)
        self.set_colour_by(self.colour_by)

    def set_colour_by(self, mode: str) -> None:
        """``"maps"`` (the thumbnails) or ``"share"`` (:meth:`set_shares`)."""
        self.colour_by = mode
        if self.thumbs is not None:
            self._image = self._compose()
            self.setFixedSize(self.sizeHint())
        self.update()

    def _showing_shares(self) -> bool:
        return (
            self.colour_by == "share"
            and self.shares is not None
            and self.thumbs is not None
            and self.shares.shape == self.thumbs.shape[:2]
        )

    def set_selected(self, layer: int, head: int) -> None:
        self.selected = (layer, head)
        self.update()

    # -- geometry -------------------------------------------------------------------------------
    def head_x(self, head: int) -> int:
        g = head // self.group_size
        return self.LEFT + head * (self.THUMB + self.GAP) + g * self.GROUP_GAP

    def layer_y(self, layer: int) -> int:
        return self.TOP + layer * (self.THUMB + self.GAP)

    def sizeHint(self) -> QSize:
        if self.thumbs is None:
            return QSize(400, 200)
        L, H = self.thumbs.shape[:2]
        width = self.head_x(H - 1) + self.THUMB + 12
        if self.no_map:  # room for the longest "short convolution, no map" across a narrow grid
            from PySide6.QtGui import QFontMetrics

            fm = QFontMetrics(self.font())
            text = max((fm.horizontalAdvance(self._no_map_text(i)) for i in self.no_map), default=0)
            width = max(width, self.head_x(0) + text + 24)
        return QSize(width, self.layer_y(L - 1) + self.THUMB + 12)

    def _no_map_text(self, layer: int) -> str:
        """What a layer with no map says across its row (the row is labelled ``layer N`` already)."""
        line = self.no_map.get(layer, f"layer {layer}: no map")
        return line.split(": ", 1)[-1]

    def cell_at(self, pos: QPoint) -> tuple[int, int] | None:
        if self.thumbs is None:
            return None
        L, H = self.thumbs.shape[:2]
        for h in range(H):
            x = self.head_x(h)
            if x <= pos.x() < x + self.THUMB:
                layer = (pos.y() - self.TOP) // (self.THUMB + self.GAP)
                if 0 <= layer < L and pos.y() - self.layer_y(layer) < self.THUMB and pos.y() >= self.TOP:
                    if self._is_no_map(int(layer)):
                        return None  # no map to open
                    return int(layer), h
        return None

    def _is_no_map(self, layer: int) -> bool:
        if layer in self.no_map:
            return True
        return self.thumbs is not None and bool(np.isnan(self.thumbs[layer]).all())

    # -- drawing ------------------------------------------------------------------------------
    def _compose(self) -> QImage:
        assert self.thumbs is not None  # (called once set_thumbnails or set_shares made them)
        L, H, P, _ = self.thumbs.shape
        size = self.sizeHint()
        canvas = np.full((size.height(), size.width(), 3), 255, dtype=np.uint8)
        idx = (np.arange(self.THUMB) * P // self.THUMB).clip(0, P - 1)
        n_groups = (H + self.group_size - 1) // self.group_size
        for g in range(n_groups):  # shaded band behind each GQA group
            x0 = self.head_x(g * self.group_size) - 6
            x1 = self.head_x(min(H, (g + 1) * self.group_size) - 1) + self.THUMB + 6
            canvas[self.TOP - 6 : self.layer_y(L - 1) + self.THUMB + 6, x0:x1] = (
                (232, 236, 244) if g % 2 == 0 else (240, 236, 228)
            )
        cover = self.n if self.n is not None else P
        pattern = hatch(self.THUMB, self.THUMB)
        for layer in range(L):
            if self._is_no_map(layer):  # a hybrid model's layer with no map: a band, named in paintEvent
                y = self.layer_y(layer)
                x0, x1 = self.head_x(0), size.width() - 12
                canvas[y : y + self.THUMB, x0:x1] = NO_MAP_RGB
                continue
            done = bool(self.thumbs[layer].any())  # row 0 always puts weight 1 on key 0 once computed
            win = self.windows[layer] if self.windows is not None and layer < len(self.windows) else None
            masked = masked_blocks(cover, P, win)[idx][:, idx] if cover >= P else None
            layer_max = (
                max(self._auto_max(t) for t in self.thumbs[layer]) if self.range_mode == "shared" else 1.0
            )
            for h in range(H):
                x, y = self.head_x(h), self.layer_y(layer)
                if self._showing_shares() and self.shares is not None:
                    canvas[y : y + self.THUMB, x : x + self.THUMB] = share_rgb(float(self.shares[layer, h]))
                    continue
                if not done:
                    canvas[y : y + self.THUMB, x : x + self.THUMB] = PENDING_RGB
                    continue
                vmin, vmax = self.thumb_range(self.thumbs[layer, h], layer_max)
                rgb = to_rgb(self.thumbs[layer, h], self.cmap, vmin, vmax, self.scale, self.gamma)[idx][
                    :, idx
                ]
                if masked is not None:
                    rgb[masked] = pattern[masked]
                canvas[y : y + self.THUMB, x : x + self.THUMB] = rgb
        self._canvas = np.ascontiguousarray(canvas)
        return QImage(
            self._canvas.data,
            canvas.shape[1],
            canvas.shape[0],
            canvas.shape[1] * 3,
            QImage.Format.Format_RGB888,
        )

    @staticmethod
    def _auto_max(thumb: np.ndarray) -> float:
        """The heatmap's Auto level (:func:`attnscope.core.analysis.aggregate.robust_max`: a high percentile
        of the non-zero weights, not the max, which row 0 makes 1 on every causal map) of one thumbnail."""
        from attnscope.core.analysis.aggregate import robust_max

        return robust_max(np.nan_to_num(thumb, nan=0.0, posinf=0.0, neginf=0.0))

    def thumb_range(self, thumb: np.ndarray, layer_max: float) -> tuple[float, float]:
        """``(vmin, vmax)`` one thumbnail is coloured over: the heatmap's fixed levels, the thumbnail's own
        Auto level, or (Shared) ``layer_max``, the largest Auto level of its layer's heads: as the heatmap
        ranges one map or a layer's heads."""
        if self.range_mode == "auto":
            return 0.0, self._auto_max(thumb)
        if self.range_mode == "shared":
            return 0.0, max(layer_max, 1e-6)
        return self.fixed_range

    def corner_rect(self) -> QRect:
        """The top-left corner, left of the "KV head" headers and above the layer labels."""
        return QRect(2, 2, self.LEFT - 4, self.TOP - 4)

    def corner_font(self, text: str) -> QFont:
        """The largest font (from the widget's, down to 5 pt) in which ``text`` wraps inside
        :meth:`corner_rect` (it was cut: "partial: 30% of / layers")."""
        from PySide6.QtGui import QFontMetrics

        rect = self.corner_rect()
        font = QFont(self.font())
        size = font.pointSizeF() if font.pointSizeF() > 0 else 9.0
        while size > 5.0:
            font.setPointSizeF(size)
            got = QFontMetrics(font).boundingRect(
                rect, int(Qt.AlignmentFlag.AlignLeft | Qt.TextFlag.TextWordWrap), text
            )
            if got.height() <= rect.height() and got.width() <= rect.width():
                break
            size -= 0.5
        font.setPointSizeF(max(size, 5.0))
        return font

    def set_effects(self, values: np.ndarray | None, label: str = "") -> None:
        """Frame each thumbnail in the colour of ``values[layer, head]`` (a diverging map, blue below 0, orange
        above, symmetric about 0, so not the selection's red; NaN: no frame), e.g. the "Which heads matter" tab's ablation effects;
        None removes the frames."""
        self.effects = None if values is None else np.asarray(values, dtype=np.float64)
        self.effects_label = label if values is not None else ""
        self.update()

    def _effect_colour(self, layer: int, head: int) -> QColor | None:
        e = self.effects
        if e is None or layer >= e.shape[0] or head >= e.shape[1] or not np.isfinite(e[layer, head]):
            return None
        lim = float(np.nanmax(np.abs(e))) or 1.0
        x = float(np.clip(e[layer, head] / lim, -1.0, 1.0))
        end = (235, 120, 0) if x > 0 else (30, 70, 225)
        return QColor(*(int(round(255 + (c - 255) * abs(x))) for c in end))

    def set_note(self, text: str) -> None:
        """A line over the grid, e.g. that it is partial while the remaining layers are computed."""
        self.note = text
        self.update()

    def clear_thumbnails(self) -> None:
        """Forget the thumbnails (a new model or no sequence): the placeholder shows again."""
        self.thumbs = None
        self._image = None
        self.update()

    def set_placeholder(self, text: str) -> None:
        """What the canvas says while it has no thumbnails (nothing run yet, or computing them)."""
        self.placeholder = text
        if self._image is None:
            self.update()

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.fillRect(self.rect(), Qt.GlobalColor.white)
        if self._image is None or self.thumbs is None:  # (clear_thumbnails drops both)
            p.setPen(Qt.GlobalColor.darkGray)
            p.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, self.placeholder)
            return
        p.drawImage(0, 0, self._image)
        L, H = self.thumbs.shape[:2]
        if getattr(self, "note", ""):
            p.setPen(QColor(176, 48, 0))
            corner = self.corner_rect()
            p.setFont(self.corner_font(self.note))
            p.drawText(corner, Qt.AlignmentFlag.AlignLeft | Qt.TextFlag.TextWordWrap, self.note)
        font = QFont(self.font())
        font.setPointSizeF(max(7.0, font.pointSizeF() - 1))
        p.setFont(font)
        if not getattr(self, "note", "") and not self._showing_shares():  # the scale (also in an export)
            p.setPen(QColor(30, 60, 140))
            p.drawText(
                QRect(2, 4, self.LEFT - 4, 36),
                Qt.AlignmentFlag.AlignLeft | Qt.TextFlag.TextWordWrap,
                ("value-weighted" if self.weighting == "value-weighted" else "attention")
                + ("\nlog colours" if self.scale == "log" else ""),
            )
            p.setPen(QColor(40, 40, 40))
        p.setPen(QColor(40, 40, 40))
        n_groups = (H + self.group_size - 1) // self.group_size
        for g in range(n_groups):
            x0 = self.head_x(g * self.group_size)
            x1 = self.head_x(min(H, (g + 1) * self.group_size) - 1) + self.THUMB
            bold = QFont(font)
            bold.setBold(True)
            p.setFont(bold)
            p.drawText(QRect(x0, 4, x1 - x0, 16), Qt.AlignmentFlag.AlignCenter, f"KV head {g}")
            p.setFont(font)
            for h in range(g * self.group_size, min(H, (g + 1) * self.group_size)):
                p.drawText(QRect(self.head_x(h), 22, self.THUMB, 16), Qt.AlignmentFlag.AlignCenter, f"q{h}")
        for layer in range(L):
            p.drawText(
                QRect(0, self.layer_y(layer), self.LEFT - 8, self.THUMB),
                Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
                f"layer {layer}",
            )
            if self._is_no_map(layer):
                x0, x1 = self.head_x(0), self.width() - 12
                p.setPen(QColor(110, 110, 110))
                p.drawText(
                    QRect(x0 + 6, self.layer_y(layer), x1 - x0 - 6, self.THUMB),
                    Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                    self._no_map_text(layer),
                )
                p.setPen(QColor(40, 40, 40))
        if self._showing_shares() and self.shares is not None:  # the value on each head
            for layer in range(L):
                if self._is_no_map(layer):
                    continue
                for h in range(H):
                    v = float(self.shares[layer, h])
                    p.setPen(QColor(255, 255, 255) if np.isfinite(v) and v < 0.2 else QColor(30, 30, 30))
                    p.drawText(
                        QRect(self.head_x(h), self.layer_y(layer), self.THUMB, self.THUMB),
                        Qt.AlignmentFlag.AlignCenter,
                        "—" if not np.isfinite(v) else f"{v:.2f}",
                    )
        if self.effects is not None:  # the "Which heads matter" effect of each head, as a frame
            for layer in range(L):
                for h in range(H):
                    c = self._effect_colour(layer, h)
                    if c is not None and not self._is_no_map(layer):
                        p.setPen(QPen(c, 3))
                        p.drawRect(
                            self.head_x(h) - 1, self.layer_y(layer) - 1, self.THUMB + 1, self.THUMB + 1
                        )
            p.setPen(QColor(40, 40, 40))
        if self.selected is not None and self.selected[0] < L and self.selected[1] < H:
            layer, h = self.selected
            p.setPen(QPen(QColor(220, 30, 30), 3))
            p.drawRect(self.head_x(h) - 2, self.layer_y(layer) - 2, self.THUMB + 3, self.THUMB + 3)
        p.end()

    def mousePressEvent(self, e) -> None:
        cell = self.cell_at(e.position().toPoint())
        if cell is not None:
            self.set_selected(*cell)
            self.headClicked.emit(*cell)

    def mouseMoveEvent(self, e) -> None:
        cell = self.cell_at(e.position().toPoint())
        if cell is None:
            self.setToolTip("")
        else:
            layer, h = cell
            tip = f"layer {layer}, query head {h} (reads KV head {h // self.group_size}); click to open"
            if self._effect_colour(layer, h) is not None and self.effects is not None:
                tip += f"\n{self.effects_label}: {self.effects[layer, h]:+.4f} (frame colour)"
            self.setToolTip(tip)


#: the title's words for the heatmap's Range as the thumbnails follow it
RANGE_TITLES = {
    "fixed": "range fixed",
    "auto": "range per head (auto)",
    "shared": "range per layer (shared)",
}


def share_rgb(v: float) -> tuple[int, int, int]:
    """Blue (0: content) → white (0.5) → orange (1: position); light grey for NaN."""
    if not np.isfinite(v):
        return PENDING_RGB
    t = float(np.clip(v, 0.0, 1.0))
    blue, white, orange = np.array((52, 101, 164)), np.array((255, 255, 255)), np.array((230, 126, 34))
    c = blue + (white - blue) * (t / 0.5) if t < 0.5 else white + (orange - white) * ((t - 0.5) / 0.5)
    r, g, b = (int(round(x)) for x in c)
    return r, g, b


SHARE_TITLE = (
    "positional share (score variance in bands faster than 64 tokens): orange position, blue content"
)

SCALE_TITLES = {
    "attention": "attention weights α, max-pooled per block",
    "value-weighted": "value-weighted α·‖v W_O‖ (Kobayashi et al. 2020), row-normalised, max-pooled per block",
}


class HeadGridView(QScrollArea):
    """Scrollable :class:`HeadGridCanvas` under a bar: the "Weights" combo (attention or value-weighted;
    ``weightingChanged(str)`` when the user changes it) and a title naming the scale shown."""

    BAR = 42  # the bar's least height: a title of two lines (scale, legend, partial note); more lines grow it
    weightingChanged = Signal(str)
    colourByChanged = Signal(str)  # "maps" or "share" (the positional share per head)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.bar = QWidget(self)
        self._bar_layout = lay = QHBoxLayout(self.bar)
        lay.setContentsMargins(8, 2, 8, 2)
        lay.addWidget(QLabel("Weights"))
        self.weighting_combo = QComboBox()
        self.weighting_combo.addItem("attention", "attention")
        self.weighting_combo.addItem("value-weighted", "value-weighted")
        self.weighting_combo.setToolTip(
            "Thumbnails of the attention weights, or of the row-normalised "
            "value-weighted maps α·‖v W_O‖ (the same choice as the heatmap's Weights)"
        )
        lay.addWidget(self.weighting_combo)
        lay.addWidget(QLabel("Colour"))
        self.colour_combo = QComboBox()
        self.colour_combo.addItem("maps", "maps")
        self.colour_combo.addItem("positional share", "share")
        self.colour_combo.setToolTip(
            "The heads' maps, or one colour per head: its positional share (how much of its score "
            "varies with position rather than content: Why a head attends)"
        )
        lay.addWidget(self.colour_combo)
        self.title = QLabel()
        self.title.setWordWrap(True)  # a long title wraps rather than losing its end
        lay.addWidget(self.title, 1)
        self._bar_height = self.BAR
        self.setViewportMargins(0, self.BAR, 0, 0)
        self.weighting_combo.currentIndexChanged.connect(
            lambda _i: self.weightingChanged.emit(self.weighting)
        )
        self.canvas = HeadGridCanvas()
        self.colour_combo.currentIndexChanged.connect(self._on_colour_by)
        self.setWidget(self.canvas)
        self.setWidgetResizable(False)
        self.setAlignment(Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop)
        self.setStyleSheet("QScrollArea { background: white; }")
        self.headClicked = self.canvas.headClicked
        self.show_scale()

    def _on_colour_by(self, _i) -> None:
        mode = self.colour_combo.currentData()
        self.canvas.set_colour_by(mode)
        self.show_scale()
        self.colourByChanged.emit(mode)

    @property
    def weighting(self) -> str:
        """The scale chosen in the combo (what the next thumbnails will be computed on)."""
        return self.weighting_combo.currentData()

    def set_weighting(self, weighting: str) -> None:
        """Set the combo without emitting ``weightingChanged`` (e.g. following the heatmap's choice)."""
        i = self.weighting_combo.findData(weighting)
        if i >= 0 and i != self.weighting_combo.currentIndex():
            self.weighting_combo.blockSignals(True)
            self.weighting_combo.setCurrentIndex(i)
            self.weighting_combo.blockSignals(False)

    def show_scale(self) -> None:
        """Title: the scale of the thumbnails on screen (or of those being computed, when it differs)."""
        if self.canvas.colour_by == "share":
            got = self.canvas._showing_shares()
            self.title.setText(f"Showing: {SHARE_TITLE}" + ("" if got else " · computing…"))
            self._fit_bar()
            return
        shown = SCALE_TITLES.get(self.canvas.weighting, self.canvas.weighting)
        text = f"Showing: {shown}"
        if self.canvas.thumbs is not None and self.canvas.n is not None:
            from attnscope.core.io.colour_scale import LONG_MAP, scale_note

            text += " · " + scale_note(self.canvas.n, self.canvas.scale, self.canvas.n >= LONG_MAP)
            text += " · " + RANGE_TITLES.get(self.canvas.range_mode, self.canvas.range_mode)
        if self.canvas.thumbs is not None:
            text += f" · {MASKED_LEGEND}"
            if not np.isfinite(self.canvas.thumbs).all():
                text += f" · {NONFINITE_LEGEND}"
            note = getattr(self.canvas, "note", "")
            if note:
                text += f" · {note} (grey: pending)"
        if self.canvas.effects is not None:
            text += f" · frames: {self.canvas.effects_label} (orange > 0, blue < 0)"
        if self.canvas.thumbs is not None and self.weighting != self.canvas.weighting:
            text += f" · computing {self.weighting}…"
        self.title.setText(text)
        self._fit_bar()

    def set_effects(self, values: np.ndarray | None, label: str = "") -> None:
        """The canvas's effect frames (:meth:`HeadGridCanvas.set_effects`), named in the title."""
        self.canvas.set_effects(values, label)
        self.show_scale()

    def view_state(self) -> dict:
        """What an export's sidecar records about the grid: the scale and pooling of the thumbnails shown."""
        return {"weighting": self.canvas.weighting, "pooling": self.canvas.pooling}

    def restore_view_state(self, state: dict) -> None:
        if isinstance(state, dict) and self.weighting_combo.findData(state.get("weighting")) >= 0:
            self.weighting_combo.setCurrentIndex(self.weighting_combo.findData(state["weighting"]))

    def resizeEvent(self, e) -> None:
        super().resizeEvent(e)
        self._fit_bar()

    def _fit_bar(self) -> None:
        """The bar above the thumbnails as tall as its title's wrapped lines need at the bar's width
        (:data:`BAR` at least): in a 1000 px window the title takes three lines, and a bar of two cut
        the third."""
        r = self.contentsRect()
        self.bar.setGeometry(r.left(), r.top(), r.width(), self._bar_height)
        lay = self._bar_layout
        lay.activate()
        m = lay.contentsMargins()
        need = max(self.BAR, self.title.heightForWidth(self.title.width()) + m.top() + m.bottom())
        if need != self._bar_height:
            self._bar_height = need
            self.setViewportMargins(0, need, 0, 0)
            self.bar.setGeometry(r.left(), r.top(), r.width(), need)
