"""``attnscope patch``: activation patching of every head between a clean and a corrupted prompt.

For each query head and each KV head's GQA group: the fraction of the clean − corrupted target difference
restored when its output is taken from the clean run into the corrupted one (denoising), and the fraction
lost the other way (noising) (:func:`attnscope.core.analysis.head_effects.patch_heads`).
"""

from __future__ import annotations

import sys

from attnscope.core.cli.commands.ablate import (
    add_output_arguments,
    add_target_arguments,
    target_of,
    write_rows,
)
from attnscope.core.cli.options import add_model_arguments, add_prompt_arguments, open_session

NAME = "patch"
HELP = "activation patching of every head between --prompt and --corrupt (JSON/CSV)"


def add_arguments(p) -> None:
    add_model_arguments(p)
    add_prompt_arguments(p, steps=False)
    p.add_argument("--corrupt", required=True, help="the corrupted prompt (as many tokens as --prompt)")
    add_target_arguments(p)
    p.add_argument(
        "--scope",
        choices=("readout", "everywhere"),
        default="everywhere",
        help="patch the head's output at every position (default) or at the read-out position only",
    )
    p.add_argument("--top", type=int, default=10, help="heads listed on the terminal (default 10)")
    add_output_arguments(p)


def run(args) -> int:
    import numpy as np
    from attnscope.core.analysis.head_effects import patch_heads
    from attnscope.core.io.paths import check_output, shown, write_json

    if args.json is None and args.csv is None:
        raise ValueError("give --json FILE or --csv FILE (or both)")
    out = check_output(args.json, "--json", stdout=True) if args.json is not None else None
    out_csv = check_output(args.csv, "--csv") if args.csv is not None else None
    args.steps = 0
    s = open_session(args)
    t = target_of(s, args)
    res = patch_heads(s, args.corrupt, t, args.scope)
    data = {"model": s.info.name, "prompt": s.prompt, "corrupt": args.corrupt, **res.to_json()}
    if args.json is not None:
        write_json(out, data)
    if out_csv is not None:
        rows = [
            [layer, h, s.info.kv_head(h), f"{res.denoise[layer, h]:.7g}", f"{res.noise[layer, h]:.7g}"]
            for layer in res.layers
            for h in range(s.info.n_heads)
        ]
        write_rows(out_csv, ["layer", "head", "kv_head", "denoise", "noise"], rows)
    where = sys.stdout if out is not None or args.json is None else sys.stderr
    print(
        f"clean {res.clean:.4f}, corrupted {res.corrupt:.4f}; heads by restored fraction (denoising):",
        file=where,
    )
    order = np.argsort(-np.nan_to_num(res.denoise), axis=None)[: args.top]
    for i in order:
        layer, h = divmod(int(i), s.info.n_heads)
        print(
            f"  L{layer} H{h}: {res.denoise[layer, h]:+.3f} (noising {res.noise[layer, h]:+.3f})", file=where
        )
    wrote = [shown(p) for p, a in ((out, args.json), (out_csv, args.csv)) if a is not None]
    print(f"wrote {', '.join(wrote)}", file=where)
    return 0
