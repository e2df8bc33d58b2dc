"""A session's view is checked against the model that loads, once, for the window's File → Open
session and ``attnscope export --session``: ``view.layer: 99`` on a 2-layer model is one line in
both, before anything runs, and the window keeps its run and its layer (tiny random llama)."""

from __future__ import annotations

import json

import pytest
from attnscope.core.io import sessionfile

PROMPT = "The cat sat on the mat."


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tiny_models import save_tiny

    folder = tmp_path_factory.mktemp("llama_viewcheck")
    save_tiny("llama", folder)
    return folder


@pytest.fixture(scope="module")
def bad_file(tiny_folder, tmp_path_factory):
    """A session of the tiny model whose view names layer 99 (the model has layers 0..1)."""
    from attnscope.core.session import Session

    s = Session.load(str(tiny_folder))
    s.prefill(PROMPT, chat_template=False)
    path = tmp_path_factory.mktemp("sess") / "bad.attnscope"
    sessionfile.save(sessionfile.SessionFile.from_session(s, view={"layer": 99, "head": 0}), path)
    return path


LINE = "bad session file: view.layer is 99, but"


def test_check_view_names_the_field_and_the_models_range(tiny_folder):
    from attnscope.core.session import Session

    info = Session.load(str(tiny_folder)).info
    with pytest.raises(sessionfile.SessionFileError, match=r"view\.layer is 99, but .* has layers 0\.\.1$"):
        sessionfile.check_view({"layer": 99}, info)
    with pytest.raises(sessionfile.SessionFileError, match=r"view\.head is 4, but .* query heads 0\.\.3$"):
        sessionfile.check_view({"layer": 1, "head": 4}, info)
    sessionfile.check_view({"layer": 1, "head": 3}, info)  # the last of each is fine
    sessionfile.check_view({"layer": None}, info)


def test_replay_refuses_before_the_prefill(bad_file, tiny_folder, monkeypatch):
    from attnscope.core.session import Session

    prefills = []
    real = Session.prefill
    monkeypatch.setattr(Session, "prefill", lambda self, *a, **k: prefills.append(1) or real(self, *a, **k))
    with pytest.raises(sessionfile.SessionFileError, match=LINE):
        sessionfile.replay(sessionfile.load(bad_file), model=str(tiny_folder))
    assert prefills == []


def test_cli_export_session_refuses_in_the_same_line(bad_file, tiny_folder, tmp_path, capsys):
    from attnscope.core.cli.main import main

    out = tmp_path / "map.npy"
    code = main(["export", "--session", str(bad_file), "--model", str(tiny_folder), "--out", str(out)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert code != 0 and not out.exists()
    assert len(err) == 1 and LINE in err[0], err


def test_the_window_refuses_the_file_and_keeps_its_run_and_layer(qtbot, tiny_folder, bad_file, tmp_path):
    from gui_helpers import ran_window

    win = ran_window(qtbot, tiny_folder, "Another prompt, the one on screen.", steps=2)
    win.select(1, 2)
    before = (win.snapshot.prompt, win.snapshot.seq_len)
    win.sessions.open_session(bad_file)
    assert win.engine.wait_idle(60)
    from PySide6.QtWidgets import QApplication

    for _ in range(3):
        QApplication.processEvents()
    assert win.last_error is not None and LINE in win.last_error, win.last_error
    assert "Opened" not in win.statusBar().currentMessage()
    assert (win.layer, win.head) == (1, 2)
    assert (win.snapshot.prompt, win.snapshot.seq_len) == before
    # a sound file of the same model still opens (the check refuses only what the model rules out)
    good = tmp_path / "good.attnscope"
    data = json.loads(bad_file.read_text(encoding="utf-8"))
    data["view"]["layer"] = 1
    good.write_text(json.dumps(data), encoding="utf-8")
    win.status.last_error = None
    win.sessions.open_session(good)
    assert win.engine.wait_idle(60)
    for _ in range(3):
        QApplication.processEvents()
    assert win.last_error is None, win.last_error
    assert win.snapshot.prompt == PROMPT and win.layer == 1 and win.head == 0
    win.close()
