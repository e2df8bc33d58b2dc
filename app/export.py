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
  job, :func:`attnscope.core.io.export.export_batch` / :func:`attnscope.core.io.export.decode_frames`).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
from attnscope.core import __version__
from attnscope.core.analysis.pooling import max_pool
from attnscope.core.io.colormaps import normalize, to_rgb
from attnscope.core.tokens import visible_text
from PySide6.QtCore import QMarginsF, QPoint, QPointF, QRect, QRectF, QSize, QSizeF, Qt
from PySide6.QtGui import (
    QBrush,
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
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
)

VECTOR_MAX_CELLS = 65536  # up to 256 × 256 tokens the cells are rectangles; beyond, one image
FIGURE_SIZE_IN = (8.0, 7.0)  # default figure size in inches
FIGURE_DPI = 150.0
SCREEN_DPI = 96.0
MAX_LABEL_CHARS = 12


def ensure_gui() -> None:
    """Make sure a Qt GUI application exists (headless: the offscreen platform when none is set)."""
    if QGuiApplication.instance() is None:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        # a QApplication (not just a QGuiApplication), so widgets can still be made in this process
        ensure_gui.app = QApplication(["attnscope"])  # keep a reference for the process' life


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
def paint_to_file(
    path: str | os.PathLike,
    size: tuple[int, int],
    paint,
    dpi: float = SCREEN_DPI,
    title: str = "",
    metadata: dict | None = None,
    scale: float = 1.0,
    crisp_svg: bool = False,
) -> Path:
    """Open the device for ``path`` (by suffix), call ``paint(painter)`` in a ``size`` coordinate box, close.

    ``size``: logical ``(width, height)``; PNG pixels are ``size × scale`` and the PNG records ``dpi``,
    the physical size of SVG and PDF is ``size / dpi`` inches. SVGs pass through
    :func:`attnscope.app.svg_fixups.fix_svg` (strokes, images and patterns drawn alike in every viewer; text XML
    can hold); PDFs store images losslessly (Flate, never JPEG). ``metadata`` (JSON) goes into a PNG text chunk ``"attnscope"``
    or the SVG ``<desc>``; the PDF gets ``title`` and AttnScope as creator. ``crisp_svg`` marks the
    SVG ``shape-rendering="crispEdges"``: viewers then draw abutting cells without anti-aliased
    hairline seams between them.

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
        dpm = round(dpi / 0.0254)  # the chosen DPI (pixels are size × scale: the DPI is what they mean)
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
        gen.setTitle(visible_text(title) or "AttnScope")
        gen.setDescription(text or f"AttnScope {__version__}")
        p = QPainter()
        if not p.begin(gen):
            raise OSError(f"could not write {path}")
        try:
            p.fillRect(QRectF(0, 0, w, h), Qt.white)
            paint(p)
        finally:
            p.end()
        from attnscope.app.svg_fixups import fix_svg

        svg = fix_svg(path.read_text(encoding="utf-8"))
        if crisp_svg:
            svg = svg.replace("<svg ", '<svg shape-rendering="crispEdges" ', 1)
        path.write_text(svg, encoding="utf-8")
        return path
    writer = QPdfWriter(str(path))
    writer.setResolution(round(dpi))
    writer.setPageSize(
        QPageSize(QSizeF(w / dpi * 72.0, h / dpi * 72.0), QPageSize.Point, "", QPageSize.ExactMatch)
    )
    writer.setPageMargins(QMarginsF(0, 0, 0, 0))
    writer.setTitle(visible_text(title) or "AttnScope")
    writer.setCreator(f"AttnScope {__version__}")
    p = QPainter()
    if not p.begin(writer):
        raise OSError(f"could not write {path}")
    p.setRenderHint(QPainter.LosslessImageRendering, True)  # Flate, not JPEG: cells keep their exact colours
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


def _resizing_scroll_area(widget):
    """The QScrollArea that holds ``widget`` with ``widgetResizable`` on (it would undo a resize), or None."""
    from PySide6.QtWidgets import QScrollArea

    viewport = widget.parentWidget()
    area = viewport.parentWidget() if viewport is not None else None
    if isinstance(area, QScrollArea) and area.widget() is widget and area.widgetResizable():
        return area
    return None


def _size_showing_tables(widget, rounds: int = 12) -> QSize | None:
    """A size of ``widget`` at which every table inside it shows all its rows and columns (the view is
    laid out at growing sizes until none scrolls), or None when no table inside it scrolls. The
    widget is put back to its size before returning."""
    from PySide6.QtWidgets import QTableView

    tables = [t for t in widget.findChildren(QTableView) if t.isVisibleTo(widget)]
    old = widget.size()
    size = QSize(old)
    try:
        for _ in range(rounds):
            dw = max((t.horizontalHeader().length() - t.viewport().width() for t in tables), default=0)
            dh = max((t.verticalHeader().length() - t.viewport().height() for t in tables), default=0)
            if dw <= 0 and dh <= 0:
                break
            # a splitter or layout gives the table only part of what the view grows: grow again
            size = QSize(size.width() + (dw + 2 if dw > 0 else 0), size.height() + (dh + 2 if dh > 0 else 0))
            widget.resize(size)
    finally:
        widget.resize(old)
    return None if size == old else size


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


def _graphics_views(widgets):
    from PySide6.QtWidgets import QGraphicsView

    return [w for w in widgets if isinstance(w, QGraphicsView) and w.scene() is not None]


def _plain_labels(widget) -> list:
    """pyqtgraph's plain-text labels (plot titles, legends) inside ``widget``."""
    import pyqtgraph as pg
    from PySide6.QtWidgets import QWidget

    out = []
    for view in _graphics_views([widget, *widget.findChildren(QWidget)]):
        for item in view.scene().items():
            text = getattr(item, "text", None) if isinstance(item, pg.LabelItem) else None
            if isinstance(text, str) and text and "<" not in text:
                out.append(item)
    return out


def _elide_titles(widget, width: int) -> list:
    """Shorten (…) the widest plain-text pyqtgraph labels (a plot title, a legend line) until the scene
    fits ``width`` pixels, so a small export keeps the whole plot; returns ``[(label, text)]`` to put back."""
    labels = _plain_labels(widget)
    saved: dict = {}
    for _ in range(8):
        _settle(widget)
        over = _overflow(widget)[0]
        if over <= 0:
            break
        shrinkable = [lab for lab in labels if len(lab.text.rstrip("…")) > 1]
        if not shrinkable:
            break
        lab = max(shrinkable, key=lambda item: item.item.boundingRect().width())
        full = saved.setdefault(lab, lab.text)
        goal = lab.item.boundingRect().width() - over - 2
        keep = len(lab.text.rstrip("…"))
        while keep > 1 and lab.item.boundingRect().width() > goal:
            keep = max(1, min(keep - 1, int(keep * goal / max(1.0, lab.item.boundingRect().width()))))
            lab.setText(full[:keep].rstrip() + "…")
    return list(saved.items())


def _settle(widget) -> None:
    """Lay ``widget`` and its children out at its current size now, also when it was never shown.

    A hidden widget's resize only records the size; layouts and pyqtgraph's scenes follow when the
    posted layout requests and resize events are delivered: here, before painting, so a render at a
    new size is that size's layout (not the old one cropped)."""
    from PySide6.QtCore import QEvent
    from PySide6.QtGui import QResizeEvent
    from PySide6.QtWidgets import QGraphicsWidget, QWidget

    for _ in range(3):  # nested layouts settle in a few rounds; only this widget's tree (its parent's
        tree = [widget, *widget.findChildren(QWidget)]  # layout would put the old size back)
        for w in tree:
            QApplication.sendPostedEvents(w, QEvent.LayoutRequest)
            lay = w.layout()
            if lay is not None:
                lay.activate()
        for w in tree:
            if w.testAttribute(Qt.WA_PendingResizeEvent):
                w.setAttribute(Qt.WA_PendingResizeEvent, False)
                QApplication.sendEvent(w, QResizeEvent(w.size(), w.size()))
        for view in _graphics_views(tree):  # pyqtgraph: the scene's layouts (QGraphicsLayout) too
            # its resizeEvent fits the central item to the view again (clamped to the item's minimum
            # when it was set, which an elided title may have lowered since)
            vp, inner = view.viewport(), view.contentsRect()  # a hidden scroll area leaves its viewport
            if vp.geometry() != inner:  # at the old size (pyqtgraph's resizeEvent does not lay it out)
                vp.setGeometry(inner)
                if vp.testAttribute(Qt.WA_PendingResizeEvent):
                    vp.setAttribute(Qt.WA_PendingResizeEvent, False)
                    QApplication.sendEvent(vp, QResizeEvent(vp.size(), vp.size()))
            QApplication.sendEvent(view, QResizeEvent(view.size(), view.size()))
            ci = getattr(view, "centralWidget", None)
            if ci is not None and hasattr(
                ci, "setGeometry"
            ):  # pyqtgraph skips this when its range is unchanged
                ci.setGeometry(QRectF(0, 0, vp.width(), vp.height()))
            for item in view.scene().items():
                lay = QGraphicsWidget.layout(item) if isinstance(item, QGraphicsWidget) else None
                if lay is not None:  # (pyqtgraph items shadow .layout with an attribute)
                    lay.activate()
            for item in view.scene().items():  # pyqtgraph's view boxes: transforms for the new geometry
                if hasattr(item, "updateMatrix") and hasattr(item, "prepareForPaint"):
                    item.prepareForPaint()
                    item.updateMatrix()


def _settle_ancestors(widget) -> None:
    """Deliver the pending layout of every ancestor of ``widget`` (outermost first), polishing them."""
    from PySide6.QtCore import QEvent

    chain, w = [], widget.parentWidget()
    while w is not None:
        chain.append(w)
        w = w.parentWidget()
    for w in reversed(chain):
        w.ensurePolished()
        QApplication.sendPostedEvents(w, QEvent.LayoutRequest)
        if w.layout() is not None:
            w.layout().activate()
    widget.ensurePolished()


def _overflow(widget) -> tuple[int, int]:
    """Pixels by which a scene inside ``widget`` needs more than its view shows (pyqtgraph's title,
    axes, colour bar would be cut at the view's edge), ``(width, height)``, ≤ 0 when it fits."""
    from PySide6.QtWidgets import QWidget

    grow_w = grow_h = -(10**9)
    for view in _graphics_views([widget, *widget.findChildren(QWidget)]):
        ci = getattr(view, "centralWidget", None)
        if ci is None or not hasattr(ci, "effectiveSizeHint"):
            continue
        need = ci.effectiveSizeHint(Qt.MinimumSize)
        vp = view.viewport().size()
        grow_w = max(grow_w, math.ceil(need.width() - vp.width()))
        grow_h = max(grow_h, math.ceil(need.height() - vp.height()))
    return grow_w, grow_h


def _apply_layout(widget) -> None:
    """:func:`_settle`, then grow ``widget`` to what it needs to show whole (its minimum size hint, a
    scene's minimum), so the caller sees the size it really needs."""
    _settle(widget)
    hint = widget.minimumSizeHint()
    if hint.isValid() and (hint.width() > widget.width() or hint.height() > widget.height()):
        widget.resize(max(hint.width(), widget.width()), max(hint.height(), widget.height()))
        _settle(widget)
    grow_w, grow_h = _overflow(widget)
    if grow_w > 0 or grow_h > 0:
        widget.resize(widget.width() + max(0, grow_w), widget.height() + max(0, grow_h))
        _settle(widget)


def render_widget(
    widget,
    path: str | os.PathLike,
    size: tuple[int, int] | None = None,
    dpi: float = SCREEN_DPI,
    metadata: dict | None = None,
    title: str = "",
) -> Path:
    """Render ``widget`` (see :func:`export_target`) as shown to PNG, SVG or PDF (by suffix).

    ``size``: layout size in logical pixels (the widget is laid out at that size for the render and
    put back, also a view never shown); default its current size (a table: every row and column).
    A long plot title is elided (…) to fit ``size``; a size below what the view still needs to show
    whole (its minimum size) is refused, never cropped. ``dpi``: PNG pixels =
    ``size × dpi / 96`` (text and lines re-rendered sharp, not upscaled); for SVG/PDF the physical size
    is ``size / 96`` inches at any ``dpi`` (vectors), raster parts embedded at their own resolution.

    Raises:
        ValueError: unknown suffix; ``size`` smaller than the view's minimum (the message names it).
        FileNotFoundError: missing folder. OSError: could not write.
    """
    from PySide6.QtWidgets import QAbstractScrollArea, QWidget

    target = export_target(widget)
    # a view inside a resizable scroll area (a tab page) is held at the page's size: let go for the render
    holder = _resizing_scroll_area(target)
    if holder is not None:
        holder.setWidgetResizable(False)
    _settle_ancestors(target)  # a pending layout of a parent would resize the target mid-render
    old = target.size()
    want = QSize(*size) if size is not None else (_full_size(target) or _size_showing_tables(target))
    # tables inside the view: no scroll bars in the picture (at the default size they show everything)
    from PySide6.QtWidgets import QTableView

    inner = [t for t in target.findChildren(QTableView) if t is not target]
    inner_policies = [(t.horizontalScrollBarPolicy(), t.verticalScrollBarPolicy()) for t in inner]
    if size is None:
        for t in inner:
            t.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
            t.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
    policies = None
    if want is not None and want != old:
        if isinstance(target, QAbstractScrollArea):
            policies = (target.horizontalScrollBarPolicy(), target.verticalScrollBarPolicy())
            target.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
            target.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        target.resize(want)
    lossless, elided = [], []
    try:
        fmt = _fmt(Path(path))
        if size is not None:
            elided = _elide_titles(target, want.width())
        _apply_layout(target)
        cur = target.size()
        if size is not None and (cur.width() > want.width() or cur.height() > want.height()):
            raise ValueError(
                f"{want.width()} × {want.height()} px is too small for this view: it needs at least "
                f"{cur.width()} × {cur.height()} px to show whole"
            )
        scale = dpi / SCREEN_DPI if fmt == "png" else 1.0
        if fmt == "pdf":  # views paint with their own painters: make theirs lossless too
            from PySide6.QtWidgets import QGraphicsView

            for v in [target, *target.findChildren(QGraphicsView)]:
                if isinstance(v, QGraphicsView) and not v.renderHints() & QPainter.LosslessImageRendering:
                    v.setRenderHint(QPainter.LosslessImageRendering, True)
                    lossless.append(v)

        def paint(p: QPainter) -> None:
            # QWidget's render, also for a QGraphicsView (whose own render() has another signature)
            QWidget.render(
                target,
                p,
                QPoint(0, 0),
                QRect(0, 0, cur.width(), cur.height()),
                QWidget.RenderFlag.DrawWindowBackground | QWidget.RenderFlag.DrawChildren,
            )

        return paint_to_file(
            path,
            (cur.width(), cur.height()),
            paint,
            dpi=dpi if fmt == "png" else SCREEN_DPI,
            title=title,
            metadata=metadata,
            scale=scale,
        )
    finally:
        for v in lossless:
            v.setRenderHint(QPainter.LosslessImageRendering, False)
        for label, text in elided:
            label.setText(text)
        if target.size() != old or elided:  # resized for the render, or grown to its minimum
            target.resize(old)
            _settle(target)
        if policies is not None:
            target.setHorizontalScrollBarPolicy(policies[0])
            target.setVerticalScrollBarPolicy(policies[1])
        for t, (hp, vp) in zip(inner, inner_policies, strict=True):
            t.setHorizontalScrollBarPolicy(hp)
            t.setVerticalScrollBarPolicy(vp)
        if holder is not None:
            holder.setWidgetResizable(True)


# -- heatmap figure ----------------------------------------------------------------------------------------
def _ticks(vmin: float, vmax: float, scale: str) -> list[float]:
    if scale == "log":
        lo = max(vmin, 1e-6)
        return [
            10.0**k for k in range(math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(vmax) + 1e-9) + 1)
        ]
    return [vmin + (vmax - vmin) * f for f in (0, 0.25, 0.5, 0.75, 1.0)]


def _tick_text(v: float, scale: str) -> str:
    if scale == "log":
        return f"1e{round(math.log10(v))}" if v < 0.01 else f"{v:g}"
    return f"{v:.2f}"


def figure_layout(
    n_rows: int, n_cols: int, size: tuple[int, int], dpi: float, label_w: float, label_h: float
) -> tuple[QRectF, float]:
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


def paint_heatmap(
    p: QPainter,
    size: tuple[int, int],
    weights: np.ndarray,
    q_labels: list[str],
    k_labels: list[str],
    *,
    title: str = "",
    cmap: str = "viridis",
    scale: str = "linear",
    vmin: float = 0.0,
    vmax: float = 1.0,
    dpi: float = FIGURE_DPI,
    colorbar_label: str = "attention weight",
    q_axis: str = "query position",
    k_axis: str = "key position",
    gamma: float = 0.5,
    masked: np.ndarray | None = None,
) -> QRectF:
    """Paint a labelled map (rows = queries top to bottom, columns = keys) into ``size``; returns the map's rect.

    Cell colours are :func:`attnscope.core.io.colormaps.to_rgb` of the values: exactly the colours of the plain PNG.
    ``masked`` (bool, the map's shape): cells the mask hid, drawn as a grey hatch outside the colour
    map (light grey in a raster map) instead of the colour of weight 0, as the window's heatmap does.
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
    p.drawText(
        QRectF(8 * f, 6 * f, size[0] - 16 * f, tfm.height() + 2),
        Qt.AlignHCenter | Qt.AlignTop,
        tfm.elidedText(title, Qt.ElideRight, size[0] - 16 * f),
    )

    # cells
    rgb = to_rgb(w, cmap, vmin, vmax, scale, gamma)
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
                p.fillRect(
                    QRectF(rect.left() + a * cell, y, (b - a) * cell + dx, cell + dy), QColor(r, g, bl)
                )
        if masked is not None and masked.shape == w.shape and masked.any():
            hatch = QBrush(QColor(150, 150, 150), Qt.BDiagPattern)
            for i in np.flatnonzero(masked.any(axis=1)):
                m = np.concatenate(([False], masked[i], [False]))
                edges = np.flatnonzero(m[1:] != m[:-1])
                for a, b in zip(edges[::2], edges[1::2], strict=True):
                    r_ = QRectF(rect.left() + a * cell, rect.top() + i * cell, (b - a) * cell, cell)
                    p.fillRect(r_, QColor(255, 255, 255))
                    p.fillRect(r_, hatch)
    else:
        img_rgb = rgb
        mk = masked if masked is not None and masked.shape == w.shape else None
        if cell < 1:  # more cells than pixels: keep the strongest weight of each block visible
            pooled = max_pool(w, max(1, int(rect.height())), max(1, int(rect.width())))
            img_rgb = to_rgb(pooled, cmap, vmin, vmax, scale, gamma)
            if mk is not None:  # a block is masked when all its cells are
                mk = max_pool((~mk).astype(np.float32), pooled.shape[0], pooled.shape[1]) == 0
        if mk is not None and mk.any():
            img_rgb = np.array(img_rgb, copy=True)
            img_rgb[mk] = (225, 225, 225)
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
        p.drawText(
            QRectF(rect.left() - tick - label_w - 2 * f, y - label_h / 2, label_w + f, label_h),
            Qt.AlignRight | Qt.AlignVCenter,
            q_short[i],
        )
    for j in range(0, n_cols, stride):
        x = rect.left() + (j + 0.5) * cell
        p.drawLine(QPointF(x, rect.bottom()), QPointF(x, rect.bottom() + tick))
        p.save()
        p.translate(x, rect.bottom() + tick + 2 * f)
        p.rotate(-90)
        p.drawText(
            QRectF(-label_w, -label_h / 2, label_w, label_h), Qt.AlignRight | Qt.AlignVCenter, k_short[j]
        )
        p.restore()
    # axis titles
    p.drawText(
        QRectF(rect.left(), rect.bottom() + tick + 2 * f + label_w + 4 * f, rect.width(), label_h),
        Qt.AlignHCenter | Qt.AlignTop,
        k_axis,
    )
    p.save()
    p.translate(rect.left() - tick - label_w - 6 * f - label_h, rect.center().y())
    p.rotate(-90)
    p.drawText(QRectF(-rect.height() / 2, 0, rect.height(), label_h), Qt.AlignHCenter | Qt.AlignTop, q_axis)
    p.restore()

    # colour bar (top = vmax): the 256 colours of the map as a 1 × 256 image stretched over the bar (one
    # small element in SVG/PDF; 256 rectangles would be 100 kB of SVG, a Qt gradient 45 kB of PDF);
    # ticks are placed through the same normalisation as the cells
    from attnscope.core.io.colormaps import lut

    bar = QRectF(rect.right() + 10 * f, rect.top(), 12 * f, max(rect.height(), 60 * f))
    strip = np.ascontiguousarray(lut(cmap)[::-1].reshape(-1, 1, 3))
    p.drawImage(bar, QImage(strip.data, 1, strip.shape[0], 3, QImage.Format_RGB888).copy())
    p.setPen(pen)
    p.drawRect(bar)
    p.setPen(QColor(20, 20, 20))
    for v in _ticks(vmin, vmax, scale):
        y = bar.bottom() - bar.height() * float(normalize(np.array([v]), vmin, vmax, scale, gamma)[0])
        p.drawLine(QPointF(bar.right(), y), QPointF(bar.right() + tick, y))
        p.drawText(
            QRectF(bar.right() + tick + f, y - label_h / 2, 4 * label_h, label_h),
            Qt.AlignLeft | Qt.AlignVCenter,
            _tick_text(v, scale),
        )
    p.save()
    p.translate(bar.right() + tick + 4 * label_h + 2 * f, bar.center().y())
    p.rotate(90)
    p.drawText(
        QRectF(-bar.height() / 2, -label_h, bar.height(), label_h),
        Qt.AlignHCenter | Qt.AlignBottom,
        colorbar_label,
    )
    p.restore()
    return rect


def figure_mask(shape, q_tokens, k_tokens, metadata: dict | None) -> np.ndarray | None:
    """Cells of a ``shape`` map the mask hid (bool), from the tokens' positions (a later key: causal)
    and the provenance's sliding window (``metadata["mask"]["sliding_window"]``; not for the mean of
    all layers, where a cell is masked only if every layer masks it). None without positions."""
    if q_tokens is None or k_tokens is None:
        return None
    q = np.array([t.position for t in q_tokens][: shape[0]], dtype=np.int64)[:, None]
    k = np.array([t.position for t in k_tokens][: shape[1]], dtype=np.int64)[None, :]
    if q.shape[0] != shape[0] or k.shape[1] != shape[1]:
        return None
    out = k > q
    mask = (metadata or {}).get("mask")
    window = mask.get("sliding_window") if isinstance(mask, dict) else None
    if window and (metadata or {}).get("aggregate") != "all":
        out |= k <= q - int(window)
    return out


def save_heatmap_figure(
    weights: np.ndarray,
    path: str | os.PathLike,
    *,
    tokens=None,
    q_tokens=None,
    k_tokens=None,
    title: str = "",
    cmap: str = "viridis",
    scale: str = "linear",
    size: tuple[int, int] | None = None,
    dpi: float | None = None,
    metadata: dict | None = None,
    vmin: float = 0.0,
    vmax: float = 1.0,
    gamma: float = 0.5,
) -> Path:
    """Write the labelled figure of ``weights`` ``(n_query, n_key)`` to PNG/SVG/PDF (by suffix).

    ``tokens`` (attnscope.core.tokens.Token) label both axes (or ``q_tokens``/``k_tokens``; default: positions).
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
    # the colour bar's label names the masked cells' grey (hatched in vector maps, light in raster ones)
    bar = "attention weight · grey: masked" if masked is not None and masked.any() else "attention weight"
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
            cmap=cmap,
            scale=scale,
            vmin=vmin,
            vmax=vmax,
            dpi=dpi,
            gamma=gamma,
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


def _frame_palette(cmap: str):
    """A PIL palette image: 240 steps of ``cmap`` and 16 greys (text, frame, background)."""
    from attnscope.core.io.colormaps import lut
    from PIL import Image

    table = lut(cmap)
    pal = np.concatenate(
        [
            table[np.round(np.linspace(0, 255, 240)).astype(int)],
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
    cmap: str = "viridis",
    scale: str = "linear",
    gamma: float = 0.5,
    vmin: float = 0.0,
    vmax: float = 1.0,
    size: tuple[int, int] = FRAME_SIZE,
    dpi: float = FRAME_DPI,
):
    """One animation frame: the labelled figure (:func:`paint_heatmap`: token axes, colour bar, ``title``
    as caption) of the ``(T, T)`` map ``weights`` with positions ``n .. T-1`` blank (not generated
    yet), so every frame has the same layout. Returns a PIL palette image (240 colour-map steps +
    16 greys; the cells are the map's colours to within one step of 256). Any thread (QImage)."""
    from PIL import Image

    ensure_gui()
    w = np.asarray(weights, dtype=np.float32)
    T = w.shape[0]
    labels = (
        [(t.text if i < n else "") for i, t in enumerate(list(tokens)[:T])]
        if tokens is not None
        else [(str(i) if i < n else "") for i in range(T)]
    )
    img = QImage(int(size[0]), int(size[1]), QImage.Format_RGB32)
    img.fill(Qt.white)
    p = QPainter(img)
    try:
        rect = paint_heatmap(
            p,
            size,
            w,
            labels,
            labels,
            title=title,
            cmap=cmap,
            scale=scale,
            vmin=vmin,
            vmax=vmax,
            dpi=dpi,
            gamma=gamma,
        )
        if n < T:
            cell = rect.width() / T
            p.fillRect(QRectF(rect.left(), rect.top() + n * cell, rect.width(), (T - n) * cell + 1), Qt.white)
            p.fillRect(QRectF(rect.left() + n * cell, rect.top(), (T - n) * cell + 1, n * cell), Qt.white)
            pen = QPen(QColor(60, 60, 60))
            pen.setWidthF(0.6 * dpi / 72.0)
            p.setPen(pen)
            p.drawRect(rect)
    finally:
        p.end()
    bits = img.constBits()
    arr = np.frombuffer(bits, dtype=np.uint8, count=img.bytesPerLine() * img.height())
    arr = arr.reshape(img.height(), img.bytesPerLine())[:, : img.width() * 4].reshape(
        img.height(), img.width(), 4
    )
    rgb = Image.fromarray(np.ascontiguousarray(arr[..., 2::-1]), mode="RGB")  # BGRA → RGB
    return rgb.quantize(palette=_frame_palette(cmap), dither=Image.Dither.NONE)


# -- the window's export and session commands ---------------------------------------------------------------
SESSION_FILTER = "AttnScope session (*.attnscope)"
IMAGE_FILTERS = "PNG image (*.png);;SVG vector image (*.svg);;PDF document (*.pdf)"
DATA_FILTERS = "NumPy array (*.npy);;CSV table (*.csv);;safetensors (*.safetensors)"


def _suffix_from_filter(path: str, chosen_filter: str) -> str:
    """Add the chosen filter's suffix when the typed name has none."""
    if Path(path).suffix or "*." not in chosen_filter:
        return path
    return path + chosen_filter.split("*", 1)[1].split(")")[0]


class ExportController:
    """File → Save/Open session and the Export menu of a :class:`attnscope.app.main_window.MainWindow`.

    GUI thread: dialogs, rendering widgets. Engine thread (jobs): weights, hashes, files.
    """

    def __init__(self, window):
        self.win = window
        self.last_written: list[Path] = []
        self.last_warnings: list[str] = []
        self.batch_dialog: BatchExportDialog | None = None

    # -- view state --------------------------------------------------------------------------------------
    def current_view_key(self) -> str:
        w = self.win.tabs.currentWidget()
        return next((k for k, v in self.win.views.items() if v is w), "heatmap")

    def view_state(self) -> dict:
        """What is on screen: layer, head, tab, colour map, heatmap options, query row, timeline step,
        plus each view's own ``view_state()`` (an optional hook) under ``"views"``."""
        win = self.win
        state = {
            "layer": win.layer,
            "head": win.head,
            "tab": self.current_view_key(),
            "cmap": win.cmap_combo.currentText(),
            "query_row": win.query_row,
        }
        hm = win.heatmap
        for key in ("aggregate", "weighting", "scale", "gamma", "range_mode"):
            if hasattr(hm, key):
                state[key] = getattr(hm, key)
        tl = getattr(win, "timeline", None)
        if tl is not None:
            state["timeline_step"] = None if tl.at_latest else tl.step
        views = {k: v.view_state() for k, v in win.views.items() if hasattr(v, "view_state")}
        if views:
            state["views"] = views
        return state

    def restore_view(self, state: dict) -> None:
        """Apply a :meth:`view_state` dict; unknown or out-of-range entries are skipped."""
        win = self.win
        hm = win.heatmap
        if state.get("cmap"):
            win.cmap_combo.setCurrentText(str(state["cmap"]))
        if hasattr(hm, "set_scale") and state.get("scale"):
            hm.set_scale(state["scale"], state.get("gamma"))
        if hasattr(hm, "set_aggregate") and state.get("aggregate"):
            try:
                hm.set_aggregate(state["aggregate"])
            except ValueError:
                pass
        if hasattr(hm, "set_range_mode") and state.get("range_mode"):
            try:
                hm.set_range_mode(state["range_mode"])
            except ValueError:
                pass
        tl = getattr(win, "timeline", None)
        if tl is not None and state.get("timeline_step") is not None:
            try:
                tl.set_step(int(state["timeline_step"]))
            except (IndexError, ValueError):
                pass
        try:
            win.select(int(state.get("layer", win.layer)), int(state.get("head", win.head)))
        except (IndexError, ValueError):
            pass
        for key, vs in (state.get("views") or {}).items():
            view = win.views.get(key)
            if view is not None and hasattr(view, "restore_view_state"):
                view.restore_view_state(vs)
        if state.get("tab") in win.views:
            win.show_view(state["tab"])
        row = state.get("query_row")
        if isinstance(row, int) and win.snapshot is not None and 0 <= row < win.snapshot.seq_len:
            win.query_row = row
            win._show_token_strip()

    def _visible_n(self) -> int | None:
        tl = getattr(self.win, "timeline", None)
        return None if tl is None or tl.at_latest else self.win.visible_len

    def _need_run(self) -> bool:
        if self.win.snapshot is None or self.win.snapshot.seq_len == 0:
            self.win.show_error("Nothing to export yet: run a prompt first.")
            return False
        return True

    def _done(self, paths) -> None:
        self.last_written = [Path(p) for p in paths]
        if self.last_written:
            self.win.statusBar().showMessage(f"Saved {self.last_written[0]}", 6000)

    # -- sessions ------------------------------------------------------------------------------------------
    def save_session(self, path) -> int | None:
        """Save model reference, prompt, sampling, tokens and view to ``path`` (engine job; returns its id)."""
        if not self._need_run():
            return None
        view = self.view_state()

        def job(ctx):
            from attnscope.core.io import sessionfile

            s = _session(ctx)
            return [sessionfile.save(sessionfile.SessionFile.from_session(s, view=view), path)]

        return self.win.engine.enqueue(job, self._done, self.win.show_error, label="save session")

    def open_session(self, path) -> int | None:
        """Open a saved session: load its model if needed, prefill, replay its tokens, restore the view."""
        from attnscope.core.io import sessionfile

        try:
            sf = sessionfile.load(path)
        except (OSError, ValueError, sessionfile.SessionFileError) as e:
            self.win.show_error(f"Could not open the session: {e}")
            return None

        def job(ctx):
            from attnscope.core.errors import Cancelled

            old = ctx.session
            reused = old is not None and sessionfile.same_model(old, sf)

            def progress(message, fraction):
                if ctx.cancelled():
                    raise Cancelled("opening the session cancelled")
                ctx.progress(message, fraction)

            try:
                s, warnings = sessionfile.replay(
                    sf, session=old, device=self.win.device, progress=progress, cancelled=ctx.cancelled
                )
            except Exception:
                if reused and old.seq_len:  # replayed part-way into the running session: never half a replay
                    old.clear()
                raise
            ctx.session = s
            return s.snapshot(), warnings, s is not old

        def done(result):
            snap, warnings, reloaded = result
            win = self.win
            if reloaded:
                win._on_loaded(snap)
            win.prompt_edit.setPlainText(sf.prompt)
            win.chat_check.setChecked(sf.chat_template)
            win.decode_panel.set_sampling(sf.sampling)  # what the replayed session samples with
            win._on_ran(snap)
            self.restore_view(sf.view)
            self.last_warnings = list(warnings)
            msg = f"Opened {Path(path).name}: {snap.n_prompt} prompt + {snap.n_generated} replayed tokens"
            win.statusBar().showMessage(msg + (" · " + " · ".join(warnings) if warnings else ""), 15000)
            if warnings:
                win.show_error("; ".join(warnings))

        def failed(message):
            from attnscope.app.engine import CancelledMessage

            # the engine keeps the previous run, or (a replay into the same model stopped part-way) an
            # empty session: the window shows whichever it is
            if isinstance(message, CancelledMessage):
                message = CancelledMessage(f"Opening {Path(path).name} cancelled ({message})")
            else:
                message = f"Could not open the session: {message}"
            self.win._on_command_failed(message)

        return self.win.engine.enqueue(job, done, failed, label="open session")

    def save_session_dialog(self) -> None:
        if not self._need_run():
            return
        from PySide6.QtWidgets import QFileDialog

        path, _ = QFileDialog.getSaveFileName(self.win, "Save session", "session.attnscope", SESSION_FILTER)
        if path:
            self.save_session(_suffix_from_filter(path, SESSION_FILTER))

    def open_session_dialog(self) -> None:
        from PySide6.QtWidgets import QFileDialog

        path, _ = QFileDialog.getOpenFileName(self.win, "Open session", str(Path.home()), SESSION_FILTER)
        if path:
            self.open_session(path)

    # -- exports -------------------------------------------------------------------------------------------
    def export_view(self, path, size: tuple[int, int] | None = None, dpi: float = SCREEN_DPI) -> list[Path]:
        """Render the current tab as shown to PNG/SVG/PDF; a sidecar ``<file>.json`` with the session's
        provenance follows from the engine thread. Returns ``[image]`` (the sidecar is added to
        :attr:`last_written` when written)."""
        key = self.current_view_key()
        widget = self.win.views[key]
        view = self.view_state()
        title = f"AttnScope · {self.win.tabs.tabText(self.win.tabs.currentIndex())}"
        out = render_widget(widget, path, size=size, dpi=dpi, title=title)
        self._done([out])
        if self.win.snapshot is not None and self.win.snapshot.seq_len:
            n = self._visible_n()

            def job(ctx):
                from attnscope.core.io import export as E

                s = _session(ctx)
                meta = E.session_metadata(s)
                if n is not None and n < s.seq_len:
                    meta = E.head_metadata(s, view["layer"], view["head"], n=n, base=meta)
                meta.update(
                    {
                        "kind": "view",
                        "view": key,
                        "view_state": view,
                        "image": out.name,
                        "dpi": dpi if out.suffix.lower() == ".png" else None,
                    }
                )
                E.embed_metadata(out, meta)  # PNG text chunk / SVG <desc>, as the CLI's images
                return [out, E.write_json(E.sidecar_path(out), meta)]

            self.win.engine.enqueue(job, self._done, self.win.show_error, label="export view")
        return [out]

    def export_data(self, path) -> int | None:
        """The current map (head or aggregate, at the timeline's step) as .npy/.csv/.safetensors + sidecar."""
        if not self._need_run():
            return None
        layer, head, n = self.win.layer, self.win.head, self._visible_n()
        mode = getattr(self.win.heatmap, "aggregate", "head") or "head"
        from attnscope.core.analysis.aggregate import LONG_PROMPT

        # the scale shown is the one written (and recorded): long overviews are shown as attention
        shown_n = n or self.win.snapshot.seq_len
        weighting = self.win.heatmap.weighting if shown_n <= LONG_PROMPT else "attention"

        def job(ctx):
            from attnscope.core.io import export as E

            return E.export_head(_session(ctx), layer, head, path, n=n, mode=mode, weighting=weighting)

        return self.win.engine.enqueue(job, self._done, self.win.show_error, label="export data")

    def export_view_dialog(self) -> None:
        key = self.current_view_key()
        dlg = ExportViewDialog(self.win, key, export_target(self.win.views[key]).size())
        if dlg.exec():
            try:
                self.export_view(dlg.path(), size=dlg.chosen_size(), dpi=dlg.chosen_dpi())
            except (OSError, ValueError) as e:
                self.win.show_error(f"Could not export: {e}")

    def export_data_dialog(self) -> None:
        if not self._need_run():
            return
        from attnscope.core.io.export_long import FULL_SIZE_LIMIT
        from PySide6.QtWidgets import QFileDialog

        n = self._visible_n() or self.win.snapshot.seq_len
        if n > FULL_SIZE_LIMIT:  # a full-size long map: say what it costs and ask first
            from attnscope.core.units import format_bytes
            from PySide6.QtWidgets import QMessageBox

            answer = QMessageBox.question(
                self.win,
                "Export a long map",
                f"This map is {n:,} × {n:,} cells: the file holds {format_bytes(n * n * 4)} of float32 weights "
                "(held once in memory while written; CSV is about three times larger). Export it anyway?",
            )
            if answer != QMessageBox.Yes:
                return
        name = f"attn_L{self.win.layer}_H{self.win.head}.npy"
        path, chosen = QFileDialog.getSaveFileName(self.win, "Export data", name, DATA_FILTERS)
        if path:
            self.export_data(_suffix_from_filter(path, chosen))

    def batch_export_dialog(self) -> None:
        if not self._need_run():
            return
        if self.batch_dialog is None:
            self.batch_dialog = BatchExportDialog(self.win)
        self.batch_dialog.refresh_scopes()
        self.batch_dialog.show()
        self.batch_dialog.raise_()


def _session(ctx):
    from attnscope.core.errors import SessionError

    if ctx.session is None:
        raise SessionError("no model loaded")
    return ctx.session


class ExportViewDialog(QDialog):
    """File, layout size and DPI for "Export view as PNG/SVG/PDF"."""

    def __init__(self, parent, view_key: str, current: QSize):
        super().__init__(parent)
        self.setWindowTitle("Export view")
        form = QFormLayout(self)
        self.path_edit = QLineEdit(str(Path.home() / f"attnscope_{view_key}.png"))
        self.path_edit.setMinimumWidth(self.path_edit.fontMetrics().horizontalAdvance("x" * 48))
        browse = QPushButton("Browse…")
        row = QHBoxLayout()
        row.addWidget(self.path_edit, 1)
        row.addWidget(browse)
        form.addRow("File (.png, .svg, .pdf)", row)
        self.w_spin, self.h_spin = QSpinBox(), QSpinBox()
        for spin, v in ((self.w_spin, current.width()), (self.h_spin, current.height())):
            spin.setRange(100, 10000)
            spin.setValue(max(100, v))
            spin.setSuffix(" px")
        size_row = QHBoxLayout()
        size_row.addWidget(self.w_spin)
        size_row.addWidget(QLabel("×"))
        size_row.addWidget(self.h_spin)
        form.addRow("Layout size", size_row)
        self.dpi_spin = QDoubleSpinBox()
        self.dpi_spin.setRange(48, 1200)
        self.dpi_spin.setValue(192)
        self.dpi_spin.setToolTip(
            "PNG: pixels = layout size × DPI / 96. SVG and PDF are vectors (size / 96 inches)."
        )
        form.addRow("DPI (PNG)", self.dpi_spin)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        form.addRow(buttons)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        browse.clicked.connect(self._pick)

    def _pick(self) -> None:
        p, chosen = QFileDialog.getSaveFileName(self, "Export view", self.path_edit.text(), IMAGE_FILTERS)
        if p:
            self.path_edit.setText(_suffix_from_filter(p, chosen))

    def path(self) -> str:
        return self.path_edit.text()

    def chosen_size(self) -> tuple[int, int]:
        return self.w_spin.value(), self.h_spin.value()

    def chosen_dpi(self) -> float:
        return self.dpi_spin.value()


class BatchExportDialog(QDialog):
    """Batch export: every head of the current layer, every layer × head, or every decode step of the
    current head as an animation. Runs as one engine job with progress and Cancel.

    Attributes after a run: ``written`` (paths), ``elapsed`` (seconds), ``message`` (the status line).
    """

    HEAD_FORMATS = (
        ("PNG map (one colour per cell)", "png", False),
        ("PNG figure (labels, colour bar)", "png", True),
        ("SVG figure", "svg", True),
        ("PDF figure", "pdf", True),
        ("NumPy .npy + JSON", "npy", False),
        ("CSV + JSON", "csv", False),
        ("safetensors + JSON", "safetensors", False),
    )

    def __init__(self, window):
        super().__init__(window)
        self.win = window
        self.setWindowTitle("Batch export")
        self.setMinimumWidth(520)
        form = QFormLayout(self)
        self.scope_combo = QComboBox()
        form.addRow("Export", self.scope_combo)
        self.format_combo = QComboBox()
        form.addRow("Format", self.format_combo)
        self.path_edit = QLineEdit(str(Path.home() / "attnscope_export"))
        self.path_edit.setMinimumWidth(self.path_edit.fontMetrics().horizontalAdvance("x" * 48))
        browse = QPushButton("Browse…")
        row = QHBoxLayout()
        row.addWidget(self.path_edit, 1)
        row.addWidget(browse)
        self.path_label = QLabel("Folder")
        form.addRow(self.path_label, row)
        self.dpi_spin = QDoubleSpinBox()
        self.dpi_spin.setRange(48, 1200)
        self.dpi_spin.setValue(FIGURE_DPI)
        self.dpi_spin.setToolTip("Figures: font size and physical size; PNG maps: recorded in the file")
        form.addRow("DPI", self.dpi_spin)
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setValue(0)
        form.addRow(self.progress_bar)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        form.addRow(self.status)
        buttons = QHBoxLayout()
        self.start_button = QPushButton("Export")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.close_button = QPushButton("Close")
        buttons.addStretch(1)
        for b in (self.start_button, self.cancel_button, self.close_button):
            buttons.addWidget(b)
        form.addRow(buttons)
        self.written: list[Path] = []
        self.elapsed = 0.0
        self.message = ""
        self.running = False
        self._t0 = 0.0
        self.scope_combo.currentIndexChanged.connect(self._on_scope)
        self.format_combo.currentIndexChanged.connect(self._on_format)
        browse.clicked.connect(self._pick)
        self.start_button.clicked.connect(self.start)
        self.cancel_button.clicked.connect(self.cancel)
        self.close_button.clicked.connect(self.close)
        window.engine.progress.connect(self._on_progress)
        self.refresh_scopes()

    def refresh_scopes(self) -> None:
        """Scope texts name the current layer/head and the file counts of the loaded model."""
        snap = self.win.snapshot
        L, H = (snap.info.n_layers, snap.info.n_heads) if snap is not None else (0, 0)
        steps = snap.n_generated if snap is not None else 0
        i = max(0, self.scope_combo.currentIndex())
        self.scope_combo.blockSignals(True)
        self.scope_combo.clear()
        self.scope_combo.addItem(f"Every head of layer {self.win.layer} ({H} files)", "layer")
        self.scope_combo.addItem(f"Every layer × head ({L} × {H} = {L * H} files)", "all")
        self.scope_combo.addItem(
            f"Every decode step of layer {self.win.layer} · head {self.win.head} ({steps + 1} frames)",
            "steps",
        )
        self.scope_combo.setCurrentIndex(i)
        self.scope_combo.blockSignals(False)
        self._on_scope()

    @property
    def scope(self) -> str:
        return self.scope_combo.currentData()

    def _on_scope(self, *_):
        self.format_combo.clear()
        if self.scope == "steps":
            from attnscope.core.io.export import mp4_unavailable

            self.format_combo.addItem("Animated GIF", ("gif", False))
            self.format_combo.addItem("MP4 video (H.264)", ("mp4", False))
            self.mp4_unavailable = mp4_unavailable()
            if self.mp4_unavailable:  # listed, greyed out, saying why (never silently missing)
                item = self.format_combo.model().item(1)
                item.setEnabled(False)
                item.setText("MP4 video (unavailable: see tooltip)")
                self.format_combo.setItemData(1, self.mp4_unavailable, Qt.ToolTipRole)
            self.path_label.setText("File")
            p = Path(self.path_edit.text())
            if p.suffix.lower() not in (".gif", ".mp4"):
                self.path_edit.setText(str(p.with_suffix("")) + f"_L{self.win.layer}_H{self.win.head}.gif")
            self._on_format()
        else:
            for text, fmt, figure in self.HEAD_FORMATS:
                self.format_combo.addItem(text, (fmt, figure))
            self.path_label.setText("Folder")
            p = Path(self.path_edit.text())
            if p.suffix:
                self.path_edit.setText(str(p.with_suffix("")))

    def _on_format(self, *_) -> None:
        """An animation's file name follows the chosen format (``.gif`` ↔ ``.mp4``)."""
        data = self.format_combo.currentData()
        if self.scope != "steps" or not data:
            return
        p = Path(self.path_edit.text())
        if p.suffix.lower() in (".gif", ".mp4") and p.suffix.lower() != "." + data[0]:
            self.path_edit.setText(str(p.with_suffix("." + data[0])))

    def set_format(self, fmt: str, figure: bool = False) -> None:
        """Choose a format by code (``"svg"``, ``"npy"``, ``"gif"``...). Raises ValueError if not offered
        (MP4 where it is unavailable: the message says why)."""
        for i in range(self.format_combo.count()):
            if self.format_combo.itemData(i) == (fmt, figure):
                item = self.format_combo.model().item(i)
                if item is not None and not item.isEnabled():
                    raise ValueError(self.format_combo.itemData(i, Qt.ToolTipRole) or f"{fmt} is unavailable")
                self.format_combo.setCurrentIndex(i)
                return
        raise ValueError(f"format {fmt!r} not offered for this scope")

    def set_scope(self, scope: str) -> None:
        self.scope_combo.setCurrentIndex(["layer", "all", "steps"].index(scope))

    def _pick(self) -> None:
        if self.scope == "steps":
            p, _ = QFileDialog.getSaveFileName(
                self, "Animation file", self.path_edit.text(), "GIF (*.gif);;MP4 (*.mp4)"
            )
        else:
            p = QFileDialog.getExistingDirectory(
                self, "Export into folder", str(Path(self.path_edit.text()).parent)
            )
        if p:
            self.path_edit.setText(p)

    def start(self) -> int | None:
        """Queue the export job. Returns its id, or None when the request is not possible."""
        if self.running:
            return None
        if self.win.snapshot is None or self.win.snapshot.seq_len == 0:
            self._finish("Nothing to export yet: run a prompt first.")
            return None
        fmt, figure = self.format_combo.currentData()
        scope, out = self.scope, Path(self.path_edit.text()).expanduser()
        if scope == "steps" and out.suffix.lower() != "." + fmt:  # the Format decides what is written
            out = out.with_suffix("." + fmt)
            self.path_edit.setText(str(out))
        layer, head = self.win.layer, self.win.head
        cmap = self.win.cmap_combo.currentText()
        hm = self.win.heatmap
        scale = getattr(hm, "scale", "linear") or "linear"
        gamma = float(getattr(hm, "gamma", 0.5) or 0.5)
        range_mode = getattr(hm, "range_mode", "fixed") or "fixed"  # as on screen
        dpi = self.dpi_spin.value()

        def job(ctx):
            from attnscope.core.io import export as E

            s = _session(ctx)

            def progress(done, total, name):
                ctx.progress(f"Batch export {done}/{total}: {name}", done / total)

            if scope == "steps":
                ctx.progress("Rendering frames…", -1.0)
                return E.export_animation(
                    s,
                    layer,
                    head,
                    out,
                    cmap=cmap,
                    scale=scale,
                    gamma=gamma,
                    range_mode=range_mode,
                    cancelled=ctx.cancelled,
                    frame_renderer=figure_frame,
                )
            pairs = E.heads_in_scope(s.info.n_layers, s.info.n_heads, layer if scope == "layer" else None)
            renderer = save_heatmap_figure if figure or fmt in ("svg", "pdf") else None
            return E.export_batch(
                s,
                out,
                fmt,
                pairs,
                cmap=cmap,
                scale=scale,
                dpi=dpi,
                figure=figure,
                renderer=renderer,
                progress=progress,
                cancelled=ctx.cancelled,
                gamma=gamma,
                range_mode=range_mode,
            )

        self.running = True
        self.written = []
        self.start_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress_bar.setValue(0)
        self.status.setText(f"Exporting to {out}…")
        self._t0 = time.monotonic()
        return self.win.engine.enqueue(job, self._on_done, self._on_error, label="batch export")

    def cancel(self) -> None:
        if self.running:
            self.win.engine.cancel()
            self.status.setText("Cancelling…")

    def _on_progress(self, message: str, fraction: float) -> None:
        if self.running:
            if fraction >= 0:
                self.progress_bar.setValue(int(fraction * 1000))
            self.status.setText(message)

    def _on_done(self, paths) -> None:
        self.written = [Path(p) for p in paths]
        self.progress_bar.setValue(1000)
        n_files = sum(1 for p in self.written if not p.name.endswith(".json"))
        where = self.written[0].parent if self.written else ""
        self._finish(f"Wrote {n_files} file(s) to {where} in {time.monotonic() - self._t0:.1f} s.")

    def _on_error(self, message: str) -> None:
        self._finish(f"Stopped: {message}")

    def _finish(self, message: str) -> None:
        self.running = False
        self.elapsed = time.monotonic() - self._t0 if self._t0 else 0.0
        self.message = message
        self.status.setText(message)
        self.start_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.win.statusBar().showMessage(message, 10000)
