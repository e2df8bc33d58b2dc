"""GUI: open the window, run a prompt, step, switch head, export; the model runs off the GUI thread."""

from __future__ import annotations

import numpy as np
import pytest
from attnscope.app.views.heatmap import weight_text
from PIL import Image

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


@pytest.mark.slow  # about 20 s of CPU: a prompt, steps, every tab and the exports
def test_run_step_switch_export(window, tmp_path):
    win = window
    assert (
        win.snapshot.info.n_layers == 30 and win.layer_spin.maximum() == 29 and win.head_spin.maximum() == 8
    )
    win.prompt_edit.setPlainText(PROMPT)
    win.chat_check.setChecked(False)
    # where the model runs: prefill and decode must run on the engine thread, never the GUI's
    import threading

    session, ran_on = win.engine.session, []

    def on_gui_thread_recorded(f):
        def wrapped(*a, **k):
            ran_on.append(threading.current_thread() is threading.main_thread())
            return f(*a, **k)

        return wrapped

    session.prefill = on_gui_thread_recorded(session.prefill)
    session.step = on_gui_thread_recorded(session.step)
    win.run_prompt()
    assert win.engine.wait_idle(120)
    n0 = win.snapshot.seq_len
    assert win.weights is not None and win.weights.shape == (n0, n0)
    for i in range(3):
        win.step_button.click()
        assert win.engine.wait_idle(60)
        assert win.snapshot.seq_len == n0 + i + 1
        assert win.weights.shape == (n0 + i + 1, n0 + i + 1)
    assert ran_on == [False] * 4  # one prefill + three steps, none on the GUI thread
    assert win.snapshot.n_generated == 3
    # status bar shows seq_len and the exact KV-cache bytes
    T = win.snapshot.seq_len
    assert f"seq_len {T}" in win.seq_label.text()
    assert f"{46_080 * T:,} bytes" in win.kv_label.text()

    # switch head: the heatmap shows that head's exact weights
    win.head_spin.setValue(5)
    assert win.engine.wait_idle(30)
    assert win.weights_key == (win.layer, 5)
    assert "head 5" in win.heatmap.plot.titleLabel.text and "KV head 1" in win.heatmap.plot.titleLabel.text
    later = np.triu(np.ones(win.weights.shape, dtype=bool), 1)  # causal-masked cells are drawn hatched (NaN)
    np.testing.assert_allclose(win.heatmap.image.image, np.where(later, np.nan, win.weights))
    assert win.group_label.text().startswith("reads KV head 1")

    png = win.export_heatmap_png(tmp_path / "map.png")
    img = np.asarray(Image.open(png).convert("RGB"))
    assert img.shape[0] > 200 and img.shape[1] > 200
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 20  # not blank: many colours
    npy = win.export_heatmap_data(tmp_path / "map.npy")
    np.testing.assert_array_equal(np.load(npy), win.weights)
    csv = win.export_heatmap_data(tmp_path / "map.csv")
    from attnscope.core.io.data_writers import read_map_csv

    got, rows, cols = read_map_csv(csv)  # the header row and label column name the tokens shown
    np.testing.assert_allclose(got, win.weights, atol=1e-7)
    toks = list(win.state.snapshot.tokens)
    assert cols == [f"{t.position}:{t.text}" for t in toks[: got.shape[1]]] and rows == cols


def test_grid_click_opens_head(window):
    win = window
    win.prompt_edit.setPlainText("Hello there, general Kenobi.")
    win.run_prompt()
    assert win.engine.wait_idle(60)
    win.show_view("grid")
    assert win.engine.wait_idle(60)
    canvas = win.grid.canvas
    assert canvas.thumbs is not None and canvas.thumbs.shape[:2] == (30, 9)
    # GQA grouping: heads of one group sit closer together than across groups
    assert canvas.head_x(1) - canvas.head_x(0) < canvas.head_x(3) - canvas.head_x(2)
    canvas.headClicked.emit(7, 4)
    assert win.engine.wait_idle(30)
    assert (win.layer, win.head) == (7, 4)
    assert win.tabs.currentWidget() is win.heatmap
    assert win.weights_key == (7, 4)


def test_hover_readout(window):
    win = window
    win.prompt_edit.setPlainText("one two three")
    win.chat_check.setChecked(False)
    win.run_prompt()
    assert win.engine.wait_idle(60)
    text = win.heatmap.cell_text(2, 1)
    assert "→" in text and weight_text(win.weights[2, 1]) in text and "two" in text


def test_bad_input_keeps_app_alive(window, tmp_path):
    win = window
    win.prompt_edit.setPlainText("   ")
    win.run_prompt()
    assert "empty" in win.last_error
    info_before = win.snapshot.info
    # a folder that is not a model
    (tmp_path / "notes.txt").write_text("hello")
    win.last_error = None
    win.load_model(str(tmp_path))
    assert win.engine.wait_idle(60)
    assert "not a model folder" in win.last_error
    assert win.snapshot.info == info_before
    # the previous model still works
    win.last_error = None
    win.prompt_edit.setPlainText("still alive")
    win.run_prompt()
    assert win.engine.wait_idle(60)
    assert win.last_error is None and win.snapshot.seq_len > 0


@pytest.mark.slow  # about 15 s of CPU: five tabs compute what they show, then a step
def test_keyboard_shortcuts_switch_tabs_and_step(window, qtbot):
    """Ctrl+1…Ctrl+8 show the tabs in order (all eight listed in the View menu), F10 / Ctrl+F10 /
    Shift+F10 step, from the prompt box's focus as a user would press them."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    win = window
    win.activateWindow()
    shown = {
        a.shortcut().toString(): a.text() for a in win.view_menu.actions() if a.text().startswith("Show ")
    }
    assert [shown[f"Ctrl+{i}"] for i in range(1, 9)] == [
        "Show Heatmap",
        "Show Head grid",
        "Show GQA groups",
        "Show Mask",
        "Show Sinks",
        "Show KV cache",
        "Show Head roles",
        "Show Experiments",
    ]
    win.prompt_edit.setPlainText("The quick brown fox")
    win.chat_check.setChecked(False)
    QTest.keyClick(win.prompt_edit, Qt.Key_Return, Qt.ControlModifier)
    assert win.engine.wait_idle(120) and win.snapshot.seq_len > 0
    for i in (5, 2, 8, 3, 1):
        QTest.keyClick(win.prompt_edit, getattr(Qt, f"Key_{i}"), Qt.ControlModifier)
        assert win.tabs.currentIndex() == i - 1
    n0 = win.snapshot.n_generated
    QTest.keyClick(win.prompt_edit, Qt.Key_F10)
    assert win.engine.wait_idle(60) and win.snapshot.n_generated == n0 + 1
    win.steps_spin.setValue(3)
    QTest.keyClick(win.prompt_edit, Qt.Key_F10, Qt.ControlModifier)
    assert win.engine.wait_idle(60) and win.snapshot.n_generated == n0 + 4
    QTest.keyClick(win.prompt_edit, Qt.Key_F10, Qt.ShiftModifier)
    assert win.engine.wait_idle(60) and win.snapshot.n_generated == n0 + 3


def test_image_fills_its_cells_whatever_came_before(qtbot):
    """The map's image covers exactly columns × rows in plot coordinates after every change of shape
    (ImageItem.setRect scales by the image it holds: set before the new image, the first map was
    drawn from a 1×1 scale, stretched ~40×)."""
    from attnscope.app.views.heatmap import HeatmapView
    from attnscope.core.tokens import Token

    hm = HeatmapView()
    qtbot.addWidget(hm)

    def toks(n, start=0):
        return [Token(position=start + i, id=i, text=f"t{i}", raw=f"t{i}") for i in range(n)]

    for n_q, n_k, q0, k0 in ((39, 39, 0, 0), (48, 48, 0, 0), (12, 12, 0, 0), (1, 30, 29, 0), (5, 9, 4, 0)):
        w = np.tril(np.ones((n_q, n_k), dtype=np.float32), k=n_k - n_q)
        w /= w.sum(axis=1, keepdims=True)
        hm.set_weights(w, toks(n_q, q0), toks(n_k, k0), q_offset=q0, k_offset=k0)
        r = hm.image.mapRectToParent(hm.image.boundingRect())
        assert (r.left(), r.top(), r.width(), r.height()) == pytest.approx((k0, q0, n_k, n_q)), (n_q, n_k)


def test_token_strip_keeps_the_query_token_in_sight(qtbot):
    from attnscope.app.token_strip import TokenStrip
    from attnscope.core.tokens import Token

    strip = TokenStrip()
    qtbot.addWidget(strip)
    strip.resize(500, 90)
    strip.show()
    toks = [
        Token(position=i, id=i, text=f"w{i}↵" if i % 3 == 0 else f"w{i}", raw=f"w{i}") for i in range(300)
    ]
    strip.show_tokens(toks, None, 299)
    bar = strip.verticalScrollBar()
    assert bar.maximum() > 0 and bar.value() == bar.maximum()  # the newest token, at the end
    strip.show_tokens(toks, None, 0)
    assert bar.value() < 20  # the first line (within the document margin)
    strip.show_tokens(toks)  # no query: the end
    assert bar.value() == bar.maximum()
