"""Nothing drawn over anything at 1000x650 and 1400x900 (pytest-qt, offscreen, a tiny random llama): the
heatmap's wrapped title above the map, the Mask tab's key-axis tick labels apart, the Sinks threshold
label off the curves, and the token strip opening on whole lines."""

from __future__ import annotations

import pytest
from gui_helpers import axis_tick_rects

PROMPT = "The cat sat on the mat. The dog sat on the log."


def _settle(qtbot, win, n: int = 5) -> None:
    from PySide6.QtWidgets import QApplication

    for _ in range(n):
        QApplication.processEvents()
    qtbot.wait(50)


def _window(qtbot, tmp_path, monkeypatch, size):
    from gui_helpers import ran_window
    from tiny_models import save_tiny

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny("llama", tmp_path / "m")
    win = ran_window(qtbot, tmp_path / "m", PROMPT, size=size)
    _settle(qtbot, win)
    return win


def _text_scene_rect(text_item):
    m = text_item.document().documentMargin()
    return text_item.mapRectToScene(text_item.boundingRect().adjusted(m, m, -m, -m))


@pytest.mark.parametrize("size", [(1000, 650), (1400, 900)])
def test_heatmap_title_never_covers_the_map_with_the_why_dock_open(qtbot, tmp_path, monkeypatch, size):
    win = _window(qtbot, tmp_path, monkeypatch, size)
    win.heatmap.cellClicked.emit(7, 6)
    assert win.engine.wait_idle(120) and win.last_error is None
    _settle(qtbot, win)
    assert win.why_dock.isVisible()
    hm = win.heatmap
    hm._set_title(hm.plot.titleLabel.text)  # the title fitted to the width the dock left
    _settle(qtbot, win)
    title = _text_scene_rect(hm.plot.titleLabel.item)
    image = hm.image.mapRectToScene(hm.image.boundingRect())
    assert title.height() > 0 and image.height() > 0
    assert not title.intersects(image), (title, image, hm.plot.titleLabel.text)
    win.close()


def _show_tab(qtbot, win, key: str) -> None:
    from PySide6.QtWidgets import QTabWidget

    tabs = win.findChildren(QTabWidget)[0]
    for i in range(tabs.count()):
        if tabs.tabText(i).lower().startswith(key):
            tabs.setCurrentIndex(i)
            break
    else:
        raise AssertionError(f"no {key} tab")
    _settle(qtbot, win)
    assert win.engine.wait_idle(60) and win.last_error is None
    _settle(qtbot, win, 10)


def test_mask_key_axis_labels_never_overlap_at_1000(qtbot, tmp_path, monkeypatch):
    from gui_helpers import run_in

    win = _window(qtbot, tmp_path, monkeypatch, (1000, 650))
    run_in(win, "日本語の文章です。" * 3)  # byte tokens: each key label as wide as "<0xE6>"
    _show_tab(qtbot, win, "mask")
    from attnscope.app.views.mask import MaskView

    mask = win.findChildren(MaskView)[0]
    assert mask.report is not None
    for p in mask.plots:
        rects = axis_tick_rects(p.getAxis("bottom"))
        assert rects, "no key labels drawn"
        for (ta, a), (tb, b) in zip(rects, rects[1:], strict=False):
            assert not a.intersects(b), (ta, a, tb, b)
    win.close()


@pytest.mark.parametrize("size", [(1000, 650), (1400, 900)])
def test_sinks_threshold_label_is_off_the_curves(qtbot, tmp_path, monkeypatch, size):
    from attnscope.app.views.sinks import SinksView
    from pyqtgraph.graphicsItems.InfiniteLine import InfLineLabel

    win = _window(qtbot, tmp_path, monkeypatch, size)
    _show_tab(qtbot, win, "sinks")
    sinks = win.findChildren(SinksView)[0]
    assert sinks.report is not None
    pi = sinks.plot.getPlotItem()
    vb = pi.getViewBox()
    data_area = vb.mapRectToScene(vb.boundingRect())
    # no label drawn inside the curves' area: the threshold is named in the title's first line
    labels = [it for it in vb.allChildren() if isinstance(it, InfLineLabel) and it.isVisible()]
    for it in labels:
        if "threshold" in it.toPlainText():
            assert not it.mapRectToScene(it.boundingRect()).intersects(data_area)
    first_line = pi.titleLabel.text.split("<br>")[0]
    assert "threshold 0.50" in first_line, pi.titleLabel.text
    title = _text_scene_rect(pi.titleLabel.item)
    assert not title.intersects(data_area), (title, data_area)
    win.close()


@pytest.mark.parametrize("size", [(1000, 650), (1400, 900)])
def test_token_strip_opens_on_whole_lines(qtbot, tmp_path, monkeypatch, size):
    from gui_helpers import run_in

    win = _window(qtbot, tmp_path, monkeypatch, size)
    # several lines, as a chat-template prompt is (each ↵ breaks the strip's line)
    run_in(win, "system: be brief.\nuser: The cat sat on the mat.\nThe dog sat on the log.\nassistant:\n")
    _settle(qtbot, win, 10)
    strip = win.token_strip
    bar = strip.verticalScrollBar()
    assert bar.maximum() > 0, "the text fits the pane: nothing to scroll"
    doc = strip.document()
    tops, block = [], doc.begin()
    while block.isValid():  # each laid-out line's top, in document pixels
        y0 = doc.documentLayout().blockBoundingRect(block).top()
        tops += [y0 + block.layout().lineAt(i).y() for i in range(block.layout().lineCount())]
        block = block.next()
    assert len(tops) >= 4
    # the first visible line starts at the pane's top: whole, not cut in half
    assert min(abs(bar.value() - t) for t in tops) <= 1.0, (bar.value(), tops)
    # and the newest token's line (the last) is whole too, at the bottom
    last = doc.lastBlock()
    last_bottom = doc.documentLayout().blockBoundingRect(last).top() + last.layout().boundingRect().bottom()
    assert last_bottom <= bar.value() + strip.viewport().height() + 1.0
    win.close()
