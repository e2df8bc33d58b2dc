"""``attnscope bench``: prefill, decode, memory and map timings of AttnScope against transformers.

Prints a table (stdout; progress on stderr) and, with ``--json FILE``, writes the raw figures,
the ratios, the issue's targets (met or not) and the machine's description. See
:mod:`core.bench` for what is measured and how.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
    p.add_argument("--model", default=None, help="HF model folder or .gguf (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--json", metavar="FILE", default=None, help="write raw figures, ratios and targets as JSON")
    p.add_argument("--sizes", default=None, help="comma-separated prefill lengths (default 512,2048,8192)")
    p.add_argument("--repeats", type=int, default=None, help="prefill timings per configuration (default 3)")
    p.add_argument("--decode-steps", type=int, default=None, help="decode steps after each prefill (default 64)")
    p.add_argument("--head-repeats", type=int, default=None, help="one-head map timings per repeat (default 3)")
    p.add_argument("--memory-limit-gb", type=float, default=24.0,
                   help="memory budget in GB; eager+output_attentions is skipped where it would not fit "
                        "(default 24)")
    p.add_argument("--no-memory", dest="memory", action="store_false",
                   help="skip the peak-RSS runs (each configuration in a fresh process)")
    p.add_argument("--no-eager", dest="eager", action="store_false", help="leave out eager+output_attentions")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: T=64, 1 repeat, 4 decode steps, small matmul (for CI; figures meaningless)")


def options_from_args(args):
    from core.bench import QUICK, BenchOptions

    kw = dict(QUICK) if args.quick else {}
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
    from core.bench import format_table, run_bench

    opts = options_from_args(args)
    out = Path(args.json) if args.json else None
    if out is not None and not out.parent.exists():
        raise FileNotFoundError(f"folder {out.parent} does not exist")
    result = run_bench(opts, log=lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True))
    print(format_table(result))
    if out is not None:
        out.write_text(json.dumps(result, indent=1))
    return 0
