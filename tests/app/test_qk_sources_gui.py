"""The Why panel's By source box (pytest-qt, offscreen): after a click on a heatmap cell the engine
computes the cell's split by source and the box shows its largest pairs as bars, which with the rest add up
to the score; the frozen-scale approximation is stated under them; a key after the query says there is no
score to split."""

from __future__ import annotations

import pytest
from gui_helpers import ran_window
from test_why_gui import _click_cell
from tiny_models import save_tiny

PROMPT = "ttt tt t tt ttt t"


@pytest.fixture()
def win(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny("llama", tmp_path / "m")
    w = ran_window(qtbot, tmp_path / "m", PROMPT)
    yield w
    w.close()


def test_by_source_box_shows_the_split(win, qtbot):
    from attnscope.core.analysis.qk_sources import source_split

    win.select(1, 3)
    win.show_view("heatmap")
    assert win.engine.wait_idle(60)
    T = win.snapshot.seq_len
    _click_cell(win, T - 1, 4)
    panel = win.why_panel
    qtbot.waitUntil(lambda: panel.source_bars is not None and bool(panel.source_bars.rows), timeout=60000)
    assert win.last_error is None and panel.sources_box.isVisible()
    want = source_split(win.engine.session, 1, 3, T - 1, 4)
    bars = panel.source_bars
    assert [r[0] for r in bars.rows[:-1]] == [f"q {q} × k {k}" for q, k, _ in want.pairs]
    assert bars.total() == pytest.approx(want.score, rel=1e-4)
    assert "frozen" in bars.note.text() and "frozen" in bars.note.toolTip()
    assert "Key built by:" in bars.totals.text()
    win.resize(1500, 1000)
    import os

    shots = os.environ.get("ATTNSCOPE_SHOTS")
    if shots:
        win.grab().save(os.path.join(shots, "sources_why_panel.png"))
    # a key after the query: the box says there is nothing to split, no bars
    panel.show_sources(None)
    assert "after the query" in panel.sources_status.text() and not bars.isVisible()
