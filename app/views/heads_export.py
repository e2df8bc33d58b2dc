"""The "Which heads matter" tab's results on disk: the CSV export (a row per head and per GQA group, the
provenance in ``#`` lines) and the JSON copies a session file keeps, read back
(:func:`result_from_json`, :func:`lens_from_json`; patching: :func:`attnscope.app.views.heads_patch.patch_from_json`)."""

from __future__ import annotations

import csv
import io
import json

import numpy as np


def csv_text(
    data: dict, result: tuple | None, patch: dict | None, shape: tuple[int, int, int], layers
) -> str:
    """The CSV export: ``# key: value`` provenance lines (model, prompt, target, method, scope; the patching's
    corrupted prompt and ids, site, method, scope), then ``layer,head,kv_head`` and a column per array the
    results have (``effect``, ``direct_logit_attribution``, ``patch_denoise``, ``patch_noise``,
    ``attribution_denoise``, ``attribution_noise``): a row per query head of ``layers``, then a ``group`` row
    per KV head. ``data`` is :meth:`HeadsView.export_data`, ``shape`` ``(n_layers, n_heads, n_kv_heads)``."""
    _L, H, n_kv = shape
    g = H // max(1, n_kv)
    buf = io.StringIO()
    head = data if result is not None else data.get("patching", {})
    for k in ("model", "prompt", "target", "target_text", "other_text", "method", "scope"):
        if k in head:
            buf.write(f"# {k}: {json.dumps(head[k], ensure_ascii=False)}\n")
    if patch is not None:
        pp = data["patching"]
        for k in ("corrupt_prompt", "corrupt_ids", "site", "method", "scope"):
            if k in pp:
                buf.write(f"# patching {k}: {json.dumps(pp[k], ensure_ascii=False)}\n")
    cols: list[tuple[str, np.ndarray | None, np.ndarray | None]] = []  # name, per head, per group
    if result is not None:
        eff, dla = result[0], result[1]
        cols.append(("effect", eff.query, eff.kv))
        cols.append(("direct_logit_attribution", None if dla is None else dla.heads, None))
    if patch is not None:
        for name, pr in (("patch", patch["exact"]), ("attribution", patch["attribution"])):
            if pr is not None:
                cols.append((f"{name}_denoise", pr.denoise, pr.denoise_kv))
                cols.append((f"{name}_noise", pr.noise, pr.noise_kv))
    w = csv.writer(buf)
    w.writerow(["layer", "head", "kv_head", *(c[0] for c in cols)])
    fmt = lambda a, i, j: "" if a is None or not np.isfinite(a[i, j]) else f"{a[i, j]:.7g}"  # noqa: E731
    for layer in layers:
        for h in range(H):
            w.writerow([layer, h, h // g, *(fmt(q, layer, h) for _n, q, _kv in cols)])
        for kv in range(n_kv):
            w.writerow([layer, "group", kv, *(fmt(k, layer, kv) for _n, _q, k in cols)])
    return buf.getvalue()


def same_json(a: dict, b: dict) -> bool:
    """Whether two results' JSON are the same (NaN equal to NaN, as JSON writes both)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def result_from_json(data: dict) -> tuple:
    """The tab's result tuple rebuilt from :meth:`HeadsView.export_data` (a session file's copy).

    Raises:
        KeyError, TypeError, ValueError: a dict that is not such an export."""
    from attnscope.core.analysis.head_effects import HeadEffects, LogitAttribution, Target

    t = Target(**{k: data["target"][k] for k in ("kind", "position", "token", "other")})
    arr = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    eff = HeadEffects(
        arr(data["query_heads"]),
        arr(data["kv_heads"]),
        float(data["clean"]),
        t,
        str(data["method"]),
        str(data["scope"]),
        tuple(int(i) for i in data["layers"]),
        kv_side=arr(data["kv_side"]) if data.get("kv_side") is not None else None,
    )
    d = data.get("direct_logit_attribution")
    dla = None
    if isinstance(d, dict):
        dla = LogitAttribution(
            arr(d["heads"]),
            arr(d["attn_bias"]),
            arr(d["mlp"]),
            float(d["embedding"]),
            float(d["constant"]),
            float(d["logit"]),
            t,
            0.0,
        )
    prov = {
        k: v
        for k, v in data.items()
        if k not in ("query_heads", "kv_heads", "kv_side", "direct_logit_attribution")
    }
    return (
        eff,
        dla,
        str(data.get("direct_logit_attribution_note", "")),
        data.get("target_text") or "",
        data.get("other_text") or "",
        prov,
    )


def lens_from_json(data: dict) -> tuple:
    """The tab's logit-lens tuple rebuilt from its saved JSON (:meth:`HeadsView.view_state`'s ``"lens"``).

    Raises:
        KeyError, TypeError, ValueError: a dict that is not such a copy."""
    from attnscope.core.analysis.logit_lens import LogitLens

    lens = LogitLens(
        np.asarray(data["positions"], dtype=np.int64),
        np.asarray(data["top_ids"], dtype=np.int64),
        np.asarray(data["top_probs"], dtype=np.float64),
        np.asarray(data["final_ids"], dtype=np.int64),
        np.asarray(data["final_rank"], dtype=np.int64),
        np.asarray(data["final_prob"], dtype=np.float64),
    )
    if lens.top_ids.ndim != 3 or lens.top_ids.shape[1] != len(lens.positions):
        raise ValueError("not a logit lens")
    texts = {int(k): str(v) for k, v in dict(data["texts"]).items()}
    keys = (
        "positions",
        "top_ids",
        "top_probs",
        "final_ids",
        "final_rank",
        "final_prob",
        "texts",
        "position_texts",
    )
    prov = {k: v for k, v in data.items() if k not in keys}
    return lens, texts, [str(x) for x in data["position_texts"]], prov
