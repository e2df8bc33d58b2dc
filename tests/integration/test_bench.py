"""`attnscope bench` JSON schema, formulas and ratios (no timing assertions)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import numpy as np
import pytest
import torch
from attnscope.core.bench import overhead as bench
from attnscope.core.bench import peak_memory

SMOL = dict(
    name="SmolLM2",
    architecture="llama",
    n_layers=30,
    n_heads=9,
    n_kv_heads=3,
    head_dim=64,
    hidden_size=576,
    vocab_size=49152,
    max_context=8192,
    n_params=134_515_008,
    n_linear=30 * (576 * 576 * 2 + 2 * 576 * 192 + 3 * 576 * 1536),
    dtype="float32",
)


def attnscope(*args, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "attnscope.app.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_prefill_flops_by_hand():
    # 2 × n_linear × T + 2 × L × H × T² × D (causal half of 4·T²·D) + LM head on one position
    T = 2048
    linear = 2 * 106_168_320 * T
    attn = 2 * 30 * 9 * T * T * 64
    head = 2 * 49152 * 576
    assert SMOL["n_linear"] == 106_168_320
    assert bench.prefill_flops(SMOL, T) == linear + attn + head
    # ≈ 580 GFLOP at 2048: 434.9 in the projections, 145.0 in attention
    assert bench.prefill_flops(SMOL, T) / 1e9 == pytest.approx(579.88, abs=0.01)


def test_eager_fit_8192_skipped_2048_runs(monkeypatch):
    monkeypatch.setattr(
        bench, "available_bytes", lambda device: 100 * 10**9
    )  # plenty available: the 24 GB limit decides
    assert bench.eager_attention_bytes(SMOL, 8192) == 30 * 9 * 8192 * 8192 * 4  # 72.5 GB
    ok, why = bench.eager_fit(SMOL, 8192, 24 * 10**9)
    assert not ok and why.startswith("skipped") and "72.5 GB" in why and "limit" in why
    ok, why = bench.eager_fit(SMOL, 2048, 24 * 10**9)
    assert ok and why == ""
    monkeypatch.setattr(
        bench, "available_bytes", lambda device: 3 * 10**9
    )  # 4.5 GB of attentions > 3 GB available
    ok, why = bench.eager_fit(SMOL, 2048, 24 * 10**9)
    assert not ok and "available" in why


def test_peak_rss_sees_a_100_mb_allocation():
    # Fresh pages straight from the kernel (an anonymous mmap), touched one by one: +100 MB resident
    # whatever the allocator kept from earlier tests. (np.ones can reuse freed, still-resident memory
    # after a model test, so its RSS growth depends on test order; it read 0 after test_exactness.)
    import mmap

    peak = peak_memory.PeakRSS()
    before = peak.start()
    buf = mmap.mmap(-1, 100 * 10**6)
    np.frombuffer(buf, dtype=np.uint8)[:: mmap.PAGESIZE] = 1
    grown = peak.stop() - before
    buf.close()
    assert 95e6 <= grown < 400e6, grown


def _fake_size(T, sdpa, scope, eager):
    def cfg(prefill, decode, growth):
        return {
            "prefill_median_s": prefill,
            "decode_step_median_s": decode,
            "memory": {"growth_bytes": growth, "peak_bytes": 10**9 + growth},
        }

    configs = {"sdpa": cfg(*sdpa), "scope": cfg(*scope)}
    configs["eager"] = cfg(*eager) if eager else {"skipped": "skipped: too big"}
    return {"T": T, "configs": configs}


def test_ratios_and_targets_from_raw_figures():
    e = _fake_size(2048, (10.0, 0.020, 100e6), (11.0, 0.022, 300e6), (40.0, 0.030, 5000e6))
    e["configs"]["scope"]["head_map_median_s"] = 0.030
    e["ratios"] = bench.size_ratios(e["configs"])
    assert e["ratios"]["prefill_scope_over_sdpa"] == pytest.approx(1.1)
    assert e["ratios"]["prefill_eager_over_sdpa"] == pytest.approx(4.0)
    assert e["ratios"]["decode_scope_over_sdpa"] == pytest.approx(1.1)
    assert e["ratios"]["memory_scope_over_eager"] == pytest.approx(0.06)
    e8 = _fake_size(8192, (80.0, 0.05, 400e6), (95.0, 0.05, 1.2e9), None)
    e8["ratios"] = bench.size_ratios(e8["configs"])
    assert e8["ratios"]["memory_scope_over_eager"] is None and e8["ratios"]["prefill_eager_over_sdpa"] is None
    targets = {t["name"]: t for t in bench.evaluate_targets({"sizes": [e, e8]})}
    assert len(targets) == 5
    assert targets["capture prefill / sdpa prefill"]["met"] is True  # 1.10 <= 1.15
    assert targets["capture peak RSS growth / eager peak RSS growth"]["met"] is True  # 0.06 <= 0.10
    assert targets["capture at T=8192: peak RSS"]["value"] == 10**9 + 1.2e9
    assert targets["one head's full map"]["met"] is True
    e["configs"]["scope"]["decode_step_median_s"] = 0.025  # 1.25× sdpa
    e["ratios"] = bench.size_ratios(e["configs"])
    targets = {t["name"]: t for t in bench.evaluate_targets({"sizes": [e]})}
    assert targets["capture decode step / sdpa decode step"]["met"] is False
    assert targets["capture at T=8192: peak RSS"]["met"] is None  # not in this run: not measured, not "met"


def test_bad_options_exit_with_one_line():
    bad = [["--sizes", "1"], ["--sizes", "a,b"], ["--repeats", "0"], ["--decode-steps", "0"]]
    if not torch.cuda.is_available():
        bad.append(["--device", "cuda"])
    for args in bad:
        r = attnscope("bench", *args, timeout=120)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert r.stderr.strip().startswith("attnscope: error:") and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_quick_bench_json(tmp_path):
    out = tmp_path / "bench.json"
    r = attnscope("bench", "--quick", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "attnscope bench" in r.stdout and "targets:" in r.stdout
    res = json.loads(out.read_text())
    assert res["schema"] == bench.SCHEMA
    m = res["machine"]
    assert m["cpu_count"] >= 1 and m["torch_threads"] >= 1 and m["device"] == "cpu" and m["torch_version"]
    assert res["model"]["n_layers"] == 30 and res["model"]["n_heads"] == 9
    assert res["matmul"]["peak_flops"] == pytest.approx(res["matmul"]["flop"] / min(res["matmul"]["seconds"]))
    assert [e["T"] for e in res["sizes"]] == [64]
    e = res["sizes"][0]
    opts = res["options"]
    assert opts["repeats"] == 1 and opts["decode_steps"] == 4
    flops = bench.prefill_flops(res["model"], 64)
    for c in ("sdpa", "scope", "eager"):
        d = e["configs"][c]
        assert len(d["prefill_s"]) == 1 and d["prefill_median_s"] == statistics.median(d["prefill_s"]) > 0
        assert d["prefill_min_s"] == min(d["prefill_s"])
        assert d["decode_steps"] == 4 and d["decode_step_median_s"] > 0
        assert d["prefill_flops"] == flops
        assert d["achieved_flops"] == pytest.approx(flops / d["prefill_median_s"])
        assert d["fraction_of_peak"] == pytest.approx(d["achieved_flops"] / res["matmul"]["peak_flops"])
        mem = d["memory"]
        assert "error" not in mem, mem
        assert mem["peak_rss_bytes"] >= mem["rss_before_bytes"] > 0
        assert mem["peak_rss_growth_bytes"] == mem["peak_rss_bytes"] - mem["rss_before_bytes"]
        assert mem["kind"] == "RSS" and mem["growth_bytes"] == mem["peak_rss_growth_bytes"]
    s = e["configs"]["scope"]
    assert len(s["head_map_s"]) == 2 and all(x > 0 for x in s["head_map_s"])
    assert len(s["sink_table_s"]) == 1 and s["sink_table_median_s"] > 0
    r_ = e["ratios"]
    cfg = e["configs"]
    assert r_["prefill_scope_over_sdpa"] == pytest.approx(
        cfg["scope"]["prefill_median_s"] / cfg["sdpa"]["prefill_median_s"]
    )
    assert r_["prefill_eager_over_sdpa"] == pytest.approx(
        cfg["eager"]["prefill_median_s"] / cfg["sdpa"]["prefill_median_s"]
    )
    assert r_["prefill_scope_over_sdpa_min"] == pytest.approx(
        cfg["scope"]["prefill_min_s"] / cfg["sdpa"]["prefill_min_s"]
    )
    assert r_["decode_scope_over_sdpa"] == pytest.approx(
        cfg["scope"]["decode_step_median_s"] / cfg["sdpa"]["decode_step_median_s"]
    )
    assert r_["memory_scope_over_eager"] == pytest.approx(
        cfg["scope"]["memory"]["growth_bytes"] / cfg["eager"]["memory"]["growth_bytes"]
    )
    # T=2048 and 8192 were not run: their targets are "not measured", never "met"
    assert len(res["targets"]) == 5 and all(t["met"] is None for t in res["targets"])
