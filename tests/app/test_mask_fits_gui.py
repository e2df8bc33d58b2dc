"""The Mask tab in a small window: each of its four panels, their titles, axis labels and tick labels,
the colour bars and the decode step's "N of S keys allowed" note is shown whole, or whole after the
tab page is scrolled to it, never cut at the plot area's or the page's right edge. At 1000x650 with the
Why dock open and at 800x600 the panels need more width than the page has (628+ px after a decode step),
so the page scrolls sideways while the header keeps wrapping at the visible width; at 1400x900 all of
it is in view with no scroll bar (pytest-qt, offscreen, a tiny random llama)."""

from __future__ import annotations

import pytest
from gui_helpers import axis_tick_rects, ran_window
from PySide6.QtCore import QPoint, QPointF, QRectF
from PySide6.QtWidgets import QApplication, QGraphicsItem
from tiny_models import save_tiny

PROMPT = "The cat sat on the mat. The dog sat on the log."


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("llama_mask_fits")
    save_tiny("llama", out)
    return out


def _settle(win, rounds: int = 4) -> None:
    for _ in range(rounds):
        assert win.engine.wait_idle(60)
        for _ in range(4):
            QApplication.processEvents()
    assert win.last_error is None, win.last_error


def _text_rect(text_item) -> QRectF:
    """The scene rect of a QGraphicsTextItem's text (less its document margin)."""
    m = text_item.document().documentMargin()
    return text_item.mapRectToScene(text_item.boundingRect().adjusted(m, m, -m, -m))


def _note_item(v):
    """The text item of the decode note (a pyqtgraph LabelItem's, or a TextItem's)."""
    note = v.mask_note
    return note.textItem if hasattr(note, "textItem") else note.item


def _parts(v) -> list[tuple[str, QGraphicsItem, QRectF]]:
    """``(name, item, scene rect)`` of what the Mask tab draws: the panels, their titles, axis titles,
    tick labels, the colour bars with their titles and tick labels, and the decode note."""
    out = []
    for p in [*v.plots, v.ent_plot]:
        name = p.titleLabel.text.replace("<br>", " ")
        out.append((f"panel {name!r}", p, p.sceneBoundingRect()))
        out.append((f"title {name!r}", p.titleLabel.item, _text_rect(p.titleLabel.item)))
        for side in ("left", "bottom"):
            axis = p.getAxis(side)
            if axis.label.isVisible() and axis.label.toPlainText().strip():
                out.append((f"{side} axis title of {name!r}", axis.label, _text_rect(axis.label)))
            for text, r in axis_tick_rects(axis):
                out.append((f"{side} tick {text!r} of {name!r}", axis, axis.mapRectToScene(r)))
    for bar in (v.score_bar, v.weight_bar):
        out.append(("colour bar", bar, bar.sceneBoundingRect()))
        out.append((f"colour bar title {bar.axis.labelText!r}", bar.axis.label, _text_rect(bar.axis.label)))
        for text, r in axis_tick_rects(bar.axis):
            out.append((f"colour bar tick {text!r}", bar.axis, bar.axis.mapRectToScene(r)))
    item = _note_item(v)
    if item.toPlainText().strip():
        out.append((f"note {item.toPlainText()!r}", item, _text_rect(item)))
    return out


def _overlapping(v) -> list[str]:
    """Labels of the colour bars that run into each other: two tick labels of one bar, or the two
    bars' titles ("-0.06-0.04-0.02" read as one word at 1000x650; the score bar's one-line title ran
    into "weight")."""
    out = []
    for bar in (v.score_bar, v.weight_bar):
        rects = [(t, bar.axis.mapRectToScene(r)) for t, r in axis_tick_rects(bar.axis)]
        for (ta, a), (tb, b) in zip(rects, rects[1:], strict=False):
            if a.intersects(b):
                out.append(f"{ta!r} and {tb!r} overlap")
    titles = [_text_rect(bar.axis.label) for bar in (v.score_bar, v.weight_bar)]
    if titles[0].intersects(titles[1]):
        out.append(f"the bars' titles overlap: {titles}")
    return out


def _cut(win) -> list[str]:
    """What of the Mask tab is not whole: cut by an item that clips it (a panel's view box), by the
    plot area, or out of the page's reach (where no position of its scroll bars shows it whole)."""
    v = win.views["mask"]
    page = win.tabs.widget(win.tabs.currentIndex())
    assert page.widget() is v
    port = page.viewport()
    area = QRectF(v.glw.viewport().rect()).adjusted(-0.5, -0.5, 0.5, 0.5)
    cut = []
    for name, item, scene in _parts(v):
        clip = item.parentItem()
        while clip is not None:
            if clip.flags() & QGraphicsItem.GraphicsItemFlag.ItemClipsChildrenToShape:
                shape = clip.mapRectToScene(clip.boundingRect()).adjusted(-0.5, -0.5, 0.5, 0.5)
                if not shape.contains(scene):
                    cut.append(f"{name} cut by its {type(clip).__name__}: {scene} outside {shape}")
            clip = clip.parentItem()
        shown = v.glw.mapFromScene(scene).boundingRect().toRectF()
        if not area.contains(shown):
            cut.append(f"{name} cut by the plot area: {shown} outside {area}")
            continue
        # in the view's coordinates: scroll the page to it, as a user would, and look
        r = QRectF(shown.translated(QPointF(v.glw.mapTo(v, QPoint(0, 0)))))
        hbar, vbar = page.horizontalScrollBar(), page.verticalScrollBar()
        hbar.setValue(max(0, min(int(r.left()), hbar.maximum())))
        vbar.setValue(max(0, min(int(r.top()), vbar.maximum())))
        at = QRectF(r.translated(QPointF(v.mapTo(port, QPoint(0, 0)))))
        if not QRectF(port.rect()).adjusted(-1, -1, 1, 1).contains(at):
            cut.append(f"{name} out of the page's reach: {at} outside {port.rect()}")
        hbar.setValue(0)
        vbar.setValue(0)
    return cut


@pytest.mark.parametrize(
    "size, dock",
    [((1000, 650), True), ((800, 600), False), ((1000, 650), False), ((1400, 900), False)],
    ids=["1000x650-why-dock", "800x600", "1000x650", "1400x900"],
)
def test_every_mask_panel_is_whole_or_reached_by_scrolling(qtbot, folder, tmp_path, monkeypatch, size, dock):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    win = ran_window(qtbot, folder, PROMPT, size=size)
    if dock:
        win.show_view("heatmap")
        _settle(win)
        win.heatmap.cellClicked.emit(7, 6)  # the Why panel docks beside the tabs
        _settle(win)
        assert win.why_dock.isVisible()
    win.show_view("mask")
    _settle(win)
    v = win.views["mask"]
    page = win.tabs.widget(win.tabs.currentIndex())
    for kind in ("prefill", "decode"):
        if kind == "decode":
            win.step(1)
            _settle(win)
        assert v.report is not None and v.report.kind == kind
        assert (win.width(), win.height()) == size
        assert _cut(win) == [], (kind, size, dock)
        assert _overlapping(v) == [], (kind, size, dock)
        if size[0] >= 1000 and not dock:  # room for all of it (the note under the mask panel too)
            assert not page.horizontalScrollBar().isVisible(), kind
        if kind == "prefill":  # hover a cell: the long read-out line wraps, every line with its room
            vb = v.plots[0].getViewBox()
            v._on_mouse(0, vb.mapViewToScene(QPointF(3.5, 7.5)))
            _settle(win, 2)
            assert v.readout.text().startswith("query "), v.readout.text()
            assert v.readout.height() >= v.readout.heightForWidth(v.readout.width())
        # the header and the hover line wrap at the page's visible width: they read without scrolling
        for label in (v.header, v.readout):
            left = label.mapTo(page.viewport(), QPoint(0, 0)).x()
            assert left + label.width() <= page.viewport().width() + 1, (kind, label.width())
        if kind == "decode":
            assert (
                _note_item(v).toPlainText() == "46 of 46 keys\nallowed (j ≤ 0 + 45)"
            )  # (45 prompt tokens + 1)
        if kind == "decode" and (dock or size[0] < 1000):  # 628+ px of panels in a narrower page: it scrolls
            assert page.horizontalScrollBar().isVisible() and page.horizontalScrollBar().maximum() > 0
    win.close()
