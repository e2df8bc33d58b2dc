"""What each screen shows is the truth, read by pixel or by geometry (pytest-qt, offscreen, a tiny
random llama): an export from a window never shown is laid out whole, GQA's cells are square and the
tab fits, Compare's row plot takes each row's range and has no stray "A" button, NaN/inf cells are
magenta in Compare and GQA as everywhere, the token pane keeps its query in sight, an unsupported
folder's size is not "0 B", and the default colour scale follows the map's weights."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from attnscope.core.io.colormaps import NONFINITE_RGB, lut
from attnscope.core.tokens import Token
from PIL import Image
from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QApplication

LONG = "The cat sat on the mat. The dog sat on the log. " * 4  # ~190 tiny-tokenizer tokens: diffuse maps


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tiny_models import save_tiny

    folder = tmp_path_factory.mktemp("llama_screens")
    save_tiny("llama", folder)
    return folder


@pytest.fixture()
def win(qtbot, tiny_folder):
    from gui_helpers import ran_window

    w = ran_window(qtbot, tiny_folder, LONG, steps=1)
    yield w
    w.close()


def _idle(w):
    for _ in range(4):
        assert w.engine.wait_idle(60)
        QApplication.processEvents()
    assert w.last_error is None, w.last_error


def _pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def _has_colour(img: np.ndarray, rgb, tol: int = 3) -> int:
    return int((np.abs(img - np.array(rgb)).sum(-1) <= tol).sum())


def _lut_colours(img: np.ndarray, name: str = "viridis") -> int:
    """How many of the colour map's 256 colours appear in ``img`` (a colour bar shows ~all of them)."""
    have = {tuple(c) for c in img.reshape(-1, 3)}
    return sum(tuple(int(x) for x in c) in have for c in lut(name))


def _map(n: int) -> np.ndarray:
    rng = np.random.default_rng(3)
    w = np.tril(rng.random((n, n)) ** 3 + 0.05).astype(np.float32)
    return w / w.sum(axis=1, keepdims=True)


def _toks(n: int) -> list[Token]:
    return [Token(i, 100 + i, f"t{i}", f"t{i}") for i in range(n)]


# -- an export from a widget or window never shown -----------------------------------------------------
def test_view_export_of_a_never_shown_heatmap_equals_the_shown_one(qtbot, tmp_path):
    from attnscope.app.paint import render_widget
    from attnscope.app.views.heatmap import HeatmapView

    n = 12
    pics = []
    for shown in (False, True):
        v = HeatmapView()  # never resized: the size a script gets
        qtbot.addWidget(v)
        if shown:
            v.show()
            qtbot.waitExposed(v)
        v.set_weights(_map(n), _toks(n), _toks(n), title="L0 · query head 0")
        out = render_widget(v, tmp_path / f"v{shown}.png")
        assert not v.isVisible() if not shown else v.isVisible()  # the unshown one is hidden again
        pics.append(_pixels(out))
    unshown, shown = pics
    assert unshown.shape == shown.shape and unshown.shape[1] >= 400 and unshown.shape[0] >= 300
    assert np.abs(unshown - shown).max() <= 8  # the same picture: laid out as when shown
    h, w, _ = unshown.shape
    assert _lut_colours(unshown[:, int(0.8 * w) :]) > 150  # the colour bar, at the right of the picture
    assert _has_colour(unshown[:, : int(0.8 * w)], lut("viridis")[-1]) > 20  # cell (0, 0) is 1: the map


def test_view_export_from_a_never_shown_window_has_the_whole_map_and_bar(qtbot, tiny_folder, tmp_path):
    from attnscope.app.main_window import MainWindow

    w = MainWindow(model=str(tiny_folder))
    qtbot.addWidget(w)
    assert w.engine.wait_idle(120)
    w.prompt_edit.setPlainText("The cat sat on the mat.")
    w.chat_check.setChecked(False)
    w.run_prompt()
    _idle(w)
    (out,) = w.exports.export_view(tmp_path / "view.png")[:1]
    img = _pixels(out)
    h, wd, _ = img.shape
    # laid out at the window's natural size (as a shown window), not the 100 × 6 plot of a tab never laid out
    # (offscreen the natural size is capped at 2/3 of the screen, 720 px wide: the map's share is ~440 px,
    # now that its option bar wraps instead of holding the window wider than that)
    assert wd >= 400 and h >= 180, img.shape
    assert _lut_colours(img[:, int(0.85 * wd) :], w.state.colormap) > 50  # the colour bar is in it
    assert _has_colour(img[:, : int(0.85 * wd)], lut(w.state.colormap)[-1]) > 8  # the weight-1 cell
    assert not w.isVisible()


# -- GQA --------------------------------------------------------------------------------------------------
def _gqa_fits(win):
    v = win.views["gqa"]
    page = win.tabs.widget(win.tabs.currentIndex())  # the scroll page: it must not need to scroll
    assert v.height() <= page.height() and not page.verticalScrollBar().isVisible()
    assert not page.horizontalScrollBar().isVisible()
    r = v.report
    for p in v.plots[: len(r.heads)]:
        vb = p.getViewBox()
        (x0, x1), (y0, y1) = vb.viewRange()
        rect = vb.sceneBoundingRect()
        px_per_key, px_per_query = rect.width() / (x1 - x0), rect.height() / (y1 - y0)
        assert px_per_key == pytest.approx(px_per_query, rel=0.02)  # square cells
        assert rect.width() > 60 and rect.height() > 60
        # the map fills its plot on the tighter side (the view is not zoomed out around it)
        assert min(x1 - x0, y1 - y0) <= 1.1 * r.n, ((x0, x1), (y0, y1), r.n)
        assert x0 <= 0 and x1 >= r.n and y0 <= 0 and y1 >= r.n  # ... and shows all of it
    # the tables are not cut: every row of the pair table is in its viewport
    for t in (v.pair_table, v.layer_table_widget):
        assert t.verticalHeader().length() <= t.viewport().height() + 1 or t is v.layer_table_widget
        bottom = t.mapTo(page, QPoint(0, t.height())).y()
        assert t.height() >= t.minimumHeight() and bottom <= page.height(), (bottom, page.height())
        # not clipped by the splitter's pane either
        assert t.geometry().bottom() <= t.parentWidget().height(), (t.geometry(), t.parentWidget().height())


@pytest.mark.parametrize("size", [(1400, 900), (1000, 650)])
def test_gqa_cells_are_square_and_the_tab_fits_the_window(win, size):
    win.show_view("gqa")
    _idle(win)
    win.resize(*size)
    _idle(win)
    _gqa_fits(win)
    win.resize(1200, 760)  # and it refits on resize
    _idle(win)
    _gqa_fits(win)


def test_gqa_draws_nonfinite_cells_magenta_and_names_them(win, tmp_path):
    win.show_view("gqa")
    _idle(win)
    v = win.views["gqa"]
    r = v.report
    maps = r.maps.copy()
    maps[0, 5:9, 0:3] = np.nan  # allowed cells (below the diagonal)
    v._on_report((dataclasses.replace(r, maps=maps), v.sliding_window))
    QApplication.processEvents()
    assert "NaN/inf" in v.header.text()
    img = v.glw.grab().toImage()
    path = tmp_path / "gqa.png"
    img.save(str(path))
    assert _has_colour(_pixels(path), NONFINITE_RGB, tol=10) > 4  # magenta, not transparent (= masked)


# -- Compare -----------------------------------------------------------------------------------------------
def _compared(win):
    win.show_view("compare")
    v = win.views["compare"]
    v.kind_combo.setCurrentIndex(v.kind_combo.findData("prompt"))
    v.prompt_edit.setText(LONG.replace("cat", "dog"))
    v.run_b()
    _idle(win)
    assert v.result is not None and v.maps is not None
    return v


def test_compare_row_plot_takes_each_rows_range_and_maps_have_no_auto_button(win):
    v = _compared(win)
    for p in v.plots:
        assert not p.autoBtn.isVisible()  # pyqtgraph's "A" (auto-range) button read as map A's name
    rp = v.row_plot.getPlotItem()
    rp.setXRange(0, 3)  # a zoom left over / the previous row's range
    rp.setYRange(0, 5)
    n = v.maps[0].shape[0]
    ra = np.full(n, 0.01, np.float32)
    ra[:2] = 0.02
    v.set_rows((n - 1, ra, ra * 0.5))
    (x0, x1), (y0, y1) = rp.getViewBox().viewRange()
    assert x0 <= 0.5 and x1 >= n - 1.5
    assert 0.02 <= y1 < 0.03  # this row's largest weight, not the old 5


def test_compare_draws_nonfinite_cells_magenta_and_names_them(win, tmp_path):
    v = _compared(win)
    key, (wa, wb) = v.map_key, v.maps
    wa = wa.copy()
    wa[10:14, 2:6] = np.inf
    v.set_maps((key, wa, wb.copy(), None))
    QApplication.processEvents()
    assert v._levels[0][1] < 2 and np.isfinite(v._levels[1][1])  # ranges from the finite cells
    assert not v.map_legend.isHidden() and "NaN/inf" in v.map_legend.text()
    path = tmp_path / "cmp.png"
    v.maps_widget.grab().toImage().save(str(path))
    img = _pixels(path)
    assert _has_colour(img, NONFINITE_RGB, tol=10) > 8  # in A and in A − B


# -- the token pane ----------------------------------------------------------------------------------------
def test_token_pane_opens_with_the_newest_token_in_sight(qtbot):
    from attnscope.app.token_strip import TokenStrip

    t = TokenStrip()
    qtbot.addWidget(t)
    t.resize(120, 70)  # laid out narrow first, as a pane before its window is shown
    toks = [Token(i, i, f"word{i}", f" word{i}") for i in range(400)]
    t.show_tokens(toks)
    t.resize(700, 120)
    t.show()
    qtbot.waitExposed(t)
    QApplication.processEvents()
    sb = t.verticalScrollBar()
    assert sb.maximum() > 0 and sb.value() == sb.maximum()
    # a query row in the middle: its anchor is inside the viewport, at any later width
    t.show_tokens(toks, np.full(400, 1 / 400), query=200)
    t.resize(500, 120)
    QApplication.processEvents()
    cur = t.document().find("word200")
    assert not cur.isNull()
    rect = t.cursorRect(cur)
    assert 0 <= rect.top() and rect.bottom() <= t.viewport().height()


# -- the model picker's size column ------------------------------------------------------------------------
def test_an_unsupported_folders_size_is_not_zero_bytes(qtbot, tmp_path, monkeypatch):
    from attnscope.app.model_picker import ModelPickerDialog
    from attnscope.app.model_table import COLUMNS
    from demo_catalog import demo_entries

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTNSCOPE_CONFIG_DIR", str(tmp_path / "config"))
    entries = demo_entries()
    bad = next(e for e in entries if not e.supported)
    entries = [dataclasses.replace(bad, size_bytes=0), *[e for e in entries if e is not bad]]
    dlg = ModelPickerDialog(
        None, scanner=lambda: entries, free_memory_fn=lambda b, d: (1e10, "RAM"), scan_now=False
    )
    qtbot.addWidget(dlg)
    with qtbot.waitSignal(dlg.scanFinished, timeout=20000):
        dlg.rescan()
    col = next(i for i, c in enumerate(COLUMNS) if "ize" in c)
    row = next(r for r in range(dlg.proxy.rowCount()) if dlg.proxy.index(r, 0).data() == bad.name)
    assert dlg.proxy.index(row, col).data() == "—"


# -- the window's default colour scale ---------------------------------------------------------------------
def test_the_windows_default_colour_scale_follows_the_maps_weights(win, qtbot):
    from attnscope.core.io.colour_scale import scale_for_map

    win.show_view("heatmap")
    _idle(win)
    hm = win.heatmap
    assert not hm.scale_chosen
    assert scale_for_map(win.weights).scale == "log"  # ~190 tokens of a near-uniform head
    assert hm.scale == "log" and "would show on linear" in hm.plot.titleLabel.text
    # pixels: most causal cells are off the zero colour (the linear map was a dark field)
    img = hm.image.image
    assert np.nanmean(img[np.isfinite(img)] > 4 / 255) > 0.9
    from gui_helpers import run_in

    run_in(win, "The cat sat.")  # a short prompt: linear, as before
    _idle(win)
    assert hm.scale == "linear"


# -- text that must not be cut or overlap -------------------------------------------------------------------
@pytest.mark.parametrize("scale", ["linear", "log", "power"])
def test_colour_bar_tick_labels_never_crowd_each_other(scale):
    from attnscope.app.views.heatmap import TICK_GAP, colorbar_ticks

    for vmax in (0.013, 0.05, 0.099, 0.1, 0.128, 0.3, 0.51, 0.97, 1.0):
        ticks = colorbar_ticks(0.0, vmax, scale)
        pos = [p for p, _ in ticks]
        assert pos == sorted(pos) and len(ticks) >= 2
        assert all(b - a >= TICK_GAP - 1e-9 for a, b in zip(pos[:-1], pos[1:], strict=True)), (vmax, ticks)
        if scale == "log":  # the bar's ends are named: from 1e-06 to the top of the range
            assert ticks[0][1] == "1e-06" and pos[-1] == pytest.approx(1.0)


def test_range_note_says_where_the_log_bar_starts(qtbot):
    from attnscope.app.views.heatmap import HeatmapView

    v = HeatmapView()
    qtbot.addWidget(v)
    v.set_weights(_map(8), _toks(8), _toks(8))
    v.set_scale("log", 0.5)
    assert v.mode_label.text().startswith("colour range [1e-06, 1] (fixed), log")


def test_experiments_parameters_are_never_elided(win):
    from PySide6.QtCore import Qt

    win.show_view("experiments")
    _idle(win)
    v = win.views["experiments"]
    t = v.table
    assert t.rowCount() >= 2 and t.textElideMode() == Qt.ElideNone
    fm = t.fontMetrics()
    for r in range(t.rowCount()):  # the Parameters column is as wide as its longest text
        text = t.item(r, 1).text()
        assert fm.horizontalAdvance(text) <= t.columnWidth(1), (text, t.columnWidth(1))


def test_a_long_status_message_ends_in_an_ellipsis_before_the_seq_len_field(win, tmp_path):
    win.resize(1000, 650)
    _idle(win)
    bar = win.statusBar()
    msg = (
        "Switching to torch cpu: reloading the model and replaying the prompt and every generated token " * 2
    )
    bar.showMessage(msg)
    QApplication.processEvents()
    seq = win.status.seq_label
    assert seq.isVisible()
    rect = bar.message_rect()
    assert rect.right() < seq.x()  # the message stops before the field
    shown = bar.shown_message()
    assert shown.endswith("…") and msg.startswith(shown[:-1].rstrip())
    assert bar.fontMetrics().horizontalAdvance(shown) <= rect.width()
    assert bar.toolTip() == msg  # the whole message is still there to read
    # pixels: no ink in the 6 px before the field (a clipped message ran into it)
    path = tmp_path / "bar.png"
    bar.grab().save(str(path))
    img = _pixels(path)
    band = img[:, seq.x() - 8 : seq.x() - 2]
    assert (band.sum(-1) < 3 * 150).sum() == 0


@pytest.mark.parametrize("size", [(1000, 650), (1400, 900), (1920, 1000)])
def test_the_heatmaps_range_note_is_shown_whole(win, size):
    win.show_view("heatmap")
    win.resize(*size)
    _idle(win)
    label = win.heatmap.mode_label
    text = label.text()
    assert text.startswith("colour range [") and label.isVisible()
    assert label.fontMetrics().horizontalAdvance(text) <= label.width(), (text, label.width(), size)
    assert label.mapTo(win.heatmap, label.rect().topRight()).x() <= win.heatmap.width()


def test_no_tab_scrolls_sideways_in_a_1000_px_window(win):
    win.resize(1000, 650)
    wide = []
    for key in win.views:
        win.show_view(key)
        _idle(win)
        page = win.tabs.widget(win.tabs.currentIndex())
        bar = getattr(page, "horizontalScrollBar", None)
        if bar is not None and bar().isVisible():  # a page wider than the tab: its right side is cut
            wide.append((key, page.widget().minimumSizeHint().width(), page.viewport().width()))
    assert not wide, wide


@pytest.mark.parametrize("size", [(1000, 650), (1400, 900)])
def test_compares_table_shows_its_last_column_whole(win, size):
    v = _compared(win)
    win.resize(*size)
    _idle(win)
    t, header = v.table, v.table.horizontalHeader()
    last = t.columnCount() - 1
    assert not t.horizontalScrollBar().isVisible()
    assert header.sectionViewportPosition(last) + header.sectionSize(last) <= t.viewport().width()
    fm = header.fontMetrics()
    for c in range(t.columnCount()):  # every header and cell text fits its column
        texts = [t.horizontalHeaderItem(c).text()] + [
            t.item(r, c).text() for r in range(min(20, t.rowCount()))
        ]
        assert max(fm.horizontalAdvance(s) for s in texts) <= header.sectionSize(c), (c, texts)


def test_range_note_on_its_own_line_leaves_the_option_bar_packed(qtbot):
    from attnscope.app.views.heatmap import HeatmapView

    v = HeatmapView()
    qtbot.addWidget(v)
    v.set_weights(_map(8), _toks(8), _toks(8))
    v.resize(1100, 500)
    v.show()
    qtbot.waitExposed(v)
    v.set_scale("log", 0.5)
    v.mode_label.setText(v.mode_label.text() + " · weights above the range show its top colour" * 3)
    v._place_note()  # (what each new range note does)
    QApplication.processEvents()
    assert v.note_row.indexOf(v.mode_label) >= 0  # too narrow for the bar: on its own line, whole
    assert v.mode_label.fontMetrics().horizontalAdvance(v.mode_label.text()) <= v.mode_label.width()
    gap = v.range_combo.x() - (v.gamma_spin.x() + v.gamma_spin.width())
    assert gap < 60, gap  # the option widgets stay packed at the left, not spread over the bar
