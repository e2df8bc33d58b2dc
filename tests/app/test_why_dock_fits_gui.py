"""Opening the Why panel (a click on a heatmap cell) docks it beside the tabs without growing the window:
its content scrolls inside the dock, so a 1400x900 window on a 900-px screen keeps its status bar in view
(pytest-qt, offscreen, a tiny random llama)."""

from __future__ import annotations

PROMPT = "The cat sat on the mat. The dog sat on the log."


def test_the_why_dock_does_not_grow_the_window(qtbot, tmp_path, monkeypatch):
    from gui_helpers import ran_window
    from PySide6.QtWidgets import QApplication, QScrollArea
    from tiny_models import save_tiny

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny("llama", tmp_path / "m")
    win = ran_window(qtbot, tmp_path / "m", PROMPT, size=(1400, 900))
    for _ in range(3):
        QApplication.processEvents()
    before = win.size()
    win.heatmap.cellClicked.emit(7, 6)
    assert win.engine.wait_idle(120) and win.last_error is None
    for _ in range(5):
        QApplication.processEvents()
    qtbot.wait(100)
    assert win.why_dock.isVisible()
    assert (win.width(), win.height()) == (before.width(), before.height()), (win.size(), before)
    assert win.minimumSizeHint().height() <= 900, win.minimumSizeHint()
    assert isinstance(win.why_dock.widget(), QScrollArea)  # the panel scrolls in the dock
    win.close()
