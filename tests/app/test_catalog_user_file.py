"""A hand-edited or damaged ``models.json`` (new-user trial: ``{"paths": 5}`` / ``{"paths": null}`` made
``attnscope models`` and ``models --remove X`` end in a traceback; broken JSON was ignored silently).
Now: one warning naming the file and what is wrong, the valid entries still listed, the damaged file
kept (never overwritten without saying so)."""

from __future__ import annotations

import json
import logging

import pytest
from attnscope.core.loading import catalog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

KEEPS = "the models added there are not listed (fix or delete the file)"


@pytest.fixture()
def conf(tmp_path, monkeypatch):
    """``$XDG_CONFIG_HOME/attnscope/models.json`` as the trial had it (no ATTNSCOPE_CONFIG_DIR), a model
    folder and a GGUF-less library to add; the once-per-process warnings forgotten."""
    monkeypatch.delenv("ATTNSCOPE_CONFIG_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(catalog, "_warned", set())
    f = tmp_path / "xdg" / "attnscope" / "models.json"
    f.parent.mkdir(parents=True)
    a, b = tmp_path / "models-a", tmp_path / "models-b"
    a.mkdir()
    b.mkdir()
    return f, a, b


def _scan():
    return catalog.scan(hf_cache="/nonexistent", lmstudio=[], ollama="/nonexistent", include_embedded=False)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "attnscope.catalog"]


@pytest.mark.parametrize(
    "content, what",
    [
        ('{"paths": 5}', '"paths" is 5, expected a list of folder and file paths: ' + KEEPS),
        ('{"paths": null}', '"paths" is null, expected a list of folder and file paths: ' + KEEPS),
        ('{"paths": "/models"}', '"paths" is "/models", expected a list of folder and file paths: ' + KEEPS),
        ('{"paths": {"a": 1}}', '"paths" is {"a": 1}, expected a list of folder and file paths: ' + KEEPS),
        ('{"version": 1}', 'has no "paths" list: ' + KEEPS),
        ('["/models"]', 'is ["/models"], expected an object {"paths": [...]}: ' + KEEPS),
        ("5", 'is 5, expected an object {"paths": [...]}: ' + KEEPS),
        ('{"paths": ["/a",', "is not valid JSON (Expecting value at line 1 column 17): " + KEEPS),
        ("", "is not valid JSON (Expecting value at line 1 column 1): " + KEEPS),
    ],
)
def test_a_damaged_file_is_one_warning_and_never_a_traceback(conf, caplog, capsys, content, what):
    from attnscope.core.cli.main import main

    f, a, _ = conf
    f.write_text(content, encoding="utf-8")
    sep = " " if what.startswith(("is ", "has ")) else ": "
    problem = f"models file {f}{sep}{what}"
    with caplog.at_level(logging.WARNING, logger="attnscope.catalog"):
        assert catalog.user_paths() == []
        assert catalog.user_paths() == []  # said once per process
        entries = _scan()
    assert _warnings(caplog) == [f"attnscope: warning: {problem}"]
    assert catalog.user_file_problem() == problem
    # the picker and `attnscope models` list the damaged file, unsupported, with the problem as reason
    assert [(e.name, e.source, e.supported, e.reason, e.model_ref) for e in entries] == [
        ("models.json", "user", False, problem, "")
    ]
    # the trial's commands: no traceback, the file left as it is
    assert main(["models", "--context", "64"]) == 0
    assert problem in capsys.readouterr().out
    assert main(["models", "--remove", str(a)]) == 1
    assert capsys.readouterr().err == (f"attnscope: error: {a} is not a user-added path (see {f})\n")
    assert f.read_text(encoding="utf-8") == content


def test_bad_entries_are_skipped_and_the_valid_ones_listed(conf, caplog):
    f, a, b = conf
    f.write_text(json.dumps({"version": 1, "paths": [str(a), 5, None, "relative/x", str(a), "~/m", str(b)]}))
    uf = catalog.read_user_file()
    home = catalog.Path("~/m").expanduser()
    assert uf.paths == (a, home, b)  # duplicates once, "~" expanded
    assert uf.problem == (
        f"models file {f}: paths[1] is 5, expected a path (a string) (and 2 more bad entries): "
        "skipped; its 3 valid path(s) are listed"
    )
    names = [e.name for e in _scan()]
    assert names == ["models.json", "models-a", "m", "models-b"]
    f.write_text(json.dumps({"paths": [str(a), "relative/x"]}))
    assert catalog.read_user_file().problem == (
        f'models file {f}: paths[1] is "relative/x", expected an absolute path: skipped; its 1 valid path(s) are listed'
    )


def test_not_utf8_and_unreadable_files(conf):
    f, a, _ = conf
    f.write_bytes(b'{"paths": ["\xff\xfe"]}')
    assert catalog.read_user_file().problem == f"models file {f} is not UTF-8 text: {KEEPS}"
    f.unlink()
    f.mkdir()  # a folder where the file should be: it cannot be read, so nothing is written over it
    uf = catalog.read_user_file()
    assert not uf.readable and uf.problem == f"cannot read the models file {f}: Is a directory"
    with pytest.raises(catalog.ModelsFileError) as e:
        catalog.add_user_path(a)
    assert str(e.value) == f"cannot read the models file {f}: Is a directory: not changed"
    assert isinstance(e.value, OSError) and f.is_dir()


def test_adding_to_a_damaged_file_keeps_it_and_says_so(conf, caplog):
    f, a, b = conf
    damaged = json.dumps({"paths": [str(a), 7]})
    f.write_text(damaged)
    with caplog.at_level(logging.WARNING, logger="attnscope.catalog"):
        assert catalog.add_user_path(b) == b
    assert json.loads(f.read_text())["paths"] == [str(a), str(b)]  # the valid entry kept
    assert (f.parent / "models.json.damaged").read_text() == damaged
    assert _warnings(caplog) == [
        f"attnscope: warning: models file {f}: paths[1] is 7, expected a path (a string): skipped; "
        "its 1 valid path(s) are listed",
        f"attnscope: warning: models file {f} was damaged: its old content is kept next to it as "
        "models.json.damaged; it now lists 2 path(s)",
    ]
    assert catalog.read_user_file().problem == ""
    # broken JSON: nothing can be read from it, and a second damaged copy does not replace the first
    f.write_text('{"paths": [')
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="attnscope.catalog"):
        catalog.add_user_path(a)
    assert json.loads(f.read_text())["paths"] == [str(a)]
    assert (f.parent / "models.json.damaged-2").read_text() == '{"paths": ['
    assert (f.parent / "models.json.damaged").read_text() == damaged
    assert _warnings(caplog)[-1] == (
        f"attnscope: warning: models file {f} was damaged: its old content is kept next to it as "
        "models.json.damaged-2; it now lists 1 path(s)"
    )


def test_removing_from_a_damaged_file_keeps_the_other_entries(conf, caplog):
    from attnscope.core.cli.main import main

    f, a, b = conf
    f.write_text(json.dumps({"paths": [str(a), {"x": 1}, str(b)]}))
    with caplog.at_level(logging.WARNING, logger="attnscope.catalog"):
        assert main(["models", "--remove", str(a), "--context", "64"]) == 0
    assert json.loads(f.read_text())["paths"] == [str(b)]
    assert _warnings(caplog)[-1] == (
        f"attnscope: warning: models file {f} was damaged: its old content is kept next to it as "
        "models.json.damaged; it now lists 1 path(s)"
    )


def test_the_cli_prints_the_warning_as_one_line(conf, tmp_path):
    """Outside pytest's log capture the warning reaches stderr as the bare line (logging's last resort)."""
    import os
    import subprocess
    import sys

    f, a, _ = conf
    f.write_text('{"paths": 5}')
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    env.pop("ATTNSCOPE_CONFIG_DIR", None)
    code = "import sys; from attnscope.core.cli.main import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run(
        [sys.executable, "-c", code, "models", "--remove", str(a)], env=env, capture_output=True, text=True
    )
    assert r.returncode == 1 and r.stderr.splitlines() == [
        f'attnscope: warning: models file {f}: "paths" is 5, expected a list of folder and file paths: {KEEPS}',
        f"attnscope: error: {a} is not a user-added path (see {f})",
    ]


def test_an_unwritable_config_folder_is_one_line(tmp_path, monkeypatch, capsys):
    from attnscope.core.cli.main import main
    from tiny_models import save_tiny

    monkeypatch.setenv("ATTNSCOPE_CONFIG_DIR", "/proc/attn")
    save_tiny("llama", tmp_path / "m")  # a model folder (`models --add` refuses a folder with none)
    assert catalog.user_paths() == []
    with pytest.raises(catalog.ModelsFileError) as e:
        catalog.add_user_path(tmp_path / "m")
    assert str(e.value) == "cannot write the models file /proc/attn/models.json: No such file or directory"
    capsys.readouterr()  # what importing transformers/torchao for the folder said
    assert main(["models", "--add", str(tmp_path / "m")]) == 1
    assert capsys.readouterr().err == (
        "attnscope: error: cannot write the models file /proc/attn/models.json: No such file or directory\n"
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    doc=st.one_of(
        JSON,
        st.fixed_dictionaries({"paths": JSON}),
        st.fixed_dictionaries({"paths": st.lists(JSON, max_size=4)}),
    )
)
def test_any_json_gives_valid_paths_or_one_line(conf, doc):
    f, _, _ = conf
    f.write_text(json.dumps(doc), encoding="utf-8")
    uf = catalog.read_user_file()
    assert all(p.is_absolute() for p in uf.paths) and len(set(uf.paths)) == len(uf.paths)
    assert "\n" not in uf.problem and (uf.problem == "" or uf.problem.startswith(f"models file {f}"))
    paths = doc.get("paths") if isinstance(doc, dict) else None
    sound = isinstance(paths, list) and all(isinstance(p, str) and p.startswith(("/", "~/")) for p in paths)
    if sound or uf.problem == "":  # "~name" entries may be either: this machine's users decide
        assert (uf.problem == "") == sound or any(p.startswith("~") for p in paths)
    entries = catalog.scan_user()
    assert len(entries) >= bool(uf.problem)


def test_the_picker_lists_the_damaged_file_with_why(conf, qtbot):
    pytest.importorskip("PySide6")
    from attnscope.app.model_picker import ModelPickerDialog

    f, a, _ = conf
    f.write_text('{"paths": null}')
    dlg = ModelPickerDialog(None, free_memory_fn=lambda *_: (16 << 30, "RAM"), scan_now=False, scanner=_scan)
    qtbot.addWidget(dlg)
    with qtbot.waitSignal(dlg.scanFinished, timeout=20000):
        dlg.rescan()
    assert dlg.proxy.rowCount() == 1 and dlg.proxy.index(0, 0).data() == "models.json"
    tip = dlg.proxy.index(0, 0).data(catalog_tooltip_role())
    assert tip == (
        f'Not supported: models file {f}: "paths" is null, expected a list of folder and file paths: {KEEPS}'
    )


def catalog_tooltip_role():
    from PySide6.QtCore import Qt

    return Qt.ToolTipRole
