"""The GQA tab with four-head groups (a tiny random llama, 8 query heads / 2 KV heads) fits the window
at 1000 × 650 and 1400 × 900: every row of the pair table and every number in it shown whole, the
keys plot inside the tab, the small maps square and large enough to read (pytest-qt, offscreen)."""

from __future__ import annotations

import os

import pytest
from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import QApplication

SHOTS = "/work/notes/shots"
PROMPT = "The cat sat on the mat. The dog sat on the log. " * 4  # ~190 tiny-tokenizer tokens


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tiny_models import save_tiny

    out = tmp_path_factory.mktemp("llama_group4")
    save_tiny("llama", out, num_attention_heads=8, num_key_value_heads=2)  # group_size 4
    return out


@pytest.fixture()
def win(qtbot, folder):
    from gui_helpers import ran_window

    w = ran_window(qtbot, folder, PROMPT, steps=1)
    yield w
    w.close()


def _idle(w):
    for _ in range(4):
        assert w.engine.wait_idle(60)
        QApplication.processEvents()
    assert w.last_error is None, w.last_error


def _inside(widget, page) -> bool:
    """``widget`` lies whole inside the page's scrolled content (reachable, never clipped by a parent)."""
    content = page.widget()
    top_left = widget.mapTo(content, QPoint(0, 0))
    rect = QRect(top_left, widget.size())
    return content.rect().contains(rect)


@pytest.mark.parametrize("size", [(1000, 650), (1400, 900)])
def test_gqa_with_four_head_groups_fits_the_window(win, size):
    win.show_view("gqa")
    win.resize(*size)
    _idle(win)
    v = win.views["gqa"]
    r = v.report
    assert len(r.heads) == 4
    os.makedirs(SHOTS, exist_ok=True)
    win.grab().save(f"{SHOTS}/layout_gqa_group4_{size[0]}x{size[1]}.png")
    page = win.tabs.widget(win.tabs.currentIndex())
    assert not page.horizontalScrollBar().isVisible()
    if size == (1400, 900):
        assert not page.verticalScrollBar().isVisible()
    # everything is in the page's content: shown, or (a small window) reached by its scroll bar
    for w in (v.header, v.glw, v.pair_table, v.pair_title, v.layer_table_widget, v.layers_plot):
        assert _inside(w, page), (w, size)
    # every row of the pair table in its viewport, every number whole
    t = v.pair_table
    last = t.rowCount() - 1
    assert t.rowViewportPosition(last) + t.rowHeight(last) <= t.viewport().height() + 1
    assert not t.verticalScrollBar().isVisible() and not t.horizontalScrollBar().isVisible()
    fm = t.fontMetrics()
    for c in range(t.columnCount()):
        assert fm.horizontalAdvance(t.item(0, c).text()) + 4 <= t.columnWidth(c), (c, t.columnWidth(c))
    # the keys plot (and its axis) inside the plot area's right edge
    keys = v.plots[-1].sceneBoundingRect()
    assert keys.right() <= v.glw.viewport().width(), (keys, v.glw.viewport().width())
    # the small maps: square cells, at least 80 px a side
    for p in v.plots[:-1]:
        vb = p.getViewBox()
        (x0, x1), (y0, y1) = vb.viewRange()
        rect = vb.sceneBoundingRect()
        assert rect.width() / (x1 - x0) == pytest.approx(rect.height() / (y1 - y0), rel=0.02)
        side = min(rect.width(), rect.height())
        assert side >= 80, (side, size)
