"""Shared GUI test steps: open the window on a model folder and run a prompt as a user would."""

from __future__ import annotations


def ran_window(qtbot, folder, prompt: str, steps: int = 0, size: tuple[int, int] = (1400, 900)):
    """A shown :class:`attnscope.app.main_window.MainWindow` on ``folder`` after Run of ``prompt`` (no chat
    template) and ``steps`` decode steps; asserts that the load, the run and the steps succeeded."""
    from attnscope.app.main_window import MainWindow

    w = MainWindow(model=str(folder))
    qtbot.addWidget(w)
    w.resize(*size)
    w.show()
    assert w.engine.wait_idle(120), "model did not load"
    return run_in(w, prompt, steps)


def run_in(w, prompt: str, steps: int = 0):
    """Type ``prompt`` (no chat template), press Run, step ``steps`` tokens, as a user would; asserts
    each finished without an error. Returns the window."""
    w.prompt_edit.setPlainText(prompt)
    w.chat_check.setChecked(False)
    w.run_prompt()
    assert w.engine.wait_idle(60)
    if steps:
        w.step(steps)
        assert w.engine.wait_idle(60)
    assert w.last_error is None, w.last_error
    return w
