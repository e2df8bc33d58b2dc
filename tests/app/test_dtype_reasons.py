"""A dtype reason says "asked for" only when the user chose the dtype (new-user trial):
``attnscope bench --quantize int8`` (auto) reports why it settled on its dtype, not "asked for
(--dtype bfloat16)"; a failed load or connect leaves the window's dtype choice at "auto", so the
model picker (local or the engine's) does not preselect the resolved dtype as if it were asked for."""

from __future__ import annotations

import pytest
from tiny_models import save_tiny


def _in_process(monkeypatch):
    """The bench's phases in this process (each normally runs in a fresh one)."""
    from attnscope.core.bench import size

    monkeypatch.setattr(size, "_in_subprocess", lambda phase, spec, timeout: size.PHASES[phase](spec))
    return size


@pytest.mark.slow
def test_bench_reason_says_asked_for_only_when_asked(tmp_path, monkeypatch):
    pytest.importorskip("torchao")
    from attnscope.core.loading.precision import decide

    size = _in_process(monkeypatch)
    folder = tmp_path / "llama"
    save_tiny("llama", folder)
    auto = size.run_size_bench(
        size.SizeOptions(
            model=str(folder), quantize="int8", device="cpu", sizes=(8,), decode_steps=1, phases=("scope",)
        )
    )
    want_dtype, want_reason = decide(str(folder), "auto", "cpu")
    assert auto["options"]["dtype"] == "auto"
    assert auto["dtype"] == auto["scope"]["dtype"] == want_dtype
    assert auto["dtype_reason"] == auto["scope"]["dtype_reason"] == want_reason
    assert "asked for" not in auto["scope"]["dtype_reason"]
    # asked for: said so, in both places
    asked = size.run_size_bench(
        size.SizeOptions(
            model=str(folder),
            dtype="bfloat16",
            quantize="int8",
            device="cpu",
            sizes=(8,),
            decode_steps=1,
            phases=("scope",),
        )
    )
    assert asked["scope"]["dtype"] == "bfloat16"
    assert asked["scope"]["dtype_reason"] == "bfloat16: asked for (--dtype bfloat16)" == asked["dtype_reason"]


@pytest.mark.slow
def test_a_failed_connect_keeps_the_dtype_choice_auto(qtbot, tmp_path, monkeypatch):
    pytest.importorskip("zmq", reason="the remote engine needs pyzmq")
    from attnscope.app.connect import install
    from attnscope.app.main_window import MainWindow
    from attnscope.app.model_picker import ModelPickerDialog
    from attnscope.core.session import Session
    from test_remote import TOKEN, serving

    monkeypatch.setenv("ATTNSCOPE_CONFIG_DIR", str(tmp_path / "config"))
    folder = tmp_path / "qwen3"
    save_tiny("qwen3", folder, seed=5)
    w = MainWindow(autoload=False)
    qtbot.addWidget(w)
    w.show()
    conn = getattr(w, "engine_connector", None) or install(w)
    with serving(Session.load(str(folder), device="cpu")) as server:
        try:
            conn.connect(f"127.0.0.1:{server.port}", TOKEN)
            assert w.engine.wait_idle(60) and w.last_error is None
            assert w.state.snapshot.info.dtype == "float32" and w.state.dtype == "auto"
            conn.connect(f"127.0.0.1:{server.port}", "a-wrong-token")  # fails: the engine's model stays
            assert w.engine.wait_idle(60) and w.last_error is not None
            assert w.state.dtype == "auto"  # not the float32 it resolved to
            dlg = ModelPickerDialog(w, dtype=w.state.dtype, scanner=lambda: [])
            assert dlg.dtype.currentText() == "auto"
            dlg.deleteLater()
            # a dtype the user did choose stays chosen through a failed load
            w.state.update(dtype="bfloat16")
            w.commands.loaded(w.state.snapshot)
            w.commands.load_failed("boom")
            assert w.state.dtype == "bfloat16"
        finally:
            w.engine.shutdown()
            w.engine.session.close()


@pytest.mark.slow
def test_a_reopened_session_says_its_dtype_is_the_files_not_asked_for(qtbot, tmp_path):
    from attnscope.app.main_window import MainWindow
    from attnscope.core.io import sessionfile
    from attnscope.core.session import Session

    folder = tmp_path / "qwen3"
    save_tiny("qwen3", folder, seed=5)
    s = Session.load(str(folder), device="cpu")  # auto: the checkpoint's own float32
    assert "asked for" not in s.info.dtype_reason
    s.prefill("x y z", chat_template=False)
    path = sessionfile.save(sessionfile.SessionFile.from_session(s), tmp_path / "s.attnscope")
    sf = sessionfile.load(path)
    assert sf.dtype == "float32"
    r, _ = sessionfile.replay(sf, dtype_reason=sessionfile.SAVED_DTYPE_REASON)
    assert r.info.dtype_reason == "float32: the dtype the session was saved at"
    assert r.snapshot().info.dtype_reason == r.info.dtype_reason
    plain, _ = sessionfile.replay(sf)  # no reason given: the loader's own (the dtype handed to it)
    assert plain.info.dtype_reason == "float32: asked for (--dtype float32)"
    # the window's File → Open session: the model line's tooltip (the dtype reason) says so too
    w = MainWindow(autoload=False)
    qtbot.addWidget(w)
    w.sessions.open_session(path)
    assert w.engine.wait_idle(60) and w.last_error is None
    assert w.state.snapshot.prompt == "x y z"
    assert w.status.model_label.toolTip() == "float32: the dtype the session was saved at"
    w.engine.shutdown()
