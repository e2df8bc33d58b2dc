"""Long maps in the GUI: progressive results reach the GUI thread in order, a new prompt stops the old
view jobs at once, colours are chosen by length (and the user's choice wins), the overview is sized
to the plot, partial/stale states are said in the title."""

from __future__ import annotations

import threading

import numpy as np
from attnscope.app.engine import Engine
from attnscope.app.views.head_grid import HeadGridCanvas
from attnscope.app.views.heatmap import HeatmapView
from attnscope.core.analysis.aggregate import PooledMap
from attnscope.core.tokens import Token


def test_partial_results_arrive_before_the_result(qtbot):
    e = Engine()
    try:
        got: list = []

        def job(ctx):
            for i in range(3):
                ctx.partial(i)
            return "done"

        e.submit(
            "view", job, lambda r: got.append(("done", r)), on_partial=lambda p: got.append(("partial", p))
        )
        assert e.wait_idle(30)
        assert got == [("partial", 0), ("partial", 1), ("partial", 2), ("done", "done")]
        # a job without on_partial: partial results are dropped, nothing breaks
        e.submit("view", job, got.append)
        assert e.wait_idle(30) and got[-1] == "done"
    finally:
        e.shutdown()


def test_a_superseded_request_gets_no_partials(qtbot):
    e = Engine()
    try:
        got: list = []
        gate = threading.Event()
        e.enqueue(lambda ctx: gate.wait(10), label="block")

        def job(ctx, tag):
            ctx.partial(tag)
            return tag

        e.submit("view", lambda ctx: job(ctx, "old"), got.append, on_partial=lambda p: got.append(("p", p)))
        e.submit("view", lambda ctx: job(ctx, "new"), got.append, on_partial=lambda p: got.append(("p", p)))
        gate.set()
        assert e.wait_idle(30)
        assert got == [("p", "new"), "new"]
    finally:
        e.shutdown()


def _tokens(n):
    return [Token(position=i, id=i, text=f"t{i}", raw=f"t{i}") for i in range(n)]


def test_colours_chosen_by_length_until_the_user_picks(qtbot):
    hm = HeatmapView()
    qtbot.addWidget(hm)
    assert hm.apply_length_defaults(100) == "linear colours" and hm.scale == "linear"
    assert hm.apply_length_defaults(4096) == "log colours (chosen for 4,096 tokens)" and hm.scale == "log"
    assert not hm.plot.getViewBox().state["aspectLocked"]  # a long overview fills the plot's rectangle
    assert hm.apply_length_defaults(300) == "linear colours" and hm.scale == "linear"
    assert hm.plot.getViewBox().state["aspectLocked"]
    hm.scale_combo.setCurrentText("power")
    hm.scale_combo.activated.emit(hm.scale_combo.currentIndex())  # what a user's click emits
    assert hm.apply_length_defaults(4096) == "power colours" and hm.scale == "power"


def test_overview_pixels_follow_the_plot(qtbot):
    hm = HeatmapView()
    qtbot.addWidget(hm)
    hm.resize(1400, 700)
    hm.show()
    qtbot.waitExposed(hm)
    cols, rows = hm.overview_pixels()
    rect = hm.plot.getViewBox().sceneBoundingRect()
    assert cols > rows  # a wide window: a wide overview
    assert cols <= rect.width() * hm.devicePixelRatioF() and rows <= rect.height() * hm.devicePixelRatioF()


def test_partial_and_stale_titles(qtbot):
    hm = HeatmapView()
    qtbot.addWidget(hm)
    n = 40
    re = np.linspace(0, n, 9).round().astype(int)
    pm = PooledMap(np.full((8, 8), 0.1, np.float32), re, re, n, "max", 0.5)
    assert pm.partial
    hm.set_overview(pm, _tokens(n), title="Layer 0")
    hm.show_status("Layer 0", "partial: 50% of rows, refining")
    assert "partial: 50% of rows" in hm.plot.titleLabel.text
    hm.show_status("Layer 0")
    hm.mark_stale("stale: previous prompt")
    assert "Layer 0" in hm.plot.titleLabel.text and "stale: previous prompt" in hm.plot.titleLabel.text


def test_head_grid_note(qtbot):
    c = HeadGridCanvas()
    qtbot.addWidget(c)
    c.set_thumbnails(np.zeros((2, 4, 5, 5), np.float32), 2)
    c.set_note("partial: 50% of layers")
    assert c.note == "partial: 50% of layers"
    img = c.grab().toImage()
    assert not img.isNull()


def test_window_long_map_overview_and_new_prompt_cancels(qtbot, tmp_path, monkeypatch):
    """In the window: a long map (threshold lowered for a tiny model) arrives as a max-pooled overview
    sized to the plot, its title says the pooling and the colour scale; a new prompt stops a view job
    that is still running (its cancel token turns true at once) and marks the old map stale."""
    from attnscope.app.main_window import MainWindow
    from attnscope.core.analysis import aggregate
    from tiny_models import save_tiny

    save_tiny("llama", tmp_path, seed=1)
    monkeypatch.setattr(aggregate, "LONG_PROMPT", 8)
    w = MainWindow(model=str(tmp_path))
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    try:
        assert w.engine.wait_idle(120)
        w.prompt_edit.setPlainText("a long map is a short map seen from far away, they say, and so on and on")
        w.chat_check.setChecked(False)
        w.run_prompt()
        assert w.engine.wait_idle(120) and w.last_error is None
        hm = w.heatmap
        assert hm.pooled is not None and not hm.pooled.partial
        title = hm.plot.titleLabel.text
        assert "overview: max-pooled" in title and "linear colours" in title and "partial" not in title
        # a view job that is still running sees its token turn true when a new prompt is run
        token = w.cancel_token("heatmap")
        assert not token()
        w.prompt_edit.setPlainText("another prompt")
        w.run_prompt()
        assert token()
        assert "stale" in hm.plot.titleLabel.text
        assert w.engine.wait_idle(120) and w.last_error is None
        assert "stale" not in hm.plot.titleLabel.text
    finally:
        w.close()


def test_a_wrapped_title_stays_inside_the_plot(qtbot):
    """A title too long for the map (a long prompt's title plus "stale: …") wraps and is centred as
    wrapped: it was placed as if unwrapped, cut off on the left (seen under Xvfb at 3,922 tokens)."""
    hm = HeatmapView()
    qtbot.addWidget(hm)
    hm.resize(900, 600)
    hm.show()
    n = 40
    re = np.linspace(0, n, 9).round().astype(int)
    hm.set_overview(PooledMap(np.full((8, 8), 0.1, np.float32), re, re, n, "max", 1.0), _tokens(n), title="x")
    qtbot.wait(50)
    long_title = "Layer 0 · query head 0 (reads KV head 0) · seq_len 3922 · log colours (chosen for 3,922 tokens) · overview: max-pooled"
    hm.show_status(long_title, "stale: previous prompt (running the new one…)")
    label = hm.plot.titleLabel
    text_box = label.mapRectFromItem(label.item, label.item.boundingRect())
    assert label.item.textWidth() > 0  # wrapped to the map's width
    assert text_box.left() >= label.rect().left() - 1 and text_box.right() <= label.rect().right() + 1
