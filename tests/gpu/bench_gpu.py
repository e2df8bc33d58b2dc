"""Short CUDA benchmark: ``python tests/gpu/bench_gpu.py [--sizes 2048,8192] [--json FILE]``.

Runs :func:`attnscope.core.bench.overhead.run_bench` on the GPU (the same code path as ``attnscope bench``; the
torch backend's attention then goes through the fused CUDA kernel) and prints the table. Exits 0
with a one-line note where there is no CUDA. Memory figures are the CUDA allocator's peak growth.
The memory limit for (c) eager defaults to 80 % of the GPU's memory, so eager runs where it fits.
"""

from __future__ import annotations

import argparse
import json
import sys

import pytest

pytestmark = pytest.mark.gpu


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="2048,8192")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--decode-steps", type=int, default=64)
    p.add_argument("--no-memory", dest="memory", action="store_false")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device: skipped")
        return 0
    from attnscope.core.bench.overhead import BenchOptions, run_bench
    from attnscope.core.bench.overhead_report import format_table

    total = torch.cuda.get_device_properties(0).total_memory
    opts = BenchOptions(
        sizes=tuple(int(x) for x in args.sizes.split(",")),
        repeats=args.repeats,
        decode_steps=args.decode_steps,
        head_repeats=3,
        matmul_n=8192,
        device="cuda",
        memory=args.memory,
        memory_limit=int(0.8 * total),
    )
    res = run_bench(opts, log=lambda m: print(f"bench: {m}", file=sys.stderr, flush=True))
    print(format_table(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
