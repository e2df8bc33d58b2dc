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
    p.add_argument(
        "--site",
        choices=("output", "query", "kv"),
        default="output",
        help="what is patched: each head's output (default), its query side alone, or each KV head's keys "
        "and values (the GQA group's shared side)",
    )
    p.add_argument(
        "--method",
        choices=("exact", "attribution", "both"),
        default="exact",
        help="exact patching (a forward per head), attribution patching (one forward and one backward per "
        "direction: the gradient estimate of every patch at once), or both with their agreement",
    )
    p.add_argument("--top", type=int, default=10, help="heads listed on the terminal (default 10)")
    add_output_arguments(p)


def run(args) -> int:
    import numpy as np
    from attnscope.core.analysis.head_effects import (
        attribution_patching,
        csv_preamble,
        patch_heads,
        provenance,
    )
    from attnscope.core.io.paths import check_output, shown, write_json

    if args.json is None and args.csv is None:
        raise ValueError("give --json FILE or --csv FILE (or both)")
    out = check_output(args.json, "--json", stdout=True) if args.json is not None else None
    out_csv = check_output(args.csv, "--csv") if args.csv is not None else None
    args.steps = 0
    s = open_session(args)
    t = target_of(s, args)
    exact = (
        patch_heads(s, args.corrupt, t, args.scope, site=args.site) if args.method != "attribution" else None
    )
    est = attribution_patching(s, args.corrupt, t, args.scope, args.site) if args.method != "exact" else None
    res = exact if exact is not None else est
    assert res is not None
    prov = provenance(s, t, corrupt=args.corrupt, scope=args.scope, site=args.site, method=args.method)
    data = {**prov, **res.to_json(), "method": args.method}
    if exact is not None and est is not None:
        data["attribution"] = est.to_json()
        data["attribution_agreement"] = est.agreement(exact)
    if args.json is not None:
        write_json(out, data)
    if out_csv is not None:
        kv = args.site == "kv"
        n = s.info.n_kv_heads if kv else s.info.n_heads
        den, noi = (res.denoise_kv, res.noise_kv) if kv else (res.denoise, res.noise)
        header = ["layer", "kv_head"] if kv else ["layer", "head", "kv_head"]
        header += ["denoise", "noise"]
        if exact is not None and est is not None:
            header += ["attribution_denoise", "attribution_noise"]
        rows = []
        for layer in res.layers:
            for h in range(n):
                row = [layer, h] if kv else [layer, h, s.info.kv_head(h)]
                row += [f"{den[layer, h]:.7g}", f"{noi[layer, h]:.7g}"]
                if exact is not None and est is not None:
                    e_d, e_n = (est.denoise_kv, est.noise_kv) if kv else (est.denoise, est.noise)
                    row += [f"{e_d[layer, h]:.7g}", f"{e_n[layer, h]:.7g}"]
                rows.append(row)
        write_rows(out_csv, header, rows, csv_preamble(prov))
    where = sys.stdout if out is not None or args.json is None else sys.stderr
    print(
        f"clean {res.clean:.4f}, corrupted {res.corrupt:.4f}; heads by restored fraction (denoising):",
        file=where,
    )
    kv = args.site == "kv"
    den, noi = (res.denoise_kv, res.noise_kv) if kv else (res.denoise, res.noise)
    order = np.argsort(-np.nan_to_num(den), axis=None)[: args.top]
    for i in order:
        layer, h = divmod(int(i), den.shape[1])
        print(
            f"  L{layer} {'KV' if kv else 'H'}{h}: {den[layer, h]:+.3f} (noising {noi[layer, h]:+.3f})",
            file=where,
        )
    if exact is not None and est is not None:
        for name, a in est.agreement(exact).items():
            print(
                f"  attribution vs exact, {name}: rank correlation {a['spearman']:.3f}, "
                f"largest error {a['max_error']:.3f}",
                file=where,
            )
    wrote = [shown(p) for p, a in ((out, args.json), (out_csv, args.csv)) if a is not None]
    print(f"wrote {', '.join(wrote)}", file=where)
    return 0
