"""``attnscope export`` refuses what the model rules out (``--layer 99``, ``--head 99``, ``--steps``
past the context) with one line and a non-zero exit BEFORE any prefill: in process, on an engine
(whose run, e.g. the window's, stays as it was), and replaying a saved session."""

from __future__ import annotations

import pytest
from attnscope.core.cli.main import main
from tiny_models import save_tiny


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    f = tmp_path_factory.mktemp("tiny") / "qwen3"
    save_tiny("qwen3", f, seed=5)
    return f


@pytest.fixture
def no_prefill(monkeypatch):
    """Count the prefills of in-process sessions (the checks must come before the first)."""
    from attnscope.core.session import Session

    calls = []
    real = Session.prefill

    def prefill(self, *a, **kw):
        calls.append(a[0] if a else kw.get("prompt"))
        return real(self, *a, **kw)

    monkeypatch.setattr(Session, "prefill", prefill)
    return calls


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("attnscope: error")]
    assert len(err) == 1, err
    return err[0]


def _info(folder):
    from attnscope.core.session import Session

    return Session.load(str(folder), device="cpu").info


def test_local_export_checks_layer_head_steps_before_the_prefill(folder, tmp_path, capsys, no_prefill):
    info = _info(folder)
    L, H = info.n_layers, info.n_heads
    base = ["export", "--model", str(folder), "--device", "cpu", "--prompt", "x y z", "--no-chat-template"]
    out = ["--out", str(tmp_path / "w.npy")]
    cases = [
        (["--layer", "99", "--head", "0", *out], f"attnscope: error: layer 99 out of range 0..{L - 1}"),
        (["--layer", "0", "--head", "99", *out], f"attnscope: error: head 99 out of range 0..{H - 1}"),
        (["--layer", "-1", "--head", "0", *out], f"attnscope: error: layer -1 out of range 0..{L - 1}"),
        (["--all-heads", "--layer", str(L), "--out", str(tmp_path / "d")], f"layer {L} out of range"),
        (["--layer", "0", *out], "attnscope: error: give --layer and --head (or --all-heads)"),
        (
            ["--layer", "0", "--head", "0", "--steps", str(info.max_context), *out],
            f"does not fit the model's context of {info.max_context} tokens",
        ),
    ]
    for extra, said in cases:
        assert main([*base, *extra]) == 1, extra
        assert said in _one_error_line(capsys), extra
    assert no_prefill == [] and not (tmp_path / "w.npy").exists()
    # in range: it runs (one prefill) and writes the map
    assert main([*base, "--layer", str(L - 1), "--head", str(H - 1), *out]) == 0
    assert no_prefill == ["x y z"] and (tmp_path / "w.npy").stat().st_size > 0


@pytest.mark.slow
def test_engine_export_checks_before_replacing_the_engines_run(folder, tmp_path, capsys, monkeypatch):
    pytest.importorskip("zmq", reason="the remote engine needs pyzmq")
    from attnscope.core.session import Session
    from test_remote import TOKEN, serving

    engine_session = Session.load(str(folder), device="cpu")
    engine_session.prefill("the window's run", chat_template=False)
    engine_session.step(2)
    ids = list(engine_session.ids)
    info = engine_session.info
    monkeypatch.setenv("ATTNSCOPE_TOKEN", TOKEN)
    with serving(engine_session) as server:
        base = ["export", "--engine", f"127.0.0.1:{server.port}", "--prompt", "x", "--no-chat-template"]
        out = ["--out", str(tmp_path / "w.npy")]
        for extra, said in (
            (["--layer", "99", "--head", "0", *out], f"layer 99 out of range 0..{info.n_layers - 1}"),
            (["--layer", "0", "--head", "99", *out], f"head 99 out of range 0..{info.n_heads - 1}"),
            (["--all-heads", "--layer", "99", "--out", str(tmp_path / "d")], "layer 99 out of range"),
        ):
            assert main([*base, *extra]) == 1
            assert said in _one_error_line(capsys)
            # the engine's run is untouched: same prompt, same tokens
            assert engine_session.prompt == "the window's run" and list(engine_session.ids) == ids
        # a saved session replayed on the engine with an out-of-range head: refused before the replay
        saved = tmp_path / "s.attnscope.json"
        assert main([*base, "--layer", "0", "--head", "0", *out, "--save-session", str(saved)]) == 0
        engine_session.prefill("the window's run", chat_template=False)
        engine_session.step(2)
        capsys.readouterr()
        args = [
            "export",
            "--engine",
            f"127.0.0.1:{server.port}",
            "--session",
            str(saved),
            "--head",
            "99",
            *out,
        ]
        assert main(args) == 1
        assert f"head 99 out of range 0..{info.n_heads - 1}" in _one_error_line(capsys)
        assert engine_session.prompt == "the window's run" and list(engine_session.ids) == ids
