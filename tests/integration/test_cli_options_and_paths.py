"""The new-user trial's CLI faults: each asserts the exit code and the one line the user sees.

``bench --views --synthetic/--threads`` wired through; a mistyped option named in its subcommand's
words (no abbreviations); output paths checked before any model loads (folders, unwritable places,
no temporary files left); ``--json -`` is standard output for every command; compare records each
run's quantisation and lists no option it refuses; contradictory options refused or noted.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
from attnscope.core.cli.main import main
from tiny_models import save_tiny


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    f = tmp_path_factory.mktemp("tiny") / "llama"
    save_tiny("llama", f, seed=3)
    return f


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test if a model is loaded (checks must come before the load)."""
    from attnscope.core.session import Session

    def load(*a, **kw):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(Session, "load", load)


def _error(capsys) -> str:
    err = [x for x in capsys.readouterr().err.splitlines() if ": error: " in x]
    assert len(err) == 1, err
    return err[0]


def _run(folder, *argv):
    return ["--model", str(folder), "--device", "cpu", "--no-chat-template", *argv]


# -- 1: bench --views takes the documented --synthetic and --threads ------------------------------------
def test_bench_views_passes_synthetic_and_threads(monkeypatch, tmp_path, capsys):
    import attnscope.core.bench.views as BV

    seen = {}

    def fake_main(argv):
        seen["argv"] = argv
        return 0

    monkeypatch.setattr(BV, "main", fake_main)
    out = tmp_path / "v.json"
    assert main(["bench", "--views", "--synthetic", "8192", "--threads", "1", "--json", str(out)]) == 0
    assert seen["argv"] == ["--smol", "8192", "--synthetic", "8192", "--threads", "1", "--json", str(out)]
    assert main(["bench", "--views", "--threads", "2"]) == 0
    assert seen["argv"] == ["--smol", "8192", "--threads", "2"]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--synthetic", "512"], "attnscope: error: --synthetic only apply to 'attnscope bench --views'"),
        (["--threads", "1"], "attnscope: error: --threads only apply to 'attnscope bench --views'"),
        (
            ["--heads-rows", "lens"],
            "attnscope: error: --heads-rows only applies to 'attnscope bench --heads'",
        ),
        (["--views", "--threads", "0"], "attnscope: error: --threads must be a positive integer, got 0"),
        (
            ["--views", "--synthetic", "-5"],
            "attnscope: error: --synthetic must be a positive integer, got -5",
        ),
    ],
)
def test_bench_views_options_refused_elsewhere(argv, line, capsys):
    assert main(["bench", *argv]) == 1
    assert _error(capsys) == line


def test_bench_views_synthetic_runs_through_views_main(monkeypatch, capsys):
    """The real views main gets --synthetic (its synthetic rows run, not the prefill) at one thread."""
    import attnscope.core.bench.views as BV

    calls = {}

    def synthetic(T, log):
        import torch

        calls.update(synthetic=T, threads=torch.get_num_threads())
        return {"rows": {"one_head_8192": 0.02}}

    monkeypatch.setattr(BV, "views_synthetic", synthetic)
    monkeypatch.setattr(BV, "views_smol", lambda *a, **k: pytest.fail("prefilled instead of synthetic"))
    assert main(["bench", "--views", "--synthetic", "64", "--threads", "1", "--json", "-"]) == 0
    assert calls == {"synthetic": 64, "threads": 1}
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"smol": {"rows": {"one_head_8192": 0.02}}}  # the JSON alone
    assert "| one head's map at 8,192 (1024-px overview) | 20 ms | ≤ 50 ms | yes |" in captured.err


# -- 2: a typo is named in its subcommand's words; no abbreviations ------------------------------------
@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["export", "--promt", "hi"],
            "attnscope export: error: unrecognized arguments: --promt hi; did you mean --prompt? "
            "(see 'attnscope export --help')",
        ),
        (
            ["export", "--prompt", "hi", "--lay", "0", "--out", "x.npy"],
            "attnscope export: error: unrecognized arguments: --lay 0; did you mean --layer? "
            "(see 'attnscope export --help')",
        ),
        (
            ["sinks", "--prompt", "hi", "--json", "s.json", "--treshold", "0.3"],
            "attnscope sinks: error: unrecognized arguments: --treshold 0.3; did you mean --threshold? "
            "(see 'attnscope sinks --help')",
        ),
        (
            ["models", "--zzz"],
            "attnscope models: error: unrecognized arguments: --zzz (see 'attnscope models --help')",
        ),
    ],
)
def test_typo_names_the_subcommand(argv, line, capsys, no_load):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == line


# -- 7: output paths checked up front; no temporary files left ------------------------------------------
def test_output_paths_checked_before_the_load(tmp_path, capsys, no_load):
    adir = tmp_path / "adir.npy"
    adir.mkdir()
    ex = tmp_path / "ex"
    ex.mkdir()
    base = ["export", "--prompt", "hi", "--layer", "0", "--head", "0"]
    cases = [
        (
            [*base, "--out", str(tmp_path / "m.npy"), "--save-session", str(ex)],
            f"attnscope: error: --save-session {ex} is a folder: give a file name, e.g. {ex / 'session.attnscope'}",
        ),
        (
            [*base, "--out", str(tmp_path / "m.npy"), "--save-session", str(adir)],
            f"attnscope: error: --save-session {adir} is a folder: give a file name, e.g. "
            f"{adir / 'session.attnscope'}",
        ),
        ([*base, "--out", str(adir)], f"attnscope: error: --out {adir} is a folder: give a file name"),
        (
            [*base, "--out", "/proc/m.npy"],
            "attnscope: error: --out /proc/m.npy: cannot write in /proc (No such file or directory)",
        ),
        (
            ["export", "--session", str(ex), "--out", str(tmp_path / "m.npy")],
            f"attnscope: error: --session {ex} is a folder, not a session file (.attnscope)",
        ),
        (
            [*base, "--frames", str(tmp_path / "nope" / "a.gif")],
            f"attnscope: error: folder {tmp_path / 'nope'} does not exist",
        ),
        (
            ["sinks", "--prompt", "hi", "--json", str(ex)],
            f"attnscope: error: --json {ex} is a folder: give a file name",
        ),
        (
            ["roles", "--prompt", "hi", "--json", "/proc/r.json"],
            "attnscope: error: --json /proc/r.json: cannot write in /proc (No such file or directory)",
        ),
        (
            ["compare", "--prompt", "hi", "--json", str(tmp_path / "c.json"), "--csv", str(ex)],
            f"attnscope: error: --csv {ex} is a folder: give a file name",
        ),
        (["bench", "--json", str(ex)], f"attnscope: error: --json {ex} is a folder: give a file name"),
        (
            ["models", "--json", "/proc/m.json"],
            "attnscope: error: --json /proc/m.json: cannot write in /proc (No such file or directory)",
        ),
    ]
    for argv, line in cases:
        assert main(argv) == 1, argv
        assert _error(capsys) == line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir.npy", "ex"]  # nothing written, no .tmp
    assert list(adir.iterdir()) == [] and list(ex.iterdir()) == []


@contextlib.contextmanager
def _unwritable_folder(tmp_path):
    """A folder in which this process cannot create a file: a mode-500 folder for a user; for root
    (how CI runs), who writes in that one anyway, sysfs (``/sys``), where creating a file is refused
    to root too. Both reach the same check: the probe file of ``paths.probe_folder``."""
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            yield ro
        finally:
            ro.chmod(0o700)
        return
    sysfs = Path("/sys")
    if not sysfs.is_dir():
        pytest.skip("running as root without /sys: no folder refuses root here")
    yield sysfs


def test_read_only_folder_refused(tmp_path, capsys, no_load):
    with _unwritable_folder(tmp_path) as ro:
        assert main(["sinks", "--prompt", "hi", "--json", str(ro / "s.json")]) == 1
        assert _error(capsys).startswith(f"attnscope: error: --json {ro / 's.json'}: cannot write in {ro} (")
        assert not (ro / "s.json").exists()


def test_write_text_leaves_no_temporary_file(tmp_path, monkeypatch):
    from attnscope.core.io import paths

    target = tmp_path / "a.json"
    paths.write_json(target, {"x": 1})
    assert json.loads(target.read_text()) == {"x": 1}
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())

    def boom(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(paths.os, "replace", boom)
    with pytest.raises(OSError, match="No space"):
        paths.write_json(tmp_path / "b.json", {"x": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


# -- 6: --json - is standard output for every command that writes JSON ----------------------------------
@pytest.mark.parametrize("command", ["sinks", "roles"])
def test_json_dash_is_stdout(command, folder, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [command, *_run(folder, "--prompt", "a b c d e f", "--json", "-")]
    if command == "roles":
        argv += ["--probe-len", "4"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # the JSON alone on stdout
    assert data["prompt"] == "a b c d e f" and data["quantization"]["mode"] == "none"
    assert "wrote standard output" in captured.err
    assert list(tmp_path.iterdir()) == []  # no file named '-'


# -- 4 and 5: compare records each run's quantisation; lists no option it refuses -----------------------
def test_compare_help_lists_only_what_it_honours(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = capsys.readouterr().out
    assert "--steps" not in text and "--device-map" not in text
    assert "--quantize-b" in text and "--prompt-b" in text
    with pytest.raises(SystemExit) as e:
        main(["compare", "--prompt", "hi", "--steps", "2", "--json", "c.json"])
    assert e.value.code == 2
    assert "unrecognized arguments: --steps 2" in capsys.readouterr().err


@pytest.mark.slow
def test_compare_records_quantization_per_run(folder, tmp_path, capsys):
    pytest.importorskip("torchao")
    out = tmp_path / "c.json"
    argv = ["compare", *_run(folder, "--prompt", "a b c d", "--quantize-b", "int8", "--json", str(out))]
    assert main(argv) == 0
    d = json.loads(out.read_text())
    assert d["run_a"]["quantization"]["mode"] == "none" and d["run_a"]["quantization"]["runtime"] == ""
    assert d["run_b"]["quantization"]["mode"] == "int8"
    assert d["run_b"]["quantization"]["runtime"].startswith("int8")
    assert d["run_a"]["device_map"] == {} and d["run_b"]["device_map"] == {}


# -- 8: contradictory options: refused, or one note line -----------------------------------------------
def test_format_against_single_out_is_refused(tmp_path, capsys, no_load):
    out = tmp_path / "x.npy"
    argv = ["export", "--prompt", "hi", "--layer", "0", "--head", "0", "--format", "svg", "--out", str(out)]
    assert main(argv) == 1
    assert _error(capsys) == (
        "attnscope: error: --format svg conflicts with --out x.npy: one head's format is its --out "
        "suffix (--format is for --all-heads)"
    )


def test_moot_options_get_one_note_each(folder, tmp_path, capsys):
    out = tmp_path / "x.npy"
    argv = _run(folder, "--prompt", "a b c", "--layer", "0", "--head", "0", "--figure", "--gamma", "0.3")
    assert main(["export", *argv, "--format", "npy", "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    notes = [x for x in err if x.startswith("attnscope: note:")]
    assert notes == [
        "attnscope: note: --figure draws images: the .npy output is data, written without it",
        "attnscope: note: --gamma applies to the power scale; this map uses the linear scale, so --gamma "
        "0.3 has no effect (add --scale power)",
    ]
    assert out.exists()


def test_dtype_note_when_the_model_runs_at_another_precision():
    from argparse import Namespace

    from attnscope.core.cli.options import dtype_note

    class Info:
        dtype = "bfloat16"

    asked = Namespace(dtype="float32", quantize="int4")
    assert (
        dtype_note(asked, Info)
        == "--dtype float32 was asked, the model runs at bfloat16 (--quantize int4 runs at bfloat16)"
    )
    assert dtype_note(Namespace(dtype="float16", quantize="none"), Info) == (
        "--dtype float16 was asked, the model runs at bfloat16"
    )
    assert dtype_note(Namespace(dtype="auto", quantize="int4"), Info) == ""
    assert dtype_note(Namespace(dtype="bfloat16", quantize="int4"), Info) == ""


# -- 9: minor ---------------------------------------------------------------------------------------------
def test_all_heads_export_prints_the_tokens(folder, tmp_path, capsys):
    out = tmp_path / "heads"
    argv = ["export", *_run(folder, "--prompt", "a b c", "--all-heads", "--layer", "0", "--format", "npy")]
    assert main([*argv, "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    from attnscope.core.session import Session

    s = Session.load(str(folder), device="cpu")
    s.prefill("a b c", chat_template=False)
    assert lines == [f"{t.position}\t{t.id}\t{t.text!r}" for t in s.tokens]


def _empty_folder(d):
    (d / "empty").mkdir()
    return d / "empty"


def _truncated_gguf(d):
    """The first 24 bytes of a GGUF v3 header (magic, version, 236 tensors, ...): cut short."""
    (d / "t.gguf").write_bytes(b"GGUF\x03\x00\x00\x00\xec\x00\x00\x00\x00\x00\x00\x00\x21" + b"\x00" * 7)
    return d / "t.gguf"


def _text_gguf(d):
    (d / "text.gguf").write_text("hello")
    return d / "text.gguf"


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_empty_folder, "empty holds no model"),
        (_truncated_gguf, "t.gguf: "),
        (_text_gguf, "text.gguf is not a GGUF file"),
    ],
)
def test_models_add_refuses_what_holds_no_model(make, reason, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNSCOPE_CONFIG_DIR", str(tmp_path / "cfg"))
    p = make(tmp_path)
    assert main(["models", "--add", str(p)]) == 1
    line = _error(capsys)
    assert line.startswith("attnscope: error: ") and reason in line
    assert not (tmp_path / "cfg" / "models.json").exists()  # not remembered


def test_models_add_keeps_a_readable_model(folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNSCOPE_CONFIG_DIR", str(tmp_path / "cfg"))
    assert main(["models", "--add", str(folder), "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert any(m["path"] == str(folder.absolute()) and m["supported"] for m in data["models"])


def test_list_cache_tells_conversions_from_quantised_weights(tmp_path, monkeypatch, capsys):
    from attnscope.core.loading import conversion_cache
    from attnscope.core.loading.cache_folder import ConvertedModel

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path))
    items = [
        ConvertedModel(tmp_path / "a", "a-0123", "a.gguf", "0123", 1000, True),
        ConvertedModel(tmp_path / "b", "b-int8", "b", "", 2000, True, kind="int8 weights (torchao)"),
    ]
    monkeypatch.setattr(conversion_cache, "list_converted", lambda: items)
    assert main(["models", "--list-cache"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(
        f"model cache: GGUF conversions in {tmp_path / 'converted'}, quantised weights in "
    )
    assert out[-1].startswith("2 cache entries: 1 converted model(s), 1 quantised weight set(s), ")


def test_bench_table_names_its_statistics():
    """The table's × are ratios of medians, the summary's of the fastest runs: both say so."""
    from attnscope.core.bench.overhead_report import format_table

    cfg = {"prefill_median_s": 4.99, "decode_step_median_s": 0.05, "achieved_flops": 1e9}
    cfg.update(fraction_of_peak=0.1, cpu_per_wall=1.9)
    result = {
        "machine": dict(
            cpu_count=2,
            cpu_model="x",
            torch_threads=2,
            device="cpu",
            torch_version="2",
            transformers_version="5",
        ),
        "matmul": {"n": 512, "peak_flops": 1e10},
        "model": dict(name="m", n_layers=1, n_heads=1, n_kv_heads=1, head_dim=8),
        "options": {"decode_steps": 4, "repeats": 2},
        "sizes": [
            {
                "T": 512,
                "ratios": {"prefill_scope_over_sdpa": 0.19, "prefill_scope_over_sdpa_min": 1.05},
                "configs": {"sdpa": cfg, "scope": {**cfg, "prefill_median_s": 0.931}},
            }
        ],
        "targets": [],
        "noise": {"prefill_max_over_min": None},
        "elapsed_s": 1.0,
    }
    text = format_table(result)
    assert "prefill and decode/step: MEDIANS of 2 runs each, ×(a) the ratio of medians to SDPA's" in text
    assert (
        "ratio of the FASTEST runs (minimum of each; " in text
        and "the table's × are medians): T=512: 1.05×" in text
    )


def test_os_errors_are_one_line(tmp_path, capsys, monkeypatch, no_load):
    f = tmp_path / "f"
    f.write_text("x")
    assert main(["sinks", "--prompt", "hi", "--json", str(f / "s.json")]) == 1
    assert _error(capsys) == f"attnscope: error: --json {f / 's.json'}: {f} is not a folder"
    from attnscope.core.cli.commands import examples

    def full(args):
        raise OSError(28, "No space left on device", "/x/out.json")

    monkeypatch.setattr(examples, "run", full)
    assert main(["examples"]) == 1
    assert _error(capsys) == "attnscope: error: /x/out.json: No space left on device"


@pytest.mark.parametrize("command", ["sinks", "roles"])
def test_steps_past_the_context_are_refused_before_the_prefill(
    command, folder, tmp_path, capsys, monkeypatch
):
    """``roles``/``sinks --steps 9000`` ran until a timeout, then (after Session.step learnt its
    limit) prefilled first; now the same line as ``export`` before anything runs."""
    from attnscope.core.session import Session

    prefills = []
    monkeypatch.setattr(Session, "prefill", lambda self, *a, **k: prefills.append(a))
    context = 256  # the tiny llama's max_position_embeddings
    argv = [
        command,
        *_run(folder, "--prompt", "a b c", "--steps", str(context), "--json", str(tmp_path / "o.json")),
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err[-1] == f"attnscope: error: --steps {context} does not fit the model's context of {context} tokens"
    )
    assert prefills == [] and not (tmp_path / "o.json").exists()
