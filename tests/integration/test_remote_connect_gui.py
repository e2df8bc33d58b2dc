"""Connecting the window to an engine (new-user trial): the token never in the world-readable
settings file (a 0600 file of its own, remembered only after a connection succeeded, an old plaintext
one moved out of the ini), and File → Connect and ``attnscope --engine`` both adopting the engine's
run with its own prompt text, so the prompt box, the text and the views describe one sequence."""

from __future__ import annotations

import stat

import pytest

pytest.importorskip("zmq", reason="the remote engine needs pyzmq (pip install -e '.[remote]')")
pytest.importorskip("pytestqt")

from test_remote import TOKEN, serving  # noqa: E402
from tiny_models import save_tiny  # noqa: E402


@pytest.fixture
def config(tmp_path, monkeypatch):
    """The token file's folder and the window's settings file, both in ``tmp_path``."""
    from attnscope.app import connect
    from PySide6.QtCore import QSettings

    cfg = tmp_path / "config"
    monkeypatch.setenv("ATTNSCOPE_CONFIG_DIR", str(cfg))
    ini = tmp_path / "AttnScope.ini"
    monkeypatch.setattr(connect, "_settings", lambda: QSettings(str(ini), QSettings.IniFormat))
    return cfg, ini


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- the token file, no window -----------------------------------------------------------------------
def test_token_store_is_0600_and_keeps_one_token_per_address(config):
    from attnscope.core.remote import token_store as ts

    cfg, _ = config
    assert ts.saved_token("127.0.0.1:8765") is None and not ts.token_file().exists()
    ts.save_token("127.0.0.1:8765", "tok-a")
    ts.save_token("gpu-box:9000", "tok-b")
    assert ts.token_file() == cfg / "engine-tokens.json"
    assert _mode(ts.token_file()) == 0o600
    assert ts.saved_token("127.0.0.1:8765") == "tok-a" and ts.saved_token(" gpu-box:9000 ") == "tok-b"
    ts.forget_token("127.0.0.1:8765")
    assert ts.saved_token("127.0.0.1:8765") is None and ts.saved_token("gpu-box:9000") == "tok-b"
    # a file someone left world-readable becomes 0600 at the next write; an empty store leaves no file
    ts.token_file().chmod(0o644)
    ts.save_token("gpu-box:9000", "tok-c")
    assert _mode(ts.token_file()) == 0o600 and ts.saved_token("gpu-box:9000") == "tok-c"
    ts.save_token("gpu-box:9000", None)
    assert not ts.token_file().exists()
    ts.token_file().parent.mkdir(exist_ok=True)
    ts.token_file().write_text("not json")
    assert ts.saved_token("gpu-box:9000") is None  # a damaged file reads as empty


def test_the_dialog_token_follows_the_address_until_one_is_typed(qtbot, config, monkeypatch):
    """File → Connect to engine…: editing the address fills in the token remembered for it (else
    $ATTNSCOPE_TOKEN, else nothing); once the user types a token, it stays."""
    from attnscope.app.connect import ConnectDialog
    from attnscope.core.remote import token_store as ts
    from PySide6.QtCore import Qt

    _, ini = config
    monkeypatch.delenv("ATTNSCOPE_TOKEN", raising=False)
    ts.save_token("127.0.0.1:8765", "tok-local")
    ts.save_token("gpu-box:9000", "tok-gpu")
    dlg = ConnectDialog()
    qtbot.addWidget(dlg)
    assert dlg.address.text() == "127.0.0.1:8765" and dlg.token.text() == "tok-local"
    dlg.address.clear()
    qtbot.keyClicks(dlg.address, "gpu-box:9000")
    assert dlg.token.text() == "tok-gpu"
    qtbot.keyClicks(dlg.address, "1")  # gpu-box:90001: nothing remembered there
    assert dlg.token.text() == ""
    monkeypatch.setenv("ATTNSCOPE_TOKEN", "from-env")
    qtbot.keyClick(dlg.address, Qt.Key_Backspace)
    assert dlg.token.text() == "tok-gpu"
    qtbot.keyClick(dlg.address, Qt.Key_Backspace)
    assert dlg.token.text() == "from-env"  # gpu-box:900
    qtbot.keyClicks(dlg.token, "-typed")
    dlg.address.setText("127.0.0.1:8765")
    assert dlg.token.text() == "from-env-typed"  # what the user typed is kept


# -- the window ---------------------------------------------------------------------------------------
def _window(qtbot):
    from attnscope.app.connect import install
    from attnscope.app.main_window import MainWindow

    w = MainWindow(autoload=False)
    qtbot.addWidget(w)
    w.resize(1000, 700)
    w.show()
    return w, getattr(w, "engine_connector", None) or install(w)


def _accept_with(monkeypatch, address: str, token: str) -> None:
    """File → Connect to engine…'s dialog, filled in with ``address`` and ``token`` and accepted."""
    from attnscope.app.connect import ConnectDialog
    from PySide6.QtWidgets import QDialog

    def exec_(dlg):
        dlg.address.setText(address)
        dlg.token.setText(token)
        return QDialog.Accepted

    monkeypatch.setattr(ConnectDialog, "exec", exec_)


@pytest.mark.slow
def test_the_token_never_goes_in_the_settings_file(qtbot, tmp_path, config, monkeypatch):
    from attnscope.app.connect import ConnectDialog
    from attnscope.core.remote import token_store as ts
    from attnscope.core.session import Session
    from PySide6.QtCore import QSettings

    cfg, ini = config
    folder = tmp_path / "qwen3"
    save_tiny("qwen3", folder, seed=5)
    with serving(Session.load(str(folder), device="cpu")) as server:
        addr = f"127.0.0.1:{server.port}"
        old = QSettings(str(ini), QSettings.IniFormat)  # what an older version left: the token in clear
        old.setValue("engine/address", addr)
        old.setValue("engine/token", "plaintext-old-token")
        old.sync()
        w, conn = _window(qtbot)
        try:
            # opening the window moves it out of the ini, into the 0600 file
            assert "plaintext-old-token" not in ini.read_text()
            assert ts.saved_token(addr) == "plaintext-old-token" and _mode(ts.token_file()) == 0o600
            # a wrong token: refused, and remembered nowhere
            _accept_with(monkeypatch, addr, "wrong-token")
            conn.connect_dialog()
            assert w.engine.wait_idle(60)
            assert w.last_error is not None
            assert "wrong-token" not in ini.read_text() and "wrong-token" not in ts.token_file().read_text()
            assert ts.saved_token(addr) == "plaintext-old-token"
            # the right one: connected, then remembered in the 0600 file only
            _accept_with(monkeypatch, addr, TOKEN)
            conn.connect_dialog()
            assert w.engine.wait_idle(60) and w.last_error is None
            assert w.engine.session.info is not None
            assert ts.saved_token(addr) == TOKEN and _mode(ts.token_file()) == 0o600
            text = ini.read_text()
            assert TOKEN not in text and "token" not in text and addr in text
            assert list(cfg.iterdir()) == [ts.token_file()]  # no temporary file left behind
            monkeypatch.undo()  # the real dialog again (the settings fixture is re-applied below)
            monkeypatch.setenv("ATTNSCOPE_CONFIG_DIR", str(cfg))
            from attnscope.app import connect

            monkeypatch.setattr(connect, "_settings", lambda: QSettings(str(ini), QSettings.IniFormat))
            dlg = ConnectDialog(w)
            assert dlg.address.text() == addr and dlg.token.text() == TOKEN  # prefilled for next time
            dlg.deleteLater()
        finally:
            w.engine.shutdown()
            if hasattr(w.engine.session, "close"):
                w.engine.session.close()


@pytest.mark.slow
def test_a_failed_connection_says_so_and_the_dialog_shows_the_engine_in_use(
    qtbot, tmp_path, config, monkeypatch
):
    """A wrong token at File → Connect (or ``--engine``) reads "Could not connect to the engine at
    …", not "Could not load the model"; with no model, the model line says what to do next. Once
    connected (``attnscope --engine``, nothing remembered), the dialog shows that engine and its
    token, not the remembered default address."""
    from attnscope.app.connect import ConnectDialog
    from attnscope.core.session import Session

    monkeypatch.delenv("ATTNSCOPE_TOKEN", raising=False)
    folder = tmp_path / "qwen3"
    save_tiny("qwen3", folder, seed=5)
    with serving(Session.load(str(folder), device="cpu")) as server:
        addr = f"127.0.0.1:{server.port}"
        w, conn = _window(qtbot)
        try:
            conn.connect(addr, "wrong-token")
            assert w.engine.wait_idle(60)
            assert (
                w.last_error == f"Could not connect to the engine at {addr}: refused: wrong or missing token"
            )
            assert w.status.model_label.text().startswith("No model: File → Connect to engine…")
            import socket

            with socket.socket() as sk:  # a port where nothing listens: the address said once
                sk.bind(("127.0.0.1", 0))
                dead = f"127.0.0.1:{sk.getsockname()[1]}"
            from attnscope.core.remote.client import RemoteSession

            connect = RemoteSession.connect.__func__
            monkeypatch.setattr(
                RemoteSession,
                "connect",
                classmethod(
                    lambda cls, a, token=None, **kw: connect(cls, a, token=token, connect_timeout=1.0)
                ),
            )
            conn.connect(dead, TOKEN)
            assert w.engine.wait_idle(60)
            assert w.last_error == (
                f"Could not connect to the engine at {dead}: nothing answers there within 1 s "
                "(is `attnscope serve` running there, or an SSH tunnel open to it?)"
            )
            monkeypatch.setattr(RemoteSession, "connect", classmethod(connect))  # the real one again
            conn.connect(addr, TOKEN)  # as attnscope --engine does: nothing remembered
            assert w.engine.wait_idle(60) and w.engine.session.info is not None
            dlg = ConnectDialog(w, current=(addr, TOKEN))
            assert dlg.address.text() == addr and dlg.token.text() == TOKEN
            dlg.deleteLater()
            seen = {}

            def exec_(dlg):
                seen["address"], seen["token"] = dlg.address.text(), dlg.token.text()
                return 0  # Cancel

            monkeypatch.setattr(ConnectDialog, "exec", exec_)
            conn.connect_dialog()  # File → Connect to engine… while connected
            assert seen == {"address": addr, "token": TOKEN}
        finally:
            w.engine.shutdown()
            if hasattr(w.engine.session, "close"):
                w.engine.session.close()


def _engine_with_a_run(server, prompt: str) -> None:
    """What ``attnscope export --engine … --prompt PROMPT`` leaves on the engine: its run."""
    from attnscope.core.remote.client import RemoteSession

    r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN)
    r.prefill(prompt, chat_template=False)
    r.step(1)
    r.close()


def _describes_one_sequence(w, prompt: str, n_tokens: int) -> None:
    snap = w.state.snapshot
    assert w.prompt_edit.toPlainText() == prompt == snap.prompt
    assert snap.seq_len == n_tokens and not w.chat_check.isChecked()
    assert "no sequence yet" not in w.timeline.label.text()


@pytest.mark.slow
def test_file_connect_adopts_the_engines_run_with_its_prompt(qtbot, tmp_path, config):
    from attnscope.core.session import Session

    folder = tmp_path / "qwen3"
    save_tiny("qwen3", folder, seed=5)
    local = Session.load(str(folder), device="cpu")
    local.prefill("x y z", chat_template=False)
    local.step(1)
    with serving(Session.load(str(folder), device="cpu")) as server:
        _engine_with_a_run(server, "x y z")
        w, conn = _window(qtbot)
        assert w.prompt_edit.toPlainText() != "x y z"  # the default prompt before connecting
        try:
            conn.connect(f"127.0.0.1:{server.port}", TOKEN)
            assert w.engine.wait_idle(60) and w.last_error is None
            _describes_one_sequence(w, "x y z", local.seq_len)
            assert [t.text for t in w.state.snapshot.tokens] == [t.text for t in local.tokens]
        finally:
            w.engine.shutdown()
            w.engine.session.close()


def _launch(args, monkeypatch, seen: dict):
    """``attnscope --engine … --screenshot PNG``: record what the window shows before it goes."""
    from attnscope.app import launch
    from PySide6.QtCore import QSettings

    real_dispose = launch._dispose

    def dispose(app, win):
        seen["prompt"] = win.prompt_edit.toPlainText()
        seen["snap"] = win.state.snapshot
        seen["chat"] = win.chat_check.isChecked()
        seen["error"] = win.last_error
        win.engine.shutdown()
        if hasattr(win.engine.session, "close"):
            win.engine.session.close()
        real_dispose(app, win)

    monkeypatch.setattr(launch, "_dispose", dispose)
    fmt = QSettings.defaultFormat()
    try:
        assert launch.run_gui(args) == 0
    finally:
        QSettings.setDefaultFormat(fmt)


@pytest.mark.slow
def test_launch_with_engine_adopts_the_run_and_a_prompt_flag_replaces_it(
    qtbot, tmp_path, config, monkeypatch
):
    from attnscope.core.cli.main import build_parser
    from attnscope.core.session import Session

    folder = tmp_path / "qwen3"
    save_tiny("qwen3", folder, seed=5)
    local = Session.load(str(folder), device="cpu")
    local.prefill("x y z", chat_template=False)
    n_xyz = local.seq_len + 1
    local.prefill("the cat sat", chat_template=False)
    n_cat = local.seq_len
    tok = tmp_path / "token"
    tok.write_text(TOKEN + "\n")
    with serving(Session.load(str(folder), device="cpu")) as server:
        _engine_with_a_run(server, "x y z")
        base = ["--engine", f"127.0.0.1:{server.port}", "--token-file", str(tok), "--size", "900x600"]
        seen: dict = {}
        _launch(
            build_parser().parse_args([*base, "--screenshot", str(tmp_path / "a.png")]), monkeypatch, seen
        )
        assert seen["error"] is None
        assert seen["prompt"] == "x y z" == seen["snap"].prompt and seen["snap"].seq_len == n_xyz
        # --prompt: that prompt in the box and in the run, never the engine's old one under it
        seen = {}
        args = [
            *base,
            "--screenshot",
            str(tmp_path / "b.png"),
            "--prompt",
            "the cat sat",
            "--no-chat-template",
        ]
        _launch(build_parser().parse_args(args), monkeypatch, seen)
        assert seen["error"] is None
        assert seen["prompt"] == "the cat sat" == seen["snap"].prompt and seen["snap"].seq_len == n_cat
        assert (tmp_path / "b.png").stat().st_size > 0
