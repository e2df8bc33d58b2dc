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
* ``patch``: exact activation patching of every query head and GQA group at the read-out position, both
  directions (:func:`attnscope.core.analysis.head_effects.patch_heads`, ``scope="readout"``), against a
  corrupted prompt with one token changed: the corrupted prompt runs once, as one walk up the layers with
  every denoising unit's row beside it (no KV cache of it), and the clean run one batched step per layer;
* ``attribution``: attribution patching (one forward with gradients and one backward per direction,
  :func:`attnscope.core.analysis.head_effects.attribution_patching`), denoising alone and both directions,
  beside its floor measured in the same run: one plain forward and backward of the corrupted prompt with
  every activation kept (autograd, frozen weights, the gradient into the embeddings' output, no hooks, no
  checkpoints), its time over the prefill's and its peak memory over the prefill's;
* ``lens``: the logit lens of the last 64 positions at every layer
  (:func:`attnscope.core.analysis.logit_lens.logit_lens`), in seconds, the fastest of ``repeats``, beside
  its floor measured in the same run: the unembedding matmul alone (``(n_layers·64 × d_model) @ (d_model ×
  vocab)`` in float32, in the lens's vocabulary blocks); ``--heads-rows lens`` runs this row and the prefill alone;
* ``peak``: the process's peak resident memory during each sweep above over its peak during the prefill
  the sweeps run on (both include the weights; the loop's plain model is loaded after these are read).
  Linux resets the peak before each (``/proc/self/clear_refs``, read back as ``VmHWM``), so each sweep
  has its own figure; elsewhere the process's peak so far (``getrusage``) after each.

``only`` (``attnscope bench --heads --heads-rows readout,everywhere``) runs only some of them (the prefill
always; ``loop`` is what ``readout`` and ``everywhere`` are compared with); ratios and targets whose rows
did not run are left out.

Targets (the ratios' floors): read-out sweep ≤ 5 × prefill and ≥ 30 × faster than the loop; everywhere ≤
0.6 × the loop; attribution (one direction) ≤ 3 × prefill; logit lens ≤ 0.5 s; peak ≤ 1.1 × the
prefill's.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence

#: the rows ``run_heads_bench(only=...)`` can pick (the prefill always runs)
ROWS = ("readout", "everywhere", "patch", "attribution", "lens", "loop")

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


def check_rows(rows: Sequence[str] | None) -> tuple[str, ...]:
    """The rows to run (:data:`ROWS`; None: all). Raises ValueError (one line) on an unknown row."""
    if rows is None:
        return ROWS
    bad = [r for r in rows if r not in ROWS]
    if bad or not rows:
        raise ValueError(f"heads bench rows are {', '.join(ROWS)}, got {', '.join(rows) or 'none'}")
    return tuple(r for r in ROWS if r in rows)


def run_heads_bench(
    model: str | None = None,
    seq_len: int = 2048,
    repeats: int = 2,
    loop_heads: int = 5,
    everywhere_layers: int = 5,
    log: Callable[[str], None] = lambda _m: None,
    only: Sequence[str] | None = None,
) -> dict:
    """Run the rows in ``only`` (default every one, :data:`ROWS`; see the module docstring) on ``model``
    (default: the embedded SmolLM2-135M) at a prompt of ``seq_len`` tokens; returns raw seconds, the
    ratios and the targets of the rows that ran (JSON-ready).

    Raises:
        ValueError: an unknown row.
    """
    import torch
    from attnscope.core.analysis.head_effects import (
        _hookable,
        _parts,
        head_effects,
        make_target,
        patch_heads,
    )
    from attnscope.core.bench.views import long_text
    from attnscope.core.session import Session

    wanted = check_rows(only)
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
        "bench_rows": list(wanted),
    }
    rows, cpu = out["rows"], out["cpu_s"]
    log(f"heads: prefill of {T} tokens {rows['prefill_s']:.2f} s")
    t = make_target(s, "logprob")
    layers = list(info.arch.attention_layers)
    # every unit of the read-out sweep: query heads, GQA groups and (with k/v projections) K/V sides
    side = _hookable(_parts(s), "kv", layers)
    units = len(layers) * (info.n_heads + info.n_kv_heads * (2 if side else 1))
    out["units"] = units
    eff = None
    if "readout" in wanted:
        _reset_peak()
        eff, rows["readout_s"] = _timed(lambda: head_effects(s, t, "zero", "readout"))
        peaks["readout"] = _peak_rss()
        cpu["readout_s"] = CPU["last"]
        out["reused"] = eff.reused
        log(f"heads: read-out sweep of {units} units {rows['readout_s']:.2f} s")

    sample = [layers[i] for i in sample_layers(len(layers), everywhere_layers)]
    out["everywhere_layers"] = sample
    out["everywhere_units"] = ev_units = len(sample) * (info.n_heads + info.n_kv_heads)
    if "everywhere" in wanted:
        _reset_peak()
        ev, rows["everywhere_s"] = _timed(
            lambda: head_effects(s, t, "zero", "everywhere", layers=sample, kv_side=False)
        )
        peaks["everywhere"] = _peak_rss()
        cpu["everywhere_s"] = CPU["last"]
        out["everywhere_reused"] = ev.reused
        log(f"heads: everywhere, {ev_units} units in layers {sample}: {rows['everywhere_s']:.2f} s")

    # one token changed, at position 1 (same length): the two prompts share no prefix but the first
    # token, the worst case for the sweeps that start where the prompts first differ (a word swapped
    # throughout a prompt, as the tab's Swap does, changes it near the start)
    bad = list(ids)
    bad[1] = ids[2] if ids[2] != ids[1] else ids[3]
    out["patch_units"] = 2 * len(layers) * (info.n_heads + info.n_kv_heads)  # both directions
    if "patch" in wanted:
        _reset_peak()
        _, rows["patch_readout_s"] = _timed(lambda: patch_heads(s, bad, t, "readout"))
        peaks["patch"] = _peak_rss()
        cpu["patch_readout_s"] = CPU["last"]
        log(
            f"heads: read-out patching, {out['patch_units']} units (both directions) "
            f"{rows['patch_readout_s']:.2f} s"
        )
    if "lens" in wanted:
        _lens_rows(s, out, peaks, repeats, log)
    # attribution last: it leaves about 70 MB resident that a trim cannot hand back (allocator pages of its
    # backward; a second run adds nothing), which the rows after it would count as their own peak
    if "attribution" in wanted:
        _attribution_rows(s, bad, t, out, peaks, log)
    # the process's resident peak (the weights included) during each sweep, before the plain model the
    # loop needs is loaded: how far each sweep raised it above the prefill's own
    swept = [k for k in ("readout", "everywhere", "patch", "attribution", "lens") if k in peaks]
    if swept:
        peaks["sweeps"] = max(peaks[k] for k in swept)
    out["peak_rss_bytes"] = peaks

    if "loop" in wanted:
        _loop_rows(s, model, ids, t, eff, layers, units, ev_units, loop_heads, out, log)
    out["ratios"] = _ratios(rows)
    out["ratios_cpu"] = _ratios(cpu)  # the same from the process's CPU seconds (a busy machine)
    ratios = out["ratios"]
    if "lens_s" in rows:
        ratios["lens_s"] = rows["lens_s"]
        out["ratios_cpu"]["lens_s"] = cpu["lens_s"]
    if "sweeps" in peaks:
        ratios["peak_over_prefill_peak"] = peaks["sweeps"] / peaks["prefill"]
        out["ratios_cpu"]["peak_over_prefill_peak"] = ratios["peak_over_prefill_peak"]
    for k in swept:  # each sweep's own
        ratios[f"peak_{k}_over_prefill_peak"] = peaks[k] / peaks["prefill"]
    for name in ("attribution_one", "attribution_floor"):  # one direction alone, and its floor (no sweep)
        if name in peaks:
            ratios[f"peak_{name}_over_prefill_peak"] = peaks[name] / peaks["prefill"]
    out["targets"] = {
        k: {"limit": lim, "kind": kind, "met": ratios[k] <= lim if kind == "max" else ratios[k] >= lim}
        for k, (lim, kind) in TARGETS.items()
        if k in ratios
    }
    return out


def _attribution_rows(s, bad: list[int], t, out: dict, peaks: dict, log: Callable[[str], None]) -> None:
    """The ``attribution`` rows: attribution patching, one direction (its own peak) and both, and their
    floor (:func:`_grad_floor`, its own peak)."""
    from attnscope.core.analysis.head_effects import _release_memory, attribution_patching

    rows, cpu = out["rows"], out["cpu_s"]
    _reset_peak()
    _, rows["attribution_one_s"] = _timed(
        lambda: attribution_patching(s, bad, t, "everywhere", directions=("denoise",))
    )
    cpu["attribution_one_s"] = CPU["last"]
    peaks["attribution_one"] = _peak_rss()
    _reset_peak()
    _, rows["attribution_both_s"] = _timed(lambda: attribution_patching(s, bad, t, "everywhere"))
    peaks["attribution"] = max(_peak_rss(), peaks["attribution_one"])
    cpu["attribution_both_s"] = CPU["last"]
    _reset_peak()
    _, rows["attribution_floor_s"] = _timed(lambda: _grad_floor(s, bad, t))
    cpu["attribution_floor_s"] = CPU["last"]
    peaks["attribution_floor"] = _peak_rss()
    _release_memory()  # its activations' freed heap, before the rows after it reset their peak
    log(
        f"heads: attribution patching {rows['attribution_one_s']:.2f} s (both directions "
        f"{rows['attribution_both_s']:.2f} s; a plain forward and backward {rows['attribution_floor_s']:.2f} s)"
    )


def _grad_floor(s, ids: list[int], t) -> float:
    """Attribution patching's floor: one plain forward and backward of ``ids`` (the corrupted prompt)
    with every activation kept (autograd, the weights frozen, the gradient into the embeddings' output;
    no hooks, no checkpoints), the attention PyTorch's fused kernel as in attribution patching. Returns
    the target's value."""
    import torch
    from attnscope.core.analysis.head_effects import (
        _attending,
        _GradAttend,
        _metric,
        _prefix_call,
        _rope_at,
        _scratch,
    )

    start: dict = {}

    def needs_grad(_m, _args, x):
        x.requires_grad_(True)  # the weights are frozen: the graph starts at the embeddings' output
        start["x"] = x
        return x

    with (
        _scratch(s) as be,
        torch.inference_mode(False),
        torch.enable_grad(),
        _attending(be, _GradAttend()),
        _rope_at(be, len(ids)),
    ):
        handle = be.model.get_input_embeddings().register_forward_hook(needs_grad)
        try:
            res = be.model(**_prefix_call(be, None, ids, 0))
        finally:
            handle.remove()
        m = _metric(t, res.logits[0, -1].float())
        del res
        torch.autograd.grad(m, [start["x"]])
        return float(m.detach())


def _loop_rows(
    s, model, ids, t, eff, layers, units: int, ev_units: int, loop_heads: int, out: dict, log
) -> None:
    """The ``loop`` rows: the per-head loop of full forwards in plain transformers, a head's median
    time × the units of the read-out and everywhere sweeps; with ``eff`` (the read-out sweep's
    effects), one sampled head's effect checked against it."""
    import torch
    from attnscope.core.bench.overhead import HFRunner
    from attnscope.core.loading.resolve import resolve

    rows, cpu = out["rows"], out["cpu_s"]
    info = s.info
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
        if check is None and eff is not None:
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
    """Reset the process's peak resident set (Linux: ``5`` into ``/proc/self/clear_refs``), the heap the
    row before freed handed back first (``malloc_trim``), so that each row's peak is its own and not the
    freed-but-kept heap of the one before; False where it cannot be (then :func:`_peak_rss` is the peak
    since the start)."""
    from attnscope.core.analysis.head_effects import _release_memory

    _release_memory()
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
    """Each ratio whose two figures were measured (a row left out leaves its ratios out)."""
    pairs = {
        "readout_over_prefill": ("readout_s", "prefill_s"),
        "loop_over_readout": ("loop_s", "readout_s"),
        "everywhere_over_loop": ("everywhere_s", "everywhere_loop_s"),
        "attribution_over_prefill": ("attribution_one_s", "prefill_s"),
        "attribution_both_over_prefill": ("attribution_both_s", "prefill_s"),
        "attribution_floor_over_prefill": ("attribution_floor_s", "prefill_s"),
        "patch_readout_over_prefill": ("patch_readout_s", "prefill_s"),
        "patch_readout_over_readout": ("patch_readout_s", "readout_s"),
    }
    return {k: rows[a] / rows[b] for k, (a, b) in pairs.items() if a in rows and b in rows}


def format_heads_table(result: dict) -> str:
    """The bench's table: each row that ran, its ratios against their targets, the peaks."""
    rows, ratios, rc = result["rows"], result["ratios"], result["ratios_cpu"]
    lines = [
        f"Which heads matter: {result['model']}, T = {result['seq_len']}, {result['units']} units "
        f"(query heads, GQA groups, K/V sides), {result['torch_threads']} threads",
        f"  prefill                              {rows['prefill_s']:9.3f} s",
    ]
    if "readout_s" in rows:
        lines.append(f"  read-out sweep, every unit           {rows['readout_s']:9.3f} s")
    if "loop_s" in rows:
        check = result.get("loop_check_error")
        lines.append(
            f"  per-head loop (plain transformers)   {rows['loop_per_head_s']:9.3f} s a head, "
            f"{rows['loop_s']:9.1f} s for all" + (f" (check {check:.1e})" if check is not None else "")
        )
    if "everywhere_s" in rows:
        loop = f" (loop: {rows['everywhere_loop_s']:.1f} s)" if "everywhere_loop_s" in rows else ""
        lines.append(
            f"  everywhere, {result['everywhere_units']} units of layers {result['everywhere_layers']}: "
            f"{rows['everywhere_s']:.3f} s{loop}"
        )
    if "patch_readout_s" in rows:
        lines.append(
            f"  read-out patching, {result['patch_units']} units (both directions) "
            f"{rows['patch_readout_s']:9.3f} s"
        )
    if "attribution_one_s" in rows:
        lines.append(
            f"  attribution patching                 {rows['attribution_one_s']:9.3f} s "
            f"(both directions {rows['attribution_both_s']:.3f} s)"
        )
        if "attribution_floor_s" in rows:
            lines.append(
                f"  its floor: plain forward + backward  {rows['attribution_floor_s']:9.3f} s "
                "(every activation kept, no checkpoint)"
            )
    if "lens_s" in rows:
        lines.append(_lens_line(result))
    peaks = result["peak_rss_bytes"]
    swept = [k for k in ("readout", "everywhere", "patch", "attribution", "lens") if k in peaks]
    lines.append("  peak RSS, GiB: " + ", ".join(f"{k} {peaks[k] / 2**30:.3f}" for k in ("prefill", *swept)))
    lines.append("")
    for k, label in LABELS.items():
        if k not in result["targets"]:
            continue
        tgt = result["targets"][k]
        sign = "<=" if tgt["kind"] == "max" else ">="
        lines.append(
            f"  {label:58s} {ratios[k]:8.2f} (CPU {rc[k]:.2f})   target {sign} {tgt['limit']:g}  "
            f"{'met' if tgt['met'] else 'MISSED'}"
        )
    for k, label in (
        ("attribution_both_over_prefill", "attribution patching, both directions / prefill"),
        ("attribution_floor_over_prefill", "its floor, plain forward + backward / prefill"),
        ("patch_readout_over_prefill", "read-out patching, both directions / prefill"),
        ("patch_readout_over_readout", "read-out patching / read-out ablation sweep"),
    ):
        if k in ratios:
            lines.append(f"  {label:58s} {ratios[k]:8.2f} (CPU {rc[k]:.2f})")
    if swept:
        lines.append(
            "  peak memory / the prefill's, per sweep: "
            + ", ".join(f"{k} {ratios[f'peak_{k}_over_prefill_peak']:.2f}" for k in swept)
        )
    if "peak_attribution_floor_over_prefill_peak" in ratios:
        lines.append(
            "  peak memory / the prefill's: attribution patching, one direction "
            f"{ratios['peak_attribution_one_over_prefill_peak']:.2f}; its floor (every activation kept) "
            f"{ratios['peak_attribution_floor_over_prefill_peak']:.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:  # python -m attnscope.core.bench.heads [T]
    T = int((argv if argv is not None else sys.argv[1:] or ["2048"])[0])
    res = run_heads_bench(seq_len=T, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(format_heads_table(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
