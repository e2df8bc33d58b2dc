"""``attnscope compare``: how far run B's attention is from run A's, head by head, as JSON (and CSV).

Run A is ``--model/--backend/--dtype`` on ``--prompt``; run B takes each of those from A unless
``--model-b``, ``--backend-b``, ``--dtype-b`` (``--quantize-b`` where the models support it) or
``--prompt-b`` says otherwise. The JSON (:meth:`attnscope.core.analysis.compare_runs.CompareResult.to_json`) holds
``heads``: ``{"layer", "head", "js_mean", "js_max"}`` sorted by ``js_mean``, most changed first
(base-2 Jensen–Shannon distance over the aligned query rows, :mod:`attnscope.core.analysis.compare_runs`); ``logits``:
per position ``KL(A‖B)`` in bits and top-1 agreement; ``alignment``: token-aligned or by the shared
prefix; ``run_a``/``run_b``: model, sha256, dtype, backend, prompt, ids.
"""

from __future__ import annotations

import inspect
import sys

from attnscope.core import backend_registry as registry
from attnscope.core.cli.options import add_model_arguments, add_prompt_arguments

NAME = "compare"
HELP = "compare two runs head by head (Jensen-Shannon distance per layer and head, logits KL) as JSON"


def _supports_quantize() -> bool:
    from attnscope.core.session import Session

    return "quantize" in inspect.signature(Session.load).parameters


def add_arguments(p) -> None:
    add_model_arguments(p, device_map=False)  # both runs load on --device: no --device-map
    add_prompt_arguments(p, steps=False)  # the prompts only, no decode steps
    dtypes = next((a.choices for a in p._actions if a.dest == "dtype"), None)
    p.add_argument("--model-b", default=None, help="run B's model (default: the same as A)")
    p.add_argument("--prompt-b", default=None, help="run B's prompt (default: the same as A)")
    p.add_argument("--dtype-b", default=None, choices=dtypes, help="run B's dtype (default: A's)")
    p.add_argument(
        "--backend-b", default=None, choices=registry.names(), help="run B's backend (default: A's)"
    )
    if _supports_quantize():
        quants = next((a.choices for a in p._actions if a.dest == "quantize"), None)
        p.add_argument(
            "--quantize-b",
            default=None,
            choices=quants,
            help="run B's weight-only quantisation (default: A's)",
        )
    p.add_argument(
        "--weighting",
        default="attention",
        choices=("attention", "value-weighted"),
        help="compare the weights, or the row-normalised value-weighted maps (Kobayashi et al. 2020)",
    )
    p.add_argument(
        "--low-memory",
        action="store_true",
        help="drop A's model weights (keeping its trace) before loading B",
    )
    p.add_argument("--json", required=True, metavar="FILE", help="output JSON file ('-': standard output)")
    p.add_argument("--csv", default=None, metavar="FILE", help="also write the ranked heads table as CSV")


def run(args) -> int:
    from attnscope.core.analysis.compare_runs import run_pair
    from attnscope.core.errors import SessionError
    from attnscope.core.io.data_writers import write_compare_csv
    from attnscope.core.io.paths import check_output, shown, write_json

    out = check_output(args.json, "--json", stdout=True)  # None: standard output
    csv_out = check_output(args.csv, "--csv") if args.csv else None
    for name in ("prompt", "prompt_b"):
        v = getattr(args, name)
        if v is not None and not v.strip():
            raise SessionError(f"--{name.replace('_', '-')} is empty: give some text")
    kw = {}
    if getattr(args, "quantize_b", None) and args.quantize_b != "none":
        kw["quantize_b"] = args.quantize_b
    if getattr(args, "quantize", None) and args.quantize != "none":
        kw["quantize"] = args.quantize
    res = run_pair(
        args.model,
        args.model_b,
        args.prompt,
        args.prompt_b,
        backend=args.backend,
        backend_b=args.backend_b,
        dtype=args.dtype,
        dtype_b=args.dtype_b,
        device=args.device,
        chat_template=args.chat_template,
        weighting=args.weighting,
        low_memory=args.low_memory,
        **kw,
    )
    write_json(out, res.to_json())
    if csv_out is not None:
        write_compare_csv(res, csv_out)
    note = res.nothing_to_compare()
    if note:  # all zeros by construction (an edit of the same model's prompt that changes its length)
        print(note, file=sys.stdout if out is not None else sys.stderr)  # stdout: the JSON alone
    top = res.ranked()[:3]
    tops = ", ".join(f"L{d.layer}H{d.head} {d.js_mean:.3g}" for d in top)
    agree = res.to_json()["top1_agreement"]
    print(
        f"{res.alignment.description}; most changed heads: {tops}; top-1 agreement {agree:.0%}; "
        f"wrote {shown(out)}"
        if agree is not None
        else f"wrote {shown(out)}",
        file=sys.stdout if out is not None else sys.stderr,  # stdout: the JSON alone
    )
    return 0
