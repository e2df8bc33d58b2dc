"""``attnscope explain``: why a head gives a key its score at a query, split by rotary frequency band
(:func:`attnscope.core.analysis.explain.explain`; docs "Why a head attends").

The terminal gets the cell's score and weight, each band's part and share as a bar, the row's split, the
head's positional share and the row with the rotation removed; ``--json`` writes the same numbers with
the provenance of every export (model, prompt, token ids and a SHA-256 of them, layer, head, query, key).
"""

from __future__ import annotations

import sys

from attnscope.core.cli.options import add_model_arguments, add_prompt_arguments, open_session

NAME = "explain"
HELP = (
    "why a head attends: split one cell's score by rotary frequency band (exact, no forward) and, with "
    "--sources, by the components that wrote its query and key (one forward of the prefix)"
)


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_prompt_arguments(p)
    p.add_argument("--layer", type=int, required=True, help="layer index")
    p.add_argument("--head", type=int, required=True, help="query head index")
    p.add_argument("--query", type=int, required=True, help="query position (row; negative: from the end)")
    p.add_argument("--key", type=int, required=True, help="key position (column; negative: from the end)")
    p.add_argument(
        "--short-tokens",
        type=float,
        default=64.0,
        help="bands turning faster than every N tokens count as positional in the head summary (default 64)",
    )
    p.add_argument(
        "--sources",
        action="store_true",
        help="also split the score by the components that wrote the query and the key (embedding, earlier "
        "heads, MLPs; exact up to the norms' frozen scale; one forward of the prefix)",
    )
    p.add_argument(
        "--top",
        type=int,
        default=10,
        help="with --sources: how many of the largest pairs to list (default 10)",
    )
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="FILE",
        help="write the numbers as JSON (to FILE, or standard output when no FILE is given)",
    )


def _position(name: str, value: int, T: int) -> int:
    from attnscope.core.errors import OutOfRange

    p = value + T if value < 0 else value
    if not 0 <= p < T:
        raise OutOfRange(f"--{name} {value} is outside the sequence of {T} tokens (0..{T - 1}, or -{T}..-1)")
    return p


def payload(s, e, share: float, short_tokens: float) -> dict:
    """The JSON of ``attnscope explain``: the session's export provenance, the cell and the split."""
    import hashlib

    from attnscope.core.io.provenance import session_metadata

    meta = session_metadata(s)
    ids = meta["token_ids"]
    meta["prompt_sha256"] = hashlib.sha256(",".join(str(i) for i in ids).encode()).hexdigest()
    return {
        **meta,
        "kind": "explain",
        "positional_share": share,
        "short_tokens": short_tokens,
        **e.to_dict(),
    }


def _bar(share: float, width: int = 20) -> str:
    n = round(abs(share) * width)
    return ("+" if share >= 0 else "-") * n


def _print_sources(split, where) -> None:
    """The by-source lines: top pairs, the rest, each side's largest totals, the approximation."""
    if split is None:
        print("  by source: none (the key comes after the query: the head never scores it)", file=where)
        return
    print(f"  by source (query part × key part, the {len(split.pairs)} largest of the table):", file=where)
    for pair in split.pairs:
        print(f"    {split.pair_line(pair)}", file=where)
    n_rest = len(split.components) ** 2 - len(split.pairs)
    print(f"    rest ({n_rest} pairs)  {split.rest:+.4f}", file=where)
    for side, items in (("query", split.query_totals), ("key", split.key_totals)):
        print(f"  {side} built by: " + ", ".join(f"{n} {v:+.4f}" for n, v in items[:5]), file=where)
    for note in split.notes:
        print(f"  {note}", file=where)
    print(f"  {split.approximation}", file=where)


def run(args) -> int:
    from attnscope.core.analysis.explain import explain, head_positional_share, tokens_text
    from attnscope.core.checks import index
    from attnscope.core.io.paths import check_output, shown, write_json

    out = check_output(args.json, "--json", stdout=True) if args.json is not None else None

    def check(info) -> None:  # a bad layer/head fails before anything runs
        index("--layer", args.layer, info.n_layers)
        index("--head", args.head, info.n_heads)

    s = open_session(args, check=check)
    T = s.seq_len
    q, k = _position("query", args.query, T), _position("key", args.key, T)
    e = explain(s, args.layer, args.head, q, k, sources=args.sources, top=args.top)
    share = head_positional_share(s, args.layer, args.head, short_tokens=args.short_tokens)
    if args.json is not None:
        write_json(out, payload(s, e, share, args.short_tokens))  # out None: standard output
    where = sys.stderr if args.json == "-" else sys.stdout
    toks = s.tokens
    print(
        f"L{e.layer} H{e.head}: query {q} {toks[q].text!r} → key {k} {toks[k].text!r}: "
        f"score {e.score:+.5f}, weight {e.weight:.4f}" + ("" if e.allowed else " (masked)"),
        file=where,
    )
    if not e.bands.rope:
        print(f"  {e.bands.note}", file=where)
    else:
        for title, split in (("cell", e.bands), ("row (weighted by the row's weights)", e.row_bands)):
            print(f"  {title}: total {split.total:+.5f}", file=where)
            for name, part, sh in zip(split.names, split.parts, split.shares(), strict=True):
                print(f"    {name:<30} {part:+.5f}  {sh:+6.1%}  {_bar(sh)}", file=where)
            if split.unrotated is not None:
                print(f"    {'not rotated':<30} {split.unrotated:+.5f}", file=where)
        j = int(e.no_rope_row.argmax())
        print(
            f"  with the rotation removed the row's top key is {j} {toks[j].text!r} "
            f"(weight {e.no_rope_row[j]:.4f}; actually {e.row[j]:.4f}); this cell {e.no_rope_row[k] if k <= q else 0.0:.4f}",
            file=where,
        )
    print(
        f"  head: positional ↔ content: {share:.2f} positional "
        f"(share of score variance in bands turning faster than every {tokens_text(args.short_tokens)} tokens)",
        file=where,
    )
    if args.sources:
        _print_sources(e.sources, where)
    if out is not None:
        print(f"wrote {shown(out)}", file=where)
    return 0
