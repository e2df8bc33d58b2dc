"""``attnscope bench --dtype/--quantize``: the real-size bench (attnscope.core.bench.size)."""

from __future__ import annotations

import json

import pytest
from attnscope.core.bench.size import SizeOptions, format_size_table, run_size_bench


def _result(**over):
    r = {
        "dtype": "bfloat16",
        "dtype_reason": "bfloat16: the checkpoint's own precision (GGUF Q4_0); CPU flag avx512_bf16",
        "options": {"sizes": [512, 2048]},
        "machine": {"cpu_count": 2, "loadavg_start": 1.0, "loadavg_end": 1.5},
        "convert": {
            "gguf": True,
            "cached": False,
            "seconds": 61.5,
            "peak_rss_bytes": 3_200_000_000,
            "weights_bytes": 2_471_000_000,
        },
        "scope": {
            "cold_load_s": 2.5,
            "warm_load_s": 0.8,
            "prefill_s": {"512": 4.0, "2048": 20.0},
            "decode_step_s": 0.12,
            "head_map_s": 0.004,
            "head_map_T": 2048,
            "peak_rss_bytes": 3_900_000_000,
        },
        "sdpa": {
            "cold_load_s": 2.0,
            "prefill_s": {"512": 3.6, "2048": 18.0},
            "decode_step_s": 0.1,
            "peak_rss_bytes": 3_500_000_000,
        },
    }
    r.update(over)
    return r


def test_table_rows_and_ratios():
    t = format_size_table(_result())
    assert "| GGUF conversion | 61.50 s | peak RSS 3.20 GB |" in t
    assert "| load cold / warm | 2.50 s / 800 ms | SDPA cold 2.00 s |" in t
    assert "| prefill 2048 (capture / SDPA) | 20.00 s / 18.00 s | 1.11× |" in t
    assert "| decode step (capture / SDPA) | 120 ms / 100 ms | 1.20× |" in t
    assert "| one head's map (T=2048) | 4 ms |" in t
    assert "| peak RSS (capture / SDPA) | 3.90 GB / 3.50 GB |" in t
    cached = format_size_table(_result(convert={"gguf": True, "cached": True, "weights_bytes": 1}))
    assert "cached (not measured)" in cached
    failed = format_size_table(_result(sdpa={"phase": "sdpa", "error": "exit 1: boom"}))
    assert "| sdpa failed | exit 1: boom |" in failed and "20.00 s / — | — |" in failed


@pytest.mark.slow
def test_runs_on_a_tiny_gguf_each_phase_in_its_own_process(tmp_path, monkeypatch):
    import gguf
    from gguf_families import write_family_gguf

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    path = write_family_gguf("llama", tmp_path / "q8.gguf", gguf.GGMLQuantizationType.Q8_0)
    r = run_size_bench(
        SizeOptions(model=str(path), dtype="bfloat16", device="cpu", sizes=(24, 8), decode_steps=2)
    )
    json.dumps(r)  # JSON-ready
    assert r["dtype"] == "bfloat16" and r["convert"]["gguf"] and not r["convert"]["cached"]
    assert r["convert"]["weights_bytes"] > 0 and r["convert"]["folder"].endswith("-bfloat16")
    for p in ("scope", "sdpa"):
        assert "error" not in r[p], r[p]
        assert (
            set(r[p]["prefill_s"]) == {"8", "24"}
            and r[p]["decode_step_s"] > 0
            and r[p]["peak_rss_bytes"] > 10**8
        )
    assert r["scope"]["dtype"] == "bfloat16" and r["scope"]["head_map_T"] == 24
    again = run_size_bench(
        SizeOptions(model=str(path), dtype="bfloat16", device="cpu", sizes=(8,), decode_steps=1)
    )
    assert again["convert"]["cached"]


@pytest.mark.slow
def test_the_bench_says_whether_the_cold_load_read_or_wrote_the_quantised_weights_cache(tmp_path):
    from tiny_models import save_tiny

    folder = tmp_path / "llama"
    save_tiny("llama", folder)
    opts = SizeOptions(
        model=str(folder), dtype="float32", quantize="int8", device="cpu", sizes=(8,), decode_steps=1
    )
    first = run_size_bench(opts)
    assert first["scope"]["quant_cache"] == "written", first["scope"]
    again = run_size_bench(opts)
    assert again["scope"]["quant_cache"] == "read", again["scope"]
    assert "quantised-weights cache read at the cold load" in format_size_table(again)
    plain = run_size_bench(
        SizeOptions(model=str(folder), dtype="float32", device="cpu", sizes=(8,), decode_steps=1)
    )
    assert "quant_cache" not in plain["scope"]
