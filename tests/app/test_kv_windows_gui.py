"""In the window, on a tiny Gemma 3 (3 layers: sliding 4, global, sliding 4): the KV tab
and the status bar show what the model needs and what AttnScope keeps; the KV plots leave the wheel to
the page and never show negative ranges; the heatmap draws masked cells (causal and outside the window)
as hatched, not as weight 0; the Mask tab names the global layer; every token is labelled when the
labels fit; sorting the Head roles table shows its top (pytest-qt, offscreen)."""

from __future__ import annotations

import numpy as np
import pytest
from gui_helpers import ran_window
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QFontMetrics, QWheelEvent
from PySide6.QtWidgets import QApplication
from tiny_models import save_tiny

PROMPT = "The cat sat on the mat, then it slept."


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma3_text")
    save_tiny("gemma3_text", folder)
    return folder


@pytest.fixture()
def win(qtbot, gemma_folder):
    w = ran_window(qtbot, gemma_folder, PROMPT, steps=0)
    yield w
    w.close()


def _show(win, key):
    win.show_view(key)
    assert win.engine.wait_idle(120)
    assert win.last_error is None, win.last_error
    return win.views[key]


def test_kv_tab_and_status_bar_show_the_models_need(win):
    view = _show(win, "kv")
    T = win.snapshot.seq_len
    per = 2 * 2 * 16 * 4  # K + V, 2 KV heads of 16, float32
    need, kept = (min(T, 4) + T + min(T, 4)) * per, 3 * T * per
    assert view.live.config.windows == (4, None, 4)
    assert (view.live.model_bytes, view.live.total_bytes) == (need, kept)
    text = view.live_label.text()
    assert (
        "Model needs" in text
        and f"{need:,} B" in text
        and "AttnScope keeps" in text
        and f"{kept:,} B" in text
    )
    assert f"(1 × {T} + 2 × {min(T, 4)})" in text and "✓ equal" in text
    # the bars: the model's need in front of what AttnScope keeps
    np.testing.assert_allclose(
        view.layer_bars.opts["height"] / view.kept_bars.opts["height"], [min(T, 4) / T, 1, min(T, 4) / T]
    )
    assert "(model)" in win.kv_label.text() and "kept" in win.kv_label.text()
    assert f"{need:,} bytes" in win.kv_label.toolTip() and f"{kept:,} bytes" in win.kv_label.toolTip()
    # the scheme table and the projection count the windows
    assert view.live.schemes_now[1].total_bytes == need and view.live.schemes_now[1].is_given
    x, y = view.need_curve.getData()
    assert list(x) == [0, 4, x[-1]]
    # "This model" fills the calculator with the model's window and its layers
    view.preset_combo.setCurrentIndex(0)
    assert (view.calc_window.value(), view.calc_sliding.currentText()) == (
        4,
        "1:1",
    )  # sliding, global, sliding
    view.calc_tokens.setValue(T)
    assert view.calc_rows()[1][2] == need


def test_calculator_windows(win):
    view = _show(win, "kv")
    view.preset_combo.setCurrentIndex(
        view.preset_combo.findData("Gemma-3-270M, window 512 (5:1), 32768 tokens")
    )
    assert view.calc_config().windows == tuple(None if (i + 1) % 6 == 0 else 512 for i in range(18))
    assert view.calc_rows()[-1] == ("MQA", 1, 217_055_232 // 2)  # bf16
    assert "108,527,616 bytes" in view.calc_result.text() and "15 of 18 layers" in view.calc_result.text()
    view.calc_sliding.setCurrentText("0-40")  # bad input: one clear line, no table
    assert "layers run 0..17" in view.calc_result.text() and view.calc_table.rowCount() == 0
    view.calc_sliding.setCurrentText("all")
    view.calc_window.setValue(0)  # no window: the plain formula
    assert view.calc_rows()[-1][2] == 2 * 18 * 256 * 32768 * 2
    # the handbook's table is untouched
    view.preset_combo.setCurrentIndex(view.preset_combo.findData("Llama-2-70B, 8192 tokens"))
    assert [r[2] for r in view.calc_rows()] == [21_474_836_480, 2_684_354_560, 335_544_320]


def _wheel(widget, dy: int = -120) -> None:
    pos = QPointF(widget.width() / 2, widget.height() / 2)
    ev = QWheelEvent(
        pos,
        widget.mapToGlobal(pos),
        QPoint(0, 0),
        QPoint(0, dy),
        Qt.NoButton,
        Qt.NoModifier,
        Qt.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(widget, ev)


def test_kv_plots_leave_the_wheel_to_the_page(win):
    view = _show(win, "kv")
    win.resize(1000, 560)  # the page must scroll
    QApplication.processEvents()
    page = win.tabs.page_of(view)
    bar = page.verticalScrollBar()
    assert bar.maximum() > 0
    bar.setValue(0)
    for plot in (view.layer_plot, view.growth_plot, view.proj_plot):
        vb = plot.getPlotItem().getViewBox()
        before = vb.viewRange()
        _wheel(plot.viewport())
        QApplication.processEvents()
        assert vb.viewRange() == before  # no zoom
        # ranges never below 0 (the per-layer bars start at -1 for bar 0's half width)
        vb.setXRange(-500, 10, padding=0)
        vb.setYRange(-500, 10, padding=0)
        (x0, _), (y0, _) = vb.viewRange()
        assert x0 >= -1.0 and y0 >= 0.0
    assert bar.value() > 0  # the wheel scrolled the page


def test_heatmap_draws_masked_cells_outside_the_colour_map(win):
    hm = win.heatmap
    T = win.snapshot.seq_len
    win.show_view("kv")  # the KV tab's measurement knows the windows
    assert win.engine.wait_idle(60)
    _show(win, "heatmap")
    win.layer_spin.setValue(0)  # sliding, window 4
    assert win.engine.wait_idle(60)
    assert hm.mask_window == 4
    img = hm.image.image
    q, k = np.arange(T)[:, None], np.arange(T)[None, :]
    masked = (k > q) | (k <= q - 4)
    assert np.isnan(img[masked]).all() and np.isfinite(img[~masked]).all()
    assert "outside the 4-key sliding window" in hm.mask_legend.text
    assert "outside the 4-key sliding window" in hm.cell_text(T - 1, 0)
    assert hm.mask_bg.isVisible()
    win.layer_spin.setValue(1)  # global: the causal mask only
    assert win.engine.wait_idle(60)
    assert hm.mask_window is None
    assert np.isnan(hm.image.image[k > q]).all() and np.isfinite(hm.image.image[k <= q]).all()
    assert "causal mask)" in hm.mask_legend.text
    hm.set_aggregate("all")  # mean of all layers: a cell is masked only where every layer masks it
    assert win.engine.wait_idle(60)
    assert hm.mask_window is None and np.isfinite(hm.image.image[T - 1, 0])


def test_mask_tab_names_the_windowed_layers(win):
    win.layer_spin.setValue(1)
    view = _show(win, "mask")
    assert (
        view.report.window_note == "This layer is global (full causal mask); layers 0, 2 use a 4-key window."
    )
    assert "This layer is global" in view.header.text()
    win.layer_spin.setValue(0)
    assert win.engine.wait_idle(60)
    assert (
        view.report.window_note.startswith("Sliding window: 4 keys")
        and "Layer 1 is global." in view.report.window_note
    )


def test_every_token_labelled_when_the_labels_fit(qtbot):
    from attnscope.app.views.heatmap import HeatmapView, stacked_label_pitch
    from attnscope.core.tokens import Token

    words = ("The cat sat on the mat and the dog sat on the log while it rained " * 4).split()[:50]
    toks = [Token(i, 100 + i, w, w) for i, w in enumerate(words)]
    w = np.tril(np.ones((50, 50), np.float32))
    w /= w.sum(1, keepdims=True)
    hm = HeatmapView()
    qtbot.addWidget(hm)
    for height, all_rows in ((1000, True), (420, False)):
        hm.resize(900, height)
        hm.show()
        hm.set_weights(w, toks, toks)
        QApplication.processEvents()
        hm._update_ticks()
        ax = hm.plot.getAxis("left")
        fm = QFontMetrics(ax.style["tickFont"] or ax.font())
        px = hm.plot.getViewBox().height() / np.diff(hm.plot.getViewBox().viewRange()[1])[0]
        fits = px >= stacked_label_pitch(fm, [t.text for t in toks])
        assert fits == all_rows, (px, height)
        ticks = ax._tickLevels[0]
        if all_rows:
            assert [t[1] for t in ticks] == words  # every token, at 9 pt
        else:
            steps = set(np.diff([t[0] for t in ticks]))
            assert len(ticks) < 50 and len(steps) == 1  # a regular subset
    # the measure is the glyphs' ink, under the font's line height
    assert stacked_label_pitch(fm, ["on", "a"]) < fm.height()


def test_roles_sort_keeps_the_top_in_view(win, qtbot):
    view = _show(win, "roles")
    table = view.table
    win.resize(1000, 500)
    QApplication.processEvents()
    bar = table.verticalScrollBar()
    assert bar.maximum() > 0
    bar.setValue(bar.maximum())
    header = table.horizontalHeader()
    header.sectionClicked.emit(5)  # what a header click sends (the table sorts on it too)
    table.sortItems(5, Qt.DescendingOrder)
    qtbot.waitUntil(lambda: bar.value() == 0, timeout=2000)
    assert table.rowViewportPosition(0) == 0


def test_exported_figure_hatches_masked_cells(tmp_path, qtbot):
    """The labelled figure (SVG/PDF/--figure PNG) draws masked cells as the window does: the map's
    weight-0 colour appears nowhere when every zero is a masked cell."""
    from attnscope.app.figure import figure_mask, save_heatmap_figure
    from attnscope.core.io.colormaps import to_rgb
    from attnscope.core.tokens import Token
    from PIL import Image

    n, W = 12, 4
    toks = [Token(i, 100 + i, f"t{i}", f"t{i}") for i in range(n)]
    q, k = np.arange(n)[:, None], np.arange(n)[None, :]
    allowed = (k <= q) & (k > q - W)
    w = allowed / allowed.sum(1, keepdims=True)
    meta = {"mask": {"kind": "causal", "sliding_window": W}, "aggregate": "head"}
    np.testing.assert_array_equal(figure_mask(w.shape, toks, toks, meta), ~allowed)
    np.testing.assert_array_equal(figure_mask(w.shape, toks, toks, dict(meta, aggregate="all")), k > q)
    assert figure_mask(w.shape, None, None, meta) is None
    zero = tuple(int(c) for c in to_rgb(np.zeros((1, 1)), "viridis", 0.0, 1.0, "linear", 0.5)[0, 0])

    def count(path, rgb):
        return int(np.all(np.asarray(Image.open(path).convert("RGB")) == rgb, axis=-1).sum())

    win_png = save_heatmap_figure(w, tmp_path / "win.png", tokens=toks, metadata=meta)
    causal_png = save_heatmap_figure(
        w,
        tmp_path / "causal.png",
        tokens=toks,
        metadata=dict(meta, mask={"kind": "causal", "sliding_window": None}),
    )
    assert count(win_png, (150, 150, 150)) > count(causal_png, (150, 150, 150)) > 0  # the hatch
    # weight 0's colour: only the colour bar's bottom with the window; the 36 cells outside it without
    assert count(causal_png, zero) > count(win_png, zero) + 30 * 40 * 40
