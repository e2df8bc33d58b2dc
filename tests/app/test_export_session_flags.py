"""`attnscope export --session FILE` with flags the session also sets: an explicit flag
wins and the sidecar says what ran, or the conflict is one line."""

from __future__ import annotations

import json

import pytest
from attnscope.core.cli.main import main

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("sess")
    f = d / "fox.attnscope"
    assert (
        main(["export", "--prompt", PROMPT, "--steps", "1", "--dtype", "float32", "--save-session", str(f)])
        == 0
    )
    return f


def _export(saved, tmp_path, *flags):
    out = tmp_path / "map.npy"
    code = main(["export", "--session", str(saved), "--layer", "0", "--head", "0", "--out", str(out), *flags])
    return code, out


def test_backend_flag_is_not_silently_dropped(saved, tmp_path, capsys):
    code, out = _export(saved, tmp_path, "--backend", "mlx")
    err = capsys.readouterr().err
    if code == 0:  # MLX here: it ran, and the sidecar says so
        assert json.loads((tmp_path / "map.npy.json").read_text())["backend"] == "mlx"
    else:  # no MLX: one line about MLX, nothing written by the session's torch backend
        lines = [ln for ln in err.splitlines() if ln.startswith("attnscope: error")]
        assert len(lines) == 1 and "mlx" in lines[0].lower() and "Traceback" not in err
        assert not out.exists()
    assert "--backend mlx overrides the session's backend torch" in err


def test_dtype_flag_wins_and_the_sidecar_says_so(saved, tmp_path, capsys):
    code, out = _export(saved, tmp_path, "--dtype", "bfloat16")
    err = capsys.readouterr().err
    assert code == 0, err
    meta = json.loads((tmp_path / "map.npy.json").read_text())
    assert meta["dtype"] == "bfloat16" and meta["backend"] == "torch" and meta["step"] == 1
    assert "--dtype bfloat16 overrides the session's dtype float32" in err


def test_same_values_are_no_override(saved, tmp_path, capsys):
    code, _ = _export(saved, tmp_path, "--backend", "torch", "--device", "cpu", "--dtype", "float32")
    err = capsys.readouterr().err
    assert code == 0 and "overrides" not in err
    meta = json.loads((tmp_path / "map.npy.json").read_text())
    assert (meta["backend"], meta["device"], meta["dtype"]) == ("torch", "cpu", "float32")


def test_chat_template_conflict_is_one_line(saved, tmp_path, capsys):
    code, out = _export(saved, tmp_path, "--no-chat-template")
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and not out.exists()
    assert err == [
        "attnscope: error: --no-chat-template conflicts with fox.attnscope, saved with the chat "
        "template: drop the flag, or give the prompt with --prompt"
    ]


def test_without_session_defaults_still_apply(tmp_path, capsys):
    out = tmp_path / "p.npy"
    assert (
        main(
            [
                "export",
                "--prompt",
                PROMPT,
                "--no-chat-template",
                "--layer",
                "0",
                "--head",
                "0",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    meta = json.loads((tmp_path / "p.npy.json").read_text())
    assert meta["backend"] == "torch" and meta["chat_template"] is False


def test_mp4_unavailable_is_one_line_before_loading(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "imageio_ffmpeg" else real(name, *a)
    )
    from attnscope.core import session

    monkeypatch.setattr(session.Session, "load", classmethod(lambda *a, **k: pytest.fail("loaded the model")))
    code = main(
        [
            "export",
            "--prompt",
            PROMPT,
            "--steps",
            "1",
            "--layer",
            "0",
            "--head",
            "0",
            "--frames",
            str(tmp_path / "a.mp4"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and err[0].startswith("attnscope: error: MP4 is unavailable:")


@pytest.mark.slow
def test_cli_frames_are_labelled_figures(tmp_path):
    from attnscope.app.figure import FRAME_SIZE
    from PIL import Image
    from test_cli import attnscope

    out = tmp_path / "a.gif"
    r = attnscope(
        "export", "--prompt", PROMPT, "--steps", "2", "--layer", "0", "--head", "0", "--frames", str(out)
    )
    assert r.returncode == 0, r.stderr[-1500:]
    img = Image.open(out)
    assert img.n_frames == 3 and img.size == FRAME_SIZE
