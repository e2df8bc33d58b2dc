"""File → Open session replaces the Why panel's cell (pytest-qt, offscreen, a tiny random llama): the
explanation of a cell clicked on the run the session replaces never stays on screen; a session saved
with a cell explains that cell again."""

from __future__ import annotations

from gui_helpers import run_in
from tiny_models import save_tiny

PROMPT_A = "The cat sat on the mat."
PROMPT_B = "The dog sat on the log. The dog sat."


def _explained(win) -> list[str]:
    """What the panel's text and bars say (empty: it explains nothing)."""
    p = win.why_panel
    shown = [p.score_label.text(), p.summary.text()]
    return [t for t in shown if t] + [r[0] for r in p.cell_bars.rows + p.row_bars.rows]


def test_opening_a_session_drops_the_old_cells_explanation(make_window, tmp_path, monkeypatch):
    from attnscope.app.views.why import HINT

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny("llama", tmp_path / "m")
    win = make_window(model=tmp_path / "m")
    run_in(win, PROMPT_A)
    len_a = win.snapshot.seq_len
    plain = tmp_path / "a.attnscope"  # saved before any cell was clicked
    win.sessions.save_session(plain)
    assert win.engine.wait_idle(60) and plain.is_file()
    run_in(win, PROMPT_B)
    win.heatmap.cellClicked.emit(7, 6)  # a click on the heatmap: the dock opens and explains it
    assert win.engine.wait_idle(60) and win.last_error is None
    panel = win.why_panel
    assert win.why_dock.isVisible() and panel.explanation is not None and panel.cell == (7, 6)
    assert panel.header.text().startswith("L0 H0 · query 7") and _explained(win)
    with_cell = tmp_path / "b.attnscope"  # this one keeps the cell
    win.sessions.save_session(with_cell)
    assert win.engine.wait_idle(60)

    win.sessions.open_session(plain)
    assert win.engine.wait_idle(60) and win.last_error is None
    assert win.snapshot.seq_len == len_a  # prompt A is back
    assert panel.cell is None and panel.explanation is None
    assert panel.header.text() == HINT, panel.header.text()
    assert _explained(win) == [] and not panel.cell_bars.isVisible() and not panel.export_button.isEnabled()
    assert win.state.settings["why"]["query"] is None  # a session saved now keeps no cell either

    # a session with a cell: that cell is explained again, on that session's tokens
    win.heatmap.cellClicked.emit(4, 2)
    assert win.engine.wait_idle(60) and panel.cell == (4, 2)
    win.sessions.open_session(with_cell)
    assert win.engine.wait_idle(60) and win.last_error is None
    assert panel.cell == (7, 6) and panel.explanation is not None and panel.explanation.query == 7
    assert panel.header.text().startswith("L0 H0 · query 7") and panel.cell_bars.isVisible()
