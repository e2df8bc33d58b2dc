"""`attnscope examples`: the seeds' worked numbers, as a user runs them (the oracle is in the product)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from attnscope.core.cli.commands import examples as E
from attnscope.core.cli.main import main


def test_every_example_matches_its_seed_and_the_command_exits_0(capsys):
    assert main(["examples"]) == 0
    out = capsys.readouterr().out
    for key in E.EXAMPLES:
        assert f"[{key};" in out
    assert "MISMATCH" not in out
    # the 3-token trace (worked_examples.TRACE_*), row 1 of the weights: 0.045, 0.768, 0.187
    assert "[0.045388, 0.767918, 0.186694]" in out


def test_json_carries_computed_and_printed_values(capsys):
    assert main(["examples", "trace", "kv70b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["key"] for d in data] == ["trace", "kv70b"]
    steps = {s["name"]: s for s in data[0]["steps"]}
    w = np.array(steps["weights A = softmax(S/√d_k)"]["computed"])
    assert np.allclose(w.sum(axis=1), 1.0) and abs(w[0, 1] - 0.767918) < 1e-6
    gqa = {s["name"]: s for s in data[1]["steps"]}["GQA, 8 KV heads (GB)"]
    assert abs(gqa["computed"] - 2.684355) < 1e-6 and gqa["printed"] == 2.7 and gqa["status"] == "matches"


def test_an_unknown_example_is_one_line(capsys):
    assert main(["examples", "nope"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown example 'nope'" in err[0] and "trace" in err[0]


def test_a_wrong_number_fails_the_command(monkeypatch, capsys):
    """The check can fail: an example whose computed value drifts from the seed exits 1 and names it."""
    good = E.EXAMPLES["exercise1"]

    def drifted():
        ex = good()
        s = ex.steps[0]
        bad = E.Step(s.name, s.value + 1.0, s.printed, s.atol)
        return E.WorkedExample(ex.key, ex.title, ex.source, (bad, *ex.steps[1:]))

    monkeypatch.setitem(E.EXAMPLES, "exercise1", drifted)
    assert main(["examples", "exercise1"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "exercise1: q·k" in out


@pytest.mark.parametrize("key", list(E.EXAMPLES))
def test_no_failures_per_example(key):
    assert E.failures(E.report([key])) == []
