"""The "Which heads matter" tab's plots before and after a sweep (pytest-qt, offscreen, a tiny random
llama): before the first Run each plot (effect grid, KV-head columns, direct logit attribution bars)
shows a centred line saying what fills it, not empty 0..1 axes; after Run the axes come back and the
placeholders go; the bars' legend (attention, MLP) lies outside the bars' view box, so it covers no bar."""

from __future__ import annotations

import pytest
from gui_helpers import axis_tick_rects, run_in
from tiny_models import save_tiny

PROMPT = "The cat sat on the mat. The dog sat on the log."


def _settle(win) -> None:
    from PySide6.QtWidgets import QApplication

    for _ in range(5):
        QApplication.processEvents()


def _legend_text(legend) -> str:
    """What the bars' legend says: a LabelItem's text, or a LegendItem's labels."""
    if hasattr(legend, "items"):
        return " ".join(label.text for _sample, label in legend.items)
    return getattr(legend, "text", "")


@pytest.fixture()
def win(make_window, tmp_path, monkeypatch):
    """The window after Run of :data:`PROMPT`, on the heads tab (no sweep yet)."""
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny("llama", tmp_path / "m")
    w = make_window(model=tmp_path / "m")
    run_in(w, PROMPT)
    w.show_view("heads")
    _settle(w)
    return w


def _sweep(win):
    view = win.views["heads"]
    view.run()
    assert win.engine.wait_idle(120) and win.last_error is None and view.result is not None
    _settle(win)
    return view


def test_plots_show_a_placeholder_until_the_sweep(win, tmp_path):
    view = win.views["heads"]
    plots = view.plots
    named = {"grid": plots.grid, "kv": plots.kv, "bars": plots.bars}
    for name, plot in named.items():  # before any sweep: no axes, a line instead
        shown = [a for a in ("left", "bottom", "top") if plot.getAxis(a).isVisible()]
        assert shown == [], (name, shown)
        ph = getattr(plots, "placeholders", {}).get(plot)
        assert ph is not None and ph.isVisible() and "Run" in ph.toPlainText(), name
        # centred on its plot's view box, and whole inside it
        vb = plot.vb.sceneBoundingRect()
        box = ph.sceneBoundingRect()
        assert vb.contains(box), (name, vb, box)
        assert abs(box.center().x() - vb.center().x()) < 2, (name, box, vb)
    assert not plots.colour_bar.isVisible()
    win.grab().save(str(tmp_path / "heads_empty.png"))

    _sweep(win)
    for name, plot in named.items():
        assert plot.getAxis("bottom").isVisible() and plot.getAxis("left").isVisible(), name
        assert not plots.placeholders[plot].isVisible(), name
    assert plots.grid.getAxis("top").isVisible() and plots.colour_bar.isVisible()


def test_the_bars_legend_covers_no_bar(win, tmp_path):
    plots = _sweep(win).plots
    win.grab().save(str(tmp_path / "heads_swept.png"))
    # the legend names both colours and sits above the bars, outside their view box
    legend = plots.legend
    text = _legend_text(legend)
    assert "attention" in text and "MLP" in text, text
    assert legend.isVisible()
    vb = plots.bars.vb.sceneBoundingRect()
    assert not legend.sceneBoundingRect().intersects(vb), (legend.sceneBoundingRect(), vb)
    assert legend.sceneBoundingRect().bottom() <= vb.top() + 0.5


def test_hint_after_a_prompt_asks_only_for_run(make_window, tmp_path, monkeypatch):
    """Before any prompt the hint asks to run one; once a sequence exists it asks only to press Run."""
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny("llama", tmp_path / "m")
    w = make_window(model=tmp_path / "m")
    view = w.views["heads"]
    assert view.summary.text().startswith("Run a prompt")
    run_in(w, PROMPT)
    w.show_view("heads")
    _settle(w)
    text = view.summary.text()
    assert "Run a prompt" not in text and text.startswith("Press Run"), text


@pytest.mark.parametrize("size", [(1000, 650), (1400, 900)])
def test_swept_plots_axis_titles_are_on_the_visible_page(make_window, tmp_path, monkeypatch, size):
    """After a sweep each plot's x tick labels and x axis title lie inside the tab page's visible part,
    the page scrolled to the top (at 1000 x 650 they were below its edge)."""
    from PySide6.QtCore import QPoint, QPointF, QRectF

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny("llama", tmp_path / "m")
    w = make_window(model=tmp_path / "m", size=size)
    run_in(w, PROMPT)
    w.show_view("heads")
    _settle(w)
    view = _sweep(w)
    _settle(w)
    page = w.tabs.widget(w.tabs.currentIndex())
    page.verticalScrollBar().setValue(0)
    _settle(w)
    visible = QRectF(page.viewport().rect())
    plots = view.plots
    offset = QPointF(plots.mapTo(page.viewport(), QPoint(0, 0)))
    for plot in (plots.grid, plots.kv, plots.bars):
        axis = plot.getAxis("bottom")
        for item in (axis, axis.label):
            rect = plots.mapFromScene(item.mapRectToScene(item.boundingRect())).boundingRect().toRectF()
            assert QRectF(plots.rect()).contains(rect), (axis.labelText, rect, plots.rect())  # not clipped
            assert visible.contains(rect.translated(offset)), (
                axis.labelText,
                rect.translated(offset),
                visible,
            )
    assert plots.height() >= view.PLOTS_LEAST_HEIGHT
    if size == (1400, 900):
        assert plots.height() >= view.PLOTS_MIN_HEIGHT


def test_dla_value_labels_do_not_run_together_at_1000(make_window, tmp_path, monkeypatch):
    """The DLA bars' value labels, drawn in a 1000 x 650 window, are apart (they read "0 0.10.20.3")."""
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny("llama", tmp_path / "m")
    w = make_window(model=tmp_path / "m", size=(1000, 650))
    run_in(w, PROMPT)
    w.show_view("heads")
    _settle(w)
    view = _sweep(w)
    _settle(w)
    texts = axis_tick_rects(view.plots.bars.getAxis("bottom"))
    rects = sorted((rect for _text, rect in texts), key=lambda r: r.left())
    assert rects
    for a, b in zip(rects, rects[1:], strict=False):
        assert a.right() < b.left(), ([t for t, _r in texts], a, b)
