"""`attnscope bench --views`: how long a person waits for each view of a long prompt (docs/benchmarks.md "Long prompts").

Rows (each one run; times in seconds on this machine, peak RSS in bytes):

* head grid after prefill (:func:`attnscope.core.analysis.aggregate.thumbnails`, 40 px max-pooled thumbnails of every
  head) at 2,000 and 8,000 tokens. Both come from one 8,192-token SmolLM2 prefill, cropped to ``n``
  positions (a crop is exactly the shorter prompt's map: causal mask, :mod:`attnscope.core.analysis.timeline`) and
  computing exactly the work a prompt of ``n`` tokens needs;
* mean of all layers at 8,192 (:func:`attnscope.core.analysis.aggregate.pooled_map`, mode ``all``: the heatmap's
  1024-px overview of the mean of 270 heads);
* one head's map at 8,192 (the heatmap's overview of one head; the full exact 8192² array too);
* why a head attends at 8,192 (:mod:`attnscope.core.analysis.explain`, no forward): the band split of one
  cell and of one row, and the head's positional share, whose time is also given as a ratio to that
  head's overview (``ratios``: the same cost is the target);
* a long model (``--long-model``, Gemma 3 270M): a 32,000-token prefill with capture (peak RSS),
  what its sliding-window layers cost against the global ones (stored keys, thumbnail time), and
  the bare PNG export of a 16,000-token map of it, streamed at one pixel per cell (extra peak RSS).

The targets are those of docs/benchmarks.md ("Long prompts"); a missed target keeps its measured figure and the matmul rate that
explains it (``matmul_gflops``: a 2048² float32 matmul timed just before).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnscope.core.session import Session

TARGETS = {  # row -> (limit, unit)
    "head_grid_2000": (3.0, "s"),
    "head_grid_8000": (30.0, "s"),
    "mean_all_8192": (30.0, "s"),
    "one_head_8192": (0.050, "s"),
    "explain_cell_8192": (0.005, "s"),
    "explain_row_8192": (0.005, "s"),
    "positional_share_vs_overview": (1.0, "x"),
    "png_16k_extra_rss": (1.1e9, "B"),
    "long_prefill_peak_rss": (12e9, "B"),
}
LABELS = {
    "head_grid_2000": "head grid after prefill, SmolLM2, 2,000 tokens",
    "head_grid_8000": "head grid after prefill, SmolLM2, 8,000 tokens",
    "mean_all_8192": "mean of all layers, 8,192 tokens (1024-px overview)",
    "one_head_8192": "one head's map at 8,192 (1024-px overview)",
    "explain_cell_8192": "why: one cell's band split at 8,192 (no forward)",
    "explain_row_8192": "why: one row's band split at 8,192 (no forward)",
    "positional_share_vs_overview": "why: a head's positional share ÷ its 1024-px overview, 8,192",
    "png_16k_extra_rss": "PNG export of a 16k map (one pixel per cell, streamed), extra peak RSS",
    "long_prefill_peak_rss": "Gemma 3 270M, 32,000-token prefill with capture, peak RSS",
}


def long_text(session: Session, T: int) -> str:
    """Text of about ``T`` tokens: the sample prompts repeated, cut at ``T`` tokens and decoded."""
    from attnscope.core.io.colormaps import ASSETS

    base = (ASSETS / "prompts.txt").read_text(encoding="utf-8")
    text, i = "", 0
    while len(session.encode(text, chat_template=False)) < T:
        text += f"\n[{i}] " + base * max(1, T // 4000)
        i += 1
    ids = session.encode(text, chat_template=False)[:T]
    return session.tokenizer.decode(ids)


CPU_TIMES: dict[str, float] = {}  # last row's CPU seconds of this process (see _timed)


def _timed(fn):
    """``(result, wall seconds)``; the process's CPU seconds go to ``CPU_TIMES["last"]``: on a busy
    machine (others' processes) the wall time is mostly waiting, the CPU time is the work."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    CPU_TIMES["last"] = time.process_time() - c0
    return out, time.perf_counter() - t0


def _row(out: dict, key: str, fn, log) -> None:
    _, out["rows"][key] = _timed(fn)
    out.setdefault("cpu_s", {})[key] = CPU_TIMES["last"]
    log(f"{key}: {out['rows'][key]:.3f} s wall, {CPU_TIMES['last']:.3f} s CPU")


def views_smol(T: int = 8192, model: str | None = None, log: Callable[[str], None] = lambda _m: None) -> dict:
    """Head grid (2,000 / 8,000), mean of all layers and one head at ``T`` on the default model."""
    from attnscope.core.analysis import aggregate
    from attnscope.core.bench.machine import matmul_peak
    from attnscope.core.bench.peak_memory import PeakRSS
    from attnscope.core.session import Session

    s = Session.load(model)
    log(f"views: prefill of {T} tokens")
    text = long_text(s, T)
    _, t_prefill = _timed(lambda: s.prefill(text, chat_template=False))
    n = s.seq_len
    out = {"model": s.info.name, "seq_len": n, "prefill_s": t_prefill, "rows": {}}
    out["matmul_gflops"] = matmul_peak(2048, repeats=3)["peak_flops"] / 1e9
    out["loadavg"] = list(__import__("os").getloadavg())
    out["torch_threads"] = __import__("torch").get_num_threads()
    out["kernel_rates"] = kernel_rates()
    out["floors_s"] = floors(n, s.info.n_layers, s.info.n_heads, s.info.head_dim, out["kernel_rates"])
    rows = out["rows"]
    for m in (2000, 8000):
        if m <= n:
            log(f"views: head grid at {m}")
            _, rows[f"head_grid_{m}"] = _timed(lambda m=m: aggregate.thumbnails(s, m, size=40))
    log(f"views: mean of all layers at {n}")
    _, rows["mean_all_8192"] = _timed(lambda: aggregate.pooled_map(s, 0, 0, "all", n))
    times = []
    for h in range(3):
        _, t = _timed(lambda h=h: aggregate.pooled_map(s, 10 + h, h, "head", n))
        times.append(t)
    rows["one_head_8192"] = sorted(times)[1]
    explain_rows(s, out, log)
    peak = PeakRSS()
    before = peak.start()
    _, out["one_head_exact_full_s"] = _timed(lambda: s.weights(3, 4))
    out["one_head_exact_full_extra_rss"] = peak.stop() - before
    return out


def explain_rows(s, out: dict, log: Callable[[str], None] = lambda _m: None, layer: int = 10, head: int = 1):
    """The rows of :mod:`attnscope.core.analysis.explain` on session ``s`` (median of 5, after one warm-up
    that reads the model's rotation): a cell's and a row's band split at the last query, the head's
    positional share, and its ratio to the same head's 1024-px overview timed just before."""
    from attnscope.core.analysis import aggregate
    from attnscope.core.analysis.explain import cell_bands, head_positional_share, row_bands

    n = s.seq_len
    rows = out["rows"]

    def median(fn, key: str | None = None) -> float:
        """Median wall seconds of 5 runs; its run's CPU seconds go to ``out["cpu_s"][key]``."""
        fn()
        runs = []
        for _ in range(5):
            wall = _timed(fn)[1]
            runs.append((wall, CPU_TIMES["last"]))
        wall, cpu = sorted(runs)[2]
        if key is not None:
            out.setdefault("cpu_s", {})[key] = cpu
        return wall

    log(f"views: why a head attends at {n}")
    rows["explain_cell_8192"] = median(lambda: cell_bands(s, layer, head, n - 1, n // 2), "explain_cell_8192")
    rows["explain_row_8192"] = median(lambda: row_bands(s, layer, head, n - 1), "explain_row_8192")
    overview = median(lambda: aggregate.pooled_map(s, layer, head, "head", n))
    share = median(lambda: head_positional_share(s, layer, head))
    out["explain"] = {"layer": layer, "head": head, "overview_s": overview, "positional_share_s": share}
    rows["positional_share_vs_overview"] = share / overview
    out.setdefault("ratios", {})["positional_share_vs_overview"] = share / overview


def synthetic_trace(
    n_layers: int = 30,
    n_heads: int = 9,
    n_kv_heads: int = 3,
    head_dim: int = 64,
    T: int = 8192,
    seed: int = 0,
    scale: float | None = None,
):
    """A :class:`attnscope.core.trace.torch_trace.TorchTrace` of a model's geometry (default SmolLM2-135M's) filled with
    seeded random queries/keys (float32) and a per-row LSE upper bound, for timing views without a
    prefill: every view does the same work on it as on a real trace of that length (the values
    are not attention weights of any model)."""
    import torch
    from attnscope.core.trace.torch_trace import TorchTrace

    g = torch.Generator().manual_seed(seed)
    tr = TorchTrace(n_layers, n_heads, n_kv_heads, head_dim)
    scale = head_dim**-0.5 if scale is None else scale
    keys = torch.randn((1, n_kv_heads, T, head_dim), generator=g)
    for layer in range(n_layers):
        q = torch.randn((1, n_heads, T, head_dim), generator=g)
        lse = torch.full((1, n_heads, T), float(torch.log(torch.tensor(float(T)))) + 4.0)
        tr.record(layer, q, lse, keys, scale, None)
    return tr


def kernel_rates(repeats: int = 20) -> dict:
    """What the views' inner loop can reach on this machine with torch's current threads: the
    float32 matmul of one tile (``(3, 600, 65) @ (3, 65, 600)``, the shape :mod:`attnscope.core.analysis.blocked`
    computes) in FLOP/s and float32 ``exp_`` of a 1M-element tile in elements/s (best of ``repeats``)."""
    import torch

    a, b = torch.randn(3, 600, 65), torch.randn(3, 65, 600)
    out = torch.empty(3, 600, 600)
    x = torch.randn(1 << 20) - 10
    y = torch.empty_like(x)

    def best(fn):
        fn()
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    return {
        "tile_matmul_flops": 2 * 3 * 600 * 600 * 65 / best(lambda: torch.bmm(a, b, out=out)),
        "exp_per_s": x.numel() / best(lambda: torch.exp(x, out=y)),
    }


def floors(
    T: int, n_layers: int = 30, n_heads: int = 9, head_dim: int = 64, rates: dict | None = None
) -> dict:
    """Seconds the SmolLM2 rows cannot go below at ``rates`` (:func:`kernel_rates`): the causal half of
    the scores (``m²/2`` cells of ``2(D + 1)`` FLOP per head; the LSE is one more column of the
    matmul) and, for the mean (``exp`` per cell; max pooling needs none), the exponentials."""
    rates = rates or kernel_rates()
    f, e = rates["tile_matmul_flops"], rates["exp_per_s"]
    cells = lambda m: m * m / 2  # noqa: E731
    out = {"one_head_8192": cells(T) * 2 * (head_dim + 1) / f}
    for m in (2000, 8000):
        out[f"head_grid_{m}"] = n_layers * n_heads * cells(m) * 2 * (head_dim + 1) / f
    out["mean_all_8192"] = n_layers * n_heads * cells(T) * (2 * (head_dim + 1) / f + 1 / e)
    return out


def views_synthetic(T: int = 8192, log: Callable[[str], None] = lambda _m: None) -> dict:
    """The SmolLM2 rows on :func:`synthetic_trace` (30 × 9 heads, D = 64): head grid at 2,000 and
    8,000, mean of all layers and one head's overview at ``T``."""
    import os

    from attnscope.core.analysis import blocked
    from attnscope.core.bench.machine import matmul_peak

    tr = synthetic_trace(T=T)
    out = {
        "trace": "synthetic, SmolLM2 geometry",
        "seq_len": T,
        "rows": {},
        "matmul_gflops": matmul_peak(2048, repeats=3)["peak_flops"] / 1e9,
        "loadavg": list(os.getloadavg()),
    }
    L, H = tr.n_layers, tr.n_heads
    import torch

    out["torch_threads"] = torch.get_num_threads()
    out["kernel_rates"] = kernel_rates()
    out["floors_s"] = floors(T, L, H, tr.head_dim, out["kernel_rates"])
    _row(out, "one_head_8192", lambda: blocked.pooled_heads(tr, 10, [1], T, 1024), log)
    for m in (2000, 8000):
        if m <= T:
            _row(out, f"head_grid_{m}", lambda m=m: blocked.thumbnails(tr, m, 40), log)
            out[f"head_grid_{m}_matmul_flop"] = L * H * m * m * tr.head_dim  # causal half of 2·m²·D per head
    pairs = [(lyr, h) for lyr in range(L) for h in range(H)]
    _row(out, "mean_all_8192", lambda: blocked.pooled_mean(tr, pairs, T, 1024), log)
    out["loadavg_end"] = list(os.getloadavg())
    return out


def gemma_long(
    path: str,
    T: int = 32000,
    png_n: int = 16000,
    out_dir: str | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> dict:
    """32,000-token prefill of a long model with capture; sliding vs global layer costs; 16k PNG."""
    import tempfile

    from attnscope.core.analysis import blocked
    from attnscope.core.bench.peak_memory import PeakRSS, status_bytes
    from attnscope.core.io import head_export
    from attnscope.core.session import Session

    peak = PeakRSS()
    peak.start()
    s = Session.load(str(path))
    text = long_text(s, T)
    log(f"long: prefill of {T} tokens")
    _, t_prefill = _timed(lambda: s.prefill(text, chat_template=False))
    out = {
        "model": s.info.name,
        "seq_len": s.seq_len,
        "prefill_s": t_prefill,
        "prefill_peak_rss": peak.stop(),
        "rss_after_prefill": status_bytes("VmRSS"),
        "rows": {},
    }
    out["rows"]["long_prefill_peak_rss"] = out["prefill_peak_rss"]
    tr = s.trace
    layers = []
    for i, rec in enumerate(tr.layers):
        layers.append(
            {
                "layer": i,
                "sliding_window": rec.sliding_window,
                "keys": int(rec.keys.shape[1]),
                "key_bytes": int(rec.keys.numel() * rec.keys.element_size()),
            }
        )
    out["layers"] = layers
    n = s.seq_len
    sl = next((d["layer"] for d in layers if d["sliding_window"]), None)
    gl = next((d["layer"] for d in layers if not d["sliding_window"]), None)
    for kind, layer in (("sliding", sl), ("global", gl)):
        if layer is None:
            continue
        log(f"long: thumbnails of a {kind} layer")
        _, t = _timed(lambda layer=layer: blocked.pooled_heads(tr, layer, range(tr.n_heads), n, 40))
        out[f"thumb_layer_{kind}_s"] = t
    q_bytes = tr._store.q[:, :, :n].numel() * tr._store.q.element_size() if hasattr(tr, "_store") else None
    out["q_store_bytes"] = q_bytes
    m = min(png_n, n)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        log(f"long: PNG of a {m}-token map, one pixel per cell")
        before = peak.start()
        _, t = _timed(
            lambda: head_export.export_head(s, gl or 0, 0, Path(tmp) / "map16k.png", n=m, full_size=True)
        )
        out["rows"]["png_16k_extra_rss"] = peak.stop() - before
        out["png_16k_s"] = t
        out["png_16k_bytes"] = (Path(tmp) / "map16k.png").stat().st_size
        before = peak.start()
        _, t = _timed(lambda: head_export.export_head(s, gl or 0, 0, Path(tmp) / "ov.png", n=m))
        out["png_16k_overview_extra_rss"] = peak.stop() - before
        out["png_16k_overview_s"] = t
    return out


def targets(rows: dict) -> list[dict]:
    out = []
    for key, (limit, unit) in TARGETS.items():
        if key in rows:
            v = rows[key]
            out.append(
                {
                    "row": key,
                    "label": LABELS[key],
                    "value": v,
                    "limit": limit,
                    "unit": unit,
                    "met": v <= limit,
                }
            )
    return out


def _fmt(v, unit):
    if unit == "x":
        return f"{v:.2f}×"
    if unit == "B":
        return f"{v / 1e9:.2f} GB"
    return f"{v * 1e3:.0f} ms" if v < 1 else f"{v:.1f} s"


def format_views(result: dict) -> str:
    """Markdown table of the rows measured, with targets."""
    rows = {}
    for part in ("smol", "long"):
        rows.update((result.get(part) or {}).get("rows", {}))
    lines = ["| view | measured | target | met |", "|---|---|---|---|"]
    for t in targets(rows):
        lines.append(
            f"| {t['label']} | {_fmt(t['value'], t['unit'])} | ≤ {_fmt(t['limit'], t['unit'])} | "
            f"{'yes' if t['met'] else 'no'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m attnscope.core.bench.views")
    p.add_argument("--smol", type=int, default=8192, help="SmolLM2 prefill length (0: skip)")
    p.add_argument(
        "--synthetic",
        type=int,
        default=0,
        help="time the SmolLM2 rows on a synthetic trace of its geometry at this length (no prefill)",
    )
    p.add_argument("--long-model", default=None, help="GGUF/folder of a long-context model (Gemma 3 270M)")
    p.add_argument("--long-tokens", type=int, default=32000)
    p.add_argument("--json", default=None, help="write the rows as JSON ('-': standard output)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for every row (default: torch's own count, the number of cores)",
    )
    a = p.parse_args(argv)
    from attnscope.core.analysis.blocked import torch_threads
    from attnscope.core.io.paths import check_output

    a.out = check_output(a.json, "--json", stdout=True) if a.json else None  # before any run

    with torch_threads(a.threads):
        return _run(a)


def _run(a) -> int:
    def log(m):
        print(f"bench: {m}", file=sys.stderr, flush=True)

    result = {}
    if a.synthetic:
        result["smol"] = views_synthetic(a.synthetic, log=log)
    elif a.smol:
        result["smol"] = views_smol(a.smol, log=log)
    if a.long_model:
        result["long"] = gemma_long(a.long_model, a.long_tokens, log=log)
    from attnscope.core.io.paths import write_json

    out = a.out
    to = sys.stderr if a.json and out is None else sys.stdout  # --json -: the JSON alone on stdout
    print(format_views(result), file=to)
    smol = result.get("smol") or {}
    if "floors_s" in smol:
        print(
            "floors (s, at this run's kernel rates): "
            + ", ".join(f"{k} {v:.3g}" for k, v in smol["floors_s"].items()),
            file=to,
        )
    if a.json:
        write_json(out, result, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
