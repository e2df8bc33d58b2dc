"""Smaller window fixes, each a kind: Head roles sorts a score highest first on its first click,
Compare's hover writes weights as the heatmap does, the timeline's slider keeps its length while
its label changes, the window remembers its prompt, colours, scale and layout (QSettings), and a
session keeps Compare's B prompt (pytest-qt, offscreen, a tiny random llama)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, QSettings, Qt

PROMPT = "The cat sat on the mat. The dog sat on the log."


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tiny_models import save_tiny

    folder = tmp_path_factory.mktemp("llama_smaller")
    save_tiny("llama", folder)
    return folder


@pytest.fixture()
def win(qtbot, tiny_folder):
    from gui_helpers import ran_window

    w = ran_window(qtbot, tiny_folder, PROMPT, steps=2)
    yield w
    w.close()


def _idle(w):
    from PySide6.QtWidgets import QApplication

    assert w.engine.wait_idle(60)
    for _ in range(3):
        QApplication.processEvents()
    assert w.last_error is None, w.last_error


def test_head_roles_first_click_on_a_score_sorts_highest_first(win, qtbot):
    from PySide6.QtTest import QTest

    win.show_view("roles")
    _idle(win)
    view = win.views["roles"]
    table, header = view.table, view.table.horizontalHeader()
    col = 4  # the first score column
    x = header.sectionViewportPosition(col) + header.sectionSize(col) // 2
    QTest.mouseClick(header.viewport(), Qt.LeftButton, pos=QPoint(x, header.height() // 2))
    qtbot.wait(50)
    scores = [table.item(r, col).data(Qt.UserRole) for r in range(table.rowCount())]
    assert len(scores) > 2 and scores == sorted(scores, reverse=True), scores
    assert header.sortIndicatorOrder() == Qt.DescendingOrder
    QTest.mouseClick(header.viewport(), Qt.LeftButton, pos=QPoint(x, header.height() // 2))
    qtbot.wait(50)
    again = [table.item(r, col).data(Qt.UserRole) for r in range(table.rowCount())]
    assert again == sorted(again)  # the second click turns it round


def test_compare_hover_writes_weights_as_the_heatmap_does():
    from attnscope.app.views.compare_maps import weight_readout as _weight
    from attnscope.app.views.heatmap import weight_text

    for v in (0.123456, 0.5, 0.0123, 3.21456e-5, 1e-7):
        assert _weight(v) == weight_text(v)  # 4 decimals from 0.01, 3 significant digits below
    assert _weight(-0.25, "+") == "-0.2500" and _weight(4.2e-5, "+") == "+4.20e-05"
    assert _weight(0.0, "+") == "+0.0000"


def test_timeline_slider_keeps_its_length_while_the_label_changes(qtbot):
    from attnscope.app.timeline_bar import TimelineBar

    bar = TimelineBar()
    qtbot.addWidget(bar)
    bar.resize(1000, 30)
    bar.show()
    bar.set_range(1200, 150)
    widths = set()
    for step in (0, 1, 2, 9, 10, 99, 100, 150):
        bar.set_step(step)
        bar.layout().activate()
        widths.add(bar.slider.width())
    assert len(widths) == 1, widths
    assert bar.label.width() >= bar.label.fontMetrics().horizontalAdvance(bar.label.text())  # never cut


def test_the_window_remembers_prompt_colours_scale_and_layout(win, qtbot, tiny_folder, tmp_path):
    from attnscope.app import window_settings
    from attnscope.app.main_window import MainWindow

    settings = QSettings(str(tmp_path / "attnscope.ini"), QSettings.IniFormat)
    win.prompt_edit.setPlainText("A prompt I was working on.")
    win.cmap_combo.setCurrentText("magma")
    win.heatmap.set_scale("power")
    win.resize(1000, 700)
    qtbot.wait(20)
    size = (win.width(), win.height())
    win.splitters[1].setSizes([600, 300])
    sizes = win.splitters[1].sizes()
    window_settings.save(win, settings)

    other = MainWindow(model=str(tiny_folder), autoload=False)
    qtbot.addWidget(other)
    window_settings.restore(other, QSettings(str(tmp_path / "attnscope.ini"), QSettings.IniFormat))
    other.show()
    qtbot.wait(50)
    assert other.prompt_edit.toPlainText() == "A prompt I was working on."
    assert other.state.colormap == "magma" and other.cmap_combo.currentText() == "magma"
    assert other.heatmap.scale == "power" and other.heatmap.scale_chosen
    assert other.height() == size[1] != other.sizeHint().height()  # the offscreen screen clamps widths
    a, b = other.splitters[1].sizes()
    assert 1.5 < a / b < 3 and abs(sizes[0] / sizes[1] - 2) < 0.5  # tabs : next-token panel as left (2:1)
    # a scale the map's length picked is not remembered as a choice; junk values are skipped
    other.heatmap.scale_chosen = False
    bad = QSettings(str(tmp_path / "bad.ini"), QSettings.IniFormat)
    window_settings.save(other, bad)
    assert bad.value(window_settings.SCALE) is None
    bad.setValue(window_settings.CMAP, "no-such-map")
    bad.setValue(window_settings.GEOMETRY, "junk")
    window_settings.restore(other, bad, prompt=False)
    assert other.state.colormap == "magma"
    other.close()


def test_a_session_keeps_compares_b_prompt(win, tmp_path):
    view = win.views["compare"]
    view.kind_combo.setCurrentIndex(view.kind_combo.findData("prompt"))
    view.prompt_edit.setText("The dog sat on the mat.")
    saved = win.state.to_view_dict()
    assert saved["views"]["compare"]["prompt_edit"] == "The dog sat on the mat."
    path = tmp_path / "s.attnscope"
    win.sessions.save_session(path)
    _idle(win)
    view.prompt_edit.setText("something else")
    win.sessions.open_session(path)
    _idle(win)
    assert view.prompt_edit.text() == "The dog sat on the mat."
    assert view.kind_combo.currentData() == "prompt"


def test_uniform_causal_baseline_is_a_uniform_heads_sink_score():
    import numpy as np
    from attnscope.core.analysis.sinks import uniform_causal_baseline

    for n in (2, 3, 4, 17, 2048):
        w = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]  # a uniform causal head, float64
        assert uniform_causal_baseline(n) == pytest.approx(w[1:, 0].mean(), rel=1e-12)
    assert uniform_causal_baseline(4) == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        uniform_causal_baseline(1)


def test_sinks_tab_shows_the_baseline_and_each_heads_ratio(win):
    from attnscope.core.analysis.sinks import uniform_causal_baseline

    win.show_view("sinks")
    _idle(win)
    view = win.views["sinks"]
    n = view.step_spin.value()
    b = uniform_causal_baseline(n)
    assert f"uniform causal baseline {b:.3f}" in view.summary.text()
    it = view.table.item(1, 2)
    v = it.data(Qt.UserRole)
    assert f"×{v / b:.1f} the uniform causal baseline {b:.3f} at {n} tokens" in it.toolTip()


def test_head_grid_follows_the_heatmaps_scale(win):
    import numpy as np

    win.show_view("grid")
    _idle(win)
    canvas = win.grid.canvas
    assert canvas.thumbs is not None and canvas.scale == "linear" == win.heatmap.scale
    linear = np.asarray(canvas._canvas, dtype=float).copy()
    win.heatmap.set_scale("log")
    win.maps.push_colour()
    _idle(win)
    assert canvas.scale == "log"
    log = np.asarray(canvas._canvas, dtype=float)
    # by pixel: small weights (most cells) are lifted off the map's darkest colour under log
    assert log.mean() > linear.mean() + 10
    assert "log" in win.grid.title.text()


def test_head_grid_follows_the_heatmaps_range(win):
    """Auto range colours each thumbnail up to its own Auto level and Shared up to its layer's largest,
    as the heatmap ranges one map or a layer's heads; the title says which. By pixel: the thumbnail's
    cells are drawn in the colours of the fixed [0, 1] range, then of its Auto level."""
    import numpy as np
    from attnscope.core.analysis.aggregate import robust_max
    from attnscope.core.io.colormaps import to_rgb

    win.show_view("grid")
    _idle(win)
    canvas = win.grid.canvas
    levels = np.array([[robust_max(t) for t in row] for row in canvas.thumbs])
    layer, h = np.unravel_index(int(levels.argmin()), levels.shape)  # the head Auto changes most
    thumb = canvas.thumbs[layer, h]
    assert levels[layer, h] < 0.8
    P = thumb.shape[0]
    idx = (np.arange(canvas.THUMB) * P // canvas.THUMB).clip(0, P - 1)

    def drawn():
        x, y = canvas.head_x(h), canvas.layer_y(layer)
        return canvas._canvas[y : y + canvas.THUMB, x : x + canvas.THUMB].astype(int)

    def expected(vmax):
        return to_rgb(thumb, canvas.cmap, 0.0, vmax, canvas.scale, canvas.gamma)[idx][:, idx].astype(int)

    lower = np.tril(np.ones((canvas.THUMB, canvas.THUMB), bool))  # causal cells (no hatch)
    differ = lower & (np.abs(expected(1.0) - expected(levels[layer, h])).sum(-1) > 30)
    assert differ.sum() > 20  # the two ranges colour these cells visibly differently

    assert canvas.range_mode == "fixed" and "range fixed" in win.grid.title.text()
    assert np.abs(drawn() - expected(1.0))[differ].max() <= 2
    win.heatmap.set_range_mode("auto")
    win.maps.push_colour()
    _idle(win)
    assert canvas.range_mode == "auto" and "range per head (auto)" in win.grid.title.text()
    assert np.abs(drawn() - expected(levels[layer, h]))[differ].max() <= 2
    win.heatmap.set_range_mode("shared")
    win.maps.push_colour()
    _idle(win)
    assert canvas.range_mode == "shared" and "range per layer (shared)" in win.grid.title.text()
    assert np.abs(drawn() - expected(levels[layer].max()))[differ].max() <= 2


def test_status_bar_names_the_backend_once(win):
    import dataclasses

    from attnscope.app.status import backend_device

    assert (
        backend_device("mlx", "mlx:cpu") == "mlx cpu" and backend_device("torch", "cuda:0") == "torch cuda:0"
    )
    snap = dataclasses.replace(win.snapshot, backend="mlx", device="mlx:cpu")
    win.status.show_model(snap)
    text = win.status.model_label.text()
    assert "mlx cpu" in text and "mlx mlx" not in text, text
