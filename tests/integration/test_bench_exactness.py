"""``attnscope bench --dtype/--quantize``'s exactness phase (the per-dtype rule; attnscope.core.bench.size)."""

from __future__ import annotations

import json

import pytest
from attnscope.core.bench.size import SizeOptions, format_size_table, run_size_bench


def _result(exactness):
    return {
        "dtype": "bfloat16",
        "dtype_reason": "bfloat16: the checkpoint's own precision",
        "options": {"sizes": [512]},
        "machine": {"cpu_count": 2, "loadavg_start": 1.0, "loadavg_end": 1.5},
        "convert": {"gguf": False, "weights_bytes": 1},
        "exactness": exactness,
    }


def test_table_row_says_met_or_missed():
    ex = {
        "n_tokens": 128,
        "n_heads_total": 512,
        "ours_max_err": 4.2e-4,
        "eager_max_err": 3.9e-3,
        "share_ours_le_eager": 1.0,
        "median_ratio": 0.21,
        "rule": "ours ≤ eager for every head",
        "met": True,
    }
    t = format_size_table(_result(dict(ex, seconds=33.2, peak_rss_bytes=6_790_000_000)))
    assert (
        "| exactness phase (capture, eager, float32 eager; one after another) | 33.20 s | peak RSS 6.79 GB |"
        in t
    )
    assert "prefill" not in t and "load cold" not in t  # the phases that did not run leave no empty rows
    assert (
        "| exactness (128 tokens): max weight error vs float32 eager (capture / eager) | 4.20e-04 / 3.90e-03 "
        "| ours ≤ eager for every head: met (ours ≤ eager in all 512 heads, median ratio 0.21) |"
    ) in t
    missed = format_size_table(_result(dict(ex, share_ours_le_eager=0.998, met=False)))
    assert "ours ≤ eager for every head: missed (ours ≤ eager in 99.8% of 512 heads, median" in missed
    f32 = dict(ex, rule="ours ≤ 1e-05", median_ratio=None, eager_max_err=0.0, share_ours_le_eager=0.0)
    assert "| 4.20e-04 / 0.00e+00 | ours ≤ 1e-05: met (max over 512 heads) |" in format_size_table(
        _result(f32)
    )
    means = dict(ex, ours_mean_abs_err=3.0e-4, eager_mean_abs_err=3.1e-4, share_mean_abs_ours_le_eager=0.949)
    assert (
        "| exactness: mean abs weight error per head, mean over heads (capture / eager) | 3.00e-04 / 3.10e-04 "
        "| ours ≤ eager in 94.9% of heads; by max error in 90.6% of layer 0's"
    ) in format_size_table(_result(dict(means, layer0_share=0.90625)))
    failed = format_size_table(_result({"phase": "exactness", "error": "exit 1: boom"}))
    assert "| exactness failed | exit 1: boom |" in failed


def test_unknown_phase_is_one_line():
    from attnscope.core.cli.commands.bench import _phases

    assert _phases("exactness") == ("exactness",)
    assert _phases(" scope , exactness") == ("scope", "exactness")
    with pytest.raises(ValueError, match=r"^--phases takes a comma-separated list of scope, sdpa, exactness"):
        _phases("scope,eager")


@pytest.mark.slow
def test_exactness_phase_alone_in_its_own_process(tmp_path):
    from tiny_models import save_tiny

    folder = tmp_path / "llama"
    save_tiny("llama", folder)
    r = run_size_bench(
        SizeOptions(
            model=str(folder), dtype="bfloat16", device="cpu", phases=("exactness",), exactness_tokens=32
        )
    )
    json.dumps(r)
    assert "scope" not in r and "sdpa" not in r
    ex = r["exactness"]
    assert "error" not in ex, ex
    assert ex["n_tokens"] == 32 and ex["n_heads_total"] == 2 * 4 and ex["dtype"] == "bfloat16"
    assert ex["met"] and ex["share_ours_le_eager"] == 1.0
    assert 0 < ex["ours_max_err"] < ex["eager_max_err"] < 0.05
    assert 0 < ex["ours_mean_abs_err"] < ex["eager_mean_abs_err"] and ex["layer0_share"] == 1.0
    assert ex["peak_rss_bytes"] > 10**8 and ex["seconds"] > 0
    assert "exactness (32 tokens)" in format_size_table(r)


def test_exactness_is_skipped_in_one_line_where_its_float32_reference_cannot_fit(tmp_path, monkeypatch):
    """An 8B at bf16 (16 GB of weights) needs a 32 GB float32 reference: on a 23 GB machine the phase
    says so instead of being killed for memory (the machine's other work with it)."""
    from attnscope.core.bench import size

    monkeypatch.setattr(size, "_mem_available", lambda: 23 * 10**9)
    assert size._exactness_room({"weights_bytes": 16_060_522_496}, "bfloat16") == (
        "its float32 reference needs 33.2 GB, 23.0 GB available"
    )
    assert size._exactness_room({"weights_bytes": 2_471_000_000}, "bfloat16") == ""  # the 1B: 6 GB
    r = _result({"skipped": "its float32 reference needs 33.2 GB, 23.0 GB available"})
    table = format_size_table(r)
    assert "| exactness | skipped | its float32 reference needs 33.2 GB, 23.0 GB available |" in table
