"""An engine that shuts down (SIGTERM: :meth:`EngineServer.stop`) in the middle of Step ×N: the
tokens it made stay in the window, the status line says the engine is shutting down, Run / Step /
Back are off, and no key press raises a dialog while the engine is away (tiny random llama)."""

from __future__ import annotations

import pytest

pytest.importorskip("zmq", reason="the remote engine needs pyzmq (pip install -e '.[remote]')")
pytest.importorskip("pytestqt")

from test_remote import TOKEN, serving  # noqa: E402
from tiny_models import save_tiny  # noqa: E402


class _Shown:
    """QApplication as a real desktop reports it (dialogs are raised there, not offscreen)."""

    @staticmethod
    def platformName():
        return "xcb"


@pytest.mark.slow
def test_engine_stopping_mid_step_n_keeps_the_tokens_and_raises_no_dialog(qtbot, tmp_path, monkeypatch):
    from attnscope.app import status
    from attnscope.app.connect import install
    from attnscope.app.main_window import MainWindow
    from attnscope.core.session import Session
    from PySide6.QtWidgets import QApplication

    folder = tmp_path / "llama"
    save_tiny("llama", folder, seed=3)
    w = MainWindow(autoload=False)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    conn = getattr(w, "engine_connector", None) or install(w)
    dialogs: list[str] = []
    monkeypatch.setattr(status, "QApplication", _Shown)
    monkeypatch.setattr(status.QMessageBox, "warning", lambda *a: dialogs.append(a[-1]))
    served = Session.load(str(folder), device="cpu")
    try:
        with serving(served) as server:
            real_step, steps = served.step, []

            def step(n, sampling=None, progress=None, cancelled=None):
                out = real_step(n, sampling, progress=progress, cancelled=cancelled)
                steps.append(n)
                if len(steps) == 3:
                    server.stop()  # what SIGTERM does to the engine (its signal handler calls this)
                return out

            served.step = step
            conn.connect(f"127.0.0.1:{server.port}", TOKEN)
            assert w.engine.wait_idle(60) and w.last_error is None
            w.prompt_edit.setPlainText("attention is all you need")
            w.chat_check.setChecked(False)
            w.run_prompt()
            assert w.engine.wait_idle(60)
            n0 = w.snapshot.seq_len
            w.step(40)
            assert w.engine.wait_idle(60)
            for _ in range(3):
                QApplication.processEvents()
            made = w.snapshot.seq_len - n0
            assert 3 <= made < 40, made  # the decoded tokens stay in the window
            assert w.token_strip.n_shown == n0 + made  # the strip shows them
            assert (
                "engine is lost" in w.heatmap.plot.titleLabel.text
                and "engine is lost" in w.decode_panel.header.text()
            )
            err = w.last_error or ""
            assert f"Step stopped after {made} of 40" in err and "the engine is shutting down" in err, err
            assert dialogs == []
            # the commands that need the engine are off, and pressing their keys says so, never a dialog
            assert not w.run_button.isEnabled() and not w.step_button.isEnabled()
            assert not w.back_button.isEnabled() and "Reconnect" in w.step_button.toolTip()
            said: list[str] = []
            w.state.events.message.connect(lambda m: said.append(m[0]))
            for press in (lambda: w.step(1), w.run_prompt, lambda: w.step_back(1)):
                press()
            w.select(1, 1)  # a view request to the lost engine
            assert w.engine.wait_idle(60)
            for _ in range(3):
                QApplication.processEvents()
            assert dialogs == [], dialogs
            assert sum("Engine lost: File → Reconnect" in m for m in said) == 3, said
            assert w.snapshot.seq_len == n0 + made
            w.grab().save("/work/notes/shots/window_engine_lost.png")
    finally:
        w.engine.shutdown()


@pytest.mark.slow
def test_connecting_releases_the_local_model_and_says_so(qtbot, tmp_path):
    """The model loaded here is let go once the window drives an engine: no object holds its
    weights any more, and the status line says it was unloaded."""
    import gc
    import weakref

    from attnscope.app.main_window import MainWindow
    from attnscope.core.session import Session

    folder = tmp_path / "llama"
    save_tiny("llama", folder, seed=3)
    w = MainWindow(model=str(folder))
    qtbot.addWidget(w)
    w.show()
    try:
        assert w.engine.wait_idle(120) and w.last_error is None
        w.prompt_edit.setPlainText("attention is all you need")
        w.chat_check.setChecked(False)
        w.run_prompt()
        assert w.engine.wait_idle(60)
        local = w.engine.session
        weights = weakref.ref(next(local.backend.model.parameters()))
        kv_before = local.kv_cache_bytes()
        assert kv_before > 0
        del local
        said: list[str] = []
        w.state.events.message.connect(lambda m: said.append(m[0]))
        with serving(Session.load(str(folder), device="cpu")) as server:
            w.engine_connector.connect(f"127.0.0.1:{server.port}", TOKEN)
            assert w.engine.wait_idle(60) and w.last_error is None
            gc.collect()
            assert weights() is None  # nothing on this machine holds the local weights
            assert any("was unloaded from this machine's memory" in m for m in said), said
            w.engine.session.close()
    finally:
        w.engine.shutdown()
