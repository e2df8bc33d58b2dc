"""In a 1000 px window (and at 1400 × 900) the Experiments tab's plot title and axis titles are shown
whole above a plot with room for its curves, its legend beside them; the KV tab's plots and their axis
titles fit the visible page; the head grid's caption is whole; and the Sinks tab's summary runs across
the tab under its controls, not wrapped into a narrow column beside them (pytest-qt, offscreen, a tiny
random llama)."""

from __future__ import annotations

import os

import pytest
from gui_helpers import axis_title_rect
from PySide6.QtCore import QPoint, QPointF, QRect, QRectF
from PySide6.QtWidgets import QApplication

SHOTS = "/work/notes/shots"
PROMPT = "The cat sat on the mat. The dog sat on the log. " * 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tiny_models import save_tiny

    out = tmp_path_factory.mktemp("llama_narrow")
    save_tiny("llama", out)
    return out


@pytest.fixture()
def win(qtbot, folder):
    from gui_helpers import ran_window

    w = ran_window(qtbot, folder, PROMPT, steps=1)
    yield w
    w.close()


def _idle(w):
    for _ in range(4):
        assert w.engine.wait_idle(120)
        QApplication.processEvents()
    assert w.last_error is None, w.last_error


def _shot(w, name):
    os.makedirs(SHOTS, exist_ok=True)
    w.grab().save(f"{SHOTS}/layout_{name}.png")


def _shown_whole(widget, page) -> bool:
    """``widget`` lies whole inside the visible part of the tab page (no scrolling needed)."""
    top_left = widget.mapTo(page, QPoint(0, 0))
    return page.rect().contains(QRect(top_left, widget.size()))


@pytest.mark.parametrize("size", [(1000, 650), (1400, 900)])
def test_experiments_plot_title_is_whole_above_a_readable_plot(win, size):
    win.show_view("experiments")
    win.resize(*size)
    _idle(win)
    v = win.views["experiments"]
    assert v.table.rowCount() >= 5  # the tab ran all five by itself
    _shot(win, f"experiments_{size[0]}x{size[1]}")
    page = win.tabs.widget(win.tabs.currentIndex())
    assert not page.verticalScrollBar().isVisible() and not page.horizontalScrollBar().isVisible()
    pi = v.plot.getPlotItem()
    title = pi.titleLabel
    assert title.isVisible() and "Evict the first k" in title.text
    # the title's text fits the plot's width (a title wider than its plot is cut at both ends)
    assert title.item.boundingRect().width() <= v.plot.width() - 8, (
        title.item.boundingRect().width(),
        v.plot.width(),
    )
    assert _shown_whole(v.plot, page)
    assert pi.getViewBox().sceneBoundingRect().height() >= 90  # room for the curves, not a sliver
    # both axis titles whole inside the plot (the rotated y title was longer than its axis, cut at
    # both ends; the x title fell off the plot's bottom)
    plot_rect = QRectF(v.plot.viewport().rect())
    for side in ("left", "bottom"):
        assert plot_rect.contains(axis_title_rect(v.plot, side)), (
            side,
            axis_title_rect(v.plot, side),
            plot_rect,
        )
    # the legend names both curves and lies beside the view box, never over the curves
    vb = pi.getViewBox().sceneBoundingRect()
    legend = pi.legend.sceneBoundingRect()
    assert [label.text.split("<br>")[0] for _i, label in pi.legend.items] == ["unmodified", "Evict first k"]
    assert legend.left() >= vb.right() - 1, (legend, vb)  # right of the view box (they share an edge)
    assert not legend.intersects(v.exp_curve.sceneBoundingRect()) and legend.right() <= plot_rect.right() + 1
    for _sample, label in pi.legend.items:  # each entry whole inside the legend (not cut by the plot's edge)
        assert legend.contains(label.sceneBoundingRect().adjusted(1, 1, -1, -1)), label.text
    # the table still shows its header and at least two rows; every header whole in its column
    t = v.table
    assert t.viewport().height() >= 2 * t.rowHeight(0)
    fm = t.horizontalHeader().fontMetrics()
    for c in range(t.columnCount()):
        head = t.horizontalHeaderItem(c).text()
        assert max(fm.horizontalAdvance(s) for s in head.split("\n")) <= t.columnWidth(c), (head, c)


@pytest.mark.parametrize("size", [(1000, 650), (1400, 900)])
def test_sinks_summary_runs_across_the_tab(win, size):
    win.show_view("sinks")
    win.resize(*size)
    _idle(win)
    v = win.views["sinks"]
    _shot(win, f"sinks_{size[0]}x{size[1]}")
    page = win.tabs.widget(win.tabs.currentIndex())
    assert not page.verticalScrollBar().isVisible() and not page.horizontalScrollBar().isVisible()
    s = v.summary
    assert "uniform causal baseline" in s.text()
    assert s.width() >= 0.8 * v.width(), (s.width(), v.width())  # the tab's width, not a side column
    lines = s.heightForWidth(s.width()) / s.fontMetrics().lineSpacing()
    assert lines <= 2.5, lines
    assert s.height() >= s.heightForWidth(s.width())  # every line it needs, none cut
    assert _shown_whole(s, page) and _shown_whole(v.table, page)
    # the plot's title (which head, its legend) fits the plot
    title = v.plot.getPlotItem().titleLabel
    assert "query head" in title.text
    assert title.item.boundingRect().width() <= v.plot.width() - 8, (
        title.item.boundingRect().width(),
        v.plot.width(),
    )


@pytest.mark.parametrize("size", [(1000, 650), (1400, 900)])
def test_mask_tabs_four_panels_are_all_inside_the_tab(win, size):
    from PySide6.QtCore import Qt

    win.show_view("mask")
    win.resize(*size)
    _idle(win)
    v = win.views["mask"]
    _shot(win, f"mask_{size[0]}x{size[1]}")
    page = win.tabs.widget(win.tabs.currentIndex())
    assert not page.horizontalScrollBar().isVisible()
    if size == (1400, 900):  # room for all of it: the wrapped header does not make the page scroll
        assert not page.verticalScrollBar().isVisible()
    # the panels' row fits the plot area: none is pushed out past its right edge
    assert v.glw.ci.effectiveSizeHint(Qt.SizeHint.MinimumSize).width() <= v.glw.viewport().width()
    for p in [*v.plots, v.ent_plot]:
        assert p.sceneBoundingRect().right() <= v.glw.viewport().width() + 1, (p.titleLabel.text, size)
        assert p.titleLabel.item.boundingRect().width() <= p.vb.sceneBoundingRect().width() + 2


@pytest.mark.parametrize("size", [(1000, 650), (1400, 900)])
def test_head_roles_headers_are_whole_and_the_summary_runs_across(win, size):
    from PySide6.QtGui import QFontMetrics

    win.show_view("roles")
    win.resize(*size)
    _idle(win)
    v = win.views["roles"]
    _shot(win, f"roles_{size[0]}x{size[1]}")
    page = win.tabs.widget(win.tabs.currentIndex())
    assert not page.verticalScrollBar().isVisible() and not page.horizontalScrollBar().isVisible()
    t, hh = v.table, v.table.horizontalHeader()
    font = hh.font()
    font.setBold(True)  # (as the style draws a header: the widest it gets)
    fm = QFontMetrics(font)
    for c in range(t.columnCount()):
        text = t.horizontalHeaderItem(c).text()
        widest = max(fm.horizontalAdvance(s) for s in text.split("\n"))
        assert widest + 8 <= hh.sectionSize(c), (text, widest, hh.sectionSize(c))
    s = v.summary
    assert "heads at threshold" in s.text() and s.width() >= 0.8 * v.width()
    assert _shown_whole(s, page) and s.height() >= s.heightForWidth(s.width())


@pytest.mark.parametrize("size", [(1000, 650), (1400, 900)])
def test_kv_plots_titles_and_legends_fit_their_plots(win, size):
    win.show_view("kv")
    win.resize(*size)
    _idle(win)
    v = win.views["kv"]
    _shot(win, f"kv_{size[0]}x{size[1]}")
    page = win.tabs.widget(win.tabs.currentIndex())
    assert not page.horizontalScrollBar().isVisible()  # (the calculator below is reached by scrolling down)
    for pw in (v.growth_plot, v.proj_plot):
        pi = pw.getPlotItem()
        vb = pi.getViewBox().sceneBoundingRect()
        # centred over the view box: wider than it, a title is cut at the plot's edge
        assert pi.titleLabel.item.boundingRect().width() <= vb.width(), (pi.titleLabel.text, vb.width())
        legend = pi.legend.sceneBoundingRect()
        assert legend.right() <= vb.right() + 1 and legend.left() >= vb.left() - 1, (legend, vb)
    # the plots fit the page's visible height: their axis titles are on screen without scrolling (at
    # 1000 x 650 the plots were 611 px tall in a 361 px page, the x titles below its edge)
    visible = QRectF(page.viewport().rect())
    for pw in (v.layer_plot, v.growth_plot, v.proj_plot):
        plot_rect = QRectF(pw.viewport().rect())
        for side in ("left", "bottom"):
            title = axis_title_rect(pw, side)
            assert plot_rect.contains(title), (side, title, plot_rect)
            on_page = title.translated(QPointF(pw.mapTo(page.viewport(), QPoint(0, 0))))
            assert visible.contains(on_page), (pw.getPlotItem().getAxis(side).labelText, on_page, visible)


@pytest.mark.parametrize("size", [(1000, 650), (1400, 900)])
def test_head_grid_caption_is_whole(win, size):
    """The grid's caption (scale, colours, range, legend) wraps onto as many lines as it needs, and
    the bar above the thumbnails is as tall as they are (at 1000 px its third line was cut)."""
    from PySide6.QtCore import Qt

    win.tabs.setCurrentWidget(win.grid)
    win.resize(*size)
    _idle(win)
    grid = win.grid
    title = grid.title
    for weighting in ("attention", "value-weighted"):  # the value-weighted caption is the longer
        grid.weighting_combo.setCurrentIndex(grid.weighting_combo.findData(weighting))
        _idle(win)
        _shot(win, f"grid_{weighting}_{size[0]}x{size[1]}")
        assert title.text().startswith(f"Showing: {weighting}") and "masked" in title.text()
        r = title.contentsRect()
        need = title.fontMetrics().boundingRect(
            QRect(0, 0, r.width(), 10_000), int(Qt.TextFlag.TextWordWrap), title.text()
        )
        assert need.width() <= r.width() and need.height() <= r.height(), (weighting, need, r)
        # the label lies inside the bar, and the bar above the thumbnails' viewport
        assert grid.bar.rect().contains(title.geometry()), (title.geometry(), grid.bar.rect())
        assert grid.bar.geometry().bottom() < grid.viewport().geometry().top()


def test_the_edited_hint_never_widens_a_1000_px_window(win):
    win.resize(1000, 650)
    _idle(win)
    assert win.width() == 1000
    win.prompt_edit.setPlainText(win.prompt_edit.toPlainText() + " And")
    _idle(win)
    hint = win.controls.edited_label
    assert hint.isVisible()
    _shot(win, "edited_hint_1000x650")
    assert win.width() == 1000  # the row gave up width (the group label ends in "…"), not the window
    assert hint.width() >= hint.fontMetrics().horizontalAdvance(hint.text())  # the hint whole
    label = win.group_label
    assert label.text().startswith("reads KV head 0") and label.text() in label.toolTip()
    assert label.geometry().right() < win.cmap_combo.geometry().left()


def test_sinks_plot_shows_a_uniform_causal_head_beside_the_selected_one(win):
    from attnscope.core.analysis.sinks import uniform_causal_baseline

    win.show_view("sinks")
    _idle(win)
    v = win.views["sinks"]
    n = v.step_spin.value()
    b = uniform_causal_baseline(n)
    x, y = v.uniform_curve.getData()
    assert len(x) == n - 1 and x[0] == 1
    assert y[-1] == pytest.approx(b, rel=1e-9) and y[0] == pytest.approx(0.5)  # row 1: 1/2 on token 0
    assert y[3] == pytest.approx(uniform_causal_baseline(5), rel=1e-9)
    _, score = v.mean_curve.getData()
    title = v.plot.getPlotItem().titleLabel.text
    assert f"a uniform causal head: {b:.3f}</span> (×{score[-1] / b:.1f})" in title
    v.metric_combo.setCurrentIndex(v.metric_combo.findData("sink_set"))  # another score: no baseline
    _idle(win)
    ux, _uy = v.uniform_curve.getData()
    assert (ux is None or len(ux) == 0) and "uniform" not in v.plot.getPlotItem().titleLabel.text
