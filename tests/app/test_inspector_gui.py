"""Part A GUI: timeline, sampling + next token, heatmap options (aggregate, scale, range, ticks,
hover), long-prompt overview with exact tiles, GQA and Mask panels, --view screenshots (pytest-qt, offscreen)."""

from __future__ import annotations

import numpy as np
import pytest
from attnscope.app.figure import token_label
from attnscope.app.main_window import MainWindow
from attnscope.app.views.heatmap import colorbar_ticks, weight_text
from attnscope.core.analysis import aggregate
from attnscope.core.io.colormaps import normalize
from attnscope.core.sampling import Sampling
from PIL import Image
from PySide6.QtGui import QFontMetrics

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


@pytest.fixture()
def win(make_window):
    w = make_window()
    w.prompt_edit.setPlainText(PROMPT)
    w.chat_check.setChecked(False)
    w.run_prompt()
    assert w.engine.wait_idle(120)
    w.step(3)
    assert w.engine.wait_idle(120)
    assert w.last_error is None
    return w


def _session(w):
    return w.engine.session


def test_timeline_replays_steps(win):
    s = _session(win)
    n0 = win.snapshot.n_prompt
    tl = win.timeline
    assert (tl.step, tl.n_generated, tl.at_latest) == (3, 3, True)
    assert win.weights.shape == (n0 + 3, n0 + 3)
    tl.set_step(1)
    assert win.engine.wait_idle(60)
    assert win.visible_len == n0 + 1
    assert win.weights.shape == (n0 + 1, n0 + 1)
    np.testing.assert_allclose(win.weights, s.weights(win.layer, win.head)[: n0 + 1, : n0 + 1])
    assert "step 1 of 3" in win.heatmap.plot.titleLabel.text
    assert "positions 0.." + str(n0) in tl.label.text()
    # next-token panel at step 1: the token generated at step 1 is highlighted
    table = win.decode_panel.bars.table
    assert table.step == 1 and table.chosen_id == s.ids[n0 + 1]
    assert [r.id for r in table.rows] == [t.id for t in s.next_token_probs(10)] or table.step != 3
    # the token strip shows the sequence as it was: n0 + 1 tokens
    assert win.token_strip.toHtml().count("tok:") == n0 + 1
    # stepping while looking back moves the timeline to the newest step first (no token is added out
    # of sight); Latest stays there
    win.step(1)
    assert win.engine.wait_idle(60)
    assert (tl.step, tl.n_generated) == (4, 4) and win.weights.shape == (n0 + 4, n0 + 4)
    tl.latest_button.click()
    assert win.engine.wait_idle(60)
    assert tl.step == 4 and win.weights.shape == (n0 + 4, n0 + 4)
    # step back at the latest step: the timeline follows
    win.step_back(2)
    assert win.engine.wait_idle(60)
    assert (tl.step, tl.n_generated) == (2, 2) and win.weights.shape == (n0 + 2, n0 + 2)
    with pytest.raises(IndexError):
        tl.set_step(3)


def test_next_token_panel_and_sampling(win):
    s = _session(win)
    table = win.decode_panel.bars.table
    assert table.step == 3 and len(table.rows) == 10 and table.chosen_id is None
    np.testing.assert_allclose(
        [r.p_model for r in table.rows], [t.prob for t in s.next_token_probs(10)], rtol=1e-6
    )
    c = win.decode_panel.controls
    assert not c.temperature.isEnabled()
    c.mode_combo.setCurrentIndex(1)
    c.temperature.setValue(0.8)
    c.top_k.setValue(5)
    c.seed.setValue(3)
    assert win.engine.wait_idle(60)
    assert s.sampling == Sampling(temperature=0.8, top_k=5, top_p=1.0, seed=3)
    table = win.decode_panel.bars.table
    assert table.sampling == s.sampling
    p = np.array([r.p_sampled for r in table.rows])
    assert np.all(p[:5] > 0) and np.all(p[5:] == 0) and p.sum() == pytest.approx(1.0)
    win.step(2)
    assert win.engine.wait_idle(60)
    assert win.snapshot.n_generated == 5
    win.grab().save("/tmp/a4_test_sampling.png")


def test_heatmap_aggregate_scale_range(win):
    s = _session(win)
    hm = win.heatmap
    win.select(4, 5)
    assert win.engine.wait_idle(60)
    hm.set_aggregate("group")
    assert win.engine.wait_idle(60)
    np.testing.assert_allclose(win.weights, np.mean([s.weights(4, h) for h in (3, 4, 5)], axis=0), atol=1e-6)
    assert "mean of KV group 1 (q3, q4, q5)" in hm.plot.titleLabel.text
    hm.set_aggregate("layer")
    assert win.engine.wait_idle(60)
    np.testing.assert_allclose(win.weights, np.mean([s.weights(4, h) for h in range(9)], axis=0), atol=1e-6)
    hm.set_aggregate("head")
    assert win.engine.wait_idle(60)
    w = win.weights
    later = np.triu(np.ones(w.shape, dtype=bool), 1)  # the causal mask's cells are drawn hatched (NaN), not 0

    def shown(x):
        return np.where(later, np.nan, x)

    from attnscope.core.io.colour_scale import scale_for_map

    assert hm.scale == scale_for_map(w).scale  # the default follows the map's own weights
    hm.set_scale("linear")
    np.testing.assert_allclose(hm.image.image, shown(w), atol=1e-7)  # linear, fixed [0, 1]
    hm.set_scale("log")
    np.testing.assert_allclose(hm.image.image, shown(normalize(w, 0, 1, "log")), atol=1e-6)
    hm.set_scale("power", gamma=0.3)
    np.testing.assert_allclose(hm.image.image, shown(normalize(w, 0, 1, "power", gamma=0.3)), atol=1e-6)
    hm.set_scale("linear")
    hm.set_range_mode("auto")
    assert hm.value_range() == (0.0, pytest.approx(aggregate.robust_max(w)))
    assert hm.value_range()[1] < 1.0
    np.testing.assert_allclose(hm.image.image, shown(np.clip(w / aggregate.robust_max(w), 0, 1)), atol=1e-5)
    hm.set_range_mode("shared")
    assert win.engine.wait_idle(60)
    assert hm.shared_max == pytest.approx(aggregate.layer_robust_max(s, 4))
    assert "(shared)" in hm.mode_label.text()
    # shared stays when switching heads of the layer
    win.select(4, 0)
    assert win.engine.wait_idle(60)
    assert hm.value_range()[1] == pytest.approx(aggregate.layer_robust_max(s, 4))


def test_colorbar_ticks_are_real_values():
    lin = colorbar_ticks(0, 1, "linear")
    assert [lab for _, lab in lin] == ["0", "0.2", "0.4", "0.6", "0.8", "1"]
    np.testing.assert_allclose([p for p, _ in lin], [0, 0.2, 0.4, 0.6, 0.8, 1.0])
    log = dict((lab, p) for p, lab in colorbar_ticks(0, 1, "log"))
    assert (
        log["1e-06"] == pytest.approx(0.0)
        and log["0.001"] == pytest.approx(0.5)
        and log["1"] == pytest.approx(1.0)
    )
    pw = dict((lab, p) for p, lab in colorbar_ticks(0, 1, "power", 0.5))
    assert pw["0.2"] == pytest.approx(0.2**0.5) and pw["0.01"] == pytest.approx(0.1)
    auto = colorbar_ticks(0, 0.12, "linear")
    assert auto[-1][0] <= 1.0 and all(float(lab) <= 0.12 for _, lab in auto)


def _bottom_extents(hm):
    """Pixel extents of the bottom tick labels as drawn."""
    ax = hm.plot.getAxis("bottom")
    fm = QFontMetrics(ax.style["tickFont"] or ax.font())
    vb = hm.plot.getViewBox()
    (x0, x1), _ = vb.viewRange()
    ppc = vb.width() / (x1 - x0)
    return [
        ((v - x0) * ppc - fm.horizontalAdvance(lab) / 2, (v - x0) * ppc + fm.horizontalAdvance(lab) / 2, lab)
        for v, lab in ax._tickLevels[0]
    ]


def test_tick_labels_readable_at_any_zoom(win):
    hm = win.heatmap
    n = win.visible_len
    for xr in ((0, n), (10, 14), (0, 4 * n)):  # whole map, far in, far out
        hm.plot.setRange(xRange=xr, yRange=(0, n), padding=0)
        ext = _bottom_extents(hm)
        assert ext, f"no labels at {xr}"
        for (_, r, _), (l2, _, _) in zip(ext[:-1], ext[1:], strict=True):
            assert l2 > r, f"labels overlap at zoom {xr}"
        left = hm.plot.getAxis("left")._tickLevels[0]
        ys = [v for v, _ in left]
        vb = hm.plot.getViewBox()
        (_, _), (y0, y1) = vb.viewRange()
        rows_px = vb.height() / (y1 - y0)
        fm = QFontMetrics(hm.plot.getAxis("left").font())
        boxes = [fm.tightBoundingRect(lab) for _, lab in left]
        for dy, a, b in zip(np.diff(ys), boxes[:-1], boxes[1:], strict=True):  # stacked glyphs never touch
            assert dy * rows_px >= a.bottom() + max(0, -b.top()), f"left labels overlap at zoom {xr}"
    hm.plot.setRange(xRange=(10, 14), yRange=(10, 14), padding=0)
    ticks = hm.plot.getAxis("bottom")._tickLevels[0]
    toks = win.snapshot.tokens
    first = int(ticks[0][0] - 0.5)
    # zoomed far in: every visible key is labelled, in order, centred on its column
    assert [lab for _, lab in ticks] == [token_label(toks[i].text) for i in range(first, first + len(ticks))]
    assert [v for v, _ in ticks] == [i + 0.5 for i in range(first, first + len(ticks))] and len(ticks) >= 4


def test_hover_readout_and_row_click(win):
    hm = win.heatmap
    toks = win.snapshot.tokens
    text = hm.cell_text(12, 3)
    assert f"#{toks[12].position}" in text and f"id {toks[3].id}" in text and repr(toks[3].raw) in text
    assert weight_text(win.weights[12, 3]) in text
    assert "masked" in hm.cell_text(3, 12) and "masked" not in text  # a later key: the causal mask
    assert not hm.row_frame.isVisible()
    hm.rowClicked.emit(5)
    assert win.query_row == 5
    assert "border:2px solid" in win.token_strip.toHtml() or "border" in win.token_strip.toHtml()
    r = hm.row_frame.rect()  # the clicked row is outlined across the map
    assert hm.row_frame.isVisible() and (r.top(), r.height(), r.width()) == (5, 1, win.snapshot.seq_len)
    win.token_strip.tokenClicked.emit(7)
    assert win.query_row == 7 and hm.row_frame.rect().top() == 7


def test_gqa_panel(win):
    s = _session(win)
    win.select(6, 4)
    win.show_view("gqa")
    assert win.engine.wait_idle(120)
    view = win.views["gqa"]
    r = view.report
    assert r.layer == 6 and r.kv_head == 1 and r.heads == (3, 4, 5)
    for i, h in enumerate(r.heads):  # masked cells are NaN (drawn hatched, not as weight 0)
        img, w = view.images[i].image, s.weights(6, h)
        np.testing.assert_array_equal(np.isnan(img), np.triu(np.ones(w.shape, bool), 1))
        np.testing.assert_allclose(img[~np.isnan(img)], w[~np.isnan(img)], atol=1e-7)
    assert view.pair_table.rowCount() == 3
    assert view.pair_table.item(0, 1).text() == f"{r.distances[3, 4]:.3f}"
    assert view.layers is not None and view.layers[1][0].shape == (30,)
    assert "KV head 1" in view.header.text()
    # the timeline crops the panel too
    win.timeline.set_step(0)
    assert win.engine.wait_idle(120)
    assert view.report.n == win.snapshot.n_prompt
    win.grab().save("/tmp/a4_test_gqa.png")


def test_mask_panel(win):
    win.select(2, 7)
    win.show_view("mask")
    assert win.engine.wait_idle(60)
    view = win.views["mask"]
    n0 = win.snapshot.n_prompt
    r = view.report
    assert (r.kind, r.L, r.S, r.layer, r.head) == ("decode", 1, n0 + 3, 2, 7)
    head = view.header.text()
    assert f"tril(ones(1, {n0 + 3}), k = {n0 + 3} − 1 = {n0 + 2})" in head and "No padding" in head
    win.timeline.set_step(0)
    assert win.engine.wait_idle(60)
    r = view.report
    assert (r.kind, r.L, r.S) == ("prefill", n0, n0)
    assert view.images[0].image.shape[:2] == (n0, n0)
    win.grab().save("/tmp/a4_test_mask_prefill.png")


@pytest.mark.parametrize("view", ["gqa", "mask"])
def test_screenshot_views(view, tmp_path, capsys):
    from attnscope.app.cli import main

    out = tmp_path / f"{view}.png"
    assert main(["--screenshot", str(out), "--prompt", "The cat sat", "--steps", "2", "--view", view]) == 0
    img = np.asarray(Image.open(out).convert("RGB"))
    assert img.shape[1] >= 1000 and len(np.unique(img.reshape(-1, 3), axis=0)) > 50


def test_screenshot_unknown_view(tmp_path, capsys):
    from attnscope.app.cli import main

    assert main(["--screenshot", str(tmp_path / "x.png"), "--prompt", "hi", "--view", "nosuch"]) == 1
    assert "unknown view" in capsys.readouterr().err


@pytest.mark.slow
def test_long_prompt_overview_and_exact_tiles(qtbot):
    """~1100 tokens (above LONG_PROMPT): a max-pooled overview, exact tiles on zoom."""
    w = MainWindow()
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    assert w.engine.wait_idle(300)
    w.prompt_edit.setPlainText(" ".join(["The quick brown fox jumps over the lazy dog."] * 110))
    w.chat_check.setChecked(False)
    w.run_prompt()
    assert w.engine.wait_idle(600)
    s = w.engine.session
    n = w.snapshot.seq_len
    assert n > aggregate.LONG_PROMPT
    hm = w.heatmap
    assert w.weights is None and hm.pooled is not None and hm.pooled.n == n

    # the overview is computed at the plot's pixel size (it uses the space the window has,
    # one block max per pixel, so a one-cell sink column is one of them)
    # (and again when the plot settles at another size than the one it was asked at)
    def at_plot_size():
        rows, cols = hm.image.image.shape
        want_cols, want_rows = hm.overview_pixels()
        return abs(cols - want_cols) <= 0.05 * cols and abs(rows - want_rows) <= 0.05 * rows

    qtbot.waitUntil(at_plot_size, timeout=60_000)
    assert w.engine.wait_idle(120)
    rows, cols = hm.image.image.shape
    assert rows < n and cols < n
    full = s.weights(w.layer, w.head)
    from attnscope.core.analysis.pooling import max_pool

    np.testing.assert_allclose(hm.pooled.image, max_pool(full, rows, cols), atol=1e-6)
    # zoom into a 120 x 120 region: an exact tile arrives and is drawn where it belongs
    hm.plot.setRange(xRange=(500, 620), yRange=(700, 820), padding=0)
    qtbot.waitUntil(lambda: hm.tile is not None, timeout=60_000)
    assert w.engine.wait_idle(60)
    tile, r0, c0 = hm.tile
    assert r0 <= 700 and c0 <= 500 and r0 + tile.shape[0] >= 820 and c0 + tile.shape[1] >= 620
    np.testing.assert_allclose(tile, full[r0 : r0 + tile.shape[0], c0 : c0 + tile.shape[1]], atol=1e-6)
    rect = hm.tile_image.mapRectToParent(hm.tile_image.boundingRect())
    assert (rect.x(), rect.y(), rect.width(), rect.height()) == (c0, r0, tile.shape[1], tile.shape[0])
    assert weight_text(full[750, 510], hm.scale) in hm.cell_text(750, 510)
    assert "block max" in hm.cell_text(50, 20)
    # the token strip still gets the exact query row
    qtbot.waitUntil(lambda: "background-color" in w.token_strip.toHtml(), timeout=30_000)
    w.grab().save("/tmp/a4_test_long_zoom.png")
    w.close()


def test_grid_follows_timeline(win):
    s = _session(win)
    n0 = win.snapshot.n_prompt
    win.show_view("grid")
    assert win.engine.wait_idle(120)
    assert win.grid.canvas.thumbs.shape == (30, 9, n0 + 3, n0 + 3)
    win.timeline.set_step(0)
    assert win.engine.wait_idle(120)
    th = win.grid.canvas.thumbs
    assert th.shape == (30, 9, n0, n0)
    np.testing.assert_allclose(th[5, 2], s.weights(5, 2)[:n0, :n0], atol=1e-7)  # n0 < 40: unpooled
