"""The Compare tab when run A or run B changes under a shown comparison (app/views/compare.py): an
out-of-date comparison is marked and computes no maps, a new comparison replaces the maps, the row
plot and the hover line, an edit of the same model's prompt that changes its length says there is
nothing to compare, and the maps follow the window's colour map (pytest-qt, offscreen)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from attnscope.core.analysis.compare_runs import Alignment, CompareResult, RunInfo
from attnscope.core.errors import SessionError
from gui_helpers import ran_window, run_in
from PySide6.QtCore import QPointF
from tiny_models import save_tiny

PROMPT = "The cat sat on the mat. The dog"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    base = tmp_path_factory.mktemp("base")
    save_tiny("llama", base)
    return base


@pytest.fixture()
def win(qtbot, folder):
    w = ran_window(qtbot, folder, PROMPT, steps=2)
    yield w
    w.close()


def _kind(view, kind):
    view.kind_combo.setCurrentIndex([view.kind_combo.itemData(i) for i in range(4)].index(kind))


def _compare(win, view, kind="dtype", dtype="bfloat16", prompt=None):
    _kind(view, kind)
    if kind == "dtype":
        view.dtype_combo.setCurrentText(dtype)
    if prompt is not None:
        view.prompt_edit.setText(prompt)
    assert view.run_b() is not None, view.summary.text()
    assert win.engine.wait_idle(180) and win.engine.wait_idle(60)


def _click_row(win, view, r):
    """Select row ``r`` of the table (as a click does) and let every job finish."""
    view.table.selectRow(r)
    assert win.engine.wait_idle(60)


def _shot(win, name):
    shots = os.environ.get("ATTNSCOPE_SHOTS")
    if shots:
        win.grab().save(os.path.join(shots, name))


def test_run_a_changing_marks_the_comparison_out_of_date(win, folder):
    """The trial's fault: a new, shorter Run under a shown comparison, then a click on rank 2 raised
    (shapes (32,32) vs (41,41) in set_maps). Every path that changes A: step, step back, Run, reload."""
    win.show_view("compare")
    view = win.views["compare"]
    _compare(win, view)
    res = view.result
    n = res.alignment.n
    assert n == win.snapshot.seq_len and view.stale is None and view.map_key is not None
    assert view.maps[0].shape == (n, n)

    # a step: A is longer than the compared sequence
    win.step(1)
    assert win.engine.wait_idle(60) and win.last_error is None
    assert view.stale == f"run A's sequence changed ({n} tokens compared, {n + 1} now)"
    assert view.summary.text().startswith("Out of date: run A's sequence changed")
    assert not view.table.isEnabled() and view.maps is None and view.map_key is None
    assert all(img.image is None for img in view.images)
    _click_row(win, view, 1)  # a (programmatic) click on an out-of-date table computes nothing
    assert view.maps is None and win.last_error is None
    # step back: A is the compared sequence again (same session, same ids), the comparison is current
    win.step_back(1)
    assert win.engine.wait_idle(60)
    assert view.stale is None and view.table.isEnabled() and view.summary.text().startswith("A: ")
    assert view.maps is not None and view.maps[0].shape == (n, n)

    # the trial's steps: a new, shorter Run, then a click on rank 2
    run_in(win, "Hi.")
    assert win.snapshot.seq_len < n
    assert view.stale.startswith("run A's sequence changed") and not view.table.isEnabled()
    _click_row(win, view, 1)
    view.on_selection(0, 1)  # the window's layer/head spin boxes: nothing computed either
    view.request_maps(1, 3)
    assert win.engine.wait_idle(60)
    assert view.maps is None and win.last_error is None
    assert view.hover.text().startswith("Out of date")
    _shot(win, "cmpfix_stale.png")
    # under the view: the engine refuses maps of n positions from a run that now holds fewer
    from attnscope.core.analysis.compare_run_b import b_maps

    with pytest.raises(SessionError, match=f"run A now holds {win.snapshot.seq_len} positions, not the {n}"):
        b_maps(win.engine.session, 0, 0, n)

    # the same ids again but another load of the model: B went with the old session
    run_in(win, PROMPT, steps=2)
    assert view.stale is None  # back to the compared sequence on the same session
    win.commands.load_model(str(folder))
    assert win.engine.wait_idle(120)
    run_in(win, PROMPT, steps=2)
    assert tuple(t.id for t in win.snapshot.tokens) == res.run_a.ids
    assert view.stale is not None and view.stale.startswith("run A was reloaded")
    _click_row(win, view, 2)
    assert view.maps is None and win.last_error is None
    # a remote engine's session object outlives a load (the engine drops B before it loads): the
    # load itself marks the comparison, even when the same ids and model come back
    _compare(win, view)
    assert view.stale is None and view.maps is not None
    session, snap = win.engine.session, win.snapshot
    win.state.events.loaded.emit(snap)
    assert win.engine.session is session and win.snapshot is snap
    assert view.stale.startswith("run A was reloaded") and view.maps is None
    view.request_maps(0, 0)
    assert win.engine.wait_idle(60) and view.maps is None


def test_a_new_comparison_replaces_maps_row_plot_and_hover(win):
    """The trial's fault: after a bf16 comparison, a new one (edited prompt) listed a new rank 1 but
    the three maps, the "Row N" plot and the hover line stayed the old comparison's."""
    win.show_view("compare")
    view = win.views["compare"]
    _compare(win, view)
    first = view.result.ranked()[0]
    assert view.map_key == (first.layer, first.head)
    wa, wb = view.maps
    view._on_hover(view.plots[0].vb.mapViewToScene(QPointF(1.5, 5.5)))
    assert view.hover.text().startswith("query 5")
    view.set_rows((5, wa[5], wb[5]))
    assert len(view.row_a.getData()[0]) == 6 and "Row 5" in view.row_plot.getPlotItem().titleLabel.text
    # the trial's bf16 result had its rank 1 selected already; a new comparison must still draw its own
    view.table.selectRow(0)
    edited = "The dog sat on the mat. The cat"  # same token count: token-aligned, differs from position 4
    _compare(win, view, kind="prompt", prompt=edited)
    res = view.result
    assert res.alignment.kind == "token" and res.alignment.first_difference == 4
    top = res.ranked()[0]
    assert view.map_key == (top.layer, top.head)
    s = win.engine.session
    np.testing.assert_allclose(view.maps[0], s.weights(top.layer, top.head), atol=1e-7)
    assert view.plots[0].titleLabel.text.startswith(f"A · L{top.layer} H{top.head}")
    x, _ = view.row_a.getData()
    assert x is None or len(x) == 0  # the old "Row 5" plot went
    assert view.row_plot.getPlotItem().titleLabel.text.startswith("Click a map row")
    assert view.hover.text().startswith("Hover a map")
    # beyond the sample: same model, edit at position 4: rows 0..3 are the same by construction
    assert res.same_by_construction() == 4
    assert "(rows 0..3 precede it: equal by construction)" in view.summary.text()
    np.testing.assert_allclose(view.maps[0][:4], view.maps[1][:4], atol=1e-6)
    # a map answer of the previous comparison arriving late is dropped (the generation key)
    old = view._gen
    view._gen += 1
    view.request_maps(0, 0)
    view._gen = old + 2
    assert win.engine.wait_idle(60)
    assert view.map_key == (top.layer, top.head)
    _shot(win, "cmpfix_new_comparison.png")


def test_edited_prompt_of_another_length_says_nothing_to_compare(win):
    """Prefix alignment of the same model's edit compares only positions before the edit: zero by
    construction. The tab says so instead of showing an all-zero table as a result."""
    win.show_view("compare")
    view = win.views["compare"]
    _compare(win, view)  # a real comparison first: it must not stay on screen under the message
    assert view.table.rowCount() > 0
    edited = "The cat sat on the mat. The quick brown fox"
    ids_a, ids_b = list(win.engine.session.ids), win.engine.session.encode(edited, False)
    k = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y)
    assert k == 27  # "The cat sat on the mat. The " is 27 tokens
    n_b = len(ids_b) + 2  # B is fed A's 2 generated tokens
    assert (len(ids_a), n_b) == (32, 44)
    _compare(win, view, kind="prompt", prompt=edited)
    text = view.summary.text()
    assert text.startswith(
        f"Nothing to compare: B's prompt differs from position {k} on (32 tokens in A, 44 in B)"
    )
    assert f"a causal model's first {k} positions are the same in both runs" in text
    assert view.result is None and view.table.rowCount() == 0 and view.maps is None
    assert all(img.image is None for img in view.images)
    assert len(view.kl_curve.getData()[0] if view.kl_curve.getData()[0] is not None else []) == 0
    _shot(win, "cmpfix_nothing_to_compare.png")
    view._export_table_dialog()  # nothing to export: one line, no dialog
    assert view.summary.text() == "Nothing to export yet: run B first."


def _info(**kw):
    base = dict(
        model="m",
        source="/m",
        sha256=None,
        dtype="float32",
        backend="torch",
        device="cpu",
        prompt="p",
        chat_template=False,
        ids=(1, 2, 3),
    )
    return RunInfo(**{**base, **kw})


def _result(run_b, alignment):
    z = np.zeros((2, 3))
    return CompareResult(_info(), run_b, alignment, "attention", z, z, z.astype(np.int64))


def test_nothing_to_compare_only_when_zero_by_construction():
    prefix = Alignment("prefix", 5, 9, 7, 5)
    r = _result(_info(), prefix)
    assert r.same_by_construction() == 5
    assert r.nothing_to_compare().startswith("B's prompt differs from position 5 on (9 tokens in A, 7 in B)")
    assert r.to_json()["nothing_to_compare"] == r.nothing_to_compare()
    # another precision, backend or model: the rows before the edit do differ, a real comparison
    for kw in (
        {"dtype": "bfloat16"},
        {"backend": "mlx"},
        {"source": "/other", "model": "o"},
        {"quantization": {"mode": "int8"}},  # B quantised: its rows before the edit differ too
        {"device_map": {"strategy": "auto"}},
    ):
        r = _result(_info(**kw), prefix)
        assert r.same_by_construction() == 0 and r.nothing_to_compare() is None
    # token-aligned edits: rows after the edit can differ, so it is a result (rows 0..3 are equal)
    r = _result(_info(), Alignment("token", 9, 9, 9, 4))
    assert r.same_by_construction() == 4 and r.nothing_to_compare() is None
    assert _result(_info(), Alignment("token", 9, 9, 9, None)).same_by_construction() == 0
    assert _result(_info(), Alignment("token", 9, 9, 9, None)).to_json()["nothing_to_compare"] is None


def test_maps_follow_the_window_colour_map_and_the_kl_label_fits(win):
    from attnscope.core.io.colormaps import lut

    win.show_view("compare")
    view = win.views["compare"]
    _compare(win, view)
    assert view.cmap == win.state.colormap
    np.testing.assert_array_equal(view.images[0].lut, lut(win.state.colormap))
    win.state.set_colormap("magma")
    assert view.cmap == "magma"
    for img in view.images[:2]:
        np.testing.assert_array_equal(img.lut, lut("magma"))
    assert not np.array_equal(view.images[2].lut, lut("magma"))  # A − B stays diverging
    # the next head drawn keeps magma
    view.request_maps(0, 0)
    assert win.engine.wait_idle(60) and view.map_key == (0, 0)
    np.testing.assert_array_equal(view.images[1].lut, lut("magma"))
    sel = view.table.selectionModel().selectedRows()[0].row()  # the table shows which head is drawn
    assert (view.table.item(sel, 1).data(0x0100), view.table.item(sel, 2).data(0x0100)) == (0, 0)
    # no SI suffix on the small plots' left labels ("bits (x0.001)" was cut and left a stray ")")
    for pw in (view.logit_plot, view.row_plot):
        ax = pw.getPlotItem().getAxis("left")
        assert ax.autoSIPrefix is False and "x0" not in ax.labelString()
    assert view.logit_plot.getPlotItem().getAxis("left").labelText == "KL, bits"
    _shot(win, "cmpfix_magma.png")
