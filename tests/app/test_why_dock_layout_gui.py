"""The Why dock beside the tabs leaves every control of the heatmap and of "Which heads matter" whole
(pytest-qt, offscreen, a tiny random llama): at 1400x900 and 1000x650, with the dock open on a clicked
cell, each visible combo box shows at least its size hint (its longest item) unclipped, the option
rows wrap instead; the dock opens at a share of the window, its content inside it; the window keeps its
size."""

from __future__ import annotations

import pytest
from gui_helpers import run_in
from tiny_models import save_tiny

PROMPT = "The cat sat on the mat. The dog sat on the log."


def _settle(win) -> None:
    from PySide6.QtWidgets import QApplication

    for _ in range(6):
        QApplication.processEvents()


def _cut_combos(win) -> list[tuple]:
    """Visible combo boxes narrower than their size hint, or clipped by what holds them."""
    from PySide6.QtWidgets import QComboBox

    cut = []
    for combo in win.findChildren(QComboBox):
        if not combo.isVisible():
            continue
        want = combo.sizeHint().width()
        shown = combo.visibleRegion().boundingRect()
        if combo.width() < want or shown.width() < want or shown.height() < combo.height():
            cut.append((combo.currentText(), combo.width(), shown.width(), want))
    return cut


@pytest.mark.parametrize("size", [(1400, 900), (1000, 650)])
def test_the_why_dock_leaves_the_tabs_controls_whole(make_window, tmp_path, monkeypatch, size):
    from attnscope.app.views.why import DOCK_MAX_SHARE, DOCK_MIN_WIDTH, dock_width

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny("llama", tmp_path / "m")
    win = make_window(model=tmp_path / "m", size=size)
    run_in(win, PROMPT)
    win.show_view("heatmap")
    _settle(win)
    win.heatmap.cellClicked.emit(7, 6)  # the dock opens beside the map
    assert win.engine.wait_idle(60) and win.last_error is None
    _settle(win)
    dock, panel = win.why_dock, win.why_panel
    assert dock.isVisible() and panel.explanation is not None
    assert (win.width(), win.height()) == size  # the window did not grow
    # the dock: its share of the window, never squeezed under its minimum, its content inside it
    assert DOCK_MIN_WIDTH <= dock.width() <= max(DOCK_MIN_WIDTH, DOCK_MAX_SHARE * size[0]) + 2, dock.width()
    assert dock.width() <= dock_width(size[0]) + 2
    viewport = dock.widget().viewport()
    assert panel.width() <= viewport.width()
    for plot in (panel.cell_bars, panel.row_bars, panel.rows_plot):
        item = plot.getPlotItem()
        assert item.geometry().width() <= plot.width() + 0.5, (item.geometry(), plot.width())
    for key in ("heatmap", "heads"):
        win.show_view(key)
        _settle(win)
        assert _cut_combos(win) == [], (key, size)
        page = win.tabs.widget(win.tabs.currentIndex())
        bar = getattr(page, "horizontalScrollBar", None)
        assert bar is None or not bar().isVisible(), key  # no page wider than its tab
        win.grab().save(str(tmp_path / f"why_dock_{key}_{size[0]}.png"))
