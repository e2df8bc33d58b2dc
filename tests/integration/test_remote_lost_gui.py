"""A lost remote engine stays said in the status bar ("engine at HOST:PORT lost — File → Reconnect")
after the error's popup and timed message are gone, until a Reconnect succeeds; the heatmap's stale
title stops saying the new prompt is running when the lost engine failed it."""

from __future__ import annotations

import pytest

pytest.importorskip("zmq", reason="the remote engine needs pyzmq (pip install -e '.[remote]')")
pytest.importorskip("pytestqt")

from test_remote import TOKEN, serving  # noqa: E402
from tiny_models import save_tiny  # noqa: E402


def _lost_text(w) -> str | None:
    """What the status bar's shown labels and message say of a lost engine (None: nothing)."""
    from PySide6.QtWidgets import QLabel

    sb = w.statusBar()
    said = [lab.text() for lab in sb.findChildren(QLabel) if lab.isVisibleTo(w)] + [sb.currentMessage()]
    lost = [t for t in said if "lost" in t]
    return lost[0] if len(lost) == 1 else (None if not lost else " | ".join(lost))


def _window_and_model(qtbot, tmp_path):
    """(a shown window with its engine connector, a tiny llama folder for the engines to serve)."""
    from attnscope.app.connect import install
    from attnscope.app.main_window import MainWindow

    folder = tmp_path / "llama"
    save_tiny("llama", folder, seed=3)
    w = MainWindow(autoload=False)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    return w, getattr(w, "engine_connector", None) or install(w), folder


@pytest.mark.slow
@pytest.mark.parametrize("first", ["step", "run"])
def test_a_lost_engine_is_said_until_reconnect(qtbot, tmp_path, first):
    """The trial's steps: connect, Run, step; the engine is killed; the next command (a step, or Run
    of a new prompt) fails: the status bar keeps "engine at 127.0.0.1:PORT lost — File → Reconnect"
    after its timed message is cleared, and through a Reconnect that finds no engine; a Reconnect to
    a new engine on the port removes it."""
    from attnscope.core.session import Session

    w, conn, folder = _window_and_model(qtbot, tmp_path)
    try:
        with serving(Session.load(str(folder), device="cpu")) as server:
            conn.connect(f"127.0.0.1:{server.port}", TOKEN)
            assert w.engine.wait_idle(60) and w.last_error is None
            session = w.engine.session
            w.prompt_edit.setPlainText("attention is all you need")
            w.chat_check.setChecked(False)
            w.run_prompt()
            assert w.engine.wait_idle(60)
            w.step(2)
            assert w.engine.wait_idle(60) and w.last_error is None
            assert _lost_text(w) is None  # connected: nothing said
            port = server.port
        lost = f"engine at 127.0.0.1:{port} lost — File → Reconnect"
        if first == "step":
            w.step(1)
        else:
            w.prompt_edit.setPlainText("a new prompt that the lost engine never runs")
            w.run_prompt()
        assert w.engine.wait_idle(60)
        assert f"engine at 127.0.0.1:{port}" in (w.last_error or "")
        w.statusBar().clearMessage()  # the error's timed message is gone ...
        assert _lost_text(w) == lost  # ... the lasting indication stays
        title = w.heatmap.plot.titleLabel.text
        assert "running" not in title, title
        assert "stale: the engine is lost — File → Reconnect" in title  # why nothing new comes
        w.grab().save(str(tmp_path / "lost.png"))
        conn.reconnect()  # nothing answers yet: still lost
        assert w.engine.wait_idle(60)
        assert "nothing answers" in (w.last_error or "")
        w.statusBar().clearMessage()
        assert _lost_text(w) == lost
        with serving(Session.load(str(folder), device="cpu"), port=port):
            conn.reconnect()
            assert w.engine.wait_idle(60)
            assert _lost_text(w) is None
            assert w.state.snapshot.n_generated == 2
            w.engine.shutdown()
            session.close()
    finally:
        w.engine.shutdown()


def test_an_engine_lost_while_the_window_is_idle_is_said_within_seconds(qtbot, tmp_path):
    """Connected and idle (no command pressed), the engine stops: within a few seconds the status
    bar says the engine is lost and where, with no progress bar shown for the look; the window keeps
    its run, and a Reconnect to a new engine on the port restores it."""
    import time

    from attnscope.app.connect import LINK_CHECK_MS
    from attnscope.core.session import Session

    w, conn, folder = _window_and_model(qtbot, tmp_path)
    busy_seen: list = []
    try:
        with serving(Session.load(str(folder), device="cpu")) as server:
            conn.connect(f"127.0.0.1:{server.port}", TOKEN)
            assert w.engine.wait_idle(60) and w.last_error is None
            w.prompt_edit.setPlainText("attention is all you need")
            w.chat_check.setChecked(False)
            w.run_prompt()
            assert w.engine.wait_idle(60)
            port = server.port
            qtbot.wait(2 * LINK_CHECK_MS + 500)  # looks while connected say nothing
            assert _lost_text(w) is None
            w.engine.busy.connect(
                lambda on, label: busy_seen.append((on, label, w.status.progress.isVisible()))
            )
        t0 = time.monotonic()  # the engine has stopped; nobody touches the window
        qtbot.waitUntil(lambda: _lost_text(w) is not None, timeout=3 * LINK_CHECK_MS + 2000)
        assert time.monotonic() - t0 < 3 * LINK_CHECK_MS / 1000 + 2
        assert f"127.0.0.1:{port}" in _lost_text(w)
        assert "the engine closed the connection" in conn.lost_label.toolTip()  # the whole line, not cut
        assert busy_seen and all(label == "link check" and not shown for _on, label, shown in busy_seen)
        assert w.state.snapshot.seq_len > 0  # the run is kept
        w.grab().save(str(tmp_path / "lost_idle.png"))
        with serving(Session.load(str(folder), device="cpu"), port=port):
            conn.reconnect()
            assert w.engine.wait_idle(60)
            assert _lost_text(w) is None and w.last_error is None
    finally:
        w.engine.shutdown()
