"""Bad input gives one clear message; nothing crashes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from attnscope.core.errors import ModelLoadError, SessionError
from attnscope.core.loading.checks import check_gguf
from attnscope.core.loading.resolve import default_gguf_path, resolve


def test_empty_prompt(smol_session):
    with pytest.raises(SessionError, match="empty"):
        smol_session.prefill("")
    with pytest.raises(SessionError, match="empty"):
        smol_session.prefill(" \n\t ")


def test_step_before_prompt_is_an_error():
    from attnscope.core.session import Session

    class Dummy:
        info = None
        tokenizer = None
        trace = None

    s = Session.__new__(Session)
    s._logits = None
    with pytest.raises(SessionError, match="run a prompt"):
        Session.step(s, 1)


def test_folder_that_is_not_a_model(tmp_path):
    (tmp_path / "README.txt").write_text("not a model")
    with pytest.raises(ModelLoadError, match="not a model folder"):
        resolve(tmp_path)


def test_folder_with_bad_config(tmp_path):
    (tmp_path / "config.json").write_text("{ this is not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        resolve(tmp_path)


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        resolve(tmp_path / "nope.gguf")


def test_truncated_gguf(tmp_path):
    src = default_gguf_path()
    bad = tmp_path / "cut.gguf"
    with open(src, "rb") as f:
        bad.write_bytes(f.read(3_000_000))
    with pytest.raises(ModelLoadError, match="truncated"):
        check_gguf(bad)
    with pytest.raises(ModelLoadError, match="truncated"):
        resolve(bad)


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "fake.gguf"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        resolve(bad)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "attnscope.app.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_bad_arguments_one_line(tmp_path):
    r = _cli("export", "--prompt", "", "--layer", "0", "--head", "0", "--out", str(tmp_path / "x.npy"))
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [
        "attnscope: error: the prompt is empty: give some text with --prompt"
    ]
    r = _cli("export", "--prompt", "hi", "--layer", "0", "--head", "0", "--out", str(tmp_path / "x.txt"))
    assert r.returncode != 0 and "unsupported output" in r.stderr and "Traceback" not in r.stderr
    r = _cli(
        "export",
        "--prompt",
        "hi",
        "--model",
        str(tmp_path),
        "--layer",
        "0",
        "--head",
        "0",
        "--out",
        str(tmp_path / "x.npy"),
    )
    assert r.returncode != 0 and "not a model folder" in r.stderr and "Traceback" not in r.stderr


def test_usage_errors_are_one_line():
    for args, want in (
        (("export", "--layer", "abc"), "attnscope export: error: argument --layer: invalid int value: 'abc'"),
        (("kv",), "attnscope kv: error: the following arguments are required: --n-layers"),
        (("--bogus",), "attnscope: error: unrecognized arguments: --bogus"),
    ):
        r = _cli(*args)
        assert r.returncode == 2
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(want) and lines[0].endswith("--help')"), r.stderr


def test_unusable_device_is_one_line():
    import torch
    from attnscope.core.backends.torch_backend import pick_device
    from attnscope.core.errors import ModelLoadError

    assert pick_device("cpu") == "cpu"
    assert pick_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ModelLoadError, match=r"^unknown device 'bogus': use cpu, cuda, cuda:N or mps$"):
        pick_device("bogus")
    with pytest.raises(ModelLoadError, match="'cuda:99' is not available"):
        pick_device("cuda:99")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match=r"^device 'cuda' is not available: .*; use --device cpu$"):
            pick_device("cuda")
