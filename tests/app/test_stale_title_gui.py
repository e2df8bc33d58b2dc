"""The heatmap's "stale" title describes the map actually shown (its layer, head and seq_len), and its
"running the new one…" lasts only while the new prompt's run does: done, failed or cancelled, it goes."""

from __future__ import annotations

import pytest

PROMPT = "The cat sat on the mat. The cat"
LONGER = "The cat sat on the mat. The cat sat on the mat again, and then it slept there all day long."


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tiny_models import save_tiny

    folder = tmp_path_factory.mktemp("llama")
    save_tiny("llama", folder)
    return folder


def _title(win) -> str:
    return win.heatmap.plot.titleLabel.text


def _shown(win) -> str:
    """The title part before any status: the shown map's own description."""
    return _title(win).split(" · <span")[0]


@pytest.mark.slow
def test_the_stale_title_names_the_map_on_screen(qtbot, tiny_folder):
    """The trial's steps: Run, step twice, move to another head (here layer 1 head 3, as Compare's
    Run B moved the trial's window to L29 H2) and one step back on the timeline; then Run a new
    prompt: the title still names the map shown (it named layer 0 head 0 and the length of when the
    previous Run was pressed), then the new map replaces it and nothing is stale."""
    from gui_helpers import ran_window

    win = ran_window(qtbot, tiny_folder, PROMPT, steps=2)
    try:
        n = win.state.snapshot.seq_len
        win.select(1, 3)
        assert win.engine.wait_idle(60)
        win.state.step = 1
        assert win.engine.wait_idle(60) and win.last_error is None
        shown = f"Layer 1 · query head 3 (reads KV head 1) · seq_len {n - 1} · step 1 of 2"
        assert _shown(win).startswith(shown), _title(win)
        assert win.map_key[:2] == (1, 3) and win.map_key[3] == n - 1
        win.prompt_edit.setPlainText(LONGER)
        win.run_prompt()  # the stale mark is set at once, before the engine runs the prompt
        title = _title(win)
        assert _shown(win).startswith(shown) and "Layer 0" not in title, title
        assert "stale: previous prompt (running the new one…)" in title
        assert win.engine.wait_idle(60) and win.last_error is None
        m = win.state.snapshot.seq_len
        assert m > n and "stale" not in _title(win) and "running" not in _title(win)
        assert _shown(win).startswith(f"Layer 1 · query head 3 (reads KV head 1) · seq_len {m}")
    finally:
        win.close()


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["failed", "was cancelled"])
def test_running_goes_when_the_run_ends_without_a_new_sequence(qtbot, tiny_folder, monkeypatch, ending):
    """Beyond the sample: the new prompt's run fails (or is cancelled) and the engine cannot be asked
    what it holds now (as with a killed remote engine): the title says the run ended, never that
    it is still running, and still names the map shown."""
    from attnscope.app import jobs
    from attnscope.core.errors import Cancelled, SessionError
    from gui_helpers import ran_window

    win = ran_window(qtbot, tiny_folder, PROMPT)
    try:
        n = win.state.snapshot.seq_len
        win.select(1, 2)
        assert win.engine.wait_idle(60)

        def broken_prefill(prompt, chat):
            def job(ctx):
                raise (
                    Cancelled("prefill cancelled")
                    if ending == "was cancelled"
                    else SessionError("engine gone")
                )

            return job

        def broken_sync(ctx):
            raise SessionError("engine gone")

        monkeypatch.setattr(jobs, "prefill_job", broken_prefill)
        monkeypatch.setattr(jobs, "sync_job", broken_sync)
        win.prompt_edit.setPlainText(LONGER)
        win.run_prompt()
        assert "running the new one" in _title(win)
        assert win.engine.wait_idle(60)
        title = _title(win)
        assert "running" not in title and f"stale: previous prompt (the new run {ending})" in title, title
        assert _shown(win).startswith(f"Layer 1 · query head 2 (reads KV head 1) · seq_len {n}")
    finally:
        win.close()
