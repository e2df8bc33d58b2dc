"""``attnscope bench --heads``: what "Which heads matter" costs, as ratios measured side by side in one run.

Rows (wall seconds on this machine; every ratio divides two figures taken in the same process, minutes
apart, so a busy machine slows both sides alike):

* ``prefill``: the prompt's own prefill with capture (:meth:`attnscope.core.session.Session.prefill`), the
  fastest of ``repeats``;
* ``readout``: zero-ablation of every query head, every GQA group and every KV head's K/V side at the
  read-out position (:func:`attnscope.core.analysis.head_effects.head_effects`): the whole sweep;
* ``loop``: the per-head loop TransformerLens users write, built from plain transformers (SDPA, float32,
  the same weights): one full forward of the prompt per head with a forward pre-hook on that layer's
  ``o_proj`` zeroing the head's slice of its input. Its per-head time is the median over ``loop_heads``
  heads spread over the layers (a forward's cost does not depend on which head is hooked), and the loop's
  total is that times the sweep's number of units; one sampled head's effect is checked against the
  sweep's (``loop_check_error``);
* ``everywhere``: the same ablation at every position, with the layers below each head reused, over a
  sample of layers spread evenly (its mean layer is the model's middle; the cost of a head grows with the
  layers above it), against the loop's time for the same number of units;
* ``attribution``: attribution patching (one forward with gradients and one backward per direction,
  :func:`attnscope.core.analysis.head_effects.attribution_patching`), denoising alone and both directions;
* ``lens``: the logit lens of the last 64 positions at every layer
  (:func:`attnscope.core.analysis.logit_lens.logit_lens`), in seconds, the fastest of ``repeats``, beside
  its floor measured in the same run: the unembedding matmul alone (``(n_layers·64 × d_model) @ (d_model ×
  vocab)`` in float32, in the lens's vocabulary blocks); ``--lens-only`` runs this row and the prefill alone
  (:func:`run_lens_bench`);
* ``peak``: the process's peak resident memory during each sweep above over its peak during the prefill
  the sweeps run on (both include the weights; the loop's plain model is loaded after these are read).
  Linux resets the peak before each (``/proc/self/clear_refs``, read back as ``VmHWM``), so each sweep
  has its own figure; elsewhere the process's peak so far (``getrusage``) after each.

Targets (the ratios' floors): read-out sweep ≤ 5 × prefill and ≥ 30 × faster than the loop; everywhere ≤
0.6 × the loop; attribution (one direction) ≤ 3 × prefill; logit lens ≤ 0.5 s; peak ≤ 1.1 × the
prefill's.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

TARGETS = {  # ratio -> (limit, "max" | "min")
    "readout_over_prefill": (5.0, "max"),
    "loop_over_readout": (30.0, "min"),
    "everywhere_over_loop": (0.6, "max"),
    "attribution_over_prefill": (3.0, "max"),
    "lens_s": (0.5, "max"),  # seconds, 64 positions x every layer
    "peak_over_prefill_peak": (1.10, "max"),
}
LABELS = {
    "readout_over_prefill": "read-out sweep of every head / prefill",
    "loop_over_readout": "per-head loop of full forwards / read-out sweep",
    "everywhere_over_loop": "everywhere sweep (layers below reused) / per-head loop",
    "attribution_over_prefill": "attribution patching (one direction, all heads) / prefill",
    "lens_s": "logit lens, 64 positions x every layer (seconds)",
    "peak_over_prefill_peak": "peak memory of any sweep / of the prefill (RSS)",
}


CPU: dict[str, float] = {}  # the process's CPU seconds of the last _timed call


def _timed(fn):
    """``(result, wall seconds)``; the process's CPU seconds go to ``CPU["last"]``: on a machine busy
    with other processes the wall time is mostly waiting, the CPU time is the work."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    CPU["last"] = time.process_time() - c0
    return out, time.perf_counter() - t0


def sample_layers(n_layers: int, k: int) -> list[int]:
    """``k`` layers spread evenly, centred: their mean is the middle layer (``(n_layers - 1) / 2``)."""
    k = max(1, min(k, n_layers))
    step = n_layers / k
    return sorted({int(step * (i + 0.5)) for i in range(k)})


def run_heads_bench(
    model: str | None = None,
    seq_len: int = 2048,
    repeats: int = 2,
    loop_heads: int = 5,
    everywhere_layers: int = 5,
    log: Callable[[str], None] = lambda _m: None,
) -> dict:
    """Run every row (see the module docstring) on ``model`` (default: the embedded SmolLM2-135M) at a
    prompt of ``seq_len`` tokens; returns raw seconds, the ratios and the targets (JSON-ready)."""
    import numpy as np
    import torch
    from attnscope.core.analysis.head_effects import (
        attribution_patching,
        head_effects,
        make_target,
    )
    from attnscope.core.bench.overhead import HFRunner
    from attnscope.core.bench.views import long_text
    from attnscope.core.loading.resolve import resolve
    from attnscope.core.session import Session

    s = Session.load(model)
    text = long_text(s, seq_len)
    times, cpus = [], []
    for _ in range(max(1, repeats)):
        _reset_peak()
        _, t = _timed(lambda: s.prefill(text, chat_template=False))
        times.append(t)
        cpus.append(CPU["last"])
    peaks = {"prefill": _peak_rss()}  # the prefill the sweeps run on
    ids = list(s.ids)
    T = len(ids)
    info = s.info
    out: dict = {
        "model": info.name,
        "seq_len": T,
        "torch_threads": torch.get_num_threads(),
        "rows": {"prefill_s": min(times)},
        "cpu_s": {"prefill_s": min(cpus)},
    }
    rows, cpu = out["rows"], out["cpu_s"]
    log(f"heads: prefill of {T} tokens {rows['prefill_s']:.2f} s")
    t = make_target(s, "logprob")
    _reset_peak()
    eff, rows["readout_s"] = _timed(lambda: head_effects(s, t, "zero", "readout"))
    peaks["readout"] = _peak_rss()
    cpu["readout_s"] = CPU["last"]
    units = int(np.isfinite(eff.query).sum() + np.isfinite(eff.kv).sum())
    if eff.kv_side is not None:
        units += int(np.isfinite(eff.kv_side).sum())
    out["units"] = units
    out["reused"] = eff.reused
    log(f"heads: read-out sweep of {units} units {rows['readout_s']:.2f} s")

    layers = list(info.arch.attention_layers)
    sample = [layers[i] for i in sample_layers(len(layers), everywhere_layers)]
    _reset_peak()
    ev, rows["everywhere_s"] = _timed(
        lambda: head_effects(s, t, "zero", "everywhere", layers=sample, kv_side=False)
    )
    peaks["everywhere"] = _peak_rss()
    cpu["everywhere_s"] = CPU["last"]
    ev_units = int(np.isfinite(ev.query).sum() + np.isfinite(ev.kv).sum())
    out["everywhere_layers"] = sample
    out["everywhere_units"] = ev_units
    log(f"heads: everywhere, {ev_units} units in layers {sample}: {rows['everywhere_s']:.2f} s")

    bad = list(ids)
    bad[len(bad) // 2] = ids[len(ids) // 2 - 1]  # one token changed: same length
    _reset_peak()
    _, rows["attribution_one_s"] = _timed(
        lambda: attribution_patching(s, bad, t, "everywhere", directions=("denoise",))
    )
    cpu["attribution_one_s"] = CPU["last"]
    _, rows["attribution_both_s"] = _timed(lambda: attribution_patching(s, bad, t, "everywhere"))
    peaks["attribution"] = _peak_rss()
    cpu["attribution_both_s"] = CPU["last"]
    log(
        f"heads: attribution patching {rows['attribution_one_s']:.2f} s (both directions {rows['attribution_both_s']:.2f} s)"
    )

    _lens_rows(s, out, peaks, repeats, log)
    # the process's resident peak (the weights included) during each sweep, before the plain model the
    # loop needs is loaded: how far each sweep raised it above the prefill's own
    peaks["sweeps"] = max(peaks[k] for k in ("readout", "everywhere", "attribution", "lens"))
    out["peak_rss_bytes"] = peaks

    folder, _ = resolve(model)
    ref = HFRunner(folder, "sdpa", s.backend.device).model
    D, H = info.head_dim, info.n_heads
    x = torch.tensor([ids], device=s.backend.device)
    heads = [(layer, i % H) for i, layer in enumerate(sample_layers(len(layers), loop_heads))]
    loop, loop_cpu = [], []
    check = None
    for li, h in heads:
        layer = layers[li]
        proj = ref.model.layers[layer].self_attn.o_proj

        def zero(_m, args, h=h):
            z = args[0].clone()
            z[:, -1:, h * D : (h + 1) * D] = 0  # the read-out position: the sweep's own effect
            return (z,)

        handle = proj.register_forward_pre_hook(zero)
        try:
            with torch.inference_mode():
                logits, dt = _timed(lambda: ref(input_ids=x).logits[0, -1].double())
        finally:
            handle.remove()
        loop.append(dt)
        loop_cpu.append(CPU["last"])
        if check is None:
            lp = torch.log_softmax(logits, -1)[t.token].item()
            check = abs((lp - eff.clean) - float(eff.query[layer, h]))
    rows["loop_per_head_s"] = statistics.median(loop)
    rows["loop_s"] = rows["loop_per_head_s"] * units
    cpu["loop_per_head_s"] = statistics.median(loop_cpu)
    cpu["loop_s"] = cpu["loop_per_head_s"] * units
    out["loop_check_error"] = check
    log(f"heads: per-head loop {rows['loop_per_head_s']:.2f} s a head (x {units} units)")
    ref = None  # the plain model is not needed any more

    rows["everywhere_loop_s"] = rows["loop_per_head_s"] * ev_units
    cpu["everywhere_loop_s"] = cpu["loop_per_head_s"] * ev_units

    out["ratios"] = _ratios(rows)
    out["ratios_cpu"] = _ratios(cpu)  # the same from the process's CPU seconds (a busy machine)
    ratios = out["ratios"]
    ratios["lens_s"] = rows["lens_s"]
    ratios["peak_over_prefill_peak"] = out["peak_rss_bytes"]["sweeps"] / out["peak_rss_bytes"]["prefill"]
    out["ratios_cpu"]["lens_s"] = cpu["lens_s"]
    out["ratios_cpu"]["peak_over_prefill_peak"] = ratios["peak_over_prefill_peak"]
    for k in ("readout", "everywhere", "attribution", "lens"):  # each sweep's own
        ratios[f"peak_{k}_over_prefill_peak"] = out["peak_rss_bytes"][k] / out["peak_rss_bytes"]["prefill"]
    out["targets"] = {
        k: {"limit": lim, "kind": kind, "met": ratios[k] <= lim if kind == "max" else ratios[k] >= lim}
        for k, (lim, kind) in TARGETS.items()
    }
    return out


def _lens_rows(s, out: dict, peaks: dict, repeats: int, log: Callable[[str], None]) -> None:
    """The ``lens`` row into ``out`` (``rows``, ``cpu_s``, ``lens_*``) and its peak into ``peaks``: the
    logit lens of the last 64 positions at every layer, the fastest of ``repeats`` runs, beside the
    unembedding matmul alone (its floor, the fastest of as many)."""
    from attnscope.core.analysis.logit_lens import logit_lens

    T, info = s.seq_len, s.info
    rows, cpu = out["rows"], out["cpu_s"]
    P = min(64, T)
    _reset_peak()
    try:
        runs = []
        for _ in range(max(1, repeats)):
            _, wall = _timed(lambda: logit_lens(s, positions=list(range(T - P, T)), k=5))
            runs.append((wall, CPU["last"]))
        rows["lens_s"], cpu["lens_s"] = min(w for w, _ in runs), min(c for _, c in runs)
    except Exception as e:  # the other rows still stand; the table says the lens failed
        rows["lens_s"] = cpu["lens_s"] = float("nan")
        out["lens_error"] = f"{type(e).__name__}: {e}"
        log(f"heads: logit lens failed: {out['lens_error']}")
    peaks["lens"] = _peak_rss()
    out["lens_positions"] = P
    out["lens_layers"] = info.n_layers
    floor = [_unembedding_matmul(s, info.n_layers * P) for _ in range(max(1, repeats))]
    rows["lens_matmul_s"], cpu["lens_matmul_s"] = min(w for w, _ in floor), min(c for _, c in floor)
    log(
        f"heads: logit lens, {P} positions x {info.n_layers} layers {rows['lens_s']:.3f} s "
        f"(the unembedding matmul alone {rows['lens_matmul_s']:.3f} s)"
    )


def run_lens_bench(
    model: str | None = None,
    seq_len: int = 2048,
    repeats: int = 2,
    log: Callable[[str], None] = lambda _m: None,
) -> dict:
    """The ``prefill`` and ``lens`` rows alone (``attnscope bench --heads --lens-only``): the lens's
    seconds and its floor, and its peak memory over the prefill's; returns them JSON-ready, with the
    two targets that concern the lens."""
    import torch
    from attnscope.core.bench.views import long_text
    from attnscope.core.session import Session

    s = Session.load(model)
    text = long_text(s, seq_len)
    times, cpus = [], []
    for _ in range(max(1, repeats)):
        _reset_peak()
        _, t = _timed(lambda: s.prefill(text, chat_template=False))
        times.append(t)
        cpus.append(CPU["last"])
    peaks = {"prefill": _peak_rss()}
    out: dict = {
        "model": s.info.name,
        "seq_len": s.seq_len,
        "torch_threads": torch.get_num_threads(),
        "rows": {"prefill_s": min(times)},
        "cpu_s": {"prefill_s": min(cpus)},
    }
    log(f"heads: prefill of {s.seq_len} tokens {min(times):.2f} s")
    _lens_rows(s, out, peaks, repeats, log)
    out["peak_rss_bytes"] = peaks
    ratios = {
        "lens_s": out["rows"]["lens_s"],
        "peak_over_prefill_peak": peaks["lens"] / peaks["prefill"],
    }
    out["ratios"] = ratios
    out["ratios_cpu"] = {
        "lens_s": out["cpu_s"]["lens_s"],
        "peak_over_prefill_peak": ratios["peak_over_prefill_peak"],
    }
    out["targets"] = {
        k: {"limit": TARGETS[k][0], "kind": "max", "met": ratios[k] <= TARGETS[k][0]} for k in ratios
    }
    return out


def format_lens_table(result: dict) -> str:
    """:func:`run_lens_bench`'s result as text."""
    rows, cpu = result["rows"], result["cpu_s"]
    peaks = result["peak_rss_bytes"]
    lines = [
        f"Logit lens: {result['model']}, T = {result['seq_len']}, {result['torch_threads']} threads",
        f"  prefill                              {rows['prefill_s']:9.3f} s",
        _lens_line(result),
        f"  peak RSS, GiB: prefill {peaks['prefill'] / 2**30:.3f}, lens {peaks['lens'] / 2**30:.3f}",
        "",
    ]
    for k in ("lens_s", "peak_over_prefill_peak"):
        tgt = result["targets"][k]
        lines.append(
            f"  {LABELS[k] if k == 'lens_s' else 'peak memory of the lens / of the prefill (RSS)':58s} "
            f"{result['ratios'][k]:8.2f} (CPU {result['ratios_cpu'][k]:.2f})   target <= {tgt['limit']:g}  "
            f"{'met' if tgt['met'] else 'MISSED'}"
        )
    lines.append(f"  (lens CPU {cpu['lens_s']:.3f} s, matmul CPU {cpu['lens_matmul_s']:.3f} s)")
    return "\n".join(lines)


def _lens_line(result: dict) -> str:
    rows, cpu = result["rows"], result["cpu_s"]
    return (
        f"  logit lens, {result['lens_positions']} positions x {result.get('lens_layers', '?')} layers "
        f"{rows['lens_s']:9.3f} s = {rows['lens_s'] / TARGETS['lens_s'][0]:.1f} x the "
        f"{TARGETS['lens_s'][0]:g} s target (the unembedding matmul alone, its floor: "
        f"{rows['lens_matmul_s']:.3f} s; lens / matmul {rows['lens_s'] / rows['lens_matmul_s']:.2f}, "
        f"CPU {cpu['lens_s'] / cpu['lens_matmul_s']:.2f})"
    )


def _unembedding_matmul(s, rows: int) -> tuple[float, float]:
    """Wall and CPU seconds of the logit lens's floor: ``rows`` float32 residuals through the unembedding,
    in the lens's vocabulary blocks (:data:`attnscope.core.analysis.logit_lens.VOCAB_BLOCK`), nothing else."""
    import torch
    from attnscope.core.analysis.head_effects import _parts
    from attnscope.core.analysis.logit_lens import VOCAB_BLOCK

    w = _parts(s).lm_head.weight  # the unembedding the lens projects through
    x = torch.randn(rows, w.shape[1], device=w.device)

    def run():
        with torch.inference_mode():
            for a in range(0, w.shape[0], VOCAB_BLOCK):
                _ = x @ w[a : a + VOCAB_BLOCK].float().T

    _, wall = _timed(run)
    return wall, CPU["last"]


def _reset_peak() -> bool:
    """Reset the process's peak resident set (Linux: ``5`` into ``/proc/self/clear_refs``); False where
    it cannot be (then :func:`_peak_rss` is the peak since the start)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    """The process's peak resident set since the last :func:`_reset_peak`, bytes (``VmHWM``); where
    there is no ``/proc``, the peak so far (``getrusage``; Linux counts KiB, macOS bytes)."""
    import resource

    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _ratios(rows: dict) -> dict:
    return {
        "readout_over_prefill": rows["readout_s"] / rows["prefill_s"],
        "loop_over_readout": rows["loop_s"] / rows["readout_s"],
        "everywhere_over_loop": rows["everywhere_s"] / rows["everywhere_loop_s"],
        "attribution_over_prefill": rows["attribution_one_s"] / rows["prefill_s"],
        "attribution_both_over_prefill": rows["attribution_both_s"] / rows["prefill_s"],
    }


def format_heads_table(result: dict) -> str:
    rows, ratios, rc = result["rows"], result["ratios"], result["ratios_cpu"]
    lines = [
        f"Which heads matter: {result['model']}, T = {result['seq_len']}, {result['units']} units "
        f"(query heads, GQA groups, K/V sides), {result['torch_threads']} threads",
        f"  prefill                              {rows['prefill_s']:9.3f} s",
        f"  read-out sweep, every unit           {rows['readout_s']:9.3f} s",
        f"  per-head loop (plain transformers)   {rows['loop_per_head_s']:9.3f} s a head, "
        f"{rows['loop_s']:9.1f} s for all (check {result['loop_check_error']:.1e})",
        f"  everywhere, {result['everywhere_units']} units of layers {result['everywhere_layers']}: "
        f"{rows['everywhere_s']:.3f} s (loop: {rows['everywhere_loop_s']:.1f} s)",
        f"  attribution patching                 {rows['attribution_one_s']:9.3f} s "
        f"(both directions {rows['attribution_both_s']:.3f} s)",
        _lens_line(result),
        "  peak RSS, GiB: prefill {:.3f}, read-out {:.3f}, everywhere {:.3f}, attribution {:.3f}, lens {:.3f}".format(
            *(
                result["peak_rss_bytes"][k] / 2**30
                for k in ("prefill", "readout", "everywhere", "attribution", "lens")
            )
        ),
        "",
    ]
    for k, label in LABELS.items():
        tgt = result["targets"][k]
        sign = "<=" if tgt["kind"] == "max" else ">="
        lines.append(
            f"  {label:58s} {ratios[k]:8.2f} (CPU {rc[k]:.2f})   target {sign} {tgt['limit']:g}  "
            f"{'met' if tgt['met'] else 'MISSED'}"
        )
    lines.append(
        f"  {'attribution patching, both directions / prefill':58s} {ratios['attribution_both_over_prefill']:8.2f}"
        f" (CPU {rc['attribution_both_over_prefill']:.2f})"
    )
    lines.append(
        "  peak memory / the prefill's, per sweep: "
        + ", ".join(
            f"{k} {ratios[f'peak_{k}_over_prefill_peak']:.2f}"
            for k in ("readout", "everywhere", "attribution", "lens")
        )
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:  # python -m attnscope.core.bench.heads [T]
    T = int((argv if argv is not None else sys.argv[1:] or ["2048"])[0])
    res = run_heads_bench(seq_len=T, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(format_heads_table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
