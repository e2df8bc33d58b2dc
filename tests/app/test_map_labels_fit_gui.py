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


def _labels_inside(mask, axis) -> list:
    """``(text, QRectF)`` of ``axis``'s drawn tick labels, each asserted whole: inside the axis item
    and inside the Mask tab's plot area (its viewport), not cut at either edge."""
    rects = axis_tick_rects(axis)
    viewport = mask.glw.viewport().rect()
    for text, r in rects:
        assert r.left() >= -0.5 and r.right() <= axis.width() + 0.5, (text, r, axis.width())
        shown = mask.glw.mapFromScene(axis.mapRectToScene(r)).boundingRect()
        assert shown.left() >= 0 and shown.right() <= viewport.right() + 1, (text, shown, viewport)
    return rects


@pytest.mark.slow  # about 5.5 s: the embedded SmolLM2 loads, runs a chat-template prompt and one step
def test_mask_row_labels_are_whole_at_1000_with_a_chat_template(make_window):
    """The walk that reported "42 istant" as a clipped "42 assistant": SmolLM2's tokenizer splits
    "assistant" into "ass" + "istant", and row 42 is "istant". Every row label is drawn whole, in an
    axis as wide as its widest label, with the token's whole text (prefill and a decode step)."""
    from attnscope.app.figure import token_label
    from attnscope.app.views.mask import MaskView
    from PySide6.QtWidgets import QApplication

    win = make_window(size=(1000, 650))  # the embedded SmolLM2-135M-Instruct
    win.prompt_edit.setPlainText("The quick brown fox jumps over the lazy dog. The quick brown fox")
    win.chat_check.setChecked(True)
    win.run_prompt()
    assert win.engine.wait_idle(120) and win.last_error is None
    win.show_view("mask")
    for _ in range(3):
        assert win.engine.wait_idle(60)
        for _ in range(5):
            QApplication.processEvents()
    mask = win.findChildren(MaskView)[0]
    assert mask.report is not None and mask.report.kind == "prefill"
    toks = win.snapshot.tokens
    assert [t.text for t in toks[-3:]] == ["ass", "istant", "↵"]  # (a newline is shown as ↵)
    axis = mask.plots[0].getAxis("left")
    rects = _labels_inside(mask, axis)
    texts = [t for t, _ in rects]
    assert "42 istant" in texts and "21 <|im_start|>" in texts, texts
    for text in texts:
        i, _, shown = text.partition(" ")
        assert shown == token_label(toks[int(i)].text)  # the token's label, not cut
    # the axis reserves its widest label's width (plus pyqtgraph's tick gap), no more
    widest = max(r.width() for _, r in rects)
    assert widest <= axis.width() <= widest + 12, (widest, axis.width())

    win.step(1)  # a decode step: one query row, labelled on the mask and the entropy panel
    for _ in range(3):
        assert win.engine.wait_idle(60)
        for _ in range(5):
            QApplication.processEvents()
    assert mask.report is not None and mask.report.kind == "decode"
    toks, n = win.snapshot.tokens, win.snapshot.seq_len - 1  # the new token's row
    assert mask.report.row_start == n
    for p in (mask.plots[0], mask.ent_plot):
        texts = [t for t, _ in _labels_inside(mask, p.getAxis("left"))]
        assert texts == [f"{n} {token_label(toks[n].text)}"], texts
