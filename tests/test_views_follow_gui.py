"""The Mask, Sinks and GQA tabs follow the sequence and the timeline whatever the order of events
(a tab hidden while the run or the timeline changes, a shorter or longer run, a reopened session,
a step back), and their panels line up (pytest-qt, offscreen, tiny random llama models)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PySide6.QtCore import QPointF

SHOTS = "/work/notes/shots"
LONG = "The cat sat on the mat. The dog sat on the log. The cat sat on the mat again today."
SHORT = "Hi."


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tiny_models import save_tiny

    folder = tmp_path_factory.mktemp("llama_views")
    save_tiny("llama", folder)
    return folder


@pytest.fixture()
def win(qtbot, tiny_folder):
    from gui_helpers import ran_window

    w = ran_window(qtbot, tiny_folder, LONG, steps=4)
    yield w
    w.close()


def _idle(w):
    assert w.engine.wait_idle(60)
    assert w.last_error is None, w.last_error


def _show(w, key):
    w.show_view(key)
    _idle(w)
    return w.views[key]


def _shot(w, name):
    import os

    os.makedirs(SHOTS, exist_ok=True)
    w.grab().save(f"{SHOTS}/viewsfix_{name}.png")


# -- 1. Mask: no stale report redrawn against another sequence ----------------------------------------
def _assert_mask_matches(w):
    view = w.views["mask"]
    r = view.report
    assert r is not None and r.S == w.state.visible_len and r.step == w.state.step
    assert len(view.report_tokens) == w.snapshot.seq_len
    labels = [t for t, _ in view.plots[0].getAxis("bottom")._tickLevels[0]]
    assert max(labels) < r.S  # key ticks within the report's keys


def test_mask_tab_survives_a_shorter_run_then_a_colour_change(win, qtbot):
    """The trial: Mask tab shown, back to Heatmap, Run "Hi.", change Colours: IndexError in _ticks."""
    view = _show(win, "mask")
    long_len = win.snapshot.seq_len
    assert view.report.S == long_len
    _show(win, "heatmap")
    win.prompt_edit.setPlainText(SHORT)
    win.run_prompt()
    _idle(win)
    assert win.snapshot.seq_len < long_len
    assert view.report is None  # the long run's report is dropped, not redrawn on 3 tokens
    win.cmap_combo.setCurrentText("plasma")  # raised IndexError
    view.resize(view.width() - 20, view.height())  # a resize redraws the ticks too
    view.set_colormap("magma")
    _show(win, "mask")
    _assert_mask_matches(win)
    assert view.report.S == win.snapshot.seq_len


@pytest.mark.parametrize("order", ["longer", "step_back", "timeline_hidden", "timeline_shown"])
def test_mask_tab_follows_every_length_change(win, order):
    """Beyond the sample: a longer run after a shorter one, a step back, the timeline moved with the
    tab hidden or shown; then colours and a redraw: the report always matches the state."""
    view = _show(win, "mask")
    if order == "longer":
        _show(win, "heatmap")
        win.prompt_edit.setPlainText(SHORT)
        win.run_prompt()
        _idle(win)
        _show(win, "mask")
        _show(win, "heatmap")
        win.prompt_edit.setPlainText(LONG + " " + LONG)
        win.run_prompt()
        _idle(win)
    elif order == "step_back":
        _show(win, "heatmap")
        win.step_back(3)
        _idle(win)
    elif order == "timeline_hidden":
        _show(win, "heatmap")
        win.timeline.set_step(1)
        _idle(win)
    else:
        win.timeline.set_step(2)
        _idle(win)
        _assert_mask_matches(win)
        assert view.report.step == 2
        win.timeline.set_step(0)
        _idle(win)
        assert view.report.kind == "prefill"
    win.cmap_combo.setCurrentText("inferno")
    view.set_colormap("viridis")
    _show(win, "mask")
    _assert_mask_matches(win)


def test_mask_opened_session_after_a_longer_run(win, qtbot, tmp_path, tiny_folder):
    """The trial's second path: a short session opened right after a longer run (Mask tab hidden)."""
    from gui_helpers import ran_window

    short = ran_window(qtbot, tiny_folder, SHORT, steps=1)
    try:
        short.exports.save_session(tmp_path / "short.attnscope")
        _idle(short)
    finally:
        short.close()
    _show(win, "mask")
    _show(win, "heatmap")
    win.exports.open_session(tmp_path / "short.attnscope")
    _idle(win)
    _idle(win)
    win.cmap_combo.setCurrentText("plasma")
    _show(win, "mask")
    _assert_mask_matches(win)


# -- 2. Mask: four panels in the window, rows aligned ---------------------------------------------------
def _row_y(plot, y: float) -> float:
    return plot.getViewBox().mapViewToScene(QPointF(0.0, y)).y()


def test_mask_panels_fit_and_their_rows_line_up(win):
    win.timeline.set_step(0)  # prefill: the four panels are row maps
    _idle(win)
    view = _show(win, "mask")
    r = view.report
    assert r.kind == "prefill"
    win.repaint()
    plots = view.plots + [view.ent_plot]
    for row in (r.row_start + 0.5, (r.row_start + r.row_stop) / 2, r.row_stop - 0.5):
        ys = [_row_y(p, row) for p in plots]
        assert max(ys) - min(ys) <= 1.0, ys  # the same pixel row in every panel
    right = view.glw.viewport().width()
    for p in plots:  # nothing cut on the right: each panel's plot area inside the view
        assert p.getViewBox().sceneBoundingRect().right() <= right + 0.5
    page = win.tabs.page_of(view)
    assert page.horizontalScrollBar().maximum() == 0  # the page needs no horizontal scrolling
    _shot(win, "mask_prefill")
    win.timeline.set_step(win.timeline.n_generated)
    _idle(win)
    assert view.report.kind == "decode"
    _shot(win, "mask_decode")


# -- 3. Sinks: the table and the row plot follow the timeline -------------------------------------------
def _assert_sinks_at(w, n: int):
    view = w.views["sinks"]
    assert view.step_spin.value() == n
    np.testing.assert_allclose(view.table_values(), view.report.at_seq_len(n))
    x, _y = view.row_curve.getData()
    assert x[-1] == n - 1  # the plot's last row is the table's last row
    _x, m = view.mean_curve.getData()
    layer, head = w.state.layer, w.state.head
    assert m[-1] == pytest.approx(float(view.report.running[layer, head, n - 1]))
    if n < view.report.seq_len:
        assert f"after {n} of {view.report.seq_len}" in view.summary.text()


def test_sinks_follow_a_timeline_moved_while_hidden(win):
    """The trial: timeline at step 3 of 5 before the Sinks tab was ever shown: the table said seq_len
    47 'now' and the plot reached row 46; then moving the timeline on the tab left the plot behind."""
    n0 = win.snapshot.n_prompt
    win.timeline.set_step(2)
    _idle(win)
    view = _show(win, "sinks")
    assert view.report.seq_len == n0 + 4
    _assert_sinks_at(win, n0 + 2)
    assert "now" not in view.summary.text()
    win.timeline.set_step(1)  # on the tab
    _idle(win)
    _assert_sinks_at(win, n0 + 1)
    win.select(1, 2)
    _assert_sinks_at(win, n0 + 1)
    view.metric_combo.setCurrentIndex(1)  # another metric keeps the length
    assert view.step_spin.value() == n0 + 1
    view.metric_combo.setCurrentIndex(0)
    _show(win, "heatmap")
    win.timeline.set_step(3)  # hidden again
    _idle(win)
    _show(win, "sinks")
    _assert_sinks_at(win, n0 + 3)
    win.timeline.set_step(4)
    _idle(win)
    _assert_sinks_at(win, n0 + 4)
    assert "now" in view.summary.text()
    _shot(win, "sinks_latest")


def test_sinks_follow_a_new_sequence_and_a_reopened_session(win, qtbot, tmp_path, tiny_folder):
    """After Back, after a new run with the timeline moved before the tab is shown, and in a session
    reopened at timeline step 2 (the saved step_spin said the full length)."""
    n0 = win.snapshot.n_prompt
    _show(win, "sinks")
    win.step_back(1)
    _idle(win)
    _assert_sinks_at(win, n0 + 3)
    win.timeline.set_step(2)
    _idle(win)
    _assert_sinks_at(win, n0 + 2)
    path = tmp_path / "s.attnscope"
    win.exports.save_session(path)
    _idle(win)
    saved = json.loads(path.read_text())["view"]
    assert saved["timeline_step"] == 2 and saved["views"]["sinks"]["step_spin"] == n0 + 2
    saved["views"]["sinks"]["step_spin"] = n0 + 3  # as the trial's file had: the full length
    path.write_text(json.dumps({**json.loads(path.read_text()), "view": saved}))
    from gui_helpers import ran_window

    other = ran_window(qtbot, tiny_folder, SHORT, steps=1)
    try:
        _show(other, "sinks")
        other.exports.open_session(path)
        _idle(other)
        _idle(other)
        assert other.state.step == 2 and other.state.tab == "sinks"
        _assert_sinks_at(other, n0 + 2)
        _shot(other, "sinks_reopened")
    finally:
        other.close()
