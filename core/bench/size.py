"""Real-size bench: ``attnscope bench --model PATH --dtype D [--quantize Q]``.

What a user with a 1–8B checkpoint waits for and how much memory it takes, each phase in a fresh
Python process so that its peak RSS (``ru_maxrss``: resident pages, file-backed ones of memory-mapped
safetensors included) is its own:

1. ``convert``: resolve the model at the load dtype: the first GGUF conversion (time and peak
   RSS; "cached" when the conversion cache had it already), nothing for a folder.
2. ``scope``: AttnScope's torch backend with full capture: load (cold: first load in a fresh
   process; warm: a second load in that process, files in the page cache), prefill of each size
   (capture on), greedy decode ms/step after the first size, one head's full map at the largest
   size, peak RSS.
3. ``sdpa``: transformers' SDPA (no capture) at the same dtype (and the same ``--quantize``):
   load, the same prefills and decode, peak RSS.
4. ``exactness``: the per-dtype rule of docs/exactness.md on a short prompt (:mod:`attnscope.core.bench.exactness`):
   every head's max abs weight error of AttnScope and of transformers eager at the same precision
   against a float32 eager run of the same rounded weights; the models loaded one after another.

Token ids are seeded random ids below the tokenizer's size (the same in both runs). Prefill at
T runs in AttnScope's 512-token chunks in (2) and in one call in (3), as each is used.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

RESULT_MARK = "ATTNSCOPE_SIZE_RESULT "
SCHEMA = "attnscope-bench-size/1"


@dataclass(frozen=True)
class SizeOptions:
    model: str | None
    dtype: str = "auto"
    quantize: str = "none"
    device: str | None = None
    sizes: tuple[int, ...] = (512, 2048)
    decode_steps: int = 16
    seed: int = 0
    timeout_s: float = 3600.0
    exactness_tokens: int = 128
    phases: tuple[str, ...] = ("scope", "sdpa", "exactness")  # after "convert", which always runs


def _maxrss_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) * (1 if sys.platform == "darwin" else 1024)


def _ids(n_tokens: int, T: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, n_tokens, size=T).tolist()


def _vocab_for_ids(tok, config_vocab: int) -> int:
    try:
        return max(2, min(int(config_vocab), len(tok)))
    except TypeError:
        return int(config_vocab)


# -- phases (run in a fresh process each) ------------------------------------------------------------
def phase_convert(spec: dict) -> dict:
    from attnscope.core.loading.conversion_cache import _is_converted, converted_dir
    from attnscope.core.loading.quiet import quiet_transformers
    from attnscope.core.loading.resolve import resolve

    quiet_transformers()
    model, dtype = spec["model"], spec["dtype"]
    path = None if model in (None, "", "default") else os.path.expanduser(model)
    is_gguf = path is not None and os.path.isfile(path)
    cached = bool(path is not None and is_gguf and _is_converted(converted_dir(Path(path), dtype)))
    t0 = time.perf_counter()
    folder, _name = resolve(model, dtype=dtype)
    secs = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    return {
        "phase": "convert",
        "gguf": is_gguf,
        "cached": cached,
        "seconds": secs,
        "peak_rss_bytes": _maxrss_bytes(),
        "folder": str(folder),
        "weights_bytes": size,
    }


def _time(fn, device: str):
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def _quant_entries() -> set[str]:
    """Complete entries of the quantised-weights cache (:func:`attnscope.core.loading.quant_cache.list_entries`)."""
    from attnscope.core.loading.quant_cache import list_entries

    return {c.name for c in list_entries() if c.complete}


def phase_scope(spec: dict) -> dict:
    import torch  # noqa: F401 - imported before the clock starts
    from attnscope.core.backends.torch_backend import TorchBackend
    from attnscope.core.loading.stream_load import release_freed

    device = spec["device"]
    out: dict[str, Any] = {"phase": "scope"}
    quantised = spec["quantize"] not in (None, "", "none")
    before = _quant_entries() if quantised else set()
    b, out["cold_load_s"] = _time(
        lambda: TorchBackend.load(
            spec["model"], device=device, dtype=spec["dtype"], quantize=spec["quantize"]
        ),
        device,
    )
    if quantised:  # which cold load this was: the quantised-weights cache read, or written
        note = getattr(b.info, "load_note", "")
        out["quant_cache"] = (
            "written" if _quant_entries() - before else (f"not written: {note}" if note else "read")
        )
    del b
    gc.collect()
    release_freed()  # the C heap's freed pages back to the OS before the second load
    b, out["warm_load_s"] = _time(
        lambda: TorchBackend.load(
            spec["model"], device=device, dtype=spec["dtype"], quantize=spec["quantize"]
        ),
        device,
    )
    info = b.info
    out.update(
        dtype=info.dtype,
        dtype_reason=spec.get("dtype_reason") or info.dtype_reason,
        n_params=info.n_params,
        quantization=getattr(info, "quantization_runtime", ""),
    )
    n_tok = _vocab_for_ids(b.tokenizer, info.vocab_size)
    b.forward(_ids(n_tok, 8, 1))  # warm-up: first-call allocations and kernel selection are not timed
    b.forward([1])
    out["prefill_s"], out["decode_step_s"] = {}, None
    for i, T in enumerate(spec["sizes"]):
        b.reset()
        ids = _ids(n_tok, T, spec["seed"])
        logits, out["prefill_s"][str(T)] = _time(lambda ids=ids: b.forward(ids), device)
        if i == 0:
            steps = []
            tid = int(np.argmax(logits))
            for _ in range(spec["decode_steps"]):
                logits, s = _time(lambda t=tid: b.forward([t]), device)
                tid = int(np.argmax(logits))
                steps.append(s)
            out["decode_step_s"] = float(np.median(steps))
    layer, head = info.n_layers // 2, 0
    _, out["head_map_s"] = _time(lambda: b.trace.weights(layer, head), device)
    out["head_map_T"] = spec["sizes"][-1]
    out["peak_rss_bytes"] = _maxrss_bytes()
    if device.startswith("cuda"):
        out["cuda_peak_bytes"] = int(torch.cuda.max_memory_allocated())
    return out


def phase_sdpa(spec: dict) -> dict:
    import torch
    from attnscope.core.loading.quiet import quiet_transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    quiet_transformers()
    device = spec["device"]
    out: dict[str, Any] = {"phase": "sdpa"}
    folder, dtype = spec["folder"], spec["dtype"]

    def load():
        if spec["quantize"] != "none":  # the same tensor-by-tensor quantised load as AttnScope's
            from attnscope.core.loading.stream_load import load_quantised

            got = load_quantised(folder, spec["quantize"], dtype, device, "sdpa")
            if got is not None:
                return got[0]
        m = AutoModelForCausalLM.from_pretrained(
            folder, dtype=getattr(torch, dtype), attn_implementation="sdpa"
        )
        m.to(device).eval()
        if spec["quantize"] != "none":
            from attnscope.core.loading.quantize import quantize_model

            quantize_model(m, spec["quantize"])
        return m

    m, out["cold_load_s"] = _time(load, device)
    tok = AutoTokenizer.from_pretrained(folder)
    n_tok = _vocab_for_ids(tok, m.config.vocab_size)
    from attnscope.core.bench.overhead import _cache_kw

    kw = _cache_kw(m)
    out["prefill_s"] = {}
    with torch.inference_mode():  # warm-up, as in phase_scope
        c0 = DynamicCache()
        m(
            input_ids=torch.tensor([_ids(n_tok, 8, 1)], device=device),
            **{kw: c0},
            use_cache=True,
            logits_to_keep=1,
        )
        m(input_ids=torch.tensor([[1]], device=device), **{kw: c0}, use_cache=True, logits_to_keep=1)
        del c0
    for i, T in enumerate(spec["sizes"]):
        cache = DynamicCache()
        ids = torch.tensor([_ids(n_tok, T, spec["seed"])], device=device)
        with torch.inference_mode():
            res, out["prefill_s"][str(T)] = _time(
                lambda ids=ids, c=cache: m(input_ids=ids, **{kw: c}, use_cache=True, logits_to_keep=1), device
            )
            if i == 0:
                steps = []
                tid = int(res.logits[0, -1].argmax())
                for _ in range(spec["decode_steps"]):
                    res, s = _time(
                        lambda t=tid, c=cache: m(
                            input_ids=torch.tensor([[t]], device=device),
                            **{kw: c},
                            use_cache=True,
                            logits_to_keep=1,
                        ),
                        device,
                    )
                    tid = int(res.logits[0, -1].argmax())
                    steps.append(s)
                out["decode_step_s"] = float(np.median(steps))
        del cache, res
        gc.collect()
    out["peak_rss_bytes"] = _maxrss_bytes()
    if device.startswith("cuda"):
        out["cuda_peak_bytes"] = int(torch.cuda.max_memory_allocated())
    return out


def phase_exactness(spec: dict) -> dict:
    from attnscope.core.bench.exactness import measure_exactness
    from transformers import AutoConfig, AutoTokenizer

    folder = spec["folder"]
    n_tok = _vocab_for_ids(
        AutoTokenizer.from_pretrained(folder), AutoConfig.from_pretrained(folder).vocab_size
    )
    ids = _ids(n_tok, spec["exactness_tokens"], spec["seed"])
    t0 = time.perf_counter()
    r = measure_exactness(folder, spec["dtype"], spec["quantize"], ids, spec["device"])
    return dict(
        r.summary(), phase="exactness", seconds=time.perf_counter() - t0, peak_rss_bytes=_maxrss_bytes()
    )


PHASES = {"convert": phase_convert, "scope": phase_scope, "sdpa": phase_sdpa, "exactness": phase_exactness}


def _in_subprocess(phase: str, spec: dict, timeout: float) -> dict:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    try:
        r = subprocess.run(
            [sys.executable, "-m", "attnscope.core.bench.size", phase, json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"phase": phase, "error": f"timed out after {timeout:.0f} s"}
    for line in r.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
    return {"phase": phase, "error": f"exit {r.returncode}: {tail}"}


def run_size_bench(opts: SizeOptions, log=lambda _m: None) -> dict:
    """Run the three phases (each in a fresh process); return the JSON-ready result.

    Raises:
        ModelLoadError: unknown dtype or quantisation, or the model cannot be resolved.
    """
    from attnscope.core.backends.torch_backend import pick_device
    from attnscope.core.loading.precision import decide

    device = pick_device(opts.device)
    dtype, reason = decide(opts.model, opts.dtype, device)
    if (
        opts.quantize == "int4" and dtype != "bfloat16"
    ):  # attnscope.core.loading.quantize.load_dtype: int4 kernels take bfloat16 activations
        dtype, reason = "bfloat16", "bfloat16: int4 runs with bfloat16 activations"
    spec = {
        "model": opts.model,
        "dtype": dtype,
        # the phases load at the dtype settled here, which their loader would call "asked for
        # (--dtype …)": the reason they report is this one, unless the user did ask for it
        "dtype_reason": reason,
        "quantize": opts.quantize,
        "device": device,
        "sizes": sorted(int(t) for t in opts.sizes),
        "decode_steps": opts.decode_steps,
        "seed": opts.seed,
        "exactness_tokens": opts.exactness_tokens,
    }
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "options": asdict(opts),
        "device": device,
        "dtype": dtype,
        "dtype_reason": reason,
        "machine": {
            "cpu_count": os.cpu_count(),
            "mem_available_bytes": _mem_available(),
            "loadavg_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        },
    }
    log(f"converting / resolving at {dtype} ({reason})")
    conv = _in_subprocess("convert", spec, opts.timeout_s)
    result["convert"] = conv
    if "error" in conv:
        log(f"convert: {conv['error']}")
        return result
    for phase in [p for p in ("scope", "sdpa", "exactness") if p in opts.phases]:
        if phase == "exactness":
            skip = _exactness_room(conv, dtype)
            if skip:
                result[phase] = {"skipped": skip}
                log(f"exactness: skipped: {skip}")
                continue
            log(f"exactness: capture, eager, float32 eager; {opts.exactness_tokens} tokens (fresh process)")
        else:
            log(f"{phase}: load, prefill {spec['sizes']}, {opts.decode_steps} decode steps (fresh process)")
        result[phase] = _in_subprocess(phase, dict(spec, folder=conv["folder"]), opts.timeout_s)
        if "error" in result[phase]:
            log(f"{phase}: {result[phase]['error']}")
    result["machine"]["loadavg_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return result


def _exactness_room(conv: dict, dtype: str) -> str:
    """Why the exactness phase cannot run here ("" when it can): its float32 reference model holds
    the weights at 4 bytes each (8B: 32 GB), plus 1 GB of room, in the memory available now."""
    from attnscope.core.kv_formula import dtype_bytes

    weights, free = conv.get("weights_bytes"), _mem_available()
    if not weights or free is None:
        return ""
    need = int(weights * 4 / dtype_bytes(dtype)) + (1 << 30)
    if need <= free:
        return ""
    return f"its float32 reference needs {need / 1e9:.1f} GB, {free / 1e9:.1f} GB available"


def _mem_available() -> int | None:
    from attnscope.core.loading.free_memory import _meminfo_available

    return _meminfo_available()


def _gb(n) -> str:
    return "—" if n is None else f"{n / 1e9:.2f} GB"


def _s(x) -> str:
    return "—" if x is None else (f"{x:.2f} s" if x >= 1 else f"{x * 1e3:.0f} ms")


def format_size_table(r: dict) -> str:
    """Markdown table of :func:`run_size_bench`'s result (one row per measurement)."""
    conv, sc, sd = r.get("convert", {}), r.get("scope", {}), r.get("sdpa", {})
    m = r.get("machine", {})
    rows = [
        ("precision", f"{r['dtype']} ({r['dtype_reason']})", ""),
        (
            "machine",
            f"{m.get('cpu_count')} CPUs, load average {m.get('loadavg_start')} → {m.get('loadavg_end')}",
            "ratios from a busy machine are not comparable",
        ),
    ]
    if conv.get("gguf"):
        rows.append(
            (
                "GGUF conversion",
                "cached (not measured)" if conv.get("cached") else _s(conv.get("seconds")),
                "" if conv.get("cached") else f"peak RSS {_gb(conv.get('peak_rss_bytes'))}",
            )
        )
    rows.append(("weights on disk (load dtype)", _gb(conv.get("weights_bytes")), ""))
    timed = len(rows)  # the rows of the scope and sdpa phases start here
    rows.append(
        (
            "load cold / warm",
            f"{_s(sc.get('cold_load_s'))} / {_s(sc.get('warm_load_s'))}",
            f"SDPA cold {_s(sd.get('cold_load_s'))}"
            + (
                f"; quantised-weights cache {sc['quant_cache']} at the cold load"
                if sc.get("quant_cache")
                else ""
            ),
        )
    )
    for T in r["options"]["sizes"]:
        a, b = (sc.get("prefill_s") or {}).get(str(T)), (sd.get("prefill_s") or {}).get(str(T))
        ratio = f"{a / b:.2f}×" if a and b else "—"
        rows.append((f"prefill {T} (capture / SDPA)", f"{_s(a)} / {_s(b)}", ratio))
    a, b = sc.get("decode_step_s"), sd.get("decode_step_s")
    rows.append(("decode step (capture / SDPA)", f"{_s(a)} / {_s(b)}", f"{a / b:.2f}×" if a and b else "—"))
    rows.append((f"one head's map (T={sc.get('head_map_T', '?')})", _s(sc.get("head_map_s")), ""))
    rows.append(
        (
            "peak RSS (capture / SDPA)",
            f"{_gb(sc.get('peak_rss_bytes'))} / {_gb(sd.get('peak_rss_bytes'))}",
            "",
        )
    )
    if "scope" not in r and "sdpa" not in r:  # --phases exactness: no empty rows
        del rows[timed:]
    ex = r.get("exactness", {})
    if "ours_max_err" in ex:
        n, share = ex["n_heads_total"], ex["share_ours_le_eager"]
        if ex.get("median_ratio") is None:  # float32: eager is (or matches) the reference
            where = f"max over {n} heads"
        else:
            where = f"ours ≤ eager in {f'all {n}' if share == 1 else f'{share:.1%} of {n}'} heads, "
            where += f"median ratio {ex['median_ratio']:.2f}"
        rows.append(
            (
                f"exactness ({ex['n_tokens']} tokens): max weight error vs float32 eager (capture / eager)",
                f"{ex['ours_max_err']:.2e} / {ex['eager_max_err']:.2e}",
                f"{ex['rule']}: {'met' if ex['met'] else 'missed'} ({where})",
            )
        )
        if "ours_mean_abs_err" in ex:
            share = ex["share_mean_abs_ours_le_eager"]
            rows.append(
                (
                    "exactness: mean abs weight error per head, mean over heads (capture / eager)",
                    f"{ex['ours_mean_abs_err']:.2e} / {ex['eager_mean_abs_err']:.2e}",
                    f"ours ≤ eager in {share:.1%} of heads; by max error in {ex['layer0_share']:.1%} of "
                    "layer 0's (the one layer where both see the same q, k)",
                )
            )
        rows.append(
            (
                "exactness phase (capture, eager, float32 eager; one after another)",
                _s(ex.get("seconds")),
                f"peak RSS {_gb(ex.get('peak_rss_bytes'))}",
            )
        )
    if "skipped" in ex:
        rows.append(("exactness", "skipped", ex["skipped"]))
    for p in ("convert", "scope", "sdpa", "exactness"):
        if "error" in r.get(p, {}):
            rows.append((f"{p} failed", r[p]["error"], ""))
    lines = ["| measurement | value | note |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def _main(argv: list[str]) -> int:
    phase, spec = argv[0], json.loads(argv[1])
    out = PHASES[phase](spec)
    print(RESULT_MARK + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover - the phase subprocesses
    sys.exit(_main(sys.argv[1:]))
