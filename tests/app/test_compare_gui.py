"""The Compare tab (app/views/compare.py): run B on the engine thread, the ranked table, the three maps,
hover/row readouts, exports with a sidecar naming both runs (pytest-qt, offscreen)."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
from attnscope.core.io.provenance import sidecar_path
from gui_helpers import ran_window
from PySide6.QtCore import QPointF
from test_compare import _perturbed_copy
from tiny_models import save_tiny

PROMPT = "The cat sat on the mat. The dog"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("base")
    save_tiny("llama", base)
    last = tmp_path_factory.mktemp("last")
    _perturbed_copy(base, last, layer=1, head=2)
    return base, last


@pytest.fixture()
def win(qtbot, folders):
    w = ran_window(qtbot, folders[0], PROMPT, steps=2)
    yield w
    w.close()


def _run(win, view):
    jid = view.run_b()
    assert jid is not None, view.summary.text()
    assert win.engine.wait_idle(180)
    assert view.result is not None, view.summary.text()
    assert win.engine.wait_idle(60)


@pytest.mark.slow  # about 11 s of CPU: run B, its maps and the CSV; the edited-prompt test stays fast
def test_compare_tab_perturbed_model(win, folders, tmp_path):
    win.show_view("compare")
    view = win.views["compare"]
    assert "compare" in [k for k in win.views]
    # a View menu entry like the other tabs
    shown = {a.text(): a.shortcut().toString() for a in win.view_menu.actions()}
    assert shown["Show Compare"] == f"Ctrl+{list(win.views).index('compare') + 1}"
    view.kind_combo.setCurrentIndex(list(view.kind_combo.itemData(i) for i in range(4)).index("model"))
    view.model_edit.setText(str(folders[1]))
    view.dtype_combo.setCurrentText("float32")
    view.backend_combo.setCurrentText("torch")
    seen = []
    import attnscope.app.views.compare as C

    orig = C.run_b_job

    def spy(spec):
        job = orig(spec)

        def wrapped(ctx):
            seen.append(threading.current_thread() is not threading.main_thread())
            return job(ctx)

        return wrapped

    C.run_b_job = spy
    try:
        _run(win, view)
    finally:
        C.run_b_job = orig
    assert seen == [True]  # run B ran on the engine thread
    res = view.result
    assert (res.ranked()[0].layer, res.ranked()[0].head) == (1, 2)
    assert res.alignment.kind == "token" and res.alignment.n == win.snapshot.seq_len  # A's decode fed to B
    assert int(view.table.item(0, 1).data(0x0100)) == 1 and int(view.table.item(0, 2).data(0x0100)) == 2
    assert "most changed: L1 H2" in view.summary.text()
    # sorted high to low by JS mean, tied heads (here every unchanged one, at 0) keep their rank order
    n_rows = view.table.rowCount()
    assert [int(view.table.item(r, 0).text()) for r in range(n_rows)] == list(range(1, n_rows + 1))
    # the maps of the selected head: A, B and A - B on a symmetric range
    assert view.map_key == (1, 2)
    wa, wb = view.maps
    s = win.engine.session
    np.testing.assert_allclose(wa, s.weights(1, 2), atol=1e-7)
    lo, hi = view.images[2].levels
    assert lo == pytest.approx(-hi) and hi == pytest.approx(np.abs(wa - wb).max(), rel=1e-5)
    # sort by head number, then back by JS mean
    view.table.sortItems(2)
    assert int(view.table.item(0, 2).data(0x0100)) == 0
    # hover and row click
    p = view.plots[0]
    scene_pt = p.vb.mapViewToScene(QPointF(1.5, 5.5))
    view._on_hover(scene_pt)
    assert view.hover.text().startswith("query 5") and "A " in view.hover.text() and "B " in view.hover.text()
    view.set_rows((5, wa[5], wb[5]))
    assert len(view.row_a.getData()[0]) == 6
    shots = os.environ.get("ATTNSCOPE_SHOTS")
    if shots:
        win.grab().save(os.path.join(shots, "compare_tiny_gui.png"))
    # exports
    csv_path = view.export_table(tmp_path / "t.csv")
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("rank,layer,head,js_mean,js_max") and lines[1].startswith("1,1,2,")
    side = json.loads(sidecar_path(csv_path).read_text())
    assert side["run_b"]["source"] == str(folders[1]) and side["run_a"]["ids"] == list(s.ids)
    jp = view.export_table(tmp_path / "t.json")
    assert json.loads(jp.read_text())["heads"][0]["layer"] == 1
    for suffix in ("png", "svg", "pdf"):
        out, sc = view.export_maps(tmp_path / f"m.{suffix}")
        assert out.stat().st_size > 500
        meta = json.loads(sc.read_text())
        assert meta["weighting"] == "attention" and meta["layer"] == 1 and meta["head"] == 2
        assert {"model", "sha256", "dtype", "backend", "prompt", "ids"} <= set(meta["run_a"])
    if shots:
        win.grab().save(os.path.join(shots, "compare_tiny_gui_after_export.png"))


def test_compare_tab_edited_prompt_and_bad_input(win):
    win.show_view("compare")
    view = win.views["compare"]
    view.kind_combo.setCurrentIndex([view.kind_combo.itemData(i) for i in range(4)].index("prompt"))
    view.prompt_edit.setText("   ")
    assert view.run_b() is None and "empty" in view.summary.text()
    view.prompt_edit.setText("The dog sat on the mat. The dog")
    view.weighting_combo.setCurrentIndex(1)
    _run(win, view)
    res = view.result
    assert res.weighting == "value-weighted"
    assert res.alignment.kind == "token" and res.alignment.first_difference == 4
    assert "value-weighted" in view.plots[0].titleLabel.text
    # model kind without a model: one line, nothing submitted
    view.kind_combo.setCurrentIndex(0)
    view.model_edit.setText("")
    assert view.run_b() is None and "Choose run B's model" in view.summary.text()


def test_heatmap_value_weighted_scale(win):
    from attnscope.core.analysis.value_weighted import value_weighted_tile

    win.show_view("heatmap")
    hm = win.heatmap
    assert hm.weighting == "attention"
    s = win.engine.session
    n = win.visible_len
    np.testing.assert_allclose(
        win.weights, s.weights(win.layer, win.head, slice(0, n), slice(0, n)), atol=1e-7
    )
    hm.weighting_combo.setCurrentIndex(1)
    assert win.engine.wait_idle(60) and win.last_error is None
    want = value_weighted_tile(s, win.layer, win.head, "head", slice(0, n), slice(0, n))
    np.testing.assert_allclose(win.weights, want, atol=1e-7)
    np.testing.assert_allclose(win.weights[1:].sum(axis=1), 1.0, atol=1e-5)  # row-normalised
    assert not np.allclose(win.weights, s.weights(win.layer, win.head, slice(0, n), slice(0, n)), atol=1e-3)
    assert win.exports.view_state()["weighting"] == "value-weighted"  # exports record the scale shown
    assert "value-weighted" in hm.colorbar.getAxis("left").labelText  # the bar's one label
    # an aggregate: mean over the KV group's heads of their value-weighted maps
    hm.set_aggregate("group")
    assert win.engine.wait_idle(60) and win.last_error is None
    np.testing.assert_allclose(
        win.weights, value_weighted_tile(s, win.layer, win.head, "group", slice(0, n), slice(0, n)), atol=1e-7
    )
    hm.set_aggregate("head")
    hm.weighting_combo.setCurrentIndex(0)
    assert win.engine.wait_idle(60)
    np.testing.assert_allclose(
        win.weights, s.weights(win.layer, win.head, slice(0, n), slice(0, n)), atol=1e-7
    )


def test_sinks_value_weighted_metric(win):
    from attnscope.core.analysis.sinks import session_sink_report
    from attnscope.core.analysis.value_weighted import value_weighted_sink_scores

    win.show_view("sinks")
    assert win.engine.wait_idle(60)
    view = win.views["sinks"]
    s = win.engine.session
    view.metric_combo.setCurrentIndex(
        [view.metric_combo.itemData(i) for i in range(view.metric_combo.count())].index("sink_vw")
    )
    assert win.engine.wait_idle(60) and win.last_error is None
    want = value_weighted_sink_scores(s)
    np.testing.assert_allclose(view.table_values(), want, atol=1e-6)
    assert view.table.item(1, 2).text().startswith(f"{want[1, 2]:.2f}")
    assert "value-weighted" in view.summary.text()
    # the value-weighted share differs from the weight on token 0 (what a sink moves is small or large)
    assert not np.allclose(want, session_sink_report(s).sink, atol=1e-3)
    # the table after prefill: mean over rows 1 .. n_prompt-1 only
    view.step_spin.setValue(s.n_prompt)
    from attnscope.core.analysis.value_weighted import value_weighted_sink_rows

    rows = value_weighted_sink_rows(s)
    np.testing.assert_allclose(view.table_values(), rows[..., 1 : s.n_prompt].mean(axis=-1), atol=1e-6)
    view.metric_combo.setCurrentIndex(0)
    np.testing.assert_allclose(view.table_values(), session_sink_report(s).at_seq_len(s.n_prompt), atol=1e-6)
