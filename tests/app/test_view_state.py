"""The window's evented view state (app/state.py), its widget bindings (app/bind.py), view requests
that know their own staleness (Engine.submit with a Request), and views built without a window."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from attnscope.app.state import ViewState
from attnscope.core.io.colormaps import ColourSpec


def _recorder(state: ViewState, *names: str) -> dict[str, list]:
    got: dict[str, list] = {n: [] for n in names}
    for n in names:
        getattr(state.events, n).connect(got[n].append)
    return got


def _fake_snapshot(n_layers=4, n_heads=6, n_kv_heads=2, n_prompt=5, n_generated=2):
    info = SimpleNamespace(
        name="tiny",
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        group_size=n_heads // n_kv_heads,
        kv_head=lambda h: h // (n_heads // n_kv_heads),
    )
    toks = tuple(SimpleNamespace(id=i) for i in range(n_prompt + n_generated))
    return SimpleNamespace(
        info=info,
        backend="torch",
        prompt="p",
        chat_template=False,
        tokens=toks,
        seq_len=len(toks),
        n_prompt=n_prompt,
        n_generated=n_generated,
    )


# -- the state on its own (no Qt) ------------------------------------------------------------------------------
def test_a_field_emits_only_on_a_real_change():
    s = ViewState()
    got = _recorder(s, "layer", "colour", "changed")
    s.layer = 3
    s.layer = 3  # the same value: nothing
    s.colour = ColourSpec()  # equal to the default: nothing
    s.set_colormap("magma")
    assert got["layer"] == [3]
    assert [c.cmap for c in got["colour"]] == ["magma"]
    assert got["changed"] == [frozenset({"layer"}), frozenset({"colour"})]
    with pytest.raises(AttributeError, match="no field 'layers'"):
        s.layers = 1


def test_a_batch_emits_each_changed_field_once_and_one_selection():
    s = ViewState()
    got = _recorder(s, "layer", "head", "selection", "changed")
    with s.batch():
        s.layer = 1
        s.layer = 2
        s.head = 5
    assert got["layer"] == [2] and got["head"] == [5]
    assert got["selection"] == [(2, 5)]
    assert got["changed"] == [frozenset({"layer", "head"})]
    s.select(2, 5)  # nothing changes: no event at all
    assert got["selection"] == [(2, 5)]


def test_select_checks_the_range_of_the_loaded_model():
    s = ViewState(snapshot=_fake_snapshot(n_layers=4, n_heads=6))
    with pytest.raises(IndexError, match=r"layer 4 out of range 0..3"):
        s.select(4, 0)
    with pytest.raises(IndexError, match=r"head 6 out of range 0..5"):
        s.select(0, 6)
    s.select(3, 5)
    assert (s.layer, s.head) == (3, 5)


def test_derived_values_follow_the_snapshot_and_step():
    s = ViewState()
    assert (s.has_model, s.has_sequence, s.visible_len, s.sequence_key) == (False, False, 0, ())
    snap = _fake_snapshot(n_prompt=5, n_generated=2)
    s.update(snapshot=snap, step=2)
    assert s.visible_len == 7 and s.at_latest and s.group_size == 3
    s.step = 0
    assert s.visible_len == 5 and not s.at_latest
    assert s.sequence_key == ("tiny", "torch", "p", False, tuple(range(7)))


def test_connect_setattr_keeps_an_attribute_in_step():
    s = ViewState()
    target = SimpleNamespace(row=None)
    s.connect_setattr("query_row", target, "row")
    s.query_row = 4
    assert target.row == 4


def test_view_dict_round_trip_in_the_session_format():
    s = ViewState(snapshot=_fake_snapshot())
    s.update(layer=2, head=4, tab="mask", query_row=3, step=1)
    s.colour = ColourSpec(cmap="magma", scale="power", gamma=0.7, range_mode="auto")
    s.set_tab_settings("heatmap", {"aggregate": "head", "weighting": "attention"})
    s.set_tab_settings("sinks", {"threshold_spin": 0.5})
    d = s.to_view_dict()
    assert d == {
        "layer": 2,
        "head": 4,
        "tab": "mask",
        "cmap": "magma",
        "query_row": 3,
        "aggregate": "head",
        "weighting": "attention",
        "scale": "power",
        "gamma": 0.7,
        "range_mode": "auto",
        "timeline_step": 1,
        "views": {"sinks": {"threshold_spin": 0.5}},
    }
    s2 = ViewState(snapshot=_fake_snapshot())
    s2.update(**ViewState.parse_view_dict(json.loads(json.dumps(d)), s2.colour))
    assert s2.to_view_dict() == d


def test_an_old_or_hand_edited_view_dict_parses_what_it_can():
    """The view dicts session files have held since version 1: flat keys, "views" per tab; mistyped
    entries and unknown colour maps are left out, never an exception."""
    old = {"layer": 3, "head": "4", "cmap": "no-such-map", "scale": "power", "gamma": 0.7, "tab": 5}
    old["views"] = {"sinks": {"threshold_spin": 0.5}, "bad": [1]}
    v = ViewState.parse_view_dict(old, ColourSpec(cmap="plasma"))
    assert v["layer"] == 3 and "head" not in v and "tab" not in v
    assert v["colour"] == ColourSpec(cmap="plasma", scale="power", gamma=0.7)
    assert v["settings"] == {"sinks": {"threshold_spin": 0.5}}
    assert ViewState.parse_view_dict(None) == {"settings": {}}
    assert ViewState.parse_view_dict({"layer": 1}) == {"layer": 1, "settings": {}}


# -- widgets bound to the state ----------------------------------------------------------------------------------
def test_a_bound_spin_box_and_the_state_follow_each_other_once(qtbot):
    from attnscope.app.bind import bind_spin
    from PySide6.QtWidgets import QSpinBox

    s = ViewState()
    spin = QSpinBox()
    qtbot.addWidget(spin)
    spin.setRange(0, 9)
    bind_spin(s, "layer", spin)
    got = _recorder(s, "layer", "selection")
    widget_signals: list[int] = []
    spin.valueChanged.connect(widget_signals.append)

    s.layer = 4  # state → widget, with the widget's own signal blocked
    assert spin.value() == 4 and widget_signals == [] and got["layer"] == [4]
    spin.setValue(6)  # widget → state, once; the echo back to the widget does nothing
    assert s.layer == 6 and got["layer"] == [4, 6] and got["selection"] == [(4, 0), (6, 0)]
    assert widget_signals == [6]
    s.layer = 42  # out of the spin box's range: the state follows the widget's clamp
    assert spin.value() == 9 and s.layer == 9


# -- requests that know their own staleness ----------------------------------------------------------------------
def test_engine_submit_drops_a_result_once_the_state_moved_on(qtbot):
    import threading

    from attnscope.app.engine import Engine, Request

    s = ViewState()
    e = Engine(state=s)
    try:
        assert e.submit("heatmap", Request(lambda ctx: 1, print)) is None  # no sequence: not submitted
        s.snapshot = _fake_snapshot()
        got: list = []
        gate = threading.Event()
        e.enqueue(lambda ctx: gate.wait(10))  # holds the worker
        e.submit("heatmap", Request(lambda ctx: "for layer 0", got.append, key=lambda: s.layer))
        s.layer = 1  # the user moved on before the result arrived
        gate.set()
        assert e.wait_idle(30)
        assert got == []
        e.submit("heatmap", Request(lambda ctx: "for layer 1", got.append, key=lambda: s.layer))
        assert e.wait_idle(30)
        assert got == ["for layer 1"]
        # a newer request on the channel cancels a running one: it sees ctx.cancelled() and says nothing
        started, seen = threading.Event(), []

        def long_job(ctx):
            started.set()
            for _ in range(1000):
                if ctx.cancelled():
                    seen.append("cancelled")
                    from attnscope.core.errors import Cancelled

                    raise Cancelled("superseded")
                threading.Event().wait(0.01)
            return "finished"

        e.submit("grid", Request(long_job, got.append))
        assert started.wait(10)
        e.submit("grid", Request(lambda ctx: "newer", got.append))
        assert e.wait_idle(30)
        assert seen == ["cancelled"] and got == ["for layer 1", "newer"]
    finally:
        e.shutdown()


def test_the_engine_refuses_a_job_without_a_model_in_one_place(qtbot):
    from attnscope.app.engine import Engine

    e = Engine()
    try:
        errors: list[str] = []
        e.enqueue(lambda ctx: ctx.require(), on_error=errors.append)
        assert e.wait_idle(30)
        assert errors == ["no model loaded"]
    finally:
        e.shutdown()


# -- a view needs a state and an engine, no window --------------------------------------------------------------
class FakeEngine:
    """Records what a view asks for."""

    def __init__(self):
        self.requests: list = []

    def submit(self, channel, request, *args, **kwargs):
        self.requests.append((channel, request))
        return len(self.requests)

    def enqueue(self, *args, **kwargs):
        return None


def test_a_view_built_with_a_bare_state_and_a_fake_engine(qtbot):
    from attnscope.app.views.gqa import GqaView
    from attnscope.app.views.mask import MaskView

    s = ViewState(snapshot=_fake_snapshot())
    eng = FakeEngine()
    mask, gqa = MaskView(s, eng), GqaView(s, eng)
    qtbot.addWidget(mask)
    qtbot.addWidget(gqa)
    s.select(1, 2)  # neither tab is shown: nothing asked
    assert eng.requests == []
    s.tab = "mask"
    s.select(2, 4)
    assert [c for c, _r in eng.requests] == ["mask"]
    request = eng.requests[0][1]
    assert request.key() == (s.sequence_key, 2, 4, s.step)  # the sequence too (a new run: stale)
    s.head = 5
    assert request.key() == (s.sequence_key, 2, 5, s.step)  # the first request is stale now: its key moved on
    s.set_colormap("magma")
    assert mask.cmap == "magma" and gqa.cmap == "magma"


# -- in the window ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tiny_models import save_tiny

    folder = tmp_path_factory.mktemp("tiny_llama")
    save_tiny("llama", folder, seed=1)
    return folder


def test_window_state_layer_moves_the_spin_box_and_asks_once(qtbot, tiny_folder):
    from gui_helpers import ran_window

    win = ran_window(qtbot, tiny_folder, "the state is the single source of truth")
    try:
        asked: list[str] = []
        submit = win.engine.submit
        win.engine.submit = lambda channel, *a, **k: (asked.append(channel), submit(channel, *a, **k))[1]
        layers: list[int] = []
        win.state.events.layer.connect(layers.append)
        win.show_view("mask")  # the tab on screen asks too, once
        assert win.engine.wait_idle(60)
        asked.clear()
        win.state.layer = 1
        assert win.layer_spin.value() == 1 and layers == [1]
        assert asked.count("heatmap") == 1 and asked.count("mask") == 1
        assert asked.count("gqa") == 0  # a hidden tab asks when it is shown
        assert win.engine.wait_idle(60) and win.map_key[:2] == (1, 0)
        asked.clear()
        win.head_spin.setValue(1)  # the spin box: state once, one request, no loop
        assert win.state.head == 1 and asked.count("heatmap") == 1
        assert win.engine.wait_idle(60) and win.map_key[:2] == (1, 1)
    finally:
        win.close()


def test_an_old_format_session_file_still_opens(qtbot, tiny_folder, tmp_path):
    """A session saved before the view state existed (its view dict written from the widgets: flat
    heatmap keys, each tab's controls under "views") opens with every entry restored."""
    from attnscope.core.io import sessionfile
    from gui_helpers import ran_window

    win = ran_window(qtbot, tiny_folder, "an old file from an older window", steps=2)
    try:
        old_view = {
            "layer": 1,
            "head": 1,
            "tab": "sinks",
            "cmap": "magma",
            "query_row": 2,
            "aggregate": "head",
            "weighting": "attention",
            "scale": "power",
            "gamma": 0.7,
            "range_mode": "auto",
            "timeline_step": 1,
            "views": {"sinks": {"metric_combo": "Token 0 (sink score)", "threshold_spin": 0.4}},
        }
        sf = sessionfile.SessionFile.from_session(win.engine.session, view=old_view)
        path = sessionfile.save(sf, tmp_path / "old.attnscope")
        raw = json.loads(path.read_text())
        assert raw["version"] == 1 and raw["view"] == old_view
        win.select(0, 0)
        win.cmap_combo.setCurrentText("viridis")
        win.show_view("heatmap")
        assert win.engine.wait_idle(60)
        win.sessions.open_session(path)
        assert win.engine.wait_idle(120) and win.last_error is None, win.last_error
        assert (win.layer_spin.value(), win.head_spin.value()) == (1, 1)
        assert win.cmap_combo.currentText() == "magma" and win.exports.current_view_key() == "sinks"
        # the saved scale is the user's choice: the reopened map's length default (linear) keeps off it
        assert win.heatmap.scale == "power" and "power colours" in win.heatmap.plot.titleLabel.text
        assert win.heatmap.gamma == pytest.approx(0.7) and win.heatmap.range_mode == "auto"
        assert win.timeline.step == 1 and win.query_row == 2
        assert win.views["sinks"].threshold_spin.value() == pytest.approx(0.4)
        hm = win.heatmap  # the state says what the widgets show
        assert win.state.colour == ColourSpec(cmap="magma", scale=hm.scale, gamma=0.7, range_mode="auto")
        saved_again = win.sessions.view_state()  # what a save now writes: the same format
        same = [k for k in old_view if k not in ("views", "scale")]
        assert {k: saved_again[k] for k in same} == {k: old_view[k] for k in same}
        assert saved_again["scale"] == hm.scale
        assert saved_again["views"]["sinks"]["threshold_spin"] == pytest.approx(0.4)
    finally:
        win.close()
