"""``attnscope bench --sources``: a score's split by source against a prefill of its prefix, side by side.

A source split of the cell (query ``i``, key ``j``) costs one forward of ``ids[: i + 1]`` stopped at the
head's layer, plus one batched call of that layer's attention on the components
(:mod:`attnscope.core.analysis.qk_sources`). The row compares it with a plain prefill of the same
``i + 1`` tokens in a separate cache (what the split's forward would cost run to the end), in one run,
interleaved (prefill, split, prefill, split …), median of ``repeats``; the ratio is the target
(≤ :data:`TARGET_RATIO`). Measured for the last layer (the whole forward runs: the worst case) and a
middle one. Wall and CPU seconds are both given: on a machine shared with other work the wall time is
mostly waiting, the CPU time is the work.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

TARGET_RATIO = 1.5


def sources_bench(
    model: str | None = None,
    T: int = 512,
    repeats: int = 3,
    log: Callable[[str], None] = lambda _m: None,
) -> dict:
    """Time :func:`attnscope.core.analysis.qk_sources.source_split` of the cell (``T − 1``, ``T // 2``)
    against a prefill of ``T`` tokens, for the last and the middle layer (head 0).

    Returns:
        ``{"model", "seq_len", "rows": {layer: {"prefill_s", "split_s", "prefill_cpu_s", "split_cpu_s",
        "ratio", "cpu_ratio", "met"}}, "target_ratio"}`` (seconds, medians).

    Raises:
        ValueError: ``T < 2`` or ``repeats < 1``.
    """
    from attnscope.core.analysis.head_effects import _scratch
    from attnscope.core.analysis.qk_sources import source_split
    from attnscope.core.bench.views import CPU_TIMES, _timed, long_text
    from attnscope.core.session import Session

    if T < 2 or repeats < 1:
        raise ValueError(f"need T >= 2 and repeats >= 1, got T={T}, repeats={repeats}")
    s = Session.load(model)
    s.prefill(long_text(s, T), chat_template=False)
    n = s.seq_len
    i, j = n - 1, n // 2
    ids = s.ids

    def prefill():
        with _scratch(s) as be:
            be.forward(ids[: i + 1])

    out: dict = {"model": s.info.name, "seq_len": n, "query": i, "key": j, "rows": {}}
    out["target_ratio"] = TARGET_RATIO
    L = s.info.n_layers
    for layer in sorted({L - 1, L // 2}, reverse=True):
        if not s.info.arch.has_map(layer):
            continue
        pw, pc, sw, sc = [], [], [], []
        for r in range(repeats):
            log(f"sources: layer {layer}, repeat {r + 1}/{repeats}")
            _, t = _timed(prefill)
            pw.append(t)
            pc.append(CPU_TIMES["last"])
            _, t = _timed(lambda layer=layer: source_split(s, layer, 0, i, j))
            sw.append(t)
            sc.append(CPU_TIMES["last"])
        row = {
            "prefill_s": statistics.median(pw),
            "split_s": statistics.median(sw),
            "prefill_cpu_s": statistics.median(pc),
            "split_cpu_s": statistics.median(sc),
        }
        row["ratio"] = row["split_s"] / row["prefill_s"]
        row["cpu_ratio"] = row["split_cpu_s"] / max(row["prefill_cpu_s"], 1e-9)
        row["met"] = row["ratio"] <= TARGET_RATIO
        out["rows"][layer] = row
    return out


def format_sources(result: dict) -> str:
    """Markdown table: one row per layer, the prefill and the split side by side, and the ratio."""
    n = result["seq_len"]
    lines = [
        f"source split of cell ({result['query']}, {result['key']}) vs a prefill of {n} tokens, "
        f"{result['model']}",
        "| layer | prefill | split | ratio (wall) | ratio (CPU) | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for layer, r in result["rows"].items():
        lines.append(
            f"| {layer} | {r['prefill_s'] * 1e3:.0f} ms | {r['split_s'] * 1e3:.0f} ms | {r['ratio']:.2f} | "
            f"{r['cpu_ratio']:.2f} | ≤ {result['target_ratio']} | {'yes' if r['met'] else 'no'} |"
        )
    return "\n".join(lines)
