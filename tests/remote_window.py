"""Shared GUI test steps over a remote engine: serve a model folder on localhost, connect the window
(File → Connect to engine…), run a prompt as a user would. Needs pyzmq (the tests that use it skip
without it)."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def remote_window(
    qtbot, folder, prompt: str, steps: int = 0, size: tuple[int, int] = (1200, 800), **serve_kw
):
    """Yield a shown :class:`attnscope.app.main_window.MainWindow` connected to an ``attnscope serve``
    engine (a thread of this process) on the model in ``folder``, after Run of ``prompt`` (no chat
    template) and ``steps`` decode steps; asserts that the connection, the run and the steps
    succeeded. On exit the window's engine thread stops, the connection closes, then the server."""
    from attnscope.app.connect import install
    from attnscope.app.main_window import MainWindow
    from attnscope.core.session import Session
    from test_remote import TOKEN, serving

    w = MainWindow(autoload=False)
    qtbot.addWidget(w)
    w.resize(*size)
    w.show()
    conn = getattr(w, "engine_connector", None) or install(w)
    with serving(Session.load(str(folder), device="cpu"), **serve_kw) as server:
        conn.connect(f"127.0.0.1:{server.port}", TOKEN)
        assert w.engine.wait_idle(60) and w.last_error is None
        session = w.engine.session
        try:
            w.prompt_edit.setPlainText(prompt)
            w.chat_check.setChecked(False)
            w.run_prompt()
            assert w.engine.wait_idle(60)
            if steps:
                w.step(steps)
                assert w.engine.wait_idle(60)
            assert w.last_error is None, w.last_error
            yield w
        finally:
            w.engine.shutdown()
            session.close()
