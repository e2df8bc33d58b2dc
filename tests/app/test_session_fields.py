"""A hand-edited session file: every field's type and allowed values are checked when it is read,
and a bad one is ONE line naming the field, the value and what is allowed (new-user trial: tracebacks
from `"view": {"layer": "3"}`, `{"layer": 3.5}`; unnamed or misleading lines for `"gamma": "x"`,
`"prompt": 5`, `"sampling": "greedy"`, `"model": "default"`; `quantization.mode: "int3"`,
`sampling.seed: "abc"`, `device: "tpu"`, `device_map.strategy: "weird"` accepted silently)."""

from __future__ import annotations

import copy
import json
import re

import pytest
from attnscope.core.io import sessionfile as SF
from attnscope.core.sampling import Sampling
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def _good() -> dict:
    """A complete, valid file: every field the format has."""
    return {
        "format": "attnscope.session",
        "version": 1,
        "attnscope_version": "0.1.0",
        "created": "2026-12-01T19:00:00Z",
        "model": {"ref": "default", "name": "SmolLM2-135M-Instruct", "sha256": "ab" * 32},
        "backend": "torch",
        "dtype": "float32",
        "device": "cpu",
        "prompt": "The cat sat on the mat.",
        "chat_template": True,
        "sampling": {"temperature": 0.9, "top_k": 50, "top_p": 0.95, "seed": 7},
        "n_prompt": 3,
        "token_ids": [1, 2, 3, 4],
        "view": {
            "layer": 3,
            "head": 4,
            "tab": "heatmap",
            "cmap": "magma",
            "query_row": 2,
            "aggregate": "head",
            "weighting": "attention",
            "scale": "power",
            "gamma": 0.7,
            "range_mode": "auto",
            "timeline_step": None,
            "views": {"sinks": {"threshold_spin": 0.4}},
        },
        "quantization": {"file": "Q4_1", "runtime": "", "mode": "none"},
        "engine": {"address": "gpu-box:7767", "host": "gpu-box"},
        "device_map": {"strategy": "auto", "placement": {"cpu": 1000, "disk": 24}},
    }


def _with(path: str, value):
    """:func:`_good` with the field at dotted ``path`` set to ``value``."""
    d = _good()
    *parents, last = path.split(".")
    node = d
    for key in parents:
        node = node[key]
    node[last] = value
    return d


def _refused(d) -> str:
    with pytest.raises(SF.SessionFileError) as e:
        SF.SessionFile.from_dict(d)
    return str(e.value)


def test_the_complete_file_is_accepted_and_round_trips(tmp_path):
    sf = SF.SessionFile.from_dict(_good())
    assert sf.view["layer"] == 3 and sf.sampling == Sampling(temperature=0.9, top_k=50, top_p=0.95, seed=7)
    assert (
        sf.device_map_strategy == "auto"
        and sf.quantize == "none"
        and sf.model_name == "SmolLM2-135M-Instruct"
    )
    assert SF.load(SF.save(sf, tmp_path / "a")) == sf


# The trial's inputs, each with the exact line it now gives.
TRIAL = [
    ("view.layer", "3", 'bad session file: view.layer is "3", expected a non-negative integer'),
    ("view.head", "four", 'bad session file: view.head is "four", expected a non-negative integer'),
    ("view.layer", 3.5, "bad session file: view.layer is 3.5, expected a non-negative integer"),
    ("view.gamma", "x", 'bad session file: view.gamma is "x", expected a number > 0'),
    ("prompt", 5, "bad session file: prompt is 5, expected a non-empty string"),
    (
        "sampling",
        "greedy",
        'bad session file: sampling is "greedy", expected an object (temperature, top_k, top_p, seed)',
    ),
    (
        "model",
        "default",
        'bad session file: model is "default", expected an object with "ref" (a path, or "default")',
    ),
    (
        "quantization.mode",
        "int3",
        'bad session file: quantization.mode is "int3", expected none, int8 or int4',
    ),
    ("sampling.seed", "abc", 'bad session file: sampling.seed is "abc", expected a non-negative integer'),
    (
        "device",
        "tpu",
        'bad session file: device is "tpu", expected cpu, cuda, cuda:N, mps, mlx:cpu or mlx:gpu',
    ),
    (
        "device_map.strategy",
        "weird",
        'bad session file: device_map.strategy is "weird", expected auto, balanced, sequential, custom or "" '
        "(one device)",
    ),
]

INT = "a non-negative integer"
# Beyond the trial: every field, each kind of wrong value (wrong type, bool for a number, float for an
# integer, out of range, unknown choice). (path, value, what the line says is expected)
TABLE = [
    ("version", "1", "an integer 1..1"),
    ("version", 0, "an integer 1..1"),
    ("version", True, "an integer 1..1"),
    ("attnscope_version", 1, "a string"),
    ("created", ["2026"], "a string"),
    ("model.ref", "", "a non-empty string"),
    ("model.ref", None, "a non-empty string"),
    ("model.ref", 7, "a non-empty string"),
    ("model.name", 7, "a string"),
    ("model.sha256", "abc", "64 lowercase hex digits or null"),
    ("model.sha256", 12, "64 lowercase hex digits or null"),
    ("backend", "jax", "torch or mlx"),
    ("backend", 1, "torch or mlx"),
    ("dtype", "int8", "auto, float32, bfloat16 or float16"),
    ("dtype", "bf16", "auto, float32, bfloat16 or float16"),
    ("device", "cuda:x", "cpu, cuda, cuda:N, mps, mlx:cpu or mlx:gpu"),
    ("device", 0, "cpu, cuda, cuda:N, mps, mlx:cpu or mlx:gpu"),
    ("prompt", "", "a non-empty string"),
    ("prompt", None, "a non-empty string"),
    ("prompt", ["hi"], "a non-empty string"),
    ("chat_template", "false", "true or false"),
    ("chat_template", 0, "true or false"),
    ("chat_template", None, "true or false"),
    ("sampling", [0.5], "an object (temperature, top_k, top_p, seed)"),
    ("sampling.temperature", "0.7", "a number >= 0"),
    ("sampling.temperature", -0.1, "a number >= 0"),
    ("sampling.temperature", True, "a number >= 0"),
    ("sampling.temperature", None, "a number >= 0"),
    ("sampling.top_k", 2.5, INT),
    ("sampling.top_k", -1, INT),
    ("sampling.top_k", "40", INT),
    ("sampling.top_p", 0, "a number in (0, 1]"),
    ("sampling.top_p", 1.5, "a number in (0, 1]"),
    ("sampling.top_p", "0.9", "a number in (0, 1]"),
    ("sampling.seed", -3, INT),
    ("sampling.seed", 1.0, INT),
    ("sampling.seed", False, INT),
    ("n_prompt", 0, "an integer 1..4"),
    ("n_prompt", 5, "an integer 1..4"),
    ("n_prompt", "3", "an integer 1..4"),
    ("n_prompt", True, "an integer 1..4"),
    ("token_ids", "1 2 3", "a non-empty list of non-negative integers"),
    ("token_ids", [], "a non-empty list of non-negative integers"),
    ("view", "heatmap", "an object"),
    ("view.layer", -1, INT),
    ("view.layer", True, INT),
    ("view.layer", [3], INT),
    ("view.head", 4.0, INT),
    ("view.query_row", "2", INT),
    ("view.timeline_step", -2, INT),
    ("view.tab", 3, "a string"),
    ("view.cmap", "jet", "viridis, magma, inferno, plasma or cividis"),
    ("view.cmap", 1, "viridis, magma, inferno, plasma or cividis"),
    ("view.scale", "sqrt", "linear, log or power"),
    ("view.range_mode", "global", "fixed, auto or shared"),
    ("view.gamma", 0, "a number > 0"),
    ("view.gamma", -1.5, "a number > 0"),
    ("view.gamma", True, "a number > 0"),
    ("view.aggregate", "mean", "head, group, layer or all"),
    ("view.weighting", "value", "attention or value-weighted"),
    ("view.views", [], "an object (tab: its settings)"),
    ("view.views.sinks", "big", "an object"),
    ("quantization", "int8", "an object (file, runtime, mode)"),
    ("quantization.mode", "INT8", "none, int8 or int4"),
    ("quantization.mode", None, "none, int8 or int4"),
    ("quantization.file", 4, "a string"),
    ("quantization.runtime", None, "a string"),
    ("engine", "gpu-box:7767", "an object (address, host)"),
    ("engine.address", 7767, "a string"),
    ("device_map", "auto", "an object (strategy, placement)"),
    ("device_map.strategy", 1, 'auto, balanced, sequential, custom or "" (one device)'),
    ("device_map.placement", [1], "an object (device: bytes)"),
    ("device_map.placement.cpu", "1 GB", INT),
    ("device_map.placement.cpu", -5, INT),
    ("device_map.placement.cpu", 1.5e9, INT),
]


@pytest.mark.parametrize("path, value, line", TRIAL)
def test_the_trials_hand_edits_are_one_line_naming_the_field(path, value, line):
    assert _refused(_with(path, value)) == line


@pytest.mark.parametrize("path, value, expected", TABLE)
def test_every_field_refuses_each_kind_of_bad_value(path, value, expected):
    assert (
        _refused(_with(path, value))
        == f"bad session file: {path} is {json.dumps(value)}, expected {expected}"
    )


def test_token_ids_name_the_bad_position():
    assert _refused(_with("token_ids", [1, 2, "3", 4])) == (
        'bad session file: token_ids[2] is "3", expected a non-negative integer'
    )
    assert _refused(_with("token_ids", [1, True, 3, 4])) == (
        "bad session file: token_ids[1] is true, expected a non-negative integer"
    )


def test_unknown_sampling_field_and_missing_fields():
    assert _refused(_with("sampling.temp", 0.5)) == (
        'bad session file: sampling has the unknown field "temp" (expected temperature, top_k, top_p or seed)'
    )
    for key in ("model", "prompt", "chat_template", "token_ids", "n_prompt", "version"):
        d = _good()
        del d[key]
        assert _refused(d) == f"session file lacks the field {key!r}"
    d = _good()
    del d["model"]["ref"]
    assert _refused(d) == "session file lacks the field 'model.ref'"


def test_a_long_value_is_cut_in_the_line():
    line = _refused(_with("view.layer", "x" * 500))
    assert line == f'bad session file: view.layer is "{"x" * 38}…, expected a non-negative integer'


@pytest.mark.parametrize(
    "path, value",
    [
        ("view", None),  # absent or null: the defaults
        ("view.timeline_step", 2),
        ("view.query_row", None),
        ("view.scale", None),
        ("view.unknown_key", {"anything": [1]}),  # kept: the window's own entries
        ("device", "cuda:1"),
        ("device", "mlx:gpu"),
        ("device", "mps"),
        ("dtype", "auto"),
        ("backend", "mlx"),
        ("sampling", {}),
        ("sampling.temperature", 0),  # an integer is a number
        ("model.sha256", None),
        ("model.name", None),
        ("quantization", None),
        ("quantization.mode", "int4"),
        ("engine", None),
        ("device_map", None),
        ("device_map.strategy", "custom"),
        ("device_map.strategy", ""),
    ],
)
def test_good_values_are_accepted(path, value):
    sf = SF.SessionFile.from_dict(_with(path, value))
    assert sf.token_ids == (1, 2, 3, 4)


def test_sampling_values_keep_their_meaning():
    sf = SF.SessionFile.from_dict(_with("sampling", {"temperature": 1, "top_k": 3}))
    assert sf.sampling == Sampling(temperature=1.0, top_k=3, top_p=1.0, seed=0)
    assert isinstance(sf.sampling.temperature, float)


# Property: whatever JSON value is put at any field, reading gives a SessionFile or ONE SessionFileError
# line naming that field (never a TypeError/KeyError/... traceback), and a file that is accepted is one
# the export's readers of its view can use.
PATHS = sorted({p for p, *_ in TRIAL + TABLE} | {"view.layer", "view.head", "token_ids", "view.views"})
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=JSON)
def test_any_json_value_at_any_field_is_accepted_or_one_line(path, value):
    try:
        sf = SF.SessionFile.from_dict(_with(path, value))
    except SF.SessionFileError as e:
        line = str(e)
        assert "\n" not in line and len(line) < 200
        top = path.split(".")[0]
        newer = top == "version" and line.startswith("session file version ")  # a later format
        # fewer token ids than the saved n_prompt: n_prompt is the field that no longer fits
        fewer = top == "token_ids" and line.startswith("bad session file: n_prompt is ")
        assert line.startswith(f"bad session file: {top}") or "lacks the field" in line or newer or fewer, (
            line
        )
        return
    v = sf.view
    for key in ("layer", "head", "query_row", "timeline_step"):
        assert v.get(key) is None or (type(v[key]) is int and v[key] >= 0)
    assert v.get("gamma") is None or float(v["gamma"]) > 0
    assert isinstance(sf.prompt, str) and sf.prompt.strip() and type(sf.chat_template) is bool
    assert all(type(i) is int and i >= 0 for i in sf.token_ids) and 1 <= sf.n_prompt <= len(sf.token_ids)
    assert sf.quantize == sf.quantization.get("mode", "none")
    assert sf.device_map_strategy in (None, "auto", "balanced", "sequential")


def test_the_cli_says_the_line_before_loading_anything(tmp_path, capsys):
    from attnscope.core.cli.main import main

    p = tmp_path / "f.attnscope"
    p.write_text(json.dumps(_with("view.layer", "3")), encoding="utf-8")
    rc = main(["export", "--session", str(p), "--out", str(tmp_path / "r.png")])
    err = capsys.readouterr().err
    assert rc != 0
    assert err == 'attnscope: error: bad session file: view.layer is "3", expected a non-negative integer\n'
    assert not (tmp_path / "r.png").exists()


def test_the_windows_open_session_shows_the_line(qtbot, tmp_path):
    """File > Open session uses the same reader: the error dialog/status says the one line."""
    pytest.importorskip("PySide6")
    from attnscope.app.main_window import MainWindow

    p = tmp_path / "hand-edited.attnscope"
    p.write_text(json.dumps(_with("sampling.seed", "abc")), encoding="utf-8")
    w = MainWindow(autoload=False)
    qtbot.addWidget(w)
    try:
        assert w.sessions.open_session(p) is None
        assert w.last_error == (
            'Could not open the session: bad session file: sampling.seed is "abc", expected a non-negative integer'
        )
    finally:
        w.close()


def test_errors_copy_is_unchanged():
    """The table mutates copies: the good file is still good."""
    d = copy.deepcopy(_good())
    assert SF.SessionFile.from_dict(d).n_prompt == 3 and re.fullmatch(r"[0-9a-f]{64}", d["model"]["sha256"])
