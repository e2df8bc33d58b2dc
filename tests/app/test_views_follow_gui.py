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


@pytest.mark.slow
def test_mask_opened_session_after_a_longer_run(win, qtbot, tmp_path, tiny_folder):
    """The trial's second path: a short session opened right after a longer run (Mask tab hidden)."""
    from gui_helpers import ran_window

    short = ran_window(qtbot, tiny_folder, SHORT, steps=1)
    try:
        short.sessions.save_session(tmp_path / "short.attnscope")
        _idle(short)
    finally:
        short.close()
    _show(win, "mask")
    _show(win, "heatmap")
    win.sessions.open_session(tmp_path / "short.attnscope")
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


@pytest.mark.slow
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
    win.sessions.save_session(path)
    _idle(win)
    saved = json.loads(path.read_text())["view"]
    assert saved["timeline_step"] == 2 and saved["views"]["sinks"]["step_spin"] == n0 + 2
    saved["views"]["sinks"]["step_spin"] = n0 + 3  # as the trial's file had: the full length
    path.write_text(json.dumps({**json.loads(path.read_text()), "view": saved}))
    from gui_helpers import ran_window

    other = ran_window(qtbot, tiny_folder, SHORT, steps=1)
    try:
        _show(other, "sinks")
        other.sessions.open_session(path)
        _idle(other)
        _idle(other)
        assert other.state.step == 2 and other.state.tab == "sinks"
        _assert_sinks_at(other, n0 + 2)
        _shot(other, "sinks_reopened")
    finally:
        other.close()


# -- 4. GQA groups: the length default of the colour scale, masked blocks hatched ---------------------
def test_gqa_groups_take_the_log_default_at_long_lengths(win, monkeypatch):
    """The trial: at 3,031 tokens the GQA maps stayed linear [0, 1] and almost flat while the heatmap
    and the head grid switched to log over [1e-6, 1]. The long-map length is lowered to 40 tokens
    here (the tiny model's run is 83), as the head grid's tests do."""
    from attnscope.core.io import colour_scale
    from attnscope.core.io.colormaps import normalize

    s = win.engine.session
    view = _show(win, "gqa")
    assert view.scale == "linear" and "linear colours" in view.header.text()
    monkeypatch.setattr(colour_scale, "LONG_MAP", 40)
    win.select(1, 2)
    _idle(win)
    r = view.report
    n = win.state.visible_len
    assert view.scale == "log" and f"log colours (chosen for {n:,} tokens)" in view.header.text()
    for i, h in enumerate(r.heads):
        w = s.weights(1, h)[:n, :n]
        img = view.images[i].image
        later = np.triu(np.ones(w.shape, bool), 1)
        np.testing.assert_array_equal(np.isnan(img), later)  # masked: hatched, not weight 0
        np.testing.assert_allclose(img[~later], normalize(w, 0.0, 1.0, "log")[~later], atol=1e-6)
    labels = [t for _, t in view.colorbar.axis._tickLevels[0]]
    assert "1e-06" in labels or any("10⁻⁶" in t or "1e-6" in t for t in labels), labels
    assert "masked" in view.header.text()
    _shot(win, "gqa_log")


def test_masked_blocks_equal_brute_force():
    from attnscope.app.views.head_grid import masked_blocks
    from attnscope.core.analysis.pooling import block_edges

    for n, p, win in [(7, 7, None), (10, 4, None), (100, 40, None), (50, 50, 4), (300, 40, 64), (31, 9, 5)]:
        i, j = np.mgrid[0:n, 0:n]
        allowed = j <= i
        if win is not None:
            allowed &= i - j < win
        e = block_edges(n, p)
        want = np.array(
            [[not allowed[e[a] : e[a + 1], e[b] : e[b + 1]].any() for b in range(p)] for a in range(p)]
        )
        np.testing.assert_array_equal(masked_blocks(n, p, win), want, err_msg=f"{n} {p} {win}")


# -- 5. Head grid: the corner note fits, masked and pending cells are not the colour of 1e-6 -----------
def test_head_grid_hatches_masked_cells_and_fits_its_note(qtbot):
    from attnscope.app.views.head_grid import MASK_HATCH, PENDING_RGB, HeadGridView, masked_blocks
    from attnscope.core.io.colormaps import lut
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QFontMetrics

    v = HeadGridView()
    qtbot.addWidget(v)
    c = v.canvas
    c.cmap = "magma"
    L, H, P, n = 4, 6, 40, 3031
    rng = np.random.default_rng(0)
    thumbs = np.tril(rng.uniform(1e-7, 1.0, (L, H, P, P)).astype(np.float32))
    thumbs[..., 0, 0] = 1.0
    thumbs[3] = 0.0  # not computed yet (a partial grid)
    c.set_note("partial: 30% of layers")
    c.set_thumbnails(thumbs, 3, "attention", n=n)
    v.show_scale()
    assert c.scale == "log" and "masked (not a weight of 0)" in v.title.text()
    assert "partial: 30% of layers" in v.title.text()
    # the note wraps inside the corner at the font it is drawn with (it was cut after "30% of")
    rect = c.corner_rect()
    got = QFontMetrics(c.corner_font(c.note)).boundingRect(rect, int(Qt.AlignLeft | Qt.TextWordWrap), c.note)
    assert got.height() <= rect.height() and got.width() <= rect.width()
    canvas = c._canvas
    masked = masked_blocks(n, P)
    x, y = c.head_x(1), c.layer_y(0)
    cell = canvas[y : y + c.THUMB, x : x + c.THUMB]  # THUMB == P: one pixel per block
    lowest = lut("magma")[0]
    colours = {tuple(px) for px in cell[masked]}
    assert colours <= {(255, 255, 255), MASK_HATCH} and MASK_HATCH in colours
    assert not (cell[masked] == lowest).all(axis=-1).any()  # never the colour of 1e-6
    assert (cell[~masked] != 255).any()
    pending = canvas[c.layer_y(3) : c.layer_y(3) + c.THUMB, c.head_x(0) : c.head_x(0) + c.THUMB]
    assert (pending == PENDING_RGB).all()
    v.resize(700, 400)
    v.show()
    v.grab().save(f"{SHOTS}/viewsfix_grid_partial.png")


def test_head_grid_hatches_keys_outside_a_sliding_window(qtbot, tmp_path):
    """A sliding-window model (tiny Gemma 3: window 4 on layers 0 and 2): the grid knows each layer's
    window (from the snapshot), so blocks outside it are hatched, not drawn as the lowest weight."""
    from attnscope.app.views.head_grid import MASK_HATCH, masked_blocks
    from gui_helpers import ran_window
    from tiny_models import save_tiny

    folder = tmp_path / "gemma3"
    save_tiny("gemma3_text", folder)
    w = ran_window(qtbot, folder, LONG, steps=2)
    try:
        assert w.snapshot.layer_windows == tuple(w.engine.session.backend.layer_windows()) == (4, None, 4)
        _show(w, "grid")
        c = w.grid.canvas
        assert c.windows == (4, None, 4)
        n, P = w.state.visible_len, c.THUMB
        sliding, full = masked_blocks(n, P, 4), masked_blocks(n, P, None)
        assert (sliding & ~full).any()  # blocks only the window hides
        for layer, masked in ((0, sliding), (1, full)):
            y, x = c.layer_y(layer), c.head_x(0)
            cell = c._canvas[y : y + c.THUMB, x : x + c.THUMB]
            colours = {tuple(px) for px in cell[masked]}
            assert colours <= {(255, 255, 255), MASK_HATCH}, layer
    finally:
        w.close()
