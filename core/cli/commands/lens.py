"""``attnscope lens``: the logit lens — each layer's residual stream through the final norm and the
unembedding, at the positions asked for only (:func:`attnscope.core.analysis.logit_lens.logit_lens`)."""

from __future__ import annotations

import sys

from attnscope.core.cli.commands.ablate import write_rows
from attnscope.core.cli.options import add_model_arguments, add_prompt_arguments, open_session

NAME = "lens"
HELP = "logit lens: each layer's top tokens at chosen positions (JSON/CSV)"


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_prompt_arguments(p)
    p.add_argument(
        "--positions",
        default=None,
        help="comma-separated positions (negative: from the end; default: the last 16)",
    )
    p.add_argument("--k", type=int, default=5, help="top tokens per layer and position (default 5)")
    p.add_argument("--json", default=None, metavar="FILE", help="output JSON file ('-': standard output)")
    p.add_argument("--csv", default=None, metavar="FILE", help="output CSV: one row per layer and position")


def run(args) -> int:
    from attnscope.core.analysis.logit_lens import logit_lens
    from attnscope.core.io.paths import check_output, shown, write_json

    if args.json is None and args.csv is None:
        raise ValueError("give --json FILE or --csv FILE (or both)")
    positions = None
    if args.positions:
        try:
            positions = [int(x) for x in args.positions.split(",") if x.strip()]
        except ValueError:
            raise ValueError(
                f"--positions takes whole numbers separated by commas, got {args.positions!r}"
            ) from None
    out = check_output(args.json, "--json", stdout=True) if args.json is not None else None
    out_csv = check_output(args.csv, "--csv") if args.csv is not None else None
    s = open_session(args)
    lens = logit_lens(s, positions, args.k)
    tok = s.tokenizer
    text = lambda i: tok.decode([int(i)])  # noqa: E731
    data = {
        "model": s.info.name,
        "prompt": s.prompt,
        "tokens": [text(s.ids[p]) for p in lens.positions],
        "top_text": [[[text(i) for i in row] for row in layer] for layer in lens.top_ids],
        "final_text": [text(i) for i in lens.final_ids],
        **lens.to_json(),
    }
    if args.json is not None:
        write_json(out, data)
    if out_csv is not None:
        rows = []
        for layer in range(lens.top_ids.shape[0]):
            for j, p in enumerate(lens.positions):
                rows.append(
                    [
                        layer,
                        int(p),
                        text(s.ids[p]),
                        text(lens.top_ids[layer, j, 0]),
                        f"{lens.top_probs[layer, j, 0]:.6g}",
                        int(lens.final_rank[layer, j]),
                        f"{lens.final_prob[layer, j]:.6g}",
                    ]
                )
        write_rows(
            out_csv, ["layer", "position", "token", "top", "top_prob", "final_rank", "final_prob"], rows
        )
    where = sys.stdout if out is not None or args.json is None else sys.stderr
    j = len(lens.positions) - 1
    p = int(lens.positions[j])
    print(f"position {p} ({text(s.ids[p])!r}) → finally {text(lens.final_ids[j])!r}; by layer:", file=where)
    for layer in range(lens.top_ids.shape[0]):
        print(
            f"  L{layer}: {text(lens.top_ids[layer, j, 0])!r} {lens.top_probs[layer, j, 0]:.3f}"
            f"   final token rank {int(lens.final_rank[layer, j])}",
            file=where,
        )
    wrote = [shown(q) for q, a in ((out, args.json), (out_csv, args.csv)) if a is not None]
    print(f"wrote {', '.join(wrote)}", file=where)
    return 0
