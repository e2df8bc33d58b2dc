"""Images of views through Qt's own paint devices: PNG (QImage), SVG (QSvgGenerator), PDF (QPdfWriter).

pyqtgraph 0.14's SVG exporter fails on current Qt, so nothing here goes through pyqtgraph's
exporters: a widget is rendered with ``QWidget.render(QPainter)`` onto the device, and the labelled
heatmap figure is painted directly with QPainter. Both work headless (``QT_QPA_PLATFORM=offscreen``).

* :func:`render_widget`: any view tab as shown (heatmap, head grid, sinks table, KV plot, mask
  view...), at a chosen layout size and DPI. A scroll area is rendered with its whole content, a
  table view with every row and column.
* :func:`save_heatmap_figure`: a publication figure of one map: cells as vector rectangles (up to
  :data:`VECTOR_MAX_CELLS`, else one unsmoothed image, max-pooled when there are more cells than
  pixels), token labels on both axes, a colour bar, a title. Used by the CLI (``attnscope export
  ... --format svg``) and batch exports; safe on the engine thread (it paints on files, not widgets).
* :class:`BatchExportDialog`: scope, format, folder, progress and cancel for batch exports (an engine
  job, :func:`core.export.export_batch` / :func:`core.export.decode_frames`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from PySide6.QtCore import QMarginsF, QPoint, QPointF, QRect, QRectF, QSize, QSizeF, Qt
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontMetricsF,
    QGuiApplication,
    QImage,
    QPageSize,
    QPainter,
    QPdfWriter,
    QPen,
)

from core import __version__
from core.colormaps import normalize, to_rgb
from core.pooling import max_pool

VECTOR_MAX_CELLS = 65536  # up to 256 × 256 tokens the cells are rectangles; beyond, one image
FIGURE_SIZE_IN = (8.0, 7.0)  # default figure size in inches
FIGURE_DPI = 150.0
SCREEN_DPI = 96.0
MAX_LABEL_CHARS = 12


def ensure_gui() -> None:
    """Make sure a Qt GUI application exists (headless: the offscreen platform when none is set)."""
    if QGuiApplication.instance() is None:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        ensure_gui.app = QGuiApplication(["attnscope"])  # keep a reference for the process' life


def _fmt(path: Path) -> str:
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg", "pdf"):
        raise ValueError(f"unsupported image {path.name!r}: use .png, .svg or .pdf")
    if not path.parent.exists():
        raise FileNotFoundError(f"folder {path.parent} does not exist")
    return fmt


def token_label(text: str, n: int = MAX_LABEL_CHARS) -> str:
    """Axis label of a token: blank tokens shown with ␣, long ones cut with …"""
    if text.strip() == "":
        text = text.replace(" ", "␣")
    return text if len(text) <= n else text[: n - 1] + "…"


# -- paint devices -----------------------------------------------------------------------------------
def paint_to_file(path: str | os.PathLike, size: tuple[int, int], paint, dpi: float = SCREEN_DPI,
                  title: str = "", metadata: dict | None = None, scale: float = 1.0) -> Path:
    """Open the device for ``path`` (by suffix), call ``paint(painter)`` in a ``size`` coordinate box, close.

    ``size``: logical ``(width, height)``; PNG pixels are ``size × scale``, the physical size of SVG
    and PDF is ``size / dpi`` inches. ``metadata`` (JSON) goes into a PNG text chunk ``"attnscope"``
    or the SVG ``<desc>``; the PDF gets ``title`` and AttnScope as creator.

    Raises:
        ValueError: unknown suffix. FileNotFoundError: missing folder. OSError: could not write.
    """
    ensure_gui()
    path = Path(path)
    fmt = _fmt(path)
    w, h = int(size[0]), int(size[1])
    text = json.dumps(metadata, ensure_ascii=False) if metadata is not None else ""
    if fmt == "png":
        img = QImage(max(1, round(w * scale)), max(1, round(h * scale)), QImage.Format_RGB32)
        img.fill(Qt.white)
        dpm = round(dpi * scale / 0.0254)
        img.setDotsPerMeterX(dpm)
        img.setDotsPerMeterY(dpm)
        if text:
            img.setText("attnscope", text)
        p = QPainter(img)
        p.scale(scale, scale)
        try:
            paint(p)
        finally:
            p.end()
        if not img.save(str(path), "PNG"):
            raise OSError(f"could not write {path}")
        return path
    if fmt == "svg":
        from PySide6.QtSvg import QSvgGenerator

        gen = QSvgGenerator()
        gen.setFileName(str(path))
        gen.setSize(QSize(w, h))
        gen.setViewBox(QRect(0, 0, w, h))
        gen.setResolution(round(dpi))
        gen.setTitle(title or "AttnScope")
        gen.setDescription(text or f"AttnScope {__version__}")
        p = QPainter()
        if not p.begin(gen):
            raise OSError(f"could not write {path}")
        try:
            p.fillRect(QRectF(0, 0, w, h), Qt.white)
            paint(p)
        finally:
            p.end()
        return path
    writer = QPdfWriter(str(path))
    writer.setResolution(round(dpi))
    writer.setPageSize(QPageSize(QSizeF(w / dpi * 72.0, h / dpi * 72.0), QPageSize.Point, "", QPageSize.ExactMatch))
    writer.setPageMargins(QMarginsF(0, 0, 0, 0))
    writer.setTitle(title or "AttnScope")
    writer.setCreator(f"AttnScope {__version__}")
    p = QPainter()
    if not p.begin(writer):
        raise OSError(f"could not write {path}")
    try:
        p.scale(writer.width() / w, writer.height() / h)
        paint(p)
    finally:
        p.end()
    return path


# -- widgets ---------------------------------------------------------------------------------------------
def export_target(widget):
    """What to render for a view: its ``export_widget()`` if it has one, a scroll area's content, else itself."""
    from PySide6.QtWidgets import QScrollArea

    if hasattr(widget, "export_widget"):
        return widget.export_widget()
    if isinstance(widget, QScrollArea) and widget.widget() is not None:
        return widget.widget()
    return widget


def _full_size(widget) -> QSize | None:
    """Size showing every row and column of a table/tree view (no scroll bars needed), else None."""
    from PySide6.QtWidgets import QAbstractItemView, QTableView

    if not isinstance(widget, QAbstractItemView):
        return None
    f = 2 * widget.frameWidth()
    if isinstance(widget, QTableView):
        hh, vh = widget.horizontalHeader(), widget.verticalHeader()
        width = hh.length() + (vh.width() if vh.isVisible() else 0) + f
        height = vh.length() + (hh.height() if hh.isVisible() else 0) + f
    else:
        hint = widget.sizeHintForRow(0) if widget.model() is not None and widget.model().rowCount() else 0
        width = max(widget.width(), widget.viewport().sizeHint().width() + f)
        height = widget.viewport().height() if not hint else hint * widget.model().rowCount() + 40 + f
    return QSize(max(widget.width(), width), max(widget.height(), height))


def render_widget(widget, path: str | os.PathLike, size: tuple[int, int] | None = None,
                  dpi: float = SCREEN_DPI, metadata: dict | None = None, title: str = "") -> Path:
    """Render ``widget`` (see :func:`export_target`) as shown to PNG, SVG or PDF (by suffix).

    ``size``: layout size in logical pixels (the widget is laid out at that size for the render and
    put back); default its current size (a table: every row and column). ``dpi``: PNG pixels =
    ``size × dpi / 96`` (text and lines re-rendered sharp, not upscaled); for SVG/PDF the physical size
    is ``size / 96`` inches at any ``dpi`` (vectors), raster parts embedded at their own resolution.

    Raises:
        ValueError: unknown suffix. FileNotFoundError: missing folder. OSError: could not write.
    """
    from PySide6.QtWidgets import QAbstractScrollArea, QWidget

    target = export_target(widget)
    old = target.size()
    want = QSize(*size) if size is not None else _full_size(target)
    policies = None
    if want is not None and want != old:
        if isinstance(target, QAbstractScrollArea):
            policies = (target.horizontalScrollBarPolicy(), target.verticalScrollBarPolicy())
            target.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
            target.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        target.resize(want)
    try:
        cur = target.size()
        fmt = _fmt(Path(path))
        scale = dpi / SCREEN_DPI if fmt == "png" else 1.0

        def paint(p: QPainter) -> None:
            target.render(p, QPoint(0, 0), QRect(0, 0, cur.width(), cur.height()),
                          QWidget.RenderFlag.DrawWindowBackground | QWidget.RenderFlag.DrawChildren)

        return paint_to_file(path, (cur.width(), cur.height()), paint, dpi=dpi if fmt == "png" else SCREEN_DPI,
                             title=title, metadata=metadata, scale=scale)
    finally:
        if want is not None and want != old:
            target.resize(old)
            if policies is not None:
                target.setHorizontalScrollBarPolicy(policies[0])
                target.setVerticalScrollBarPolicy(policies[1])


# -- heatmap figure ----------------------------------------------------------------------------------------
def _ticks(vmin: float, vmax: float, scale: str) -> list[float]:
    if scale == "log":
        lo = max(vmin, 1e-6)
        return [10.0 ** k for k in range(math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(vmax) + 1e-9) + 1)]
    return [vmin + (vmax - vmin) * f for f in (0, 0.25, 0.5, 0.75, 1.0)]


def _tick_text(v: float, scale: str) -> str:
    if scale == "log":
        return f"1e{round(math.log10(v))}" if v < 0.01 else f"{v:g}"
    return f"{v:.2f}"


def figure_layout(n_rows: int, n_cols: int, size: tuple[int, int], dpi: float, label_w: float,
                  label_h: float) -> tuple[QRectF, float]:
    """The map's rectangle and cell size (px) inside a ``size`` figure; cells square, ≥ 1 px when possible."""
    f = dpi / 72.0
    pad = 8 * f
    tick = 3 * f
    title_h = 14 * f + pad
    left = pad + label_h + pad / 2 + label_w + tick
    bottom = tick + label_w + pad / 2 + label_h + pad
    right = pad + 12 * f + tick + 4 * label_h + label_h + 2 * pad
    top = pad + title_h
    aw, ah = max(1.0, size[0] - left - right), max(1.0, size[1] - top - bottom)
    cell = min(aw / n_cols, ah / n_rows)
    if cell >= 2:
        cell = math.floor(cell)  # whole pixels: PNG cells are exact blocks
    return QRectF(left, top, cell * n_cols, cell * n_rows), cell


def paint_heatmap(p: QPainter, size: tuple[int, int], weights: np.ndarray, q_labels: list[str],
                  k_labels: list[str], *, title: str = "", cmap: str = "viridis", scale: str = "linear",
                  vmin: float = 0.0, vmax: float = 1.0, dpi: float = FIGURE_DPI,
                  colorbar_label: str = "attention weight", q_axis: str = "query position",
                  k_axis: str = "key position") -> QRectF:
    """Paint a labelled map (rows = queries top to bottom, columns = keys) into ``size``; returns the map's rect.

    Cell colours are :func:`core.colormaps.to_rgb` of the values: exactly the colours of the plain PNG.
    """
    w = np.asarray(weights, dtype=np.float32)
    n_rows, n_cols = w.shape
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
    label_h = fm.height()
    rect, cell = figure_layout(n_rows, n_cols, size, dpi, label_w, label_h)
    p.setRenderHint(QPainter.Antialiasing, False)
    p.setRenderHint(QPainter.SmoothPixmapTransform, False)

    # title
    p.setFont(title_font)
    p.setPen(QColor(20, 20, 20))
    tfm = QFontMetricsF(title_font)
    p.drawText(QRectF(8 * f, 6 * f, size[0] - 16 * f, tfm.height() + 2), Qt.AlignHCenter | Qt.AlignTop,
               tfm.elidedText(title, Qt.ElideRight, size[0] - 16 * f))

    # cells
    rgb = to_rgb(w, cmap, vmin, vmax, scale)
    if n_rows * n_cols <= VECTOR_MAX_CELLS and cell >= 1:
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
                p.fillRect(QRectF(rect.left() + a * cell, y, (b - a) * cell + dx, cell + dy), QColor(r, g, bl))
    else:
        img_rgb = rgb
        if cell < 1:  # more cells than pixels: keep the strongest weight of each block visible
            pooled = max_pool(w, max(1, int(rect.height())), max(1, int(rect.width())))
            img_rgb = to_rgb(pooled, cmap, vmin, vmax, scale)
        data = np.ascontiguousarray(img_rgb, dtype=np.uint8)
        img = QImage(data.data, data.shape[1], data.shape[0], data.shape[1] * 3, QImage.Format_RGB888).copy()
        p.drawImage(rect, img)

    # frame
    pen = QPen(QColor(60, 60, 60))
    pen.setWidthF(0.6 * f)
    p.setPen(pen)
    p.setBrush(Qt.NoBrush)
    p.drawRect(rect)

    # token labels: every stride-th, so labels never overlap
    p.setFont(font)
    p.setPen(QColor(20, 20, 20))
    stride = max(1, math.ceil(label_h * 1.05 / max(cell, 1e-9)))
    tick = 3 * f
    for i in range(0, n_rows, stride):
        y = rect.top() + (i + 0.5) * cell
        p.drawLine(QPointF(rect.left() - tick, y), QPointF(rect.left(), y))
        p.drawText(QRectF(rect.left() - tick - label_w - 2 * f, y - label_h / 2, label_w + f, label_h),
                   Qt.AlignRight | Qt.AlignVCenter, q_short[i])
    for j in range(0, n_cols, stride):
        x = rect.left() + (j + 0.5) * cell
        p.drawLine(QPointF(x, rect.bottom()), QPointF(x, rect.bottom() + tick))
        p.save()
        p.translate(x, rect.bottom() + tick + 2 * f)
        p.rotate(-90)
        p.drawText(QRectF(-label_w, -label_h / 2, label_w, label_h), Qt.AlignRight | Qt.AlignVCenter, k_short[j])
        p.restore()
    # axis titles
    p.drawText(QRectF(rect.left(), rect.bottom() + tick + 2 * f + label_w + 4 * f, rect.width(), label_h),
               Qt.AlignHCenter | Qt.AlignTop, k_axis)
    p.save()
    p.translate(rect.left() - tick - label_w - 6 * f - label_h, rect.center().y())
    p.rotate(-90)
    p.drawText(QRectF(-rect.height() / 2, 0, rect.height(), label_h), Qt.AlignHCenter | Qt.AlignTop, q_axis)
    p.restore()

    # colour bar (vector strips, top = vmax), ticks placed through the same normalisation as the cells
    from core.colormaps import lut

    bar = QRectF(rect.right() + 10 * f, rect.top(), 12 * f, max(rect.height(), 60 * f))
    table = lut(cmap)
    n = 256
    for k in range(n):  # bottom (value vmin) first; each strip reaches 0.5 px into the one below (no seams)
        y0 = bar.bottom() - bar.height() * (k + 1) / n
        r, g, bl = (int(c) for c in table[k])
        extra = 0.5 if k else 0.0
        p.fillRect(QRectF(bar.left(), y0, bar.width(), bar.height() / n + extra), QColor(r, g, bl))
    p.setPen(pen)
    p.drawRect(bar)
    p.setPen(QColor(20, 20, 20))
    for v in _ticks(vmin, vmax, scale):
        y = bar.bottom() - bar.height() * float(normalize(np.array([v]), vmin, vmax, scale)[0])
        p.drawLine(QPointF(bar.right(), y), QPointF(bar.right() + tick, y))
        p.drawText(QRectF(bar.right() + tick + f, y - label_h / 2, 4 * label_h, label_h),
                   Qt.AlignLeft | Qt.AlignVCenter, _tick_text(v, scale))
    p.save()
    p.translate(bar.right() + tick + 4 * label_h + 2 * f, bar.center().y())
    p.rotate(90)
    p.drawText(QRectF(-bar.height() / 2, -label_h, bar.height(), label_h), Qt.AlignHCenter | Qt.AlignBottom,
               colorbar_label)
    p.restore()
    return rect


def save_heatmap_figure(weights: np.ndarray, path: str | os.PathLike, *, tokens=None, q_tokens=None,
                        k_tokens=None, title: str = "", cmap: str = "viridis", scale: str = "linear",
                        size: tuple[int, int] | None = None, dpi: float | None = None,
                        metadata: dict | None = None, vmin: float = 0.0, vmax: float = 1.0) -> Path:
    """Write the labelled figure of ``weights`` ``(n_query, n_key)`` to PNG/SVG/PDF (by suffix).

    ``tokens`` (core.tokens.Token) label both axes (or ``q_tokens``/``k_tokens``; default: positions).
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
    return paint_to_file(path, size, lambda p: paint_heatmap(p, size, w, q_labels, k_labels, title=title, cmap=cmap,
                                                             scale=scale, vmin=vmin, vmax=vmax, dpi=dpi),
                         dpi=dpi, title=title, metadata=metadata)
