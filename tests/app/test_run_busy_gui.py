"""What the window does while a long job runs (a new-user trial under Xvfb, /tmp/trialgui/):

* the Experiments tab runs all five by itself only on sequences up to the limit its text states;
  over it, a button says what they cost; the main views of a run never wait behind its job (it
  serves them between its chunks); a cancel is a status line, never a modal error;
* Step, Step ×N and Back are off while a prefill runs (a click queues nothing and says so), and a
  "decode cancelled after k of n" line always agrees with the counters;
* while a prompt runs, the heatmap's title, the panel covers and the timeline say so, never a message
  of an earlier state ("Cancelled: no sequence now…");
* the KV cache tab's axes carry the unit in the label, never pyqtgraph's "(x1e-09)".

Deterministic: cancels and checks happen at progress reports (the journeys' way), a gate job holds
the engine where an order must be set up, never a sleep.
"""

from __future__ import annotations

import threading

import pytest
from attnscope.app import jobs
from attnscope.app.engine import CancelledMessage
from test_gui_journeys import SHOTS, _cancel_at_progress, _trigger, visible_state

SHORT = "The cat sat on the mat. The cat"
#: 60+ tokens of the tiny model's byte-level tokenizer (its context is 256)
LONGER = "Attention lets every token look back at the tokens before it; the cat sat on the mat."


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tiny_models import save_tiny

    folder = tmp_path_factory.mktemp("llama")
    save_tiny("llama", folder)
    return folder


@pytest.fixture()
def win(qtbot, tiny_folder, monkeypatch):
    """The window on the tiny model, prefill in chunks of 8 tokens (several progress reports)."""
    from attnscope.core.backends import torch_backend
    from gui_helpers import ran_window

    monkeypatch.setattr(torch_backend, "PREFILL_CHUNK", 8)
    w = ran_window(qtbot, tiny_folder, SHORT)
    yield w
    w.close()


def _shot(w, name: str) -> None:
    """Render the window offscreen to ``/work/notes/shots/runfix_<name>.png`` (looked at by hand)."""
    try:
        SHOTS.mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    from PySide6.QtWidgets import QApplication

    for _ in range(3):
        QApplication.processEvents()
    w.grab().save(str(SHOTS / f"runfix_{name}.png"), "PNG")


def _idle(w):
    assert w.engine.wait_idle(120), "the engine did not finish"


def _at_gui_progress(w, startswith: str, fn):
    """Call ``fn()`` on the GUI thread at the first progress report starting with ``startswith``
    (the engine's GUI-side signal: the window's state as the user sees it at that moment)."""
    seen = []

    def on_progress(message, _fraction):
        if message.startswith(startswith) and not seen:
            seen.append(message)
            fn()

    w.engine.progress.connect(on_progress)
    return seen


def _labels_run(w) -> list[str]:
    ran: list[str] = []
    w.engine.busy.connect(lambda on, label: ran.append(label) if on else None)
    return ran


def _status(w) -> str:
    return w.statusBar().currentMessage()


# -- 2: decoding controls during a prefill -------------------------------------------------------------
def test_step_and_back_are_off_during_a_prefill_and_a_click_queues_nothing(win):
    w = win
    w.step(1)
    _idle(w)
    assert w.back_button.isEnabled() and w.snapshot.n_generated == 1
    during = {}

    def look():
        during["enabled"] = [b.isEnabled() for b in (w.step_button, w.stepn_button, w.back_button)]
        during["tip"] = w.step_button.toolTip()
        w.step_button.click()  # disabled: nothing
        _trigger(w, "F10")  # the shortcut reaches the command: refused, said, nothing queued
        _trigger(w, "Shift+F10")
        during["status"] = _status(w)
        during["queued"] = w.engine.worker.pending()

    w.prompt_edit.setPlainText(LONGER)
    seen = _at_gui_progress(w, "Prefill 8/", look)
    w.run_button.click()
    _idle(w)
    assert seen and during["enabled"] == [False, False, False]
    assert "Off while the prompt runs" in during["tip"]
    assert (
        during["status"].startswith("The prompt is still running (prefill)")
        and "nothing was queued" in during["status"]
    )
    assert during["queued"] == 0
    # afterwards: the new prompt and not one generated token; the controls back, with their tooltips
    s, snap = w.engine.session, w.snapshot
    assert s.n_generated == 0 and snap.n_generated == 0 and snap.seq_len == s.n_prompt > 8
    assert visible_state(w)["seq_label"] == f"seq_len {s.seq_len}  ({s.n_prompt} prompt + 0 generated)"
    assert w.step_button.isEnabled() and w.stepn_button.isEnabled() and not w.back_button.isEnabled()
    assert w.step_button.toolTip() == "Decode one token (F10)"
    assert w.last_error is None


def test_a_cancelled_decode_says_what_the_counters_show(win, monkeypatch):
    """The trial's "decode cancelled after 0 of 1 tokens" beside "+ 1 generated": the count is the
    engine's, on the sequence it decoded. Beyond it: Step ×4 cancelled inside its third token, and a Step cancelled before its first."""
    w = win
    s = w.engine.session
    n0 = s.n_prompt
    # a sequence replaced behind the window's back (as a reopened session does) before Step runs: the
    # window's snapshot had 1 generated token, the new sequence 0; one token made is no cancel
    w.step(1)
    _idle(w)
    w.engine.enqueue(
        jobs.prefill_job(LONGER, False), w.commands.ran, w.commands.command_failed, label="prefill"
    )
    w.step(1)
    _idle(w)
    assert w.last_error is None, w.last_error
    assert w.snapshot.n_generated == 1 == s.n_generated
    # Step ×4, cancelled inside its third token (which is finished): "after 3 of 4", + 4 (1 + 3)
    real, calls = s.step, []

    def step(n=1):
        calls.append(n)
        if len(calls) == 3:
            w.engine.cancel()
        return real(n)

    monkeypatch.setattr(s, "step", step)
    w.step(4)
    _idle(w)
    assert isinstance(w.last_error, CancelledMessage)
    assert w.last_error == "decode cancelled after 3 of 4 tokens; the tokens made so far stay"
    assert w.snapshot.n_generated == 4 == s.n_generated
    assert "+ 4 generated" in w.seq_label.text()
    # cancelled before its first token (Esc while it waits behind a running job): "after 0 of 1 …
    # no token was added", and the counters still say + 4
    monkeypatch.setattr(s, "step", real)
    gate = threading.Event()
    w.engine.enqueue(lambda ctx: gate.wait(60), label="gate")
    w.step(1)
    w.engine.cancel()
    gate.set()
    _idle(w)
    assert w.last_error == "decode cancelled after 0 of 1 tokens; no token was added"
    assert w.snapshot.n_generated == 4 == s.n_generated and "+ 4 generated" in w.seq_label.text()
    assert s.n_prompt != n0  # (the sequence replaced above)


# -- 3: titles during a new prefill --------------------------------------------------------------------
def test_while_a_prompt_runs_no_view_keeps_an_earlier_message(win):
    w = win
    w.prompt_edit.setPlainText(LONGER)
    seen, done = _cancel_at_progress(w, "Prefill 8/")
    w.run_prompt()
    _idle(w)
    done()
    assert seen and w.snapshot.seq_len == 0
    assert w.heatmap.plot.titleLabel.text.startswith("Cancelled: no sequence now")
    during = {}

    def look():
        during["title"] = w.heatmap.plot.titleLabel.text
        during["placeholder"] = w.heatmap.placeholder.toPlainText()
        during["readout"] = w.heatmap.readout.text()
        during["timeline"] = w.timeline.label.text()
        during["overlay"] = w._empty_overlays["mask"].text()
        during["next"] = (w.decode_panel.bars.table, w.decode_panel.bars.placeholder)
        during["status"] = _status(w)
        _shot(w, "prefill_after_cancel")

    seen = _at_gui_progress(w, "Prefill 16/", look)
    w.run_prompt()
    _idle(w)
    assert seen
    assert during["title"] == "Running the prompt (prefill)… the map comes when it ends; Esc cancels."
    assert "Cancelled" not in during["title"] and during["status"].startswith("Prefill 16/")
    assert during["timeline"] == "prefill running…"
    assert during["placeholder"] == "The prompt is running (prefill)…"
    assert during["readout"].startswith("The prompt is running")
    assert during["overlay"].startswith("The prompt is running (prefill)")
    # the next-token panel too (it said "Run a prompt to see the next-token distribution.")
    assert during["next"] == (
        None,
        "The prompt is running (prefill)… the next-token distribution comes when it ends.",
    )
    # the run ended: the map's own title, the covers' and timeline's usual words
    n = w.snapshot.seq_len
    assert (
        f"seq_len {n}" in w.heatmap.plot.titleLabel.text and "prefill" not in w.heatmap.plot.titleLabel.text
    )
    assert w._empty_overlays["mask"].text() == "Run a prompt to see this panel."
    assert w.timeline.label.text().startswith("step 0 / 0 · after prefill")
    # a cancelled run again: the covers and the timeline do not keep "running"
    seen, done = _cancel_at_progress(w, "Prefill 8/")
    w.run_prompt()
    _idle(w)
    done()
    assert seen and w.snapshot.seq_len == 0
    assert w.timeline.label.text() == "no sequence yet: run a prompt"
    assert w._empty_overlays["mask"].text() == "Run a prompt to see this panel."
    assert w.heatmap.placeholder.toPlainText() == "Run a prompt to see attention"
    assert w.heatmap.readout.text() == "Run a prompt to see attention."
    assert w.decode_panel.bars.placeholder == "Run a prompt to see the next-token distribution."


# -- 1: the Experiments tab ----------------------------------------------------------------------------
@pytest.fixture()
def limit(monkeypatch):
    """The auto-run limit made small enough for the tiny model (256 positions); the tab's text
    and its behaviour both read it."""
    from attnscope.app.views import experiments

    monkeypatch.setattr(experiments, "AUTO_RUN_MAX_TOKENS", 40)
    return 40


def test_experiments_run_by_themselves_only_up_to_the_stated_limit(limit, win):
    w = win
    view = w.views["experiments"]
    w.show_view("experiments")
    _idle(w)
    n = w.snapshot.seq_len
    assert n <= limit and view.table.rowCount() == 5 and {r.seq_len for r in view.results} == {n}
    assert f"up to {limit} tokens" in view.help.text() and not view.long_note.isVisible()
    # the trial: a longer prompt Run from this tab, the tab clicked again during the prefill
    ran = _labels_run(w)
    w.prompt_edit.setPlainText(LONGER + " " + LONGER)
    seen = _at_gui_progress(w, "Prefill 8/", lambda: (w.show_view("heatmap"), w.show_view("experiments")))
    w.run_prompt()
    _idle(w)
    T = w.snapshot.seq_len
    assert seen and T > limit
    assert "experiments" not in ran, ran  # nothing ran on its own over the limit
    assert view.table.rowCount() == 0 and view.results == []
    pi = view.plot.getPlotItem()  # nothing of the short run's rows stays: no title, the legend's own names
    assert not pi.titleLabel.isVisible() and "Evict" not in pi.titleLabel.text
    assert [label.text for _item, label in pi.legend.items] == ["unmodified", "experiment"]
    assert view.long_note.isVisible()
    note = view.long_note.text()
    assert f"{T:,} tokens, more than the {limit}" in note and "reruns it 6 times" in note
    assert view.run_all_button.text().startswith("Run all five (about ") and view.run_all_button.isEnabled()
    # the cost: six runs at this prefill's speed (never the short run's experiments: their speed is
    # their per-forward overhead), RUN_OVER_PREFILL's range of times slower
    from attnscope.app.views.experiments import RUN_OVER_PREFILL, format_estimate

    n_p, rate = view._prefill_rate
    assert n_p == T and view._run_rate[0] == n
    est = view.estimate_seconds(T)
    assert est == pytest.approx(tuple(r * 6 * T / rate for r in RUN_OVER_PREFILL))
    assert (
        format_estimate(est) in note
        and view.run_all_button.text() == f"Run all five ({format_estimate(est)})"
    )
    # the main views are of the new run
    assert w.map_key is not None and w.map_key[3] == T
    assert w.token_strip.toPlainText() != "" and w.decode_panel.bars.table is not None
    # the button runs them; their rows are of this sequence, and the note goes
    view.run_all_button.click()
    _idle(w)
    assert view.table.rowCount() == 5 and {r.seq_len for r in view.results} == {T}
    assert not view.long_note.isVisible() and view.run_all_button.text() == "Run all"
    assert view._run_rate[0] == T  # the next estimate of this length uses what these runs took
    assert view.estimate_seconds(T) == pytest.approx((6 * T / view._run_rate[1],) * 2)
    # beyond the sample: a click on Run all during a prefill runs nothing of the old sequence on the
    # new one (the job finds another sequence and adds nothing)
    w.prompt_edit.setPlainText(SHORT + " again")
    seen = _at_gui_progress(w, "Prefill 8/", view.run_all_button.click)
    w.run_prompt()
    _idle(w)
    n2 = w.snapshot.seq_len
    assert seen and n2 <= limit
    assert {r.seq_len for r in view.results} == {n2} and view.table.rowCount() == 5  # the auto-run's


def test_views_are_served_while_experiments_run(win):
    """A map asked for while Run all works (here: queued right behind it) arrives before the
    experiments end: the job serves waiting view requests between its forwards."""
    w = win
    view = w.views["experiments"]
    w.show_view("experiments")
    _idle(w)
    view.clear()
    gate = threading.Event()
    w.engine.enqueue(lambda ctx: gate.wait(60), label="gate")  # holds the engine while the queue is set up
    view.run_all_button.click()
    w.select(1, 3)  # its map request queues behind the experiments job
    at_results = []
    real = view.add_results
    view.add_results = lambda results, **kw: (at_results.append(w.map_key), real(results, **kw))
    gate.set()
    _idle(w)
    assert view.table.rowCount() == 5
    assert at_results and at_results[0] is not None and at_results[0][:2] == (1, 3), at_results


def test_cancelling_experiments_is_a_status_line_with_a_cancel_button(win):
    w = win
    view = w.views["experiments"]
    w.show_view("experiments")
    _idle(w)
    view.clear()
    during = {}
    _at_gui_progress(w, "Baseline", lambda: during.setdefault("cancel", w.cancel_button.isVisibleTo(w)))
    seen, done = _cancel_at_progress(w, "Baseline")
    view.run_all_button.click()
    _idle(w)
    done()
    assert seen and during["cancel"] is True
    assert w.last_error is None  # no error, so no dialog
    assert _status(w).startswith("Experiments stopped (cancelled): no rows added")
    assert view.table.rowCount() == 0 and view.run_all_button.isEnabled()
    # a new Run stops experiments (running or waiting) the same way, as a status line
    said = []
    w.state.events.message.connect(lambda m: said.append(m[0]))
    gate = threading.Event()
    w.engine.enqueue(lambda ctx: gate.wait(60), label="gate")  # the experiments wait behind it
    view.run_all_button.click()
    w.prompt_edit.setPlainText(LONGER)
    w.run_prompt()  # queued behind the experiments: their stop token turns true at once
    gate.set()
    _idle(w)
    assert w.last_error is None and w.snapshot.prompt == LONGER
    assert "Experiments stopped (a new prompt runs): no rows added; Run all starts them again." in said
    # the rows are the new run's own (the tab is shown: its auto-run), none of the stopped one's
    assert view.table.rowCount() == 5 and {r.seq_len for r in view.results} == {w.snapshot.seq_len}


# -- 4: the KV cache tab's units -----------------------------------------------------------------------
def test_kv_axes_carry_units_and_no_si_scaling(qtbot, tiny_folder):
    from attnscope.app.main_window import MainWindow

    w = MainWindow(model=str(tiny_folder))
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    _idle(w)
    try:
        kv = w.views["kv"]
        w.show_view("kv")
        _idle(w)
        plots = (kv.layer_plot, kv.growth_plot, kv.proj_plot)

        def labels():
            return [p.getPlotItem().getAxis(a).labelString() for p in plots for a in ("left", "bottom")]

        # no sequence: one token's K + V in a layer (2 × 2 KV heads × 16 × 4 B = 256 B) sets the range
        assert "K + V (bytes)" in labels()[0]
        assert kv.layer_plot.getPlotItem().getViewBox().viewRange()[1][1] >= 256
        assert all("(x" not in s for s in labels()), labels()
        axis = kv.layer_plot.getPlotItem().getAxis("bottom")  # layers: whole ticks only (it read 0.5, 1.5)
        ticks = [v for _spacing, vals in axis.tickValues(-0.8, 1.8, 240) for v in vals]
        assert ticks and all(float(v).is_integer() for v in ticks), ticks
        _shot(w, "kv_no_sequence")
        # a run: kB; and every range, however small or large, keeps the label's own unit
        w.prompt_edit.setPlainText(LONGER)
        w.chat_check.setChecked(False)
        w.run_prompt()
        _idle(w)
        T = w.snapshot.seq_len
        assert 2 * 2 * 16 * T * 4 >= 2000 and "K + V (kB)" in labels()[0]
        for top in (1e-9, 1e-3, 1.0, 1e4, 1e7, 1e12):
            for p in plots:
                p.getPlotItem().setYRange(0, top, padding=0)
                p.getPlotItem().setXRange(0, top, padding=0)
            assert all("(x" not in s for s in labels()), (top, labels())
    finally:
        w.close()


@pytest.mark.slow
def test_smollm2_long_run_experiments_tab_is_a_button(qtbot):
    """The trial's steps on the real model, the long prompt cut to 700 tokens (over the 512 the tab
    states): Experiments clicked during the prefill, Step pressed during it; after it the tab offers
    Run all with its cost, nothing ran by itself, the map, token text and next-token table are the
    new run's, and no token was decoded."""
    from attnscope.app.main_window import MainWindow

    words = ("The history of attention in neural networks begins with alignment models. " * 60).strip()
    w = MainWindow()
    qtbot.addWidget(w)
    w.resize(1400, 900)
    w.show()
    _idle(w)
    try:
        w.chat_check.setChecked(False)
        w.prompt_edit.setPlainText("The cat sat on the mat.")
        w.run_prompt()
        _idle(w)
        ran = _labels_run(w)
        w.prompt_edit.setPlainText(words)
        during = {}

        def look():
            w.show_view("experiments")
            w.step_button.click()
            _trigger(w, "F10")
            during["step"] = w.step_button.isEnabled()
            during["title"] = w.heatmap.plot.titleLabel.text

        seen = _at_gui_progress(w, "Prefill 512/", look)
        w.run_prompt()
        _idle(w)
        T = w.snapshot.seq_len
        assert seen and T > 512
        assert during["step"] is False and "stale: previous prompt (running the new one…)" in during["title"]
        assert "experiments" not in ran and w.snapshot.n_generated == 0
        view = w.views["experiments"]
        assert view.long_note.isVisible() and view.run_all_button.text().startswith("Run all five (about ")
        assert w.map_key is not None and w.map_key[3] == T
        assert "stale" not in w.heatmap.plot.titleLabel.text
        _shot(w, "experiments_long_run")
    finally:
        w.close()


def test_status_cancel_button_names_experiments():
    from attnscope.app.status import LONG_JOBS

    assert "experiments" in LONG_JOBS


def test_durations_are_rounded_estimates():
    from attnscope.app.views.experiments import format_duration, format_estimate

    assert [format_duration(x) for x in (0.4, 8, 62, 95, 3000, 35000)] == [
        "about 5 s",
        "about 10 s",
        "about 1 min",
        "about 2 min",
        "about 50 min",
        "about 9.7 h",
    ]
    assert format_estimate((8, 60)) == "about 10 s to 1 min"
    assert format_estimate((62, 80)) == "about 1 min"
