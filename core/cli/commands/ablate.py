"""``attnscope ablate``: which heads the prediction depends on (head ablation + direct logit attribution).

Every query head, and every KV head's whole GQA group, is ablated in turn (zero, mean or resampled from
a second prompt; at the read-out position only or everywhere) and the change in the target is written,
with the direct logit attribution of the same target (:mod:`attnscope.core.analysis.head_effects`).
"""

from __future__ import annotations

import sys

from attnscope.core.cli.options import add_model_arguments, add_prompt_arguments, open_session

NAME = "ablate"
HELP = "ablate every head (and GQA group) and write the change in a target (JSON/CSV)"


def add_target_arguments(p) -> None:
    """``--target/--other/--position/--metric``, shared with ``attnscope patch``."""
    p.add_argument(
        "--target",
        default=None,
        help="the token whose prediction is measured: a text that is one token (' Mary') or an id "
        "(default: the token the sequence holds next, or the model's top token after the last position)",
    )
    p.add_argument(
        "--other", default=None, help="a second token: the target becomes logit(target) − logit(other)"
    )
    p.add_argument(
        "--position",
        type=int,
        default=-1,
        help="read-out position whose logits are measured (negative: from the end; default -1)",
    )
    p.add_argument(
        "--metric",
        choices=("logprob", "logit_diff", "kl"),
        default=None,
        help="what is measured (default: logit_diff with --other, else logprob)",
    )


def target_of(s, args):
    from attnscope.core.analysis.head_effects import make_target

    kind = args.metric or ("logit_diff" if args.other is not None else "logprob")
    return make_target(s, kind, args.position, args.target, args.other)


def add_output_arguments(p) -> None:
    p.add_argument("--json", default=None, metavar="FILE", help="output JSON file ('-': standard output)")
    p.add_argument("--csv", default=None, metavar="FILE", help="output CSV file: one row per head")


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_prompt_arguments(p)
    add_target_arguments(p)
    p.add_argument(
        "--method", choices=("zero", "mean", "resample"), default="zero", help="ablation (default zero)"
    )
    p.add_argument(
        "--scope",
        choices=("readout", "everywhere"),
        default="readout",
        help="replace the head's output at the read-out position only, or at every position (default readout)",
    )
    p.add_argument("--source", default=None, help="the second prompt for --method resample")
    p.add_argument("--top", type=int, default=10, help="heads listed on the terminal (default 10)")
    add_output_arguments(p)


def write_rows(path, header: list[str], rows: list[list], preamble: str = "") -> None:
    """CSV ``header`` + ``rows`` to ``path``, after ``preamble`` (``# key: value`` provenance lines)."""
    import csv
    import io

    from attnscope.core.io.paths import write_text

    buf = io.StringIO()
    buf.write(preamble)
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    write_text(path, buf.getvalue())


def run(args) -> int:
    from attnscope.core.analysis.head_effects import head_effects, logit_attribution
    from attnscope.core.errors import UnsupportedModelError
    from attnscope.core.io.paths import check_output, shown, write_json

    if args.json is None and args.csv is None:
        raise ValueError("give --json FILE or --csv FILE (or both)")
    out = check_output(args.json, "--json", stdout=True) if args.json is not None else None
    out_csv = check_output(args.csv, "--csv") if args.csv is not None else None
    if args.method == "resample" and not args.source:
        raise ValueError("--method resample needs --source PROMPT")
    s = open_session(args)
    t = target_of(s, args)
    done = [0]

    def progress(i: int, n: int) -> None:
        if i == n or i - done[0] >= max(1, n // 10):
            done[0] = i
            print(f"ablate: {i}/{n} heads", file=sys.stderr, flush=True)

    eff = head_effects(s, t, args.method, args.scope, args.source, progress=progress)
    try:
        dla = logit_attribution(s, t)
    except UnsupportedModelError as e:
        dla, dla_note = None, str(e)
    else:
        dla_note = ""
    from attnscope.core.analysis.head_effects import csv_preamble, provenance

    prov = provenance(s, t, method=args.method, scope=args.scope, source=args.source)
    data = {
        **prov,
        **eff.to_json(),
        "direct_logit_attribution": dla.to_json() if dla is not None else None,
        "direct_logit_attribution_note": dla_note,
    }
    if args.json is not None:
        write_json(out, data)
    if out_csv is not None:
        rows = []
        for layer in eff.layers:
            for h in range(s.info.n_heads):
                rows.append(
                    [layer, h, s.info.kv_head(h), f"{eff.query[layer, h]:.7g}"]
                    + ([f"{dla.heads[layer, h]:.7g}"] if dla is not None else [""])
                )
        write_rows(
            out_csv,
            ["layer", "head", "kv_head", "effect", "direct_logit_attribution"],
            rows,
            csv_preamble(prov),
        )
    where = sys.stdout if out is not None or args.json is None else sys.stderr
    what = {"logprob": "log p", "logit_diff": "logit diff", "kl": "KL"}[t.kind]
    print(f"clean {what} = {eff.clean:.4f}; heads by |effect| ({args.method}, {args.scope}):", file=where)
    for layer, h, effect in eff.top(args.top):
        line = f"  L{layer} H{h} (KV {s.info.kv_head(h)}): {effect:+.4f}"
        if dla is not None:
            line += f"   direct {dla.heads[layer, h]:+.4f}"
        print(line, file=where)
    wrote = [shown(p) for p, a in ((out, args.json), (out_csv, args.csv)) if a is not None]
    print(f"wrote {', '.join(wrote)}", file=where)
    return 0
