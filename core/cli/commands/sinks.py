"""``attnscope sinks``: the layers × heads table of attention-sink scores, as JSON.

Sink score of a head (docs/window.md, Sinks): the mean, over query rows ``i >= 1``, of the
weight on key 0 (row 0 can only attend to itself, so it is left out); computed from ``q``,
``k_0`` and the LSE rows, linear in the sequence (:mod:`attnscope.core.analysis.sinks`). The JSON also holds the
mass on ``{0} ∪ delimiters`` (``sink_set``), the table after prefill and after each decode step
(``by_step``) and the heads at or above ``--threshold`` (``sink_heads``).
"""

from __future__ import annotations

import sys

import numpy as np
from attnscope.core.cli.options import add_model_arguments, add_prompt_arguments, open_session

NAME = "sinks"
HELP = "write the layers × heads attention-sink table (JSON)"


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_prompt_arguments(p)
    p.add_argument("--json", required=True, metavar="FILE", help="output JSON file ('-': standard output)")
    p.add_argument(
        "--threshold", type=float, default=None, help="sink-head threshold on the sink score (default 0.5)"
    )
    p.add_argument(
        "--value-weighted",
        action="store_true",
        help="also write sink_value_weighted: token 0's share of what each head moves, "
        "α_i0‖v_0 W_O^h‖ / Σ_j α_ij‖v_j W_O^h‖ averaged over rows i >= 1 (O(T²) per head)",
    )


def run(args) -> int:
    from attnscope.core.analysis.sinks import DEFAULT_THRESHOLD, session_sink_report
    from attnscope.core.io.paths import check_output, shown, write_json

    out = check_output(args.json, "--json", stdout=True)
    threshold = DEFAULT_THRESHOLD if args.threshold is None else args.threshold
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"--threshold must be in [0, 1], got {threshold}")
    s = open_session(args)
    rep = session_sink_report(s, threshold)
    from attnscope.core.loading.quantize import record as quant_record

    data = {
        "model": s.info.name,
        "dtype": s.info.dtype,
        "quantization": quant_record(s.info),
        "prompt": args.prompt,
        "chat_template": args.chat_template,
        **rep.to_json(),
    }
    arch = s.info.arch
    if arch.is_hybrid:  # rows of the layers with no map are null (docs/how-it-works.md "Hybrid models")
        data["attention_layers"] = list(arch.attention_layers)
        data["layer_kinds"] = list(arch.layer_kinds)
    if getattr(args, "value_weighted", False):
        from attnscope.core.analysis.value_weighted import value_weighted_sink_scores

        data["sink_value_weighted"] = [
            [None if np.isnan(x) else round(float(x), 6) for x in row]
            for row in value_weighted_sink_scores(s)
        ]
        data["weighting"] = ["attention", "value-weighted"]
    write_json(out, data)
    heads = rep.sink_heads()
    print(
        f"{len(heads)} of {len(arch.attention_layers) * rep.n_heads} heads have sink score >= {threshold:g} "
        f"(seq_len {rep.seq_len}); wrote {shown(out)}",
        file=sys.stdout if out is not None else sys.stderr,  # stdout: the JSON alone
    )
    return 0
