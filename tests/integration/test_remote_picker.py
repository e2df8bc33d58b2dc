"""File → Open model while the window drives a remote engine: the picker lists the
*engine's* models (``RemoteSession.models()``, never this machine's scan) and the chosen one is
loaded on the engine; the session stays remote and its maps are the local model's, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("zmq", reason="the remote engine needs pyzmq (pip install -e '.[remote]')")
pytest.importorskip("pytestqt")

from test_remote import TOKEN, serving  # noqa: E402
from tiny_models import save_tiny  # noqa: E402


@pytest.mark.slow
def test_open_model_while_connected_lists_and_loads_the_engines_models(qtbot, tmp_path, monkeypatch):
    from attnscope.app import model_picker
    from attnscope.app.connect import install
    from attnscope.app.main_window import MainWindow
    from attnscope.core.loading import catalog, describe_model
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

    first, second = tmp_path / "engine-qwen3", tmp_path / "engine-llama"
    save_tiny("qwen3", first, seed=5)
    save_tiny("llama", second, seed=7)
    engine_entries = describe_model.describe_path(second, "user") + describe_model.describe_path(
        first, "user"
    )
    assert [e.supported for e in engine_entries] == [True, True]

    def local_scan():  # the picker must not list this machine's models while connected
        raise AssertionError("the picker scanned this machine instead of the engine")

    monkeypatch.setattr(catalog, "scan", local_scan)
    monkeypatch.setattr(model_picker.catalog, "scan", local_scan)

    w = MainWindow(autoload=False)
    qtbot.addWidget(w)
    w.resize(1200, 800)
    w.show()
    conn = getattr(w, "engine_connector", None) or install(w)
    seen = {}

    def exec_picker(dlg):  # stands in for the user: wait for the list, look, choose the llama
        qtbot.waitUntil(lambda: len(dlg.model.entries) == 2, timeout=30000)
        seen["names"] = [e.name for e in dlg.model.entries]
        seen["paths"] = sorted(str(e.path) for e in dlg.model.entries)
        seen["title"] = dlg.windowTitle()
        seen["status"] = dlg.status.text()
        seen["buttons"] = [b.isEnabled() for b in (dlg.add_folder_btn, dlg.add_gguf_btn, dlg.cache_btn)]
        seen["devices"] = [dlg.device.itemText(i) for i in range(dlg.device.count())]
        seen["hint"], seen["drops"] = dlg.drop_hint.text(), dlg.acceptDrops()
        assert dlg.select(str(second))
        seen["remove"] = dlg.remove_btn.isEnabled()
        dlg.show()
        dlg.grab().save("/work/notes/shots/h10_picker_remote.png")
        return 1

    monkeypatch.setattr(model_picker.ModelPickerDialog, "exec", exec_picker)
    with serving(Session.load(str(first), device="cpu")) as server:
        server.op_models = lambda: engine_entries  # the engine machine's catalog
        conn.connect(f"127.0.0.1:{server.port}", TOKEN)
        assert w.engine.wait_idle(60) and w.last_error is None
        session = w.engine.session
        assert isinstance(session, RemoteSession)
        w.open_model_dialog()
        assert w.engine.wait_idle(60) and w.last_error is None
        assert sorted(seen["paths"]) == sorted([str(first), str(second)])
        assert seen["title"].startswith(f"Open model on the engine at 127.0.0.1:{server.port}")
        assert seen["buttons"] == [False, False, False] and seen["remove"] is False
        assert seen["devices"] == ["cpu"]  # the engine runs on its cpu
        # no "drop a folder here" invitation: drops are refused, the models are the engine's
        assert (
            seen["drops"] is False
            and "drop" not in seen["hint"]
            and "attnscope serve --model" in seen["hint"]
        )
        assert "free RAM on the engine (" in seen["status"], seen["status"]  # its memory, not ours
        # loaded on the engine, not here: the window's session is still the remote one
        assert w.engine.session is session and isinstance(w.engine.session, RemoteSession)
        assert str(server.session.info.source) == str(second)
        assert session.info.architecture == "llama" and session.info.n_layers == 2
        assert w.status.model_label.text().endswith(f"on {session.backend.host}")
        w.prompt_edit.setPlainText("attention is all you need")
        w.chat_check.setChecked(False)
        w.run_prompt()
        assert w.engine.wait_idle(60)
        w.state.select(1, 2)
        assert w.engine.wait_idle(60) and w.last_error is None
        local = Session.load(str(second), device="cpu")
        local.prefill("attention is all you need", chat_template=False)
        assert np.array_equal(w.heatmap.weights, local.weights(1, 2))
        w.engine.shutdown()
        session.close()


def test_engine_scanner_lists_the_engines_models_and_says_a_lost_engine_in_one_line(tmp_path):
    from attnscope.app.remote_picker import engine_scanner
    from attnscope.core.loading import describe_model
    from attnscope.core.remote.client import EngineLost, RemoteSession

    folder = tmp_path / "m"
    save_tiny("qwen3", folder, seed=1)
    entries = describe_model.describe_path(folder, "user")
    with serving(None) as server:
        server.op_models = lambda: entries
        s = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN)
        free: dict = {}
        scan = engine_scanner(s, timeout=5, free=free)
        got = scan()
        assert got == entries and got[0].model_ref == str(folder) and got[0].n_kv_heads == 2
        assert sorted(free) == [("mlx", "cpu"), ("torch", "cpu")]
        got_free, label = free[("torch", "cpu")]
        assert isinstance(got_free, int) and got_free > 0 and label.startswith("RAM on the engine (")
        with pytest.raises(ValueError, match="free_memory takes a backend"):
            s._request("free_memory", {"backend": 3, "device": "cpu"})  # one line, still serving
        assert s.free_memory("torch", "cpu")[0] > 0
        s.close()
    with pytest.raises(EngineLost, match="engine at 127.0.0.1"):
        scan()  # nothing answers there now: one line, the picker shows "Scanning failed: …"


def test_engine_scanner_waits_while_the_engine_runs_the_windows_long_request(tmp_path):
    """Browse… / Open model… while the engine is still prefilling for the window: the scan asks again
    until the engine is idle (it answered "busy" before), and still says Busy after its timeout."""
    import threading
    import time

    from attnscope.app.remote_picker import engine_scanner
    from attnscope.core.loading import describe_model
    from attnscope.core.remote.client import Busy, RemoteSession

    folder = tmp_path / "m"
    save_tiny("qwen3", folder, seed=1)
    entries = describe_model.describe_path(folder, "user")
    with serving(None) as server:
        server.op_models = lambda: entries
        busy_answers = []
        real_send = server._error

        def counting_error(ident, rid, kind, message):
            if kind == "Busy":
                busy_answers.append(message)
            real_send(ident, rid, kind, message)

        server._error = counting_error

        def long_request(ids, seconds=1.5):  # what a prefill does: work, polling the socket between chunks
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                time.sleep(0.05)
                server._poll_while_busy()
            return "done"

        server.op_decode = long_request
        window = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN)
        th = threading.Thread(target=lambda: window._request("decode", {"ids": []}))
        th.start()
        time.sleep(0.3)  # the window's request is running on the engine
        got = engine_scanner(window, timeout=20, free={})()
        th.join(10)
        assert got == entries
        assert busy_answers and busy_answers[0].startswith("the engine is busy (decode)")
        # an engine busy for longer than the scan's timeout: one Busy line
        th = threading.Thread(target=lambda: window._request("decode", {"ids": [], "seconds": 3.0}))
        th.start()
        time.sleep(0.3)
        with pytest.raises(Busy, match="the engine is busy"):
            engine_scanner(window, timeout=1, free={})()
        th.join(10)
        window.close()
