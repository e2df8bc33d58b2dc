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
    from gui_helpers import run_in
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
            yield run_in(w, prompt, steps)
        finally:
            w.engine.shutdown()
            session.close()


def tiny_local_run(tmp_path, prompt: str, family: str = "qwen3", seed: int = 5):
    """``(folder, session)``: a tiny random ``family`` model saved under ``tmp_path`` and an
    in-process Session on it that ran ``prompt`` (no chat template): what a remote view is compared
    against."""
    from attnscope.core.session import Session
    from tiny_models import save_tiny

    folder = tmp_path / family
    save_tiny(family, folder, seed=seed)
    local = Session.load(str(folder), device="cpu")
    local.prefill(prompt, chat_template=False)
    return folder, local
