"""The labelled heatmap figure, painted with QPainter on any of :mod:`attnscope.app.paint`'s devices.

* :func:`save_heatmap_figure`: a publication figure of one map: cells as vector rectangles (up to
  :data:`VECTOR_MAX_CELLS`, else one unsmoothed image, max-pooled when there are more cells than
  pixels), token labels on both axes, a colour bar, a title. Used by the CLI (``attnscope export
  ... --format svg``) and batch exports; safe on the engine thread (it paints on files, not widgets).
  It is the ``renderer`` that :func:`attnscope.core.io.head_export.export_head` takes.
* :func:`figure_frame`: one animation frame of that figure (a decode step), the ``frame_renderer`` of
  :func:`attnscope.core.io.animation.export_animation`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from attnscope.app.paint import ensure_gui, paint_to_file
from attnscope.core.analysis.pooling import max_pool
from attnscope.core.attention.masks import hidden_cells
from attnscope.core.io import render
from attnscope.core.io.colormaps import DEFAULT_COLOUR, ColourSpec
from attnscope.core.io.colour_scale import colour_for_map
from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetricsF, QImage, QPainter, QPen

VECTOR_MAX_CELLS = 65536  # up to 256 × 256 tokens the cells are rectangles; beyond, one image
FIGURE_SIZE_IN = (8.0, 7.0)  # default figure size in inches
FIGURE_DPI = 150.0
MAX_LABEL_CHARS = 12


def token_label(text: str, n: int = MAX_LABEL_CHARS) -> str:
    """Axis label of a token: blank tokens shown with ␣, long ones cut with …"""
    if text.strip() == "":
        text = text.replace(" ", "␣")
    return text if len(text) <= n else text[: n - 1] + "…"


# -- heatmap figure ----------------------------------------------------------------------------------------
def _ticks(vmin: float, vmax: float, scale: str | None) -> list[float]:
    if scale == "log":
        lo = max(vmin, 1e-6)
        return [
            10.0**k for k in range(math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(vmax) + 1e-9) + 1)
        ]
    return [vmin + (vmax - vmin) * f for f in (0, 0.25, 0.5, 0.75, 1.0)]


def _tick_text(v: float, scale: str | None) -> str:
    if scale == "log":
        return f"1e{round(math.log10(v))}" if v < 0.01 else f"{v:g}"
    return f"{v:.2f}"


def figure_layout(
    n_rows: int,
    n_cols: int,
    size: tuple[int, int],
    dpi: float,
    label_w: float,
    label_h: float,
    legend: bool = False,
) -> tuple[QRectF, float]:
    """The map's rectangle and cell size (px) inside a ``size`` figure; cells square, ≥ 1 px when
    possible. ``legend``: a line under the key axis title names masked / non-finite / blank cells."""
    f = dpi / 72.0
    pad = 8 * f
    tick = 3 * f
    title_h = 14 * f + pad
    left = pad + label_h + pad / 2 + label_w + tick
    right, bottom = _margins(dpi, label_w, label_h, legend)
    top = pad + title_h
    aw, ah = max(1.0, size[0] - left - right), max(1.0, size[1] - top - bottom)
    cell = min(aw / n_cols, ah / n_rows)
    if cell >= 2:
        cell = math.floor(cell)  # whole pixels: PNG cells are exact blocks
    return QRectF(left, top, cell * n_cols, cell * n_rows), cell


def _label_metrics(q_labels: list[str], k_labels: list[str], dpi: float):
    """``(font, title_font, fm, q_short, k_short, label_w, label_h)``: the fonts of a figure at
    ``dpi`` and the widest token label (px); shared by :func:`paint_heatmap` and
    :func:`figure_minimum_size` so both measure the same layout."""
    f = dpi / 72.0
    font = QFont()
    font.setPixelSize(max(1, round(7.5 * f)))
    title_font = QFont(font)
    title_font.setPixelSize(max(1, round(10 * f)))
    title_font.setBold(True)
    fm = QFontMetricsF(font)
    q_short = [token_label(t) for t in q_labels]
    k_short = [token_label(t) for t in k_labels]
    label_w = max([fm.horizontalAdvance(t) for t in q_short + k_short] + [fm.horizontalAdvance("0")])
    return font, title_font, fm, q_short, k_short, label_w, fm.height()


def figure_minimum_size(
    n_rows: int,
    n_cols: int,
    q_labels: list[str],
    k_labels: list[str],
    dpi: float = FIGURE_DPI,
    *,
    colorbar_label: str = "attention weight",
    q_axis: str = "query position",
    k_axis: str = "key position",
    legend: bool = False,
) -> tuple[int, int]:
    """The smallest figure ``(width, height)`` in pixels whose map (:func:`figure_layout`) is tall
    enough for the query-axis title and the colour bar's label (both run along its height, rotated),
    wide enough for the key-axis title, and at least 60 pt (the colour bar's own height): at or above
    it every label is drawn whole; below it :func:`save_heatmap_figure` refuses.

    A needed map side ``S`` over ``n`` cells needs a cell of ``S / n`` px, rounded up to whole pixels
    from 2 px (the layout's cells are whole pixels there); the margins are :func:`figure_layout`'s.
    """
    ensure_gui()
    f = dpi / 72.0
    _, _, fm, _, _, label_w, label_h = _label_metrics(q_labels, k_labels, dpi)
    need_h = max(fm.horizontalAdvance(q_axis), fm.horizontalAdvance(colorbar_label), 60 * f) + 2
    need_w = max(fm.horizontalAdvance(k_axis), 60 * f) + 2
    cell = max(need_w / n_cols, need_h / n_rows)
    if cell >= 2:
        cell = math.ceil(cell)
    zero, _ = figure_layout(n_rows, n_cols, (0, 0), dpi, label_w, label_h, legend)  # left, top margins
    left, top = zero.left(), zero.top()
    right, bottom = _margins(dpi, label_w, label_h, legend)
    return math.ceil(left + right + cell * n_cols), math.ceil(top + bottom + cell * n_rows)


def _margins(dpi: float, label_w: float, label_h: float, legend: bool = False) -> tuple[float, float]:
    """:func:`figure_layout`'s right and bottom margins (px)."""
    f = dpi / 72.0
    pad, tick = 8 * f, 3 * f
    bottom = tick + label_w + pad / 2 + label_h + pad + (label_h + pad / 2 if legend else 0.0)
    right = pad + 12 * f + tick + 4 * label_h + label_h + 2 * pad
    return right, bottom


def paint_heatmap(
    p: QPainter,
    size: tuple[int, int],
    weights: np.ndarray,
    q_labels: list[str],
    k_labels: list[str],
    *,
    title: str = "",
    colour: ColourSpec = DEFAULT_COLOUR,
    dpi: float = FIGURE_DPI,
    colorbar_label: str = "attention weight",
    q_axis: str = "query position",
    k_axis: str = "key position",
    masked: np.ndarray | None = None,
    blank_rows: int | None = None,
) -> QRectF:
    """Paint a labelled map (rows = queries top to bottom, columns = keys) into ``size``; returns the map's rect.

    Cells as every output draws them (:mod:`attnscope.core.io.render`): weights in ``colour``'s
    colours (map, scale, range: exactly the plain PNG's), ``masked`` cells (bool, the map's shape)
    grey-hatched on white, never the colour of weight 0, non-finite cells magenta, rows from
    ``blank_rows`` on (not generated yet) white; a legend line under the key axis names each of
    those the map holds. Vector devices get rectangles and a vector hatch up to
    :data:`VECTOR_MAX_CELLS` cells, else (and always for more cells than pixels) one image of
    :func:`attnscope.core.io.render.map_pixels` at the map's pixel size.
    """
    w = np.asarray(weights, dtype=np.float32)
    n_rows, n_cols = w.shape
    f = dpi / 72.0
    mk = masked if masked is not None and np.shape(masked) == w.shape else None
    kinds = render.cell_kinds(w, mk, blank_rows)
    items = render.legend(kinds)
    font, title_font, fm, q_short, k_short, label_w, label_h = _label_metrics(q_labels, k_labels, dpi)
    rect, cell = figure_layout(n_rows, n_cols, size, dpi, label_w, label_h, bool(items))
    p.setRenderHint(QPainter.RenderHint.Antialiasing, False)
    p.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, False)

    # title
    p.setFont(title_font)
    p.setPen(QColor(20, 20, 20))
    tfm = QFontMetricsF(title_font)
    p.drawText(
        QRectF(8 * f, 6 * f, size[0] - 16 * f, tfm.height() + 2),
        Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop,
        tfm.elidedText(title, Qt.TextElideMode.ElideRight, size[0] - 16 * f),
    )

    # cells
    hatch = QBrush(QColor(*render.MASK_HATCH), Qt.BrushStyle.BDiagPattern)
    if n_rows * n_cols <= VECTOR_MAX_CELLS and cell >= 1:
        rgb, _ = render.cell_colours(w, colour, mk, blank_rows)
        ov = min(0.5, cell / 4)
        for i in range(n_rows):
            row = rgb[i]
            change = np.flatnonzero(np.any(row[1:] != row[:-1], axis=1)) + 1
            starts = np.concatenate(([0], change))
            ends = np.concatenate((change, [n_cols]))
            y = rect.top() + i * cell
            # Each rectangle reaches half a pixel into its right and lower neighbours, which are painted
            # after it: vector viewers anti-alias edges, and abutting rectangles would show hairline seams.
            dy = ov if i < n_rows - 1 else 0.0
            for a, b in zip(starts, ends, strict=True):
                r, g, bl = (int(c) for c in row[a])
                dx = ov if b < n_cols else 0.0
                p.fillRect(
                    QRectF(rect.left() + a * cell, y, (b - a) * cell + dx, cell + dy), QColor(r, g, bl)
                )
        if mk is not None:
            km = kinds == render.MASKED
            for i in np.flatnonzero(km.any(axis=1)).tolist():
                m = np.concatenate(([False], km[i], [False]))
                edges = np.flatnonzero(m[1:] != m[:-1])
                for a, b in zip(edges[::2], edges[1::2], strict=True):
                    r_ = QRectF(rect.left() + a * cell, rect.top() + i * cell, (b - a) * cell, cell)
                    p.fillRect(r_, QColor(*render.MASK_BG))
                    p.fillRect(r_, hatch)
    else:
        src, src_mask, src_blank = w, mk, blank_rows
        ph, pw = max(1, round(rect.height())), max(1, round(rect.width()))
        if cell < 1:  # more cells than pixels: keep the strongest weight of each block visible
            from attnscope.core.analysis.pooling import block_edges

            src = max_pool(w, ph, pw)
            if mk is not None:  # a block is masked when all its cells are
                src_mask = max_pool((~mk).astype(np.float32), src.shape[0], src.shape[1]) == 0
            if blank_rows is not None:  # a block row is blank when all its rows are
                edges = block_edges(n_rows, src.shape[0])
                src_blank = int(np.searchsorted(edges[:-1], blank_rows, side="left"))
        data = np.ascontiguousarray(
            render.map_pixels(src, colour, masked=src_mask, blank_rows=src_blank, size=(pw, ph))
        )
        img = QImage(
            data.data, data.shape[1], data.shape[0], data.shape[1] * 3, QImage.Format.Format_RGB888
        ).copy()
        p.drawImage(rect, img)

    # frame
    pen = QPen(QColor(60, 60, 60))
    pen.setWidthF(0.6 * f)
    p.setPen(pen)
    p.setBrush(Qt.BrushStyle.NoBrush)
    p.drawRect(rect)

    # token labels: every stride-th, so labels never overlap
    p.setFont(font)
    p.setPen(QColor(20, 20, 20))
    stride = max(1, math.ceil(label_h * 1.05 / max(cell, 1e-9)))
    tick = 3 * f
    for i in range(0, n_rows, stride):
        y = rect.top() + (i + 0.5) * cell
        p.drawLine(QPointF(rect.left() - tick, y), QPointF(rect.left(), y))
        p.drawText(
            QRectF(rect.left() - tick - label_w - 2 * f, y - label_h / 2, label_w + f, label_h),
            Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
            q_short[i],
        )
    for j in range(0, n_cols, stride):
        x = rect.left() + (j + 0.5) * cell
        p.drawLine(QPointF(x, rect.bottom()), QPointF(x, rect.bottom() + tick))
        p.save()
        p.translate(x, rect.bottom() + tick + 2 * f)
        p.rotate(-90)
        p.drawText(
            QRectF(-label_w, -label_h / 2, label_w, label_h),
            Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
            k_short[j],
        )
        p.restore()
    # axis titles
    p.drawText(
        QRectF(rect.left(), rect.bottom() + tick + 2 * f + label_w + 4 * f, rect.width(), label_h),
        Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop,
        k_axis,
    )
    p.save()
    p.translate(rect.left() - tick - label_w - 6 * f - label_h, rect.center().y())
    p.rotate(-90)
    p.drawText(
        QRectF(-rect.height() / 2, 0, rect.height(), label_h),
        Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop,
        q_axis,
    )
    p.restore()
    if items:  # what the cells that are not weights mean, one line under the key axis title
        y = rect.bottom() + tick + 2 * f + label_w + 4 * f + label_h + 4 * f
        _paint_legend(p, items, QPointF(8 * f, y), label_h, fm, size[0] - 16 * f, hatch)

    # colour bar (top = vmax): the 256 colours of the map as a 1 × 256 image stretched over the bar (one
    # small element in SVG/PDF; 256 rectangles would be 100 kB of SVG, a Qt gradient 45 kB of PDF);
    # ticks are placed through the same normalisation as the cells
    bar = QRectF(rect.right() + 10 * f, rect.top(), 12 * f, max(rect.height(), 60 * f))
    strip = np.ascontiguousarray(colour.lut()[::-1].reshape(-1, 1, 3))
    p.drawImage(bar, QImage(strip.data, 1, strip.shape[0], 3, QImage.Format.Format_RGB888).copy())
    p.setPen(pen)
    p.drawRect(bar)
    p.setPen(QColor(20, 20, 20))
    for v in _ticks(colour.vmin, colour.vmax, colour.scale):
        y = bar.bottom() - bar.height() * float(colour.normalize(np.array([v]))[0])
        p.drawLine(QPointF(bar.right(), y), QPointF(bar.right() + tick, y))
        p.drawText(
            QRectF(bar.right() + tick + f, y - label_h / 2, 4 * label_h, label_h),
            Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
            _tick_text(v, colour.scale),
        )
    p.save()
    p.translate(bar.right() + tick + 4 * label_h + 2 * f, bar.center().y())
    p.rotate(90)
    p.drawText(
        QRectF(-bar.height() / 2, -label_h, bar.height(), label_h),
        Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignBottom,
        colorbar_label,
    )
    p.restore()
    return rect


def _paint_legend(p: QPainter, items, at: QPointF, h: float, fm: QFontMetricsF, width: float, hatch) -> None:
    """Swatch + text of each ``(kind, text)`` (:func:`attnscope.core.io.render.legend`) on one line from
    ``at``, within ``width`` px (the last text elided when it would run over)."""
    x, end = at.x(), at.x() + width
    sw = h * 0.8
    frame = QPen(QColor(60, 60, 60))
    frame.setWidthF(max(0.5, h / 30))
    for kind, text in items:
        box = QRectF(x, at.y() + (h - sw) / 2, sw, sw)
        if kind == render.MASKED:
            p.fillRect(box, QColor(*render.MASK_BG))
            p.fillRect(box, hatch)
        else:
            fill = render.NONFINITE_RGB if kind == render.NONFINITE else render.BLANK_RGB
            p.fillRect(box, QColor(*fill))
        p.setPen(frame)
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.drawRect(box)
        p.setPen(QColor(20, 20, 20))
        room = end - (x + sw + h / 3)
        if room <= h:
            break
        shown = fm.elidedText(text, Qt.TextElideMode.ElideRight, room)
        p.drawText(
            QRectF(x + sw + h / 3, at.y(), room, h),
            Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
            shown,
        )
        x += sw + h / 3 + fm.horizontalAdvance(shown) + h
        if x >= end:
            break


def figure_mask(shape, q_tokens, k_tokens, metadata: dict | None) -> np.ndarray | None:
    """Cells of a ``shape`` map the mask hid (bool), from the tokens' positions (a later key: causal)
    and the provenance's sliding window (``metadata["mask"]["sliding_window"]``; not for the mean of
    all layers, where a cell is masked only if every layer masks it). None without positions."""
    if q_tokens is None or k_tokens is None:
        return None
    q = np.array([t.position for t in q_tokens][: shape[0]], dtype=np.int64)
    k = np.array([t.position for t in k_tokens][: shape[1]], dtype=np.int64)
    if q.shape[0] != shape[0] or k.shape[0] != shape[1]:
        return None
    mask = (metadata or {}).get("mask")
    window = mask.get("sliding_window") if isinstance(mask, dict) else None
    if (metadata or {}).get("aggregate") == "all":
        window = None
    return hidden_cells(q, k, window)


def save_heatmap_figure(
    weights: np.ndarray,
    path: str | os.PathLike,
    *,
    tokens=None,
    q_tokens=None,
    k_tokens=None,
    title: str = "",
    colour: ColourSpec = DEFAULT_COLOUR,
    size: tuple[int, int] | None = None,
    dpi: float | None = None,
    metadata: dict | None = None,
) -> Path:
    """Write the labelled figure of ``weights`` ``(n_query, n_key)`` to PNG/SVG/PDF (by suffix).

    ``tokens`` (attnscope.core.tokens.Token) label both axes (or ``q_tokens``/``k_tokens``; default: positions).
    ``colour``: map, scale and range of the cells and the colour bar (a scale still to be chosen is
    chosen from the map's weights, :func:`attnscope.core.io.colour_scale.scale_for_map`).
    ``size``: pixels ``(width, height)``, default :data:`FIGURE_SIZE_IN` × ``dpi``; ``dpi`` default
    :data:`FIGURE_DPI`, sets font sizes (points) and the physical size of SVG/PDF (``size / dpi`` inches).

    Raises:
        ValueError: unknown suffix, empty matrix. FileNotFoundError: missing folder. OSError: write failed.
    """
    w = np.asarray(weights)
    if w.ndim != 2 or w.size == 0:
        raise ValueError(f"expected a non-empty 2-D matrix, got shape {w.shape}")
    dpi = float(dpi or FIGURE_DPI)
    if size is None:
        size = (round(FIGURE_SIZE_IN[0] * dpi), round(FIGURE_SIZE_IN[1] * dpi))
    qt = q_tokens if q_tokens is not None else tokens
    kt = k_tokens if k_tokens is not None else tokens
    q_labels = [t.text for t in qt][: w.shape[0]] if qt is not None else [str(i) for i in range(w.shape[0])]
    k_labels = [t.text for t in kt][: w.shape[1]] if kt is not None else [str(j) for j in range(w.shape[1])]
    masked = figure_mask(w.shape, qt, kt, metadata)
    colour = colour_for_map(colour, w, masked)[0]  # a scale still to be chosen: from the map's weights
    bar = "attention weight"  # masked and non-finite cells are named in the legend under the map
    has_legend = bool(render.legend(render.cell_kinds(w, masked)))
    # refused before the file is opened: a size whose map would clip its labels (or not show at all)
    need = figure_minimum_size(
        w.shape[0], w.shape[1], q_labels, k_labels, dpi, colorbar_label=bar, legend=has_legend
    )
    if size[0] < need[0] or size[1] < need[1]:
        raise ValueError(
            f"{size[0]}x{size[1]} px is too small for this figure at {dpi:g} dpi: it needs at least "
            f"{need[0]}x{need[1]} px to draw the map and its labels whole"
        )
    return paint_to_file(
        path,
        size,
        lambda p: paint_heatmap(
            p,
            size,
            w,
            q_labels,
            k_labels,
            title=title,
            colour=colour,
            dpi=dpi,
            masked=masked,
            colorbar_label=bar,
        ),
        dpi=dpi,
        title=title,
        metadata=metadata,
        crisp_svg=True,
    )


FRAME_SIZE = (720, 640)  # animation frames: figure pixels
FRAME_DPI = 100.0


def _frame_palette(colour: ColourSpec):
    """A PIL palette image: 236 steps of ``colour``'s map and the 4 cell specials
    (:func:`attnscope.core.io.render.map_palette`: masked white, hatch grey, non-finite magenta,
    blank white), then 16 greys (text, frame, background)."""
    from PIL import Image

    pal = np.concatenate(
        [
            render.map_palette(colour, 236),
            np.repeat(np.linspace(0, 255, 16).round().astype(np.uint8)[:, None], 3, axis=1),
        ]
    )
    img = Image.new("P", (1, 1))
    img.putpalette(pal.astype(np.uint8).reshape(-1).tolist())
    return img


def figure_frame(
    weights: np.ndarray,
    n: int,
    *,
    tokens=None,
    title: str = "",
    colour: ColourSpec = DEFAULT_COLOUR,
    size: tuple[int, int] = FRAME_SIZE,
    dpi: float = FRAME_DPI,
    masked: np.ndarray | None = None,
):
    """One animation frame: the labelled figure (:func:`paint_heatmap`: token axes, colour bar, ``title``
    as caption, legend) of the ``(T, T)`` map ``weights`` with rows ``n .. T-1`` blank (not generated
    yet, named in the legend), so every frame has the same layout. ``masked``: the map's mask
    (bool ``(T, T)``; default causal), hatched. Returns a PIL palette image (236 colour-map steps,
    the cell specials of :func:`attnscope.core.io.render.map_palette`, 16 greys; the cells are the
    map's colours to within one step of 256). Any thread (QImage)."""
    from PIL import Image

    ensure_gui()
    w = np.asarray(weights, dtype=np.float32)
    T = w.shape[0]
    labels = (
        [(t.text if i < n else "") for i, t in enumerate(list(tokens)[:T])]
        if tokens is not None
        else [(str(i) if i < n else "") for i in range(T)]
    )
    if masked is None or np.shape(masked) != w.shape:
        masked = hidden_cells(np.arange(T), np.arange(w.shape[1]))
    img = QImage(int(size[0]), int(size[1]), QImage.Format.Format_RGB32)
    img.fill(Qt.GlobalColor.white)
    p = QPainter(img)
    try:
        paint_heatmap(
            p,
            size,
            w,
            labels,
            labels,
            title=title,
            colour=colour,
            dpi=dpi,
            masked=masked,
            blank_rows=n if n < T else None,
        )
    finally:
        p.end()
    bits = img.constBits()
    arr = np.frombuffer(bits, dtype=np.uint8, count=img.bytesPerLine() * img.height())
    arr = arr.reshape(img.height(), img.bytesPerLine())[:, : img.width() * 4].reshape(
        img.height(), img.width(), 4
    )
    rgb = Image.fromarray(np.ascontiguousarray(arr[..., 2::-1]), mode="RGB")  # BGRA → RGB
    return rgb.quantize(palette=_frame_palette(colour), dither=Image.Dither.NONE)
