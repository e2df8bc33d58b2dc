"""``attnscope roles``: every head's role scores and label, as JSON.

Scores (definitions in :mod:`attnscope.core.analysis.roles`): previous-token, sink/delimiter and positional/local
on the prompt's sequence; induction on a repeated random-token probe (Olsson et al. 2022). The
label is the best specific role at or above ``--threshold``, else sink, else ``mixed``.
"""

from __future__ import annotations

import sys

from attnscope.core.cli.options import add_model_arguments, add_prompt_arguments, open_session

NAME = "roles"
HELP = "write each head's role scores (previous-token, induction, sink, local) and label (JSON)"


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_prompt_arguments(p)
    p.add_argument("--json", required=True, metavar="FILE", help="output JSON file ('-': standard output)")
    p.add_argument("--threshold", type=float, default=None, help="label threshold (default 0.4)")
    p.add_argument("--window", type=int, default=None, help="keys counted by the local score (default 4)")
    p.add_argument(
        "--probe-len",
        type=int,
        default=None,
        help="random tokens per copy in the induction probe (default 50)",
    )


def run(args) -> int:
    from collections import Counter

    from attnscope.core.analysis import roles
    from attnscope.core.io.paths import check_output, shown, write_json

    out = check_output(args.json, "--json", stdout=True)
    threshold = roles.DEFAULT_THRESHOLD if args.threshold is None else args.threshold
    window = roles.DEFAULT_WINDOW if args.window is None else args.window
    probe = roles.PROBE_LEN if args.probe_len is None else args.probe_len
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"--threshold must be in [0, 1], got {threshold}")
    if window < 2:
        raise ValueError(f"--window must be >= 2, got {window}")
    if probe < 2:
        raise ValueError(f"--probe-len must be >= 2, got {probe}")
    s = open_session(args)
    table = roles.role_table(s, threshold=threshold, window=window, probe_len=probe)
    from attnscope.core.loading.quantize import record as quant_record

    data = {
        "model": s.info.name,
        "dtype": s.info.dtype,
        "quantization": quant_record(s.info),
        "prompt": args.prompt,
        "chat_template": args.chat_template,
        **table.to_json(),
    }
    write_json(out, data)
    to = sys.stdout if out is not None else sys.stderr  # stdout: the JSON alone
    counts = Counter(str(x) for x in table.labels.ravel())
    summary = ", ".join(f"{roles.ROLE_TITLES[k]} {counts[k]}" for k in (*roles.ROLES, "mixed") if counts[k])
    n_heads = (table.n_layers - len(table.no_map)) * table.n_heads  # a hybrid model: attention layers only
    print(f"{n_heads} heads: {summary}; wrote {shown(out)}", file=to)
    for role in ("induction", "previous_token"):
        top = table.heads_with(role)[:8]
        if top:
            print(
                f"  {roles.ROLE_TITLES[role]}: "
                + ", ".join(f"L{a}H{b} {table.scores[role][a, b]:.2f}" for a, b in top),
                file=to,
            )
    return 0
