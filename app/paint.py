"""Views to files through Qt's own paint devices: PNG (QImage), SVG (QSvgGenerator), PDF (QPdfWriter).

pyqtgraph 0.14's SVG exporter fails on current Qt, so nothing here goes through pyqtgraph's
exporters: a widget is rendered with ``QWidget.render(QPainter)`` onto the device. Works headless
(``QT_QPA_PLATFORM=offscreen``).

* :func:`paint_to_file`: open the device for a path (by suffix), let a callback paint, close.
* :func:`render_widget`: any view tab as shown (heatmap, head grid, sinks table, KV plot, mask
  view...), at a chosen layout size and DPI. A scroll area is rendered with its whole content, a
  table view with every row and column.

The labelled heatmap figure painted on these devices is :mod:`attnscope.app.figure`.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from attnscope.core import __version__
from attnscope.core.tokens import visible_text
from PySide6.QtCore import QMarginsF, QPoint, QRect, QRectF, QSize, QSizeF, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPageSize, QPainter, QPdfWriter
from PySide6.QtWidgets import QApplication

SCREEN_DPI = 96.0


_APPS: list[QApplication] = []  # the one made by ensure_gui()


def ensure_gui() -> None:
    """Make sure a Qt GUI application exists (headless: the offscreen platform when none is set)."""
    if QGuiApplication.instance() is None:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        # a QApplication (not just a QGuiApplication), so widgets can still be made in this process
        _APPS.append(QApplication(["attnscope"]))  # keep a reference for the process' life


def _fmt(path: Path) -> str:
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg", "pdf"):
        raise ValueError(f"unsupported image {path.name!r}: use .png, .svg or .pdf")
    if not path.parent.exists():
        raise FileNotFoundError(f"folder {path.parent} does not exist")
    return fmt


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
        img = QImage(max(1, round(w * scale)), max(1, round(h * scale)), QImage.Format.Format_RGB32)
        img.fill(Qt.GlobalColor.white)
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
        # PySide6 6.x stubs type format as bytes, but only a str is accepted at run time
        if not img.save(str(path), "PNG"):  # type: ignore[call-overload]
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
            p.fillRect(QRectF(0, 0, w, h), Qt.GlobalColor.white)
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
        QPageSize(
            QSizeF(w / dpi * 72.0, h / dpi * 72.0),
            QPageSize.Unit.Point,
            "",
            QPageSize.SizeMatchPolicy.ExactMatch,
        )
    )
    writer.setPageMargins(QMarginsF(0, 0, 0, 0))
    writer.setTitle(visible_text(title) or "AttnScope")
    writer.setCreator(f"AttnScope {__version__}")
    p = QPainter()
    if not p.begin(writer):
        raise OSError(f"could not write {path}")
    p.setRenderHint(
        QPainter.RenderHint.LosslessImageRendering, True
    )  # Flate, not JPEG: cells keep their exact colours
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
            QApplication.sendPostedEvents(w, QEvent.Type.LayoutRequest)
            lay = w.layout()
            if lay is not None:
                lay.activate()
        for w in tree:
            if w.testAttribute(Qt.WidgetAttribute.WA_PendingResizeEvent):
                w.setAttribute(Qt.WidgetAttribute.WA_PendingResizeEvent, False)
                QApplication.sendEvent(w, QResizeEvent(w.size(), w.size()))
        for view in _graphics_views(tree):  # pyqtgraph: the scene's layouts (QGraphicsLayout) too
            # its resizeEvent fits the central item to the view again (clamped to the item's minimum
            # when it was set, which an elided title may have lowered since)
            vp, inner = view.viewport(), view.contentsRect()  # a hidden scroll area leaves its viewport
            if vp.geometry() != inner:  # at the old size (pyqtgraph's resizeEvent does not lay it out)
                vp.setGeometry(inner)
                if vp.testAttribute(Qt.WidgetAttribute.WA_PendingResizeEvent):
                    vp.setAttribute(Qt.WidgetAttribute.WA_PendingResizeEvent, False)
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
        QApplication.sendPostedEvents(w, QEvent.Type.LayoutRequest)
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
        need = ci.effectiveSizeHint(Qt.SizeHint.MinimumSize)
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
    A window never shown is laid out off screen for the render, as it would be shown, and hidden again.
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
    # a window never shown (built from a script or a notebook) has never been laid out: its hidden
    # splitters, tab pages and layouts keep the sizes they had when built (a map offset in a 100 × 6
    # plot). Show it off screen for the render (Qt lays it out as shown) and hide it again after.
    top = target.window()
    unshown = not top.isVisible() and not top.testAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen)
    if unshown:
        top.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen, True)
        top.show()
        _settle(top)
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
            t.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
            t.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    policies = None
    if want is not None and want != old:
        if isinstance(target, QAbstractScrollArea):
            policies = (target.horizontalScrollBarPolicy(), target.verticalScrollBarPolicy())
            target.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
            target.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        target.resize(want)
    lossless, elided = [], []
    try:
        fmt = _fmt(Path(path))
        if size is not None:
            elided = _elide_titles(target, size[0])
        _apply_layout(target)
        cur = target.size()
        if size is not None and (cur.width() > size[0] or cur.height() > size[1]):
            raise ValueError(
                f"{size[0]} × {size[1]} px is too small for this view: it needs at least "
                f"{cur.width()} × {cur.height()} px to show whole"
            )
        scale = dpi / SCREEN_DPI if fmt == "png" else 1.0
        if fmt == "pdf":  # views paint with their own painters: make theirs lossless too
            from PySide6.QtWidgets import QGraphicsView

            for v in [target, *target.findChildren(QGraphicsView)]:
                if (
                    isinstance(v, QGraphicsView)
                    and not v.renderHints() & QPainter.RenderHint.LosslessImageRendering
                ):
                    v.setRenderHint(QPainter.RenderHint.LosslessImageRendering, True)
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
            v.setRenderHint(QPainter.RenderHint.LosslessImageRendering, False)
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
        if unshown:
            top.hide()
            top.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen, False)
