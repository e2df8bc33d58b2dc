"""A session reopened in a freshly started window shows, and computes with, every saved value: no
automatic default (the heatmap's scale chosen by the map's length, the KV calculator filled from
the loaded model) replaces a value the restore set."""

from __future__ import annotations

import json

import numpy as np
import pytest
from attnscope.core.io.colormaps import normalize
from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QLineEdit, QSpinBox

PROMPT = "The cat sat on the mat. The cat"


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    from tiny_models import save_tiny

    out = {}
    for name, seed in (("a", 0), ("b", 1)):
        out[name] = tmp_path_factory.mktemp(f"llama_{name}")
        save_tiny("llama", out[name], seed=seed)
    return out


def _fresh_window(qtbot, folder):
    from attnscope.app.main_window import MainWindow

    w = MainWindow(model=str(folder))
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    assert w.engine.wait_idle(120), "model did not load"
    return w


def _click_scale(hm, scale: str) -> None:
    hm.scale_combo.setCurrentText(scale)
    hm.scale_combo.activated.emit(hm.scale_combo.currentIndex())  # what a user's click emits


def _other_value(w):
    """A value of control ``w`` other than its current one (its last item, one step up or down)."""
    if isinstance(w, QComboBox):
        return w.itemText(w.count() - 1 if w.currentIndex() != w.count() - 1 else 0)
    if isinstance(w, QLineEdit):
        return w.text() + " (edited)"
    step = w.singleStep()
    return w.value() + step if w.value() + step <= w.maximum() else w.value() - step


def _set_every_saved_control(win) -> dict:
    """Give each tab's saved controls (``STATE_CONTROLS``) a non-default value; returns what was set."""
    want = {}
    for key, view in win.views.items():
        names = getattr(view, "STATE_CONTROLS", ())
        if not names:
            continue
        win.show_view(key)  # its data first (the Sinks step's range is the report's length)
        assert win.engine.wait_idle(60) and win.last_error is None, win.last_error
        for name in names:
            w = getattr(view, name)
            v = _other_value(w)
            if isinstance(w, QComboBox):
                w.setCurrentText(v)
            elif isinstance(w, (QSpinBox, QDoubleSpinBox)):
                w.setValue(v)
            elif isinstance(w, QLineEdit):
                w.setText(v)
        want[key] = view.view_state()
    return want


def _save(win, path):
    win.sessions.save_session(path)
    assert win.engine.wait_idle(60) and win.last_error is None, win.last_error
    return json.loads(path.read_text())["view"]


def _assert_heatmap_uses(win, scale: str, gamma: float) -> None:
    """The heatmap's combo, title, range label and the image's colours all use ``scale``."""
    hm = win.heatmap
    assert hm.scale_combo.currentText() == scale and hm.scale == scale
    assert f"{scale} colours" in hm.plot.titleLabel.text, hm.plot.titleLabel.text
    assert hm.mode_label.text().split("), ")[1].startswith(scale)
    vmin, vmax = hm.value_range()
    drawn = hm.image.image
    expect = normalize(win.maps.weights, vmin, vmax, scale, gamma).astype(np.float32)
    ok = ~np.isnan(drawn)  # masked cells are transparent
    np.testing.assert_allclose(drawn[ok], expect[ok], rtol=1e-6, atol=1e-7)
    assert win.state.colour.scale == scale and win.state.colour.gamma == pytest.approx(gamma)


@pytest.mark.slow
@pytest.mark.parametrize("scale,gamma", [("log", 0.5), ("power", 0.7)])
def test_a_session_reopened_in_a_new_window_shows_every_saved_value(
    qtbot, tiny_folders, tmp_path, scale, gamma
):
    """The trial's steps: Run, step twice, scale log (or power γ 0.7), colours magma, head 1 of
    layer 1, auto range, the Sinks threshold 0.70 and every tab's saved control moved; Save; a NEW
    window (started on another model) opens the file: each control shows the file's value and the
    heatmap paints with the saved scale (it showed linear: the 31-token map's length default)."""
    from gui_helpers import ran_window

    win = ran_window(qtbot, tiny_folders["a"], PROMPT, steps=2)
    try:
        win.state.step = 1  # the timeline one token back
        want_views = _set_every_saved_control(win)
        win.views["sinks"].threshold_spin.setValue(0.70)
        kv = win.views["kv"]  # the calculator on "This model", then edited by hand
        kv.preset_combo.setCurrentIndex(0)
        assert kv.preset_combo.currentData() is None
        kv.calc_tokens.setValue(kv.calc_tokens.value() + 1000)
        kv.calc_batch.setValue(3)
        want_views["kv"] = kv.view_state()
        want_views["sinks"] = win.views["sinks"].view_state()
        win.select(1, 1)
        win.cmap_combo.setCurrentText("magma")
        hm = win.heatmap
        hm.gamma_spin.setValue(gamma)
        _click_scale(hm, scale)
        hm.set_range_mode("auto")
        hm.set_aggregate("group")  # the mean of the KV group, value-weighted
        hm.weighting_combo.setCurrentIndex(hm.weighting_combo.findData("value-weighted"))
        win.state.query_row = 2
        win.show_view("sinks")
        assert win.engine.wait_idle(60) and win.last_error is None
        saved = _save(win, tmp_path / "s.attnscope")
        assert (saved["scale"], saved["gamma"], saved["cmap"]) == (scale, pytest.approx(gamma), "magma")
        assert saved["views"]["sinks"]["threshold_spin"] == pytest.approx(0.70)
        assert (saved["aggregate"], saved["weighting"]) == ("group", "value-weighted")
    finally:
        win.close()

    win2 = _fresh_window(qtbot, tiny_folders["b"])  # another model: the reopen loads the session's
    try:
        assert win2.heatmap.scale == "linear"  # the 31-token default before the file opens
        win2.sessions.open_session(tmp_path / "s.attnscope")
        assert win2.engine.wait_idle(120) and win2.last_error is None, win2.last_error
        assert win2.engine.wait_idle(60)
        assert (win2.layer_spin.value(), win2.head_spin.value()) == (1, 1)
        assert win2.cmap_combo.currentText() == "magma" and win2.state.tab == "sinks"
        assert win2.heatmap.range_mode == "auto" and win2.state.query_row == 2
        assert win2.timeline.step == 1 == win2.state.step and saved["timeline_step"] == 1
        assert (win2.heatmap.aggregate, win2.heatmap.weighting) == ("group", "value-weighted")
        assert win2.map_key == (1, 1, "group", win2.state.visible_len)  # what was computed
        assert "value-weighted" in win2.heatmap.plot.titleLabel.text
        win2.show_view("heatmap")
        assert win2.engine.wait_idle(60)
        _assert_heatmap_uses(win2, scale, gamma)
        for key, values in want_views.items():  # every tab's saved controls, as shown
            got = win2.views[key].view_state()
            assert got == pytest.approx(values), key
            assert got == pytest.approx(saved["views"][key]), key
        again = win2.sessions.view_state()  # and a save now writes the same file
        for k in ("layer", "head", "cmap", "scale", "gamma", "range_mode", "aggregate", "weighting"):
            assert again[k] == pytest.approx(saved[k]), k
    finally:
        win2.close()


@pytest.mark.slow
def test_a_long_prompt_keeps_the_scale_the_session_saved(qtbot, tiny_folders, tmp_path, monkeypatch):
    """Beyond the sample: on a prompt at or above the long-map length (lowered to 8 tokens for the
    tiny model) the default is log; linear chosen and saved reopens linear in a new window (it
    reopened log), and a session saved on the default saves the log it showed and reopens log."""
    from attnscope.core.io import colour_scale
    from gui_helpers import ran_window

    monkeypatch.setattr(colour_scale, "LONG_MAP", 8)
    win = ran_window(qtbot, tiny_folders["a"], PROMPT)
    try:
        hm = win.heatmap
        assert hm.scale == "log" and win.state.colour.scale == "log"  # the length default, and the state
        assert _save(win, tmp_path / "default.attnscope")["scale"] == "log"
        _click_scale(hm, "linear")
        assert win.engine.wait_idle(60)
        assert _save(win, tmp_path / "linear.attnscope")["scale"] == "linear"
    finally:
        win.close()
    for name, scale in (("linear", "linear"), ("default", "log")):
        w = _fresh_window(qtbot, tiny_folders["a"])
        try:
            w.sessions.open_session(tmp_path / f"{name}.attnscope")
            assert w.engine.wait_idle(120) and w.last_error is None, w.last_error
            assert w.engine.wait_idle(60)
            _assert_heatmap_uses(w, scale, 0.5)
        finally:
            w.close()


@pytest.mark.slow
def test_the_windows_own_view_put_back_keeps_the_scale_following_the_length(qtbot, tiny_folders, monkeypatch):
    """A backend switch puts the window's own view back (restore_view with as_choice=False): a scale
    the user never chose still follows the next map's length; a reopened view's scale is a choice."""
    from attnscope.core.io import colour_scale
    from gui_helpers import ran_window

    win = ran_window(qtbot, tiny_folders["a"], PROMPT)
    try:
        hm = win.heatmap
        assert hm.scale == "linear" and not hm.scale_chosen
        win.sessions.restore_view(win.state.to_view_dict(), as_choice=False)
        assert not hm.scale_chosen
        monkeypatch.setattr(colour_scale, "LONG_MAP", 8)  # the next map is "long": log by length
        win.prompt_edit.setPlainText(PROMPT + " again")
        win.run_prompt()
        assert win.engine.wait_idle(60) and win.last_error is None
        assert hm.scale == "log" and "log colours" in hm.plot.titleLabel.text
        win.sessions.restore_view({"scale": "log"})  # a session's view: the user's choice
        assert hm.scale_chosen
    finally:
        win.close()
