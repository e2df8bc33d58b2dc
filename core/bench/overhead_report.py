"""The human-readable report of ``attnscope bench`` (:func:`format_table`): one row per size and configuration.

Qt-free. Reads the JSON-ready result of :func:`attnscope.core.bench.overhead.run_bench`.
"""

from __future__ import annotations

from attnscope.core.bench.overhead import CONFIGS, SHORT, peak_growth, ratio


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.3g} s" if x >= 1 else f"{x * 1e3:.3g} ms"


def _fmt_b(x: int | None) -> str:
    """Bytes in decimal units, 3 significant digits (:func:`attnscope.core.units.format_bytes`); None → ``—``."""
    from attnscope.core.units import format_bytes

    return format_bytes(x, none="—")


def _fmt_r(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def format_table(result: dict) -> str:
    """The human-readable report: one row per (T, configuration), then head maps, sinks, targets."""
    m, mm = result["machine"], result["matmul"]
    g = result["model"]
    lines = [
        f"attnscope bench: {g['name']} ({g['n_layers']} layers × {g['n_heads']} heads, "
        f"{g['n_kv_heads']} KV heads, head_dim {g['head_dim']}), {result['options']['decode_steps']} decode steps",
        f"machine: {m['cpu_count']} CPUs ({m['cpu_model']}), {m['torch_threads']} torch threads, device "
        f"{m['device']}, torch {m['torch_version']}, transformers {m['transformers_version']}",
        f"matmul peak ({mm['n']}³ float32): {mm['peak_flops'] / 1e9:.1f} GFLOP/s;  load average "
        f"{m.get('loadavg_start')} → {m.get('loadavg_end')}",
        "",
        f"prefill and decode/step: MEDIANS of {result['options'].get('repeats', '?')} runs each, ×(a) the "
        "ratio of medians to SDPA's; ×(c) peak RSS growth over eager's",
        f"{'T':>6}  {'config':<16}{'prefill':>10}{'×(a)':>7}{'decode/step':>13}{'×(a)':>7}"
        f"{'peak RSS +':>12}{'×(c)':>7}{'GFLOP/s':>9}{'of peak':>9}{'cpu/wall':>9}",
    ]
    for e in result["sizes"]:
        T, r = e["T"], e["ratios"]
        for c in CONFIGS:
            d = e["configs"].get(c)
            if d is None:
                continue
            if "skipped" in d:
                lines.append(f"{T:>6}  {SHORT[c]:<16}{d['skipped']}")
                continue
            pr = 1.0 if c == "sdpa" else r.get(f"prefill_{c}_over_sdpa")
            dr = 1.0 if c == "sdpa" else r.get(f"decode_{c}_over_sdpa")
            growth = peak_growth(d)
            mr = {
                "scope": r.get("memory_scope_over_eager"),
                "eager": 1.0 if growth is not None else None,
            }.get(c)
            if c == "sdpa":
                mr = ratio(growth, peak_growth(e["configs"].get("eager") or {}))
            lines.append(
                f"{T:>6}  {SHORT[c]:<16}{_fmt_s(d['prefill_median_s']):>10}{_fmt_r(pr):>7}"
                f"{_fmt_s(d['decode_step_median_s']):>13}{_fmt_r(dr):>7}{_fmt_b(growth):>12}{_fmt_r(mr):>7}"
                f"{d['achieved_flops'] / 1e9:>9.1f}{d['fraction_of_peak'] * 100:>8.0f}%{d['cpu_per_wall']:>9.2f}"
            )
            err = (d.get("memory") or {}).get("error")
            if err:
                lines.append(f"{'':>8}{err}")
    lines.append("")
    for e in result["sizes"]:
        s = e["configs"].get("scope") or {}
        if "head_map_median_s" in s:
            lines.append(
                f"T={e['T']:>5}: one head's {e['T']}×{e['T']} map {_fmt_s(s['head_map_median_s'])} (median of "
                f"{len(s['head_map_s'])}); {g['n_layers']}×{g['n_heads']} sink table {_fmt_s(s['sink_table_median_s'])}"
            )
    lines += ["", "targets:"]
    for t in result["targets"]:
        if t["unit"] == "ratio":
            val, lim = _fmt_r(t["value"]), f"{t['limit']:.2f}×"
        elif t["unit"] == "bytes":
            val, lim = _fmt_b(t["value"]), _fmt_b(t["limit"])
        else:
            val, lim = _fmt_s(t["value"]), _fmt_s(t["limit"])
        verdict = {True: "met", False: "NOT MET", None: "not measured"}[t["met"]]
        lines.append(
            f"  {t['name']} (T={t['T']}): {val} ≤ {lim}: {verdict}" + (f" ({t['note']})" if t["note"] else "")
        )
    fastest = [
        f"T={e['T']}: {_fmt_r(e['ratios'].get('prefill_scope_over_sdpa_min'))}"
        for e in result["sizes"]
        if e["ratios"].get("prefill_scope_over_sdpa_min") is not None
    ]
    if fastest:
        lines.append(
            "capture prefill / sdpa prefill, ratio of the FASTEST runs (minimum of each; contention only "
            "adds time, so this is the noise-robust reading; the table's × are medians): "
            + ", ".join(fastest)
        )
    for e in result["sizes"]:
        if e.get("note"):
            lines.append(f"T={e['T']}: {e['note']}")
    n = result["noise"]
    if n["prefill_max_over_min"] is not None:
        lines.append(
            f"noise: repeated prefills spread up to {n['prefill_max_over_min']:.2f}× (max/min), median "
            f"{n['prefill_max_over_min_median']:.2f}×; cpu/wall median {n['cpu_per_wall_median']:.2f}"
        )
    lines.append(f"elapsed {result['elapsed_s']:.0f} s")
    return "\n".join(lines)
