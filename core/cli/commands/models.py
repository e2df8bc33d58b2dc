"""``attnscope models``: every local model AttnScope can find, what it is, and whether it fits.

Lists the same entries as the model picker (:mod:`attnscope.core.loading.catalog`): the embedded default, the
Hugging Face cache, LM Studio, Ollama and user-added paths, with a fit estimate
(:mod:`attnscope.core.loading.fit`) for ``--context`` tokens on ``--backend``/``--device``. Also manages the
user-added paths (``--add`` / ``--remove``) and the GGUF conversion cache (``--list-cache`` /
``--clear-cache``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from attnscope.core import backend_registry as registry

NAME = "models"
HELP = "list local models (HF cache, LM Studio, Ollama, added paths) with size and fit estimate"
DEFAULT_CONTEXT = 4096


def add_arguments(p) -> None:
    p.add_argument(
        "--context",
        type=int,
        default=DEFAULT_CONTEXT,
        help=f"context length for the fit estimate, tokens (default {DEFAULT_CONTEXT}; capped at each model's max)",
    )
    p.add_argument(
        "--backend", choices=registry.names(), default=registry.DEFAULT, help="backend for the fit estimate"
    )
    p.add_argument(
        "--device", default="cpu", help="device for the fit estimate: cpu or cuda[:N] (default cpu)"
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="load dtype for the fit estimate (default auto: what each model loads at, shown as 'loads at')",
    )
    p.add_argument(
        "--quantize",
        default="none",
        choices=("none", "int8", "int4"),
        help="count the linear layers' weights at this weight-only quantisation (as --quantize loads them)",
    )
    p.add_argument(
        "--device-map",
        default=None,
        choices=("auto", "balanced", "sequential"),
        help="show the fit per device as --device-map places the layers (GPUs, then CPU, then disk; "
        "accelerate on a meta-device skeleton, attnscope.core.loading.fit_devices)",
    )
    p.add_argument(
        "--json",
        metavar="FILE",
        help="also write the entries and fit estimates as JSON ('-' for stdout only)",
    )
    p.add_argument("--add", metavar="PATH", help="remember a model folder, library folder or .gguf file")
    p.add_argument("--remove", metavar="PATH", help="forget a user-added path (files are not deleted)")
    p.add_argument(
        "--list-cache",
        action="store_true",
        help="list the GGUF conversion cache and the quantised-weights cache (--quantize int8|int4)",
    )
    p.add_argument(
        "--clear-cache",
        action="store_true",
        help="delete both caches (GGUFs convert, --quantize models quantise again on next load)",
    )
    p.add_argument("--remove-cached", metavar="NAME", help="delete one entry (a name --list-cache shows)")


def _count(n: int) -> str:
    if not n:
        return "?"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def rows(entries, fits, device_fits=None, backend: str = "") -> list[list[str]]:
    """Table cells per entry: name, source, arch, params, layers, attention kind, head_dim, ctx, the file's
    precision, the precision it loads at, size, fit (per device with ``device_fits``:
    :class:`attnscope.core.loading.fit_devices.DeviceMapFit` per entry, None where unknown); ``backend``:
    the one the fit is for (an entry it cannot open says "not on <backend>")."""
    from attnscope.core.loading.fit import human_bytes

    out = []
    device_fits = device_fits or [None] * len(entries)
    for e, f, d in zip(entries, fits, device_fits, strict=True):
        # the attention kind (attnscope.core.loading.attention_kind): "GQA 32/8 · 128 experts, 8 active"
        heads = e.attention_kind or (f"{e.n_heads}/{e.n_kv_heads} ({e.group_size})" if e.n_heads else "?")
        if e.text_only:
            heads += " · text only"
        fit = (
            f"{f.verdict} ({human_bytes(f.total_bytes)})"
            if (e.supported and f is not None)
            else "unsupported"
        )
        if e.supported and backend and e.problem_on(backend):
            fit = f"not on {backend}"
        if e.supported and d is not None:
            fit = f"refused ({d.quantize} needs one device)" if d.problem else f"{d.verdict} ({d.label()})"
        out.append(
            [
                e.name,
                e.source,
                e.architecture or "?",
                _count(e.n_params),
                str(e.n_layers or "?"),
                heads,
                str(e.head_dim or "?"),
                str(e.max_context or "?"),
                e.dtype,
                "—" if f is None else f.dtype if f.quantize in ("", "none") else f"{f.dtype} + {f.quantize}",
                human_bytes(e.size_bytes),
                fit,
            ]
        )
    return out


HEADERS = [
    "name",
    "source",
    "arch",
    "params",
    "layers",
    "attention",
    "head_dim",
    "ctx",
    "dtype/quant",
    "loads at",
    "size",
    "fit",
]


def format_table(cells: list[list[str]], headers: list[str] = HEADERS) -> str:
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _device_fit_json(d) -> dict | None:
    """A :class:`attnscope.core.loading.fit_devices.DeviceMapFit` as JSON (bytes per device)."""
    if d is None:
        return None
    return {
        "strategy": d.strategy,
        "verdict": d.verdict,
        "dtype": d.dtype,
        "quantize": d.quantize,
        "context": d.context,
        "devices": [{**asdict(x), "total_bytes": x.total_bytes} for x in d.devices],
        "device_map": {k: v for k, v in d.device_map},
    }


def _cache(args) -> int:
    from attnscope.core.loading.cache_folder import cache_root
    from attnscope.core.loading.conversion_cache import clear_converted, list_converted
    from attnscope.core.loading.fit import human_bytes

    if args.list_cache:
        from attnscope.core.loading import quant_cache

        items = list_converted()
        # two kinds of entry: GGUF conversions (kind "") and quantised weight sets (kind "int8 weights …")
        print(
            f"model cache: GGUF conversions in {cache_root() / 'converted'}, "
            f"quantised weights in {quant_cache.root()}"
        )
        for c in items:
            state = "" if c.complete else "  (incomplete)"
            kind = f"  [{c.kind}]" if getattr(c, "kind", "") else ""
            print(f"  {human_bytes(c.size_bytes):>9}  {c.name}  <- {c.source or '?'}{kind}{state}")
        n_q = sum(1 for c in items if getattr(c, "kind", ""))
        print(
            f"{len(items)} cache {'entry' if len(items) == 1 else 'entries'}: {len(items) - n_q} converted "
            f"model(s), {n_q} quantised weight set(s), {human_bytes(sum(c.size_bytes for c in items))}"
        )
    if args.clear_cache:
        freed = clear_converted()
        print(f"cleared the conversion cache: {human_bytes(freed)} freed")
    if getattr(args, "remove_cached", None):
        freed = clear_converted(args.remove_cached)  # ModelLoadError (one line) for an unknown name
        print(f"removed {args.remove_cached}: {human_bytes(freed)} freed")
    return 0


def _check_addable(path: str) -> None:
    """Refuse, as a non-GGUF file is refused, a path that holds no readable model: a damaged or
    truncated ``.gguf``, a folder with no model in it. A readable model of a family AttnScope does
    not run (Gemma 2) is still added, and listed as not supported with its reason.

    Raises:
        ValueError: nothing readable there (the catalog's reason in the message).
    """
    from attnscope.core.loading import describe_model

    p = Path(path).expanduser()
    if not p.exists():
        return  # add_user_path says so
    entries = describe_model.describe_path(p)
    only = entries[0] if len(entries) == 1 else None  # the path itself, not a model inside a library
    if only and not only.supported and not only.architecture and Path(only.path).absolute() == p.absolute():
        raise ValueError(f"cannot add {p}: {only.reason}")
    if not entries:
        raise ValueError(f"cannot add {p}: no model found there")


def run(args) -> int:
    from attnscope.core.io.paths import check_output, write_text
    from attnscope.core.loading import catalog
    from attnscope.core.loading.fit import estimate_entry, free_memory, human_bytes

    if args.context < 1:
        raise ValueError(f"--context must be >= 1, got {args.context}")
    out = check_output(args.json, "--json", stdout=True) if args.json else None
    if args.list_cache or args.clear_cache or getattr(args, "remove_cached", None):
        return _cache(args)
    if args.add:
        _check_addable(args.add)
        p = catalog.add_user_path(args.add)
        print(f"added {p}", file=sys.stderr if args.json == "-" else sys.stdout)  # -: the JSON alone
    if args.remove:
        if not catalog.remove_user_path(args.remove):
            raise ValueError(
                f"{args.remove} is not a user-added path (see {catalog.config_dir() / catalog.USER_FILE})"
            )
        print(
            f"removed {Path(args.remove).expanduser().absolute()}",
            file=sys.stderr if args.json == "-" else sys.stdout,
        )
    entries = catalog.scan()
    free, memory = free_memory(args.backend, args.device)
    quantize = getattr(args, "quantize", "none")
    fits = [
        estimate_entry(
            e,
            args.context,
            args.backend,
            args.device,
            args.dtype,
            free_bytes=free,
            memory=memory,
            quantize=quantize,
        )
        if e.supported
        else None
        for e in entries
    ]
    device_map = getattr(args, "device_map", None)
    device_fits = None
    if device_map:
        from attnscope.core.loading.fit_devices import device_fit_entry, measured_free

        dev_free = measured_free()
        device_fits = [
            device_fit_entry(e, device_map, args.context, args.dtype, quantize, free=dev_free)
            if e.supported and e.n_layers
            else None
            for e in entries
        ]
    if args.json != "-":
        print(format_table(rows(entries, fits, device_fits, args.backend)))
        if device_map:
            where = ", ".join(
                f"{'cuda:' + str(k) if isinstance(k, int) else k} {human_bytes(v)}"
                for k, v in dev_free.items()
            )
            print(f"\nfit per device with --device-map {device_map} (accelerate's placement); free: {where}")
        print(
            f"\n{len(entries)} model(s); fit at {args.context} tokens, {args.dtype}"
            f"{'' if quantize == 'none' else f' + {quantize}'}, {args.backend} on {args.device}: "
            f"{human_bytes(free)} free {memory}"
        )
        refused = [e for e in entries if not e.supported]
        if refused:
            print("\nnot supported:")
            for e in refused:
                print(f"  {e.name}: {e.reason}")
        elsewhere = [(e, e.problem_on(args.backend)) for e in entries if e.supported]
        elsewhere = [(e, why) for e, why in elsewhere if why]
        if elsewhere:
            print(f"\nnot on {args.backend}:")
            for e, why in elsewhere:
                print(f"  {e.name}: {why}")
        noted = [e for e in entries if e.note]
        if noted:
            print("\nnotes:")
            for e in noted:
                print(f"  {e.name}: {e.note}")
    if args.json:
        doc = {
            "context": args.context,
            "backend": args.backend,
            "device": args.device,
            "dtype": args.dtype,
            "quantize": quantize,
            "free_bytes": free,
            "memory": memory,
            "models": [],
        }
        for e, f in zip(entries, fits, strict=True):
            d = asdict(e)
            d["path"] = str(e.path)
            d["group_size"] = e.group_size
            d["fit"] = None if f is None else {**asdict(f), "total_bytes": f.total_bytes}
            if device_fits is not None:
                d["device_fit"] = _device_fit_json(device_fits[entries.index(e)])
            doc["models"].append(d)
        write_text(out, json.dumps(doc, indent=1))
    return 0
