"""``attnscope kv``: KV-cache bytes for a model configuration, and the same model under MHA/GQA/MQA.

No model is loaded: the sizes come from :mod:`attnscope.core.kv_formula`
(``2 × n_layers × n_kv_heads × head_dim × seq_len × batch × bytes``; MLA caches
``(latent + rope) × n_layers × seq_len × batch × bytes``). Example, the handbook's 70B model::

    attnscope kv --n-layers 80 --n-kv-heads 8 --n-heads 64 --head-dim 128 --seq-len 8192 --dtype bf16

Sliding windows: ``--sliding-window W`` caps the layers named by ``--sliding-layers`` (``all``,
the default; ``S:G`` for S sliding layers then G global ones, repeated; or a list ``0-4,6-10``)
at ``W`` tokens. Gemma 3 270M at its full context::

    attnscope kv --n-layers 18 --n-kv-heads 1 --n-heads 4 --head-dim 256 --seq-len 32768 \
        --dtype fp32 --sliding-window 512 --sliding-layers 5:1      # 217 MB (1.21 GB without windows)
"""

from __future__ import annotations

import json

from attnscope.core.kv_formula import KVConfig, compare_schemes, format_bytes, windows_from_spec

NAME = "kv"
HELP = "KV-cache bytes for a config (layers, KV heads, head_dim, tokens, dtype) and under MHA/GQA/MQA"
DTYPES = ("bf16", "fp16", "fp32", "fp8")


def add_arguments(p) -> None:
    p.add_argument("--n-layers", type=int, required=True, help="attention layers")
    p.add_argument("--n-kv-heads", type=int, required=True, help="K/V heads per layer")
    p.add_argument(
        "--n-heads", type=int, default=None, help="query heads (default: = --n-kv-heads, i.e. MHA)"
    )
    p.add_argument("--head-dim", type=int, required=True, help="elements per head")
    p.add_argument("--seq-len", type=int, required=True, help="tokens in the cache")
    p.add_argument("--dtype", choices=DTYPES, default="bf16", help="cache element type (default bf16)")
    p.add_argument("--batch", type=int, default=1, help="sequences cached side by side (default 1)")
    p.add_argument(
        "--gqa-kv-heads",
        type=int,
        default=None,
        help="K/V heads of the GQA row (default: the config's own if GQA, else 8 or a divisor of n_heads)",
    )
    p.add_argument(
        "--mla-latent-dim", type=int, default=None, help="add an MLA row with this latent width (d_c)"
    )
    p.add_argument(
        "--mla-rope-dim", type=int, default=0, help="MLA decoupled RoPE key width (d_h^R, default 0)"
    )
    p.add_argument(
        "--sliding-window",
        type=int,
        default=None,
        help="sliding window in keys: windowed layers cache min(seq_len, W) tokens (default: none)",
    )
    p.add_argument(
        "--sliding-layers",
        default="all",
        help="layers with the window: 'all' (default), 'S:G' (S sliding then G global, repeated; "
        "Gemma 3: 5:1) or a list such as '0-4,6-10'",
    )
    p.add_argument("--max-context", type=int, default=None, help="also show the cache at this context length")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def _size(n: int) -> str:
    dec, binary = format_bytes(n), format_bytes(n, binary=True)
    return dec if dec.endswith(" B") else f"{dec} ({binary})"


def report(args) -> dict:
    """The numbers ``attnscope kv`` prints, as a dict (bytes as ints)."""
    for name in ("n_layers", "n_kv_heads", "head_dim", "seq_len", "batch"):
        if getattr(args, name) < (0 if name == "seq_len" else 1):
            raise ValueError(
                f"--{name.replace('_', '-')} must be {'>= 0' if name == 'seq_len' else '>= 1'}, got {getattr(args, name)}"
            )
    n_heads = args.n_kv_heads if args.n_heads is None else args.n_heads
    if n_heads < args.n_kv_heads or n_heads % args.n_kv_heads:
        raise ValueError(f"--n-heads {n_heads} must be a multiple of --n-kv-heads {args.n_kv_heads}")
    if args.gqa_kv_heads is not None and (args.gqa_kv_heads < 1 or n_heads % args.gqa_kv_heads):
        raise ValueError(f"--gqa-kv-heads {args.gqa_kv_heads} must divide --n-heads {n_heads}")
    if args.max_context is not None and args.max_context < 0:
        raise ValueError(f"--max-context must be >= 0, got {args.max_context}")
    sw = getattr(args, "sliding_window", None)
    if sw is not None and sw < 1:
        raise ValueError(f"--sliding-window must be >= 1 keys, got {sw}")
    try:
        windows = windows_from_spec(sw, getattr(args, "sliding_layers", "all"), args.n_layers)
    except ValueError as e:
        raise ValueError(f"--sliding-layers: {e}") from None
    cfg = KVConfig(
        args.n_layers,
        args.n_kv_heads,
        args.head_dim,
        n_heads=n_heads,
        dtype=args.dtype,
        batch=args.batch,
        windows=windows,
    )
    rows = compare_schemes(
        cfg,
        args.seq_len,
        gqa_kv_heads=args.gqa_kv_heads,
        kv_latent_dim=args.mla_latent_dim,
        rope_head_dim=args.mla_rope_dim,
    )
    out = {
        "config": {
            "n_layers": cfg.n_layers,
            "n_kv_heads": cfg.n_kv_heads,
            "n_heads": cfg.n_heads,
            "head_dim": cfg.head_dim,
            "seq_len": args.seq_len,
            "dtype": cfg.dtype,
            "batch": cfg.batch,
            "scheme": cfg.scheme,
            "group_size": cfg.group_size,
            "windows": list(cfg.windows) if cfg.windows is not None else None,
        },
        "bytes_per_token": cfg.bytes_per_token,
        "steady_bytes_per_token": cfg.steady_bytes_per_token,
        "bytes_per_layer": cfg.bytes_per_layer(args.seq_len),
        "total_bytes": cfg.total_bytes(args.seq_len),
        "total_bytes_no_window": cfg.without_windows().total_bytes(args.seq_len),
        "windows": cfg.describe_windows(),
        "schemes": [
            {
                "scheme": r.scheme,
                "label": r.label,
                "n_kv_heads": r.config.n_kv_heads,
                "kv_latent_dim": r.config.kv_latent_dim,
                "bytes_per_token": r.bytes_per_token,
                "bytes_per_layer": r.bytes_per_layer,
                "total_bytes": r.total_bytes,
                "vs_mha": r.vs_mha,
                "is_given": r.is_given,
            }
            for r in rows
        ],
    }
    if args.max_context is not None:
        out["max_context"] = {
            "seq_len": args.max_context,
            "total_bytes": cfg.total_bytes(args.max_context),
            "total_bytes_no_window": cfg.without_windows().total_bytes(args.max_context),
        }
    return out


def format_report(rep: dict) -> str:
    c = rep["config"]
    batch = f", batch {c['batch']}" if c["batch"] != 1 else ""
    group = f", group {c['group_size']}" if c["scheme"] == "GQA" else ""
    lines = [
        f"KV cache: {c['n_layers']} layers × {c['n_kv_heads']} KV heads × head_dim {c['head_dim']}, "
        f"{c['seq_len']} tokens, {c['dtype']}{batch} ({c['scheme']}{group})",
        f"  per token  {rep['bytes_per_token']:>18,} B  {_size(rep['bytes_per_token'])}"
        + (
            f"   (until the windows fill; then {format_bytes(rep['steady_bytes_per_token'])})"
            if rep.get("windows")
            else ""
        ),
        f"  per layer  {rep['bytes_per_layer']:>18,} B  {_size(rep['bytes_per_layer'])}"
        + ("   (a global layer)" if rep.get("windows") else ""),
        f"  total      {rep['total_bytes']:>18,} B  {_size(rep['total_bytes'])}",
    ]
    if rep.get("windows"):
        nw = rep["total_bytes_no_window"]
        lines.insert(1, f"  {rep['windows']}")
        lines.append(f"  (every key kept in every layer: {nw:,} B  {_size(nw)})")
    if "max_context" in rep:
        mc = rep["max_context"]
        lines.append(
            f"  at {mc['seq_len']} tokens: {mc['total_bytes']:,} B  {_size(mc['total_bytes'])}"
            + (f"  (no windows: {_size(mc['total_bytes_no_window'])})" if rep.get("windows") else "")
        )
    lines += [
        "",
        f"Same model ({c['n_heads']} query heads) under each scheme, {c['seq_len']} tokens:",
        f"  {'scheme':<10}{'KV heads':>9}{'per token':>13}{'total':>12}{'total bytes':>19}   vs MHA",
    ]
    for r in rep["schemes"]:
        heads = "latent" if r["scheme"] == "MLA" else str(r["n_kv_heads"])
        ratio = "1×" if r["vs_mha"] == 1 else f"{r['vs_mha']:.3g}× smaller"
        mark = "   ← this config" if r["is_given"] else ""
        lines.append(
            f"  {r['label']:<10}{heads:>9}{format_bytes(r['bytes_per_token']):>13}"
            f"{format_bytes(r['total_bytes']):>12}{r['total_bytes']:>19,}   {ratio}{mark}"
        )
    return "\n".join(lines)


def run(args) -> int:
    rep = report(args)
    print(json.dumps(rep, indent=2) if args.json else format_report(rep))
    return 0
