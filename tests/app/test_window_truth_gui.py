"""The window says what ran: tabs on the live sequence say so while the timeline is back, the
next-token panel marks itself stale until its result comes, Step ×N never adds tokens off-screen,
an edited prompt box says Step continues the run shown and a backend switch keeps it, and the
colour bar has one label that names what the cells show (pytest-qt, offscreen, a tiny random llama)."""

from __future__ import annotations

import os

import numpy as np
import pytest

SHOTS = "/work/notes/shots"
PROMPT = "The cat sat on the mat. The dog sat on the log."


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tiny_models import save_tiny

    folder = tmp_path_factory.mktemp("llama_truth")
    save_tiny("llama", folder)
    return folder


@pytest.fixture()
def win(qtbot, tiny_folder):
    from gui_helpers import ran_window

    w = ran_window(qtbot, tiny_folder, PROMPT, steps=4)
    yield w
    w.close()


def _idle(w, qtbot=None):
    assert w.engine.wait_idle(60)
    from PySide6.QtWidgets import QApplication

    for _ in range(3):
        QApplication.processEvents()
    assert w.last_error is None, w.last_error


def _shot(w, name):
    os.makedirs(SHOTS, exist_ok=True)
    w.grab().save(f"{SHOTS}/window_{name}.png")


def _messages(w):
    said: list[str] = []
    w.state.events.message.connect(lambda m: said.append(m[0]))
    return said


# -- the timeline ---------------------------------------------------------------------------------
LIVE = ("kv", "roles", "experiments", "compare")


def _note(w, key):
    from attnscope.app.timeline_bar import LiveSequenceNote

    notes = w.views[key].findChildren(LiveSequenceNote)
    assert len(notes) == 1, key
    return notes[0]


def test_live_tabs_say_in_their_header_that_they_show_the_live_sequence(win):
    n = win.snapshot.seq_len
    for key in LIVE:
        assert _note(win, key).isHidden(), key  # at the newest step both agree: nothing to say
    win.timeline.set_step(1)
    _idle(win)
    for key in LIVE:
        win.show_view(key)
        _idle(win)
        note = _note(win, key)
        assert note.isVisible(), key
        assert f"all {n} positions (0..{n - 1})" in note.text()
        assert "step 1 of 4" in note.text() and f"0..{n - 4}" in note.text()
        # the note sits at the top of the tab, above its own controls
        assert note.mapTo(win.views[key], note.rect().topLeft()).y() < 10
    _shot(win, "live_note_kv")
    win.timeline.latest_button.click()
    _idle(win)
    assert all(_note(win, key).isHidden() for key in LIVE)


def test_next_token_panel_is_marked_stale_after_a_new_run_until_its_result(win):
    panel = win.decode_panel
    assert not panel.bars.stale and "stale" not in panel.header.text()
    old_header = panel.header.text()
    win.prompt_edit.setPlainText("Hello there, general Kenobi.")
    win.run_prompt()  # queued: nothing came back yet
    assert panel.bars.stale
    assert "stale: previous prompt" in panel.header.text() and old_header in panel.header.text()
    _idle(win)
    assert not panel.bars.stale and "stale" not in panel.header.text()
    assert f"position {win.snapshot.seq_len} " in panel.header.text()


def test_stale_next_token_table_is_drawn_faded(win):
    panel = win.decode_panel
    bars = panel.bars
    fresh = bars.grab().toImage()
    panel.mark_stale("stale: test")
    faded = bars.grab().toImage()

    def darkest(img):
        return min(
            img.pixelColor(x, y).value() for x in range(0, img.width(), 2) for y in range(0, img.height(), 2)
        )

    assert darkest(fresh) < 100 < darkest(faded)  # the blue bars fade towards the white ground


def test_step_n_with_the_timeline_back_moves_it_to_the_newest_and_says_so(win):
    said = _messages(win)
    win.timeline.set_step(1)
    _idle(win)
    win.step(3)
    _idle(win)
    snap = win.snapshot
    assert snap.n_generated == 7
    assert win.state.step == 7 and win.timeline.step == 7  # the new tokens are on screen
    assert win.visible_len == snap.seq_len
    assert any("timeline was at step 1 of 4" in m and "3 new tokens" in m for m in said), said


def test_an_edited_prompt_box_says_press_run_while_step_continues_the_run(win):
    label = win.controls.edited_label
    assert label.isHidden()
    ran = win.snapshot.prompt
    win.prompt_edit.setPlainText(ran + " And then?")
    assert label.isVisible() and "press Run" in label.text()
    _shot(win, "edited_hint")
    win.step(1)
    _idle(win)
    assert win.snapshot.prompt == ran  # Step continued the run shown
    assert label.isVisible()
    win.prompt_edit.setPlainText(ran)
    assert label.isHidden()
    win.prompt_edit.setPlainText("A new prompt.")
    win.run_prompt()
    _idle(win)
    assert label.isHidden()


def test_a_backend_switch_never_replaces_the_edited_prompt(win):
    typed = "Something I typed and did not run."
    win.prompt_edit.setPlainText(typed)
    snap = win.snapshot
    win.commands._backend_switched((snap, []))  # what a finished switch does with the replayed run
    _idle(win)
    assert win.prompt_edit.toPlainText() == typed
    assert win.controls.edited_label.isVisible()
    win.prompt_edit.setPlainText(snap.prompt)  # unedited: the replayed prompt is shown
    win.commands._backend_switched((snap, []))
    _idle(win)
    assert win.prompt_edit.toPlainText() == snap.prompt


# -- the colour bar's label -----------------------------------------------------------------------
def _bar_labels(hm):
    """The colour bar's axis labels that are shown: (axis name, text)."""
    out = []
    for name in ("left", "right", "top", "bottom"):
        ax = hm.colorbar.getAxis(name)
        if ax.label.isVisible() and ax.label.toPlainText().strip():
            out.append((name, ax.label.toPlainText().strip()))
    return out


def test_toggling_weights_leaves_one_colour_bar_label(win):
    hm = win.heatmap
    assert _bar_labels(hm) == [("left", "attention weight")]
    hm.weighting_combo.setCurrentIndex(hm.weighting_combo.findData("value-weighted"))
    _idle(win)
    assert [n for n, _ in _bar_labels(hm)] == ["left"]
    assert _bar_labels(hm)[0][1].startswith("value-weighted share")
    hm.weighting_combo.setCurrentIndex(hm.weighting_combo.findData("attention"))
    _idle(win)
    assert _bar_labels(hm) == [("left", "attention weight")]
    # the tick axis keeps its 45 px: a label there was clipped to a sliver beside the numbers
    assert hm.colorbar.getAxis("right").labelText == ""
    _shot(win, "weights_toggled")


def test_a_long_map_that_falls_back_to_attention_labels_its_bar_attention(win, monkeypatch):
    from attnscope.core.analysis import aggregate

    hm = win.heatmap
    monkeypatch.setattr(aggregate, "LONG_PROMPT", 8)  # this short prompt is a "long" map now
    hm.weighting_combo.setCurrentIndex(hm.weighting_combo.findData("value-weighted"))
    _idle(win)
    assert win.maps.weights is None  # the pooled overview: attention, not value-weighted
    assert _bar_labels(hm) == [("left", "attention weight")]
    assert "attention shown" in hm.plot.titleLabel.text


def test_bar_label_pixels_one_label_after_toggle(win):
    """By pixel: after a round trip the strip right of the bar's ticks is as blank as at start."""
    hm = win.heatmap

    def right_strip():
        img = hm.glw.grab().toImage()
        bar = hm.colorbar.sceneBoundingRect()
        x0 = int(bar.right()) - 12
        cols = range(max(0, x0), min(img.width(), int(bar.right()) + 1))
        rows = range(int(bar.top()) + 20, int(bar.bottom()) - 20)
        return np.array([[img.pixelColor(x, y).value() for x in cols] for y in rows])

    before = right_strip()
    for kind in ("value-weighted", "attention"):
        hm.weighting_combo.setCurrentIndex(hm.weighting_combo.findData(kind))
        _idle(win)
    after = right_strip()
    assert (after < 200).sum() <= (before < 200).sum() + 5
