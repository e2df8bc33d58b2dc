"""The window on a remote engine: File → Connect to engine…, the status bar's "on HOST",
a lost connection as a status line, Reconnect replaying the run to the same map."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("zmq", reason="the remote engine needs pyzmq (pip install -e '.[remote]')")
pytest.importorskip("pytestqt")

from test_remote import TOKEN, serving  # noqa: E402
from tiny_models import save_tiny  # noqa: E402


@pytest.mark.slow
def test_window_on_a_remote_engine_connects_loses_and_reconnects(qtbot, tmp_path):
    from attnscope.app.connect import install
    from attnscope.app.main_window import MainWindow
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

    folder = tmp_path / "qwen3"
    save_tiny("qwen3", folder, seed=5)
    local = Session.load(str(folder), device="cpu")
    w = MainWindow(autoload=False)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    conn = getattr(w, "engine_connector", None) or install(w)
    assert conn.connect_action.text() == "Connect to &engine…" and not conn.reconnect_action.isEnabled()
    with serving(Session.load(str(folder), device="cpu")) as server:
        conn.connect(f"127.0.0.1:{server.port}", TOKEN)
        assert w.engine.wait_idle(60) and w.last_error is None
        session = w.engine.session
        assert isinstance(session, RemoteSession)
        host = session.backend.host
        assert w.status.model_label.text().endswith(f"torch cpu on {host}")
        assert conn.reconnect_action.isEnabled()
        w.prompt_edit.setPlainText("attention is all you need")
        w.chat_check.setChecked(False)
        w.run_prompt()
        assert w.engine.wait_idle(60)
        w.step(2)
        assert w.engine.wait_idle(60) and w.last_error is None
        w.state.select(1, 3)
        assert w.engine.wait_idle(60)
        local.prefill("attention is all you need", chat_template=False)
        local.step(2)
        assert np.array_equal(w.heatmap.weights, local.weights(1, 3))  # bit-identical on screen
        port = server.port
    # the engine is gone: the next command fails with one status line, the window keeps its run
    w.step(1)
    assert w.engine.wait_idle(60)
    said = w.last_error or ""  # the first job says "lost the connection …", later ones "not connected …"
    assert f"engine at 127.0.0.1:{port}" in said and "reconnect" in said
    assert w.state.snapshot.n_generated == 2
    # a new engine on the same port; Reconnect replays prompt + generated ids
    fresh = Session.load(str(folder), device="cpu")
    with serving(fresh, port=port) as server:
        conn.reconnect()
        assert w.engine.wait_idle(60)
        assert w.state.snapshot.n_generated == 2 and fresh.ids == local.ids
        w.state.select(0, 1)
        assert w.engine.wait_idle(60)
        assert np.array_equal(w.heatmap.weights, local.weights(0, 1))
        assert w.status.model_label.text().endswith(f"on {host}")
        w.grab().save("/work/notes/shots/h6_remote_engine.png")
        w.engine.shutdown()
        session.close()
