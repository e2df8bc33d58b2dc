"""Part B GUI: the Sinks, Head roles and Experiments tabs show the engine's numbers, react to
their controls and open heads; ``--screenshot --view`` renders each of the four panels (pytest-qt, offscreen)."""

from __future__ import annotations

import numpy as np
import pytest
from attnscope.core.analysis.sinks import session_sink_report
from gui_helpers import ran_window
from PIL import Image
from PySide6.QtCore import Qt
from tiny_models import save_tiny

PROMPT = "Hi. The cat sat, then the dog sat.\nIt ran"


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    save_tiny("llama", folder)
    return folder


@pytest.fixture()
def win(qtbot, tiny_folder):
    w = ran_window(qtbot, tiny_folder, PROMPT, steps=3)
    yield w
    w.close()


def _show(win, key):
    win.show_view(key)
    assert win.engine.wait_idle(120)
    assert win.last_error is None, win.last_error
    return win.views[key]


def test_sinks_panel(win):
    view = _show(win, "sinks")
    s = win.engine.session
    rep = session_sink_report(s)
    np.testing.assert_allclose(view.report.sink, rep.sink)
    L, H = rep.sink.shape
    assert (view.table.rowCount(), view.table.columnCount()) == (L, H)
    th = float(np.median(rep.sink))
    view.threshold_spin.setValue(round(th, 2))
    th = view.threshold
    for layer in range(L):
        for head in range(H):
            text = view.table.item(layer, head).text()
            assert text.startswith(f"{rep.sink[layer, head]:.2f}")
            assert ("●" in text) == bool(rep.sink[layer, head] >= th)
    assert view.summary.text().startswith(f"{int((rep.sink >= th).sum())} of {L * H} heads")
    # other metric: token 0 + delimiters
    view.metric_combo.setCurrentIndex(1)
    assert view.table.item(1, 2).text().startswith(f"{rep.sink_set[1, 2]:.2f}")
    view.metric_combo.setCurrentIndex(0)
    # the table after prefill (before the 3 decode steps)
    view.step_spin.setValue(s.n_prompt)
    np.testing.assert_allclose(view.table_values(), rep.at_seq_len(s.n_prompt))
    assert "after" in view.summary.text()
    # the main timeline moves it too
    win.timeline.set_step(1)
    assert win.engine.wait_idle(60)
    assert view.step_spin.value() == s.n_prompt + 1
    np.testing.assert_allclose(view.table_values(), rep.at_seq_len(s.n_prompt + 1))
    win.timeline.set_step(3)
    assert win.engine.wait_idle(60)
    # the selected head's per-row curve is its weight on token 0
    view.table.cellClicked.emit(1, 3)
    assert (win.layer, win.head) == (1, 3)
    x, y = view.row_curve.getData()
    np.testing.assert_allclose(y, rep.per_row[1, 3, 1:])
    assert "Layer 1 · query head 3 (KV head 1)" in view.plot.getPlotItem().titleLabel.text
    assert view.decode_line.isVisible() and view.decode_line.value() == s.n_prompt - 0.5
    # double-click opens the head in the heatmap
    view.table.cellDoubleClicked.emit(0, 2)
    assert win.tabs.currentWidget() is win.views["heatmap"] and (win.layer, win.head) == (0, 2)


def test_roles_panel(win, qtbot):
    view = _show(win, "roles")
    t = view.table_data
    L, H = t.n_layers, t.n_heads
    assert view.table.rowCount() == L * H
    # sort by the induction column, highest first
    col = 5  # Layer, Head, KV head, Label, previous-token, induction, ...
    assert view.table.horizontalHeaderItem(col).text() == "induction"
    view.table.sortItems(col, Qt.DescendingOrder)
    top = view.head_at(0)
    assert t.scores["induction"][top] == pytest.approx(np.nanmax(t.scores["induction"]))
    values = [view.table.item(r, col).data(Qt.UserRole) for r in range(view.table.rowCount())]
    assert values == sorted(values, reverse=True)
    # a row shows its head's scores and label
    layer, head = view.head_at(3)
    assert view.table.item(3, 4).text() == f"{t.scores['previous_token'][layer, head]:.3f}"
    assert view.table.item(3, 2).text() == str(head // 2)
    # click selects, double-click opens the heatmap
    view.table.cellClicked.emit(3, 0)
    assert (win.layer, win.head) == (layer, head)
    # the threshold re-labels without recomputing
    view.threshold_spin.setValue(0.0)
    assert "mixed" not in {view.table.item(r, 3).text() for r in range(view.table.rowCount())}
    view.threshold_spin.setValue(1.0)
    assert {view.table.item(r, 3).text() for r in range(view.table.rowCount())} <= {"mixed", "sink/delimiter"}
    # filter
    view.filter_combo.setCurrentIndex(view.filter_combo.findData("mixed"))
    shown = [r for r in range(view.table.rowCount()) if not view.table.isRowHidden(r)]
    assert all(view.table.item(r, 3).text() == "mixed" for r in shown) and shown
    view.table.cellDoubleClicked.emit(shown[0], 1)
    assert win.tabs.currentWidget() is win.views["heatmap"] and (win.layer, win.head) == view.head_at(
        shown[0]
    )


def test_experiments_panel(win):
    s = win.engine.session
    ids, logits = s.ids, s.logits.copy()
    view = _show(win, "experiments")  # runs one of each experiment by itself (short sequence)
    assert view.table.rowCount() == 5 and len(view.results) == 5
    assert s.ids == ids and np.array_equal(s.logits, logits)
    for r, res in enumerate(view.results):
        assert view.table.item(r, 3).text() == f"{res.kl_next:.4f}"
        assert view.table.item(r, 2).text() == str(s.seq_len)
    kinds = [r.experiment.kind for r in view.results]
    assert kinds == ["evict_first", "sinks_window", "no_causal_prefill", "decode_top_left", "no_scale"]
    # the plot shows the selected row's per-position NLL of both runs
    view.table.setCurrentCell(2, 0)
    x, y = view.exp_curve.getData()
    np.testing.assert_allclose(y, view.results[2].nll_exp)
    # one more, chosen in the controls: evicting nothing changes nothing
    view.kind_combo.setCurrentIndex(view.kind_combo.findData("evict_first"))
    assert view.k_spin.isVisibleTo(view) and not view.window_spin.isVisibleTo(view)
    view.k_spin.setValue(0)
    view.run_button.click()
    assert win.engine.wait_idle(60)
    assert view.table.rowCount() == 6
    assert view.table.item(5, 3).text() == "0.0000" and "same" in view.table.item(5, 4).text()
    # a new prompt clears the results (and, the tab being shown, runs the defaults on it)
    win.prompt_edit.setPlainText("Another prompt, a new sequence.")
    win.run_prompt()
    assert win.engine.wait_idle(60)
    assert view.table.rowCount() == 5 and all(r.seq_len == win.snapshot.seq_len for r in view.results)


@pytest.mark.parametrize("name", ["sinks", "kv", "roles", "experiments"])
def test_screenshot_views(tiny_folder, tmp_path, name, qtbot):
    from attnscope.app.cli import main

    out = tmp_path / f"{name}.png"
    rc = main(
        [
            "--screenshot",
            str(out),
            "--model",
            str(tiny_folder),
            "--prompt",
            PROMPT,
            "--no-chat-template",
            "--steps",
            "2",
            "--view",
            name,
            "--size",
            "1200x800",
        ]
    )
    assert rc == 0
    img = np.asarray(Image.open(out).convert("RGB"))
    assert img.shape == (800, 1200, 3)
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 50  # drawn, not blank
