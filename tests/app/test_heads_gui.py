"""The "Which heads matter" tab (pytest-qt, offscreen): Run ablates every head on the engine thread and
shows the grid, the table sorted by effect (with each head's direct logit attribution) and a summary
naming the target; a row click selects the head; a new run marks the result out of date; a one-token
check is one status line; Cancel stops the sweep."""

from __future__ import annotations

import numpy as np
import pytest
from gui_helpers import ran_window
from tiny_models import save_tiny

PROMPT = "ttt tt t tt ttt t"


@pytest.fixture()
def win(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny("llama", tmp_path / "m")
    w = ran_window(qtbot, tmp_path / "m", PROMPT)
    yield w
    w.close()


def test_run_fills_grid_and_table_with_the_core_numbers(win, tmp_path, qtbot):
    from attnscope.core.analysis.head_effects import head_effects, logit_attribution, make_target

    win.show_view("heads")
    view = win.views["heads"]
    view.target_edit.setText("t")
    view.run()
    assert win.engine.wait_idle(120) and win.last_error is None
    eff, dla, note, tok, _, prov = view.result
    assert prov["prompt"] == PROMPT and prov["method"] == "zero" and prov["scope"] == "readout"
    s = win.engine.session
    want = head_effects(s, make_target(s, "logprob", token="t"))
    np.testing.assert_array_equal(eff.query, want.query)
    np.testing.assert_array_equal(dla.heads, logit_attribution(s, want.target).heads)
    assert view.table.rowCount() == s.info.n_layers * (s.info.n_heads + s.info.n_kv_heads)
    first = float(view.table.item(0, 3).data(0x0100))  # sorted: the largest fall first
    assert first == pytest.approx(np.nanmin(np.concatenate([eff.query.ravel(), eff.kv.ravel()])))
    assert "log p('t')" in view.summary.text() and view.run_button.isEnabled()
    img = view.image.image
    assert img.shape == (s.info.n_layers, s.info.n_heads)  # rows are layers (row-major, not transposed)
    np.testing.assert_array_equal(img, eff.query)
    win.resize(1400, 900)
    win.grab().save(str(tmp_path / "heads_tab.png"))
    # colour by direct logit attribution: the tab's grid and the Head grid's frames follow
    view.show_combo.setCurrentIndex(view.show_combo.findData("dla"))
    np.testing.assert_array_equal(view.image.image, dla.heads)
    np.testing.assert_array_equal(win.grid.canvas.effects, dla.heads)
    assert win.grid.canvas.effects_label == "direct logit attribution"
    assert "frames: direct logit attribution" in win.grid.title.text()
    win.show_view("grid")
    assert win.engine.wait_idle(120)
    qtbot.waitUntil(lambda: win.grid.canvas.thumbs is not None, timeout=60_000)
    win.grid.canvas.grab().save(str(tmp_path / "grid_frames.png"))
    win.show_view("heads")
    # exports with provenance: JSON and CSV
    import json

    view.export(str(tmp_path / "e.json"))
    data = json.loads((tmp_path / "e.json").read_text())
    assert data["prompt"] == PROMPT and data["target_text"] == "t" and data["scope"] == "readout"
    np.testing.assert_allclose(data["query_heads"], eff.query, atol=1e-6)
    view.export(str(tmp_path / "e.csv"))
    lines = (tmp_path / "e.csv").read_text().splitlines()
    assert lines[0].startswith("# model: ") and f"# prompt: {json.dumps(PROMPT)}" in lines
    rows = [r for r in lines if not r.startswith("#")]
    assert rows[0] == "layer,head,kv_head,effect,direct_logit_attribution"
    assert len(rows) == 1 + s.info.n_layers * (s.info.n_heads + s.info.n_kv_heads)
    # the session file keeps the result: a fresh tab restores it from the saved settings
    saved = win.state.to_view_dict()["views"]["heads"]
    assert saved["result"]["ids"] == list(s.ids)
    from attnscope.app.views.heads import HeadsView

    other = HeadsView(win.state, win.engine)
    other.restore_view_state(json.loads(json.dumps(saved)))
    np.testing.assert_allclose(other.result[0].query, eff.query, atol=1e-6)
    np.testing.assert_allclose(other.result[1].heads, dla.heads, atol=1e-6)
    assert other.show_combo.currentData() == "dla" and "log p('t')" in other.summary.text()
    # a row click selects the head
    view._on_clicked(0, 0)
    layer, head = view.head_at(0)
    assert (win.state.layer, win.state.head) == (layer, head)
    # a new prompt: the result says it is out of date
    win.prompt_edit.setPlainText("tt t ttt")
    win.run_prompt()
    assert win.engine.wait_idle(120)
    view.refresh()
    assert "Out of date" in view.summary.text()


def test_bad_target_is_one_line_and_the_tab_keeps_working(win):
    win.show_view("heads")
    view = win.views["heads"]
    view.target_edit.setText("tt tt")  # several tokens
    view.run()
    assert win.engine.wait_idle(120)
    assert "not one" in view.summary.text() and view.run_button.isEnabled()
    view.target_edit.setText("")
    view.metric_combo.setCurrentIndex(1)  # logit difference without a second token
    view.run()
    assert "second token" in (win.last_error or "") or "second token" in win.statusBar().currentMessage()


def test_esc_cancel_stops_the_sweep_and_run_works_again(win):
    win.show_view("heads")
    view = win.views["heads"]
    view.run()
    win.engine.cancel()  # what Esc does
    assert win.engine.wait_idle(120)
    assert "Stopped" in view.summary.text() or view.result is not None  # it may have finished first
    assert view.run_button.isEnabled() and not view.cancel_button.isEnabled()
    view.run()
    assert win.engine.wait_idle(120) and view.result is not None
