"""``attnscope bench``: prefill, decode, memory and map timings of AttnScope against transformers.

Prints a table (stdout; progress on stderr) and, with ``--json FILE``, writes the raw figures,
the ratios, the targets of docs/benchmarks.md (met or not) and the machine's description. See
:mod:`attnscope.core.bench.overhead` for what is measured and how.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

NAME = "bench"
HELP = "benchmark capture against transformers SDPA and eager+output_attentions"


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--sizes takes comma-separated integers, got {text!r}") from None
    if not sizes:
        raise ValueError("--sizes is empty")
    return sizes


def add_arguments(p) -> None:
    p.add_argument(
        "--model", default=None, help="HF model folder or .gguf (default: embedded SmolLM2-135M-Instruct)"
    )
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument(
        "--json",
        metavar="FILE",
        default=None,
        help="write raw figures, ratios and targets as JSON ('-': standard output, the table on stderr)",
    )
    p.add_argument("--sizes", default=None, help="comma-separated prefill lengths (default 512,2048,8192)")
    p.add_argument("--repeats", type=int, default=None, help="prefill timings per configuration (default 3)")
    p.add_argument(
        "--decode-steps", type=int, default=None, help="decode steps after each prefill (default 64)"
    )
    p.add_argument(
        "--head-repeats", type=int, default=None, help="one-head map timings per repeat (default 3)"
    )
    p.add_argument(
        "--memory-limit-gb",
        type=float,
        default=24.0,
        help="memory budget in GB; eager+output_attentions is skipped where it would not fit (default 24)",
    )
    p.add_argument(
        "--no-memory",
        dest="memory",
        action="store_false",
        help="skip the peak-RSS runs (each configuration in a fresh process)",
    )
    p.add_argument("--no-eager", dest="eager", action="store_false", help="leave out eager+output_attentions")
    p.add_argument(
        "--dtype",
        default=None,
        choices=("auto", "float32", "bfloat16", "float16"),
        help="real-size bench at this precision (auto: the checkpoint's own): GGUF conversion, cold/warm "
        "load, prefill, decode, one head's map and peak RSS, capture vs SDPA, each in a fresh process",
    )
    p.add_argument(
        "--quantize",
        default=None,
        choices=("none", "int8", "int4"),
        help="real-size bench with weight-only quantised linear layers (implies --dtype auto)",
    )
    p.add_argument(
        "--phases",
        default=None,
        help="with --dtype/--quantize: comma-separated phases after the conversion, of scope, sdpa, "
        "exactness (default all; exactness: the per-dtype rule of docs/exactness.md, on 128 tokens)",
    )
    p.add_argument(
        "--views",
        action="store_true",
        help="long-prompt views instead: head grid at 2,000/8,000 tokens, mean of all layers "
        "and one head at 8,192; with --long-model a 32,000-token prefill and a streamed 16k PNG",
    )
    p.add_argument(
        "--long-model",
        default=None,
        metavar="GGUF",
        help="with --views: long-context model (Gemma 3 270M's GGUF) for the 32k rows",
    )
    p.add_argument(
        "--synthetic",
        type=int,
        default=None,
        metavar="T",
        help="with --views: time the SmolLM2 rows on a synthetic trace of its geometry at T tokens "
        "(random q/k, the same work as a real trace; no prefill)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="with --views: torch threads for every row (default: torch's own count)",
    )
    from attnscope.core.remote.cli_args import add_engine_arguments

    # --engine HOST:PORT: the map and sink table over the network (core/bench/remote.py)
    add_engine_arguments(p)
    p.add_argument(
        "--startup",
        action="store_true",
        help="time the window's start-up (drawn, ready to Run) against a bare 'import torch' "
        "(fresh processes; --repeats, default 3)",
    )
    p.add_argument(
        "--sources",
        type=int,
        default=None,
        metavar="T",
        help="time a score's split by source (attnscope explain --sources) against a prefill of its "
        "T-token prefix, side by side (target: at most 1.5x); --repeats, default 3",
    )
    p.add_argument(
        "--heads",
        action="store_true",
        help="'Which heads matter' instead: read-out sweep of every head against prefill and the per-head "
        "loop of full forwards, the everywhere sweep, attribution patching, as ratios (--sizes: T, default 2048)",
    )
    p.add_argument(
        "--loop-heads",
        type=int,
        default=None,
        metavar="N",
        help="with --heads: heads the per-head loop times (its total is their median x every unit; default 5)",
    )
    p.add_argument(
        "--everywhere-layers",
        type=int,
        default=None,
        metavar="N",
        help="with --heads: layers the everywhere sweep samples, spread evenly (default 5)",
    )
    p.add_argument(
        "--heads-rows",
        default=None,
        metavar="ROWS",
        help="with --heads: run only these rows, comma-separated, of readout, everywhere, patch, "
        "attribution, lens, loop (the prefill always runs; loop is what readout and everywhere are "
        "compared with; default all)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: T=64, 1 repeat, 4 decode steps, small matmul (for CI; figures meaningless)",
    )


def options_from_args(args):
    from attnscope.core.bench.overhead import QUICK, BenchOptions

    kw: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.sizes is not None:
        kw["sizes"] = _sizes(args.sizes)
    for name in ("repeats", "decode_steps", "head_repeats"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    if args.memory_limit_gb <= 0:
        raise ValueError(f"--memory-limit-gb must be positive, got {args.memory_limit_gb}")
    kw["memory_limit"] = int(args.memory_limit_gb * 1e9)
    kw["memory"] = args.memory
    kw["configs"] = ("sdpa", "scope", "eager") if args.eager else ("sdpa", "scope")
    opts = BenchOptions(model=args.model, device=args.device, **kw)
    opts.check()
    if (args.device or "").startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: this machine has no CUDA device torch can use")
    return opts


def run(args) -> int:
    from attnscope.core.bench.overhead import run_bench
    from attnscope.core.bench.overhead_report import format_table
    from attnscope.core.io.paths import check_output

    out = check_output(args.json, "--json", stdout=True) if args.json else None
    if getattr(args, "engine", None):
        return _run_remote(args, out)
    _check_views_options(args)
    if getattr(args, "heads_rows", None) is not None and not getattr(args, "heads", False):
        raise ValueError("--heads-rows only applies to 'attnscope bench --heads'")
    if getattr(args, "startup", False):
        from attnscope.core.bench.startup import format_startup_table, run_startup_bench

        result = run_startup_bench(
            model=args.model,
            repeats=args.repeats if args.repeats is not None else (1 if args.quick else 3),
            log=lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True),
        )
        _emit(format_startup_table(result), result, args.json, out)
        return 0
    if getattr(args, "sources", None) is not None:
        from attnscope.core.bench.sources import format_sources, sources_bench

        result = sources_bench(
            model=args.model,
            T=args.sources,
            repeats=args.repeats if args.repeats is not None else (1 if args.quick else 3),
            log=lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True),
        )
        _emit(format_sources(result), result, args.json, out)
        return 0
    if getattr(args, "heads", False):
        from attnscope.core.bench.heads import check_rows, format_heads_table, run_heads_bench

        heads_rows = None
        if args.heads_rows is not None:
            heads_rows = check_rows([r.strip() for r in args.heads_rows.split(",") if r.strip()])
        result = run_heads_bench(
            model=args.model,
            seq_len=64 if args.quick else (_sizes(args.sizes)[-1] if args.sizes else 2048),
            repeats=args.repeats if args.repeats is not None else (1 if args.quick else 2),
            loop_heads=args.loop_heads or (2 if args.quick else 5),
            everywhere_layers=args.everywhere_layers or (1 if args.quick else 5),
            log=lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True),
            only=heads_rows,
        )
        _emit(format_heads_table(result), result, args.json, out)
        return 0
    if getattr(args, "views", False):
        from attnscope.core.bench.views import main as views_main

        argv = ["--smol", str(_sizes(args.sizes)[-1] if args.sizes else 8192)]
        if args.long_model:
            argv += ["--long-model", args.long_model]
        if args.synthetic is not None:
            argv += ["--synthetic", str(args.synthetic)]
        if args.threads is not None:
            argv += ["--threads", str(args.threads)]
        return views_main(argv + (["--json", str(out) if out is not None else "-"] if args.json else []))
    if getattr(args, "dtype", None) is not None or getattr(args, "quantize", None) is not None:
        return _run_size(args, out)
    opts = options_from_args(args)
    result = run_bench(opts, log=lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True))
    _emit(format_table(result), result, args.json, out)
    return 0


def _emit(table: str, result: dict, json_arg: str | None, out: Path | None) -> None:
    """The table on stdout and the JSON to ``out``; with ``--json -`` the JSON alone on stdout and
    the table on stderr."""
    from attnscope.core.io.paths import write_json

    print(table, file=sys.stderr if json_arg and out is None else sys.stdout)
    if json_arg:
        write_json(out, result)


def _check_views_options(args) -> None:
    """``--synthetic``/``--threads``/``--long-model`` belong to ``--views``: refused elsewhere, and
    checked here, before anything loads (ValueError, one line)."""
    views_only = [
        f"--{name.replace('_', '-')}"
        for name in ("synthetic", "threads", "long_model")
        if getattr(args, name, None) is not None
    ]
    if views_only and not getattr(args, "views", False):
        raise ValueError(f"{', '.join(views_only)} only apply to 'attnscope bench --views'")
    for name in ("synthetic", "threads"):
        v = getattr(args, name, None)
        if v is not None and v < 1:
            raise ValueError(f"--{name} must be a positive integer, got {v}")


def _run_size(args, out: Path | None) -> int:
    """``--dtype``/``--quantize``: the real-size bench (:mod:`attnscope.core.bench.size`)."""
    from attnscope.core.bench.size import SizeOptions, format_size_table, run_size_bench

    kw: dict[str, Any] = {}
    if args.sizes is not None:
        kw["sizes"] = _sizes(args.sizes)
    if args.decode_steps is not None:
        kw["decode_steps"] = args.decode_steps
    if args.quick:
        kw.update(sizes=(64,), decode_steps=2, exactness_tokens=16)
    if getattr(args, "phases", None) is not None:
        kw["phases"] = _phases(args.phases)
    opts = SizeOptions(
        model=args.model,
        dtype=args.dtype or "auto",
        quantize=args.quantize or "none",
        device=args.device,
        **kw,
    )
    result = run_size_bench(opts, log=lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True))
    _emit(format_size_table(result), result, args.json, out)
    failed = any("error" in result.get(p, {}) for p in ("convert", "scope", "sdpa", "exactness"))
    return 1 if failed else 0


def _phases(text: str) -> tuple[str, ...]:
    known = ("scope", "sdpa", "exactness")
    phases = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in phases if x not in known]
    if bad or not phases:
        raise ValueError(f"--phases takes a comma-separated list of {', '.join(known)}, got {text!r}")
    return phases


def _run_remote(args, out: Path | None) -> int:
    """``--engine HOST:PORT``: one head's map and the sink table, remote against in-process."""
    from attnscope.core.bench.remote import format_remote_table, run_remote_bench
    from attnscope.core.remote.client import read_token

    kw = {}
    if args.sizes is not None:
        kw["seq_len"] = _sizes(args.sizes)[-1]
    if args.quick:
        kw["seq_len"] = 64
    if args.head_repeats is not None:
        kw["repeats"] = args.head_repeats
    result = run_remote_bench(
        args.engine,
        token=read_token(args.token_file),
        device=args.device or "cpu",
        log=lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True),
        **kw,
    )
    _emit(format_remote_table(result), result, args.json, out)
    return 0
