"""The Why panel (pytest-qt, offscreen): a click on a heatmap cell opens the dock beside the map and
shows the cell's score split by rotary band (the bars add up to the score the core computes), the
row's split, the counterfactual row and the head summary; the panel follows the head selection; its
cell and visibility survive a session file; the head grid colours by positional share and the Head
roles table has the positional-share column."""

from __future__ import annotations

import numpy as np
import pytest
from gui_helpers import ran_window
from tiny_models import save_tiny

PROMPT = "ttt tt t tt ttt t"


@pytest.fixture()
def win(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny("phi3", tmp_path / "m", partial_rotary_factor=0.5)
    w = ran_window(qtbot, tmp_path / "m", PROMPT)
    yield w
    w.close()


def _click_cell(win, row: int, col: int) -> None:
    """A mouse click on heatmap cell (row, col), through the scene's click handler."""
    from PySide6.QtCore import QPointF

    hm = win.heatmap
    vb = hm.plot.getViewBox()
    scene = vb.mapViewToScene(QPointF(col + 0.5, row + 0.5))

    class Click:
        def scenePos(self):
            return scene

    hm._on_click(Click())


def test_click_a_cell_shows_bars_that_add_up_to_the_score(win, tmp_path):
    from attnscope.core.analysis.explain import explain, head_positional_share

    win.select(1, 2)
    win.show_view("heatmap")
    assert win.engine.wait_idle(60)
    assert not win.why_dock.isVisible()
    T = win.snapshot.seq_len
    _click_cell(win, T - 1, 3)
    assert win.engine.wait_idle(60) and win.last_error is None
    panel = win.why_panel
    assert win.why_dock.isVisible() and win.views["heatmap"].isVisible()  # beside the map, not over it
    assert panel.cell == (T - 1, 3)
    want = explain(win.engine.session, 1, 2, T - 1, 3)
    assert panel.explanation.score == pytest.approx(want.score, rel=1e-12)
    assert panel.cell_bars.total() == pytest.approx(want.score, rel=1e-9, abs=1e-12)
    assert panel.row_bars.total() == pytest.approx(want.row_bands.total, rel=1e-9, abs=1e-12)
    labels = [r[0] for r in panel.cell_bars.rows]
    assert labels[0].startswith("turns every") and labels[-1] == "not rotated"  # partial rotary
    share = head_positional_share(win.engine.session, 1, 2)
    assert panel.summary.text() == f"positional ↔ content: {share:.2f} positional"
    x, y = panel.norope_curve.getData()
    np.testing.assert_array_equal(y, want.no_rope_row)
    assert panel.sources_box.title() == "By source"  # filled next (tests/app/test_qk_sources_gui.py)
    win.resize(1500, 900)
    shot = tmp_path / "why_window.png"
    win.grab().save(str(shot))
    # the selection moves: the panel explains the same cell for the new head
    win.select(0, 1)
    assert win.engine.wait_idle(60)
    assert panel.explanation.layer == 0 and panel.explanation.head == 1
    assert panel.cell_bars.total() == pytest.approx(explain(win.engine.session, 0, 1, T - 1, 3).score)


def test_cell_and_visibility_survive_a_session_file(win, tmp_path, qtbot):
    from attnscope.app.main_window import MainWindow

    T = win.snapshot.seq_len
    _click_cell(win, T - 2, 1)
    assert win.engine.wait_idle(60)
    assert win.state.settings["why"] == {"visible": True, "query": T - 2, "key": 1}
    path = tmp_path / "s.attnscope"
    win.sessions.save_session(path)
    assert win.engine.wait_idle(60) and path.is_file()
    w2 = MainWindow(model=str(tmp_path / "m"))
    qtbot.addWidget(w2)
    w2.show()
    assert w2.engine.wait_idle(120)
    w2.sessions.open_session(path)
    assert w2.engine.wait_idle(120) and w2.last_error is None
    assert w2.why_panel.cell == (T - 2, 1) and w2.why_dock.isVisible()
    assert w2.why_panel.explanation is not None and w2.why_panel.explanation.query == T - 2
    w2.close()


def test_grid_colours_by_positional_share_and_roles_has_the_column(win):
    from attnscope.core.analysis.explain import positional_share_grid

    want = positional_share_grid(win.engine.session)
    win.show_view("grid")
    grid = win.grid
    grid.colour_combo.setCurrentIndex(grid.colour_combo.findData("share"))
    assert win.engine.wait_idle(60) and win.last_error is None
    np.testing.assert_allclose(grid.canvas.shares, want)
    assert "positional share" in grid.title.text()
    win.show_view("roles")
    assert win.engine.wait_idle(120)
    view = win.views["roles"]
    col = view.share_column
    assert view.table.horizontalHeaderItem(col).text().replace("\n", " ") == "positional share"
    for row in range(view.table.rowCount()):
        layer, head = view.head_at(row)
        assert float(view.table.item(row, col).data(0x0100)) == pytest.approx(float(want[layer, head]))


def test_export_writes_the_explanation_with_the_clis_provenance(win, tmp_path):
    """Export… writes what the panel shows: the CLI's ``attnscope explain --json`` keys (model, prompt,
    token ids and their SHA-256, the cell, the bands, the positional share) with the same values, and
    the by-source split once it has come back."""
    import json

    from attnscope.core.analysis.explain import explain, head_positional_share
    from attnscope.core.cli.commands.explain import payload

    win.select(1, 2)
    win.show_view("heatmap")
    assert win.engine.wait_idle(60)
    panel = win.why_panel
    assert not panel.export_button.isEnabled()
    with pytest.raises(ValueError, match="nothing to export"):
        panel.export(tmp_path / "none.json")
    T = win.snapshot.seq_len
    _click_cell(win, T - 1, 3)
    assert win.engine.wait_idle(60) and win.last_error is None
    assert panel.export_button.isEnabled()
    path = tmp_path / "why.json"
    panel.export(path)
    got = json.loads(path.read_text(encoding="utf-8"))
    s = win.engine.session
    e = explain(s, 1, 2, T - 1, 3)
    want = json.loads(
        json.dumps(payload(s, e, head_positional_share(s, 1, 2), 64), default=lambda a: a.tolist())
    )
    same = set(want) - {
        "created",
        "sources",
    }  # the time written; the split, which the CLI adds with --sources
    assert {k: got[k] for k in same} == {k: want[k] for k in same}
    assert got["kind"] == "explain" and got["layer"] == 1 and got["head"] == 2 and got["query"] == T - 1
    assert len(got["prompt_sha256"]) == 64 and got["token_ids"] == list(s.ids)
    assert got["sources"]["score"] == pytest.approx(e.score, rel=1e-6)  # the by-source split came back
    w = panel.grab()
    w.save("/work/notes/shots/why_panel_export.png") if __import__("os").path.isdir(
        "/work/notes/shots"
    ) else None
