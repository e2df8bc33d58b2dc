"""Which heads matter on the MLX backend: :mod:`attnscope.core.analysis.head_effects`'s ablation, exact and
attribution patching, direct logit attribution and logit lens, through the MLX models' intervention seams
(:mod:`attnscope.core.backends.mlx_interventions`) instead of torch module hooks. Written against the
backend-neutral :class:`attnscope.core.backends.head_sites.HeadSites`: numpy in and out, no MLX here.

Same arguments, checks, results and numbers as the torch path (tests/core/test_mlx_heads.py: within 1e-4
of the torch backend on the same weights). :mod:`attnscope.core.analysis.head_effects` calls these when
the session's backend is MLX (:data:`attnscope.core.analysis.head_effects.BACKEND_IMPLS`, filled by this
module when the package is imported).

Cost: the read-out scope runs every unit of a layer (its query heads, GQA groups, K/V sides) as the rows
of one decode step over the prefix's KV cache, from the layer on; ``everywhere`` runs the layers from the
unit's on over every position, a few units per batch. The hand-written families only (llama, mistral,
qwen2, qwen3); mlx-lm's are refused in one line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from attnscope.core import backend_registry as registry
from attnscope.core.analysis import head_effects as he
from attnscope.core.analysis.logit_lens import LogitLens, lens_positions
from attnscope.core.backends.head_sites import HeadRunner, HeadSites, RowEdit
from attnscope.core.errors import BadArgument, UnsupportedModelError

if TYPE_CHECKING:
    from attnscope.core.session import Session

#: the site keys a unit of each site replaces (as :func:`attnscope.core.analysis.head_effects._site_modules`)
_KEYS = {"output": ("z",), "query": ("q",), "kv": ("k", "v")}


def _sites(session: Session) -> HeadSites:
    from attnscope.core.backends.mlx_interventions import sites_of

    return sites_of(session.backend)


def _rows(u, values: dict | None) -> list[RowEdit]:
    return [
        RowEdit(key, tuple(u.heads), None if values is None else values.get((key, u.layer)))
        for key in _KEYS[u.site]
    ]


def _sweep(
    run: HeadRunner,
    units: Sequence,
    values: dict | None,
    measure: Callable[[np.ndarray], float],
    cancelled: Callable[[], bool] | None,
    progress: Callable[[int, int], None] | None,
    done: int,
    total: int,
) -> Iterator[tuple[Any, float]]:
    """``(unit, measure(logits))`` for every unit, in order; a layer's units run together in batches of
    at most ``run.max_rows`` the first time one of them is reached. ``cancelled()`` is checked before each
    unit and ``progress(done, total)`` called after each, as on the torch path."""
    per_layer: dict[int, list] = {}
    for u in units:
        per_layer.setdefault(u.layer, []).append(u)
    got: dict = {}
    for i, u in enumerate(units):
        he._check(cancelled, done + i, total)
        if u not in got:
            us = per_layer[u.layer]
            for b in range(0, len(us), run.max_rows):
                chunk = us[b : b + run.max_rows]
                logits = run.batch(u.layer, [_rows(x, values) for x in chunk])
                got.update({x: measure(row) for x, row in zip(chunk, logits, strict=True)})
        yield u, got[u]
        if progress is not None:
            progress(done + i + 1, total)


# -- ablation -------------------------------------------------------------------------------------------
def head_effects(
    session: Session,
    target=None,
    method: str = "zero",
    scope: str = "readout",
    source=None,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    layers: Sequence[int] | None = None,
    kv_side: bool = True,
):
    """:func:`attnscope.core.analysis.head_effects.head_effects` on the MLX backend."""
    if method not in he.METHODS:
        raise BadArgument(f"method must be one of {', '.join(he.METHODS)}, got {method!r}")
    if scope not in he.SCOPES:
        raise BadArgument(f"scope must be one of {', '.join(he.SCOPES)}, got {scope!r}")
    target = he.make_target(session) if target is None else target
    sites = _sites(session)
    info = session.info
    p = target.position
    ids = session.ids[: p + 1]
    sweep = he._layers_of(session, layers)
    units = he._units(session, None, sweep, kv_side)  # type: ignore[arg-type]  # the torch parts are unused
    keys = ("z", "k", "v") if kv_side else ("z",)
    values: dict | None = None
    if method == "mean":
        _, got = sites.capture(ids, keys)
        values = {key: r.mean(axis=0, keepdims=True) for key, r in got.items()}
    elif method == "resample":
        src = he._source_ids(session, source, p + 1)
        _, values = sites.capture(src[: p + 1], keys)
        if scope == "readout":
            values = {key: r[-1:] for key, r in values.items()}
    run = sites.runner(ids, scope)
    clean_logits = run.clean
    clean = target.value(clean_logits, clean_logits)
    out = {
        "query": np.full((info.n_layers, info.n_heads), np.nan),
        "kv": np.full((info.n_layers, info.n_kv_heads), np.nan),
        "kv_side": np.full((info.n_layers, info.n_kv_heads), np.nan),
    }

    def measure(logits: np.ndarray) -> float:
        effect = target.value(logits, clean_logits)
        return effect if target.kind == "kl" else effect - clean

    for u, effect in _sweep(run, units, values, measure, cancelled, progress, 0, len(units)):
        out[u.row][u.layer, u.col] = effect
    return he.HeadEffects(
        out["query"],
        out["kv"],
        clean,
        target,
        method,
        scope,
        sweep,
        kv_side=out["kv_side"] if kv_side else None,
        reused=True,
    )


# -- activation patching ----------------------------------------------------------------------------------
def _patch_setup(session: Session, corrupt, target, scope: str, site: str, layers):
    if scope not in he.SCOPES:
        raise BadArgument(f"scope must be one of {', '.join(he.SCOPES)}, got {scope!r}")
    if site not in he.SITES:
        raise BadArgument(f"site must be one of {', '.join(he.SITES)}, got {site!r}")
    target = he._patch_target(session, target)
    sites = _sites(session)
    p = target.position
    clean_ids = session.ids[: p + 1]
    bad = he._corrupt_ids(session, corrupt, p)
    sweep = he._layers_of(session, layers)
    return target, sites, clean_ids, bad, sweep


def patch_heads(
    session: Session,
    corrupt,
    target=None,
    scope: str = "everywhere",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    site: str = "output",
    layers: Sequence[int] | None = None,
):
    """:func:`attnscope.core.analysis.head_effects.patch_heads` on the MLX backend."""
    target, sites, clean_ids, bad, sweep = _patch_setup(session, corrupt, target, scope, site, layers)
    info = session.info
    units = he._units(session, None, sweep, False, site)  # type: ignore[arg-type]
    keys = _KEYS[site]
    total = 2 * len(units)
    out = {
        k: np.full((info.n_layers, n), np.nan)
        for k, n in (
            ("dn", info.n_heads),
            ("ns", info.n_heads),
            ("dkv", info.n_kv_heads),
            ("nkv", info.n_kv_heads),
        )
    }
    t, rows = {}, {}
    for name, run_ids in (("clean", clean_ids), ("corrupt", bad)):
        logits, rows[name] = sites.capture(run_ids, keys)
        t[name] = target.value(logits)
        if scope == "readout":
            rows[name] = {k: r[-1:] for k, r in rows[name].items()}
    diff = t["clean"] - t["corrupt"]
    done = 0
    for into, src, d in (("corrupt", "clean", "d"), ("clean", "corrupt", "n")):
        run = sites.runner(bad if into == "corrupt" else clean_ids, scope)
        for u, tv in _sweep(run, units, rows[src], target.value, cancelled, progress, done, total):
            frac = ((tv - t["corrupt"]) if d == "d" else (t["clean"] - tv)) / diff if diff else np.nan
            name = ("dn" if d == "d" else "ns") if u.row == "query" else ("dkv" if d == "d" else "nkv")
            out[name][u.layer, u.col] = frac
        done += len(units)
    return he.PatchResult(
        out["dn"], out["ns"], out["dkv"], out["nkv"], t["clean"], t["corrupt"], target, scope, sweep, site
    )


def attribution_patching(
    session: Session,
    corrupt,
    target=None,
    scope: str = "everywhere",
    site: str = "output",
    directions: Sequence[str] = ("denoise", "noise"),
):
    """:func:`attnscope.core.analysis.head_effects.attribution_patching` on the MLX backend: the gradients
    from ``mx.value_and_grad`` (:meth:`attnscope.core.backends.mlx_interventions.MlxSites.gradients`)."""
    bad_dir = [d for d in directions if d not in ("denoise", "noise")]
    if bad_dir or not directions:
        raise BadArgument(f"directions are 'denoise' and/or 'noise', got {list(directions)!r}")
    target, sites, clean_ids, bad, _ = _patch_setup(session, corrupt, target, scope, site, None)
    sweep = he._layers_of(session, None)
    info = session.info
    D, H, Hkv = info.head_dim, info.n_heads, info.n_kv_heads
    keys = _KEYS[site]

    runs = {"denoise": ("corrupt", "clean"), "noise": ("clean", "corrupt")}
    acts: dict = {}
    grads: dict = {}
    t: dict = {}
    for name, run_ids in (("clean", clean_ids), ("corrupt", bad)):
        logits, acts[name] = sites.capture(run_ids, keys)
        t[name] = target.value(logits)
    for d in directions:
        into = runs[d][0]
        _, grads[into] = sites.gradients(bad if into == "corrupt" else clean_ids, keys, target)
    diff = t["clean"] - t["corrupt"]
    rows = slice(-1, None) if scope == "readout" else slice(None)
    out = {
        k: np.full((info.n_layers, n), np.nan)
        for k, n in (("denoise", H), ("noise", H), ("denoise_kv", Hkv), ("noise_kv", Hkv))
    }
    groups = he._groups(session)
    for d in directions:
        into, src = runs[d]
        per = {}
        for key in keys:
            for layer in sweep:
                delta = (acts[src][(key, layer)] - acts[into][(key, layer)])[rows].astype(np.float64)
                prod = (delta * grads[into][(key, layer)][rows]).sum(0)
                per[(key, layer)] = prod.reshape(-1, D).sum(-1)
        sign = 1.0 if d == "denoise" else -1.0
        for layer in sweep:
            if site == "kv":
                kvh = per[("k", layer)] + per[("v", layer)]
                out[f"{d}_kv"][layer] = sign * kvh / diff if diff else np.nan
                continue
            heads = per[(keys[0], layer)]
            out[d][layer] = sign * heads / diff if diff else np.nan
            out[f"{d}_kv"][layer] = [sign * heads[g].sum() / diff if diff else np.nan for g in groups]
    return he.PatchResult(
        out["denoise"],
        out["noise"],
        out["denoise_kv"],
        out["noise_kv"],
        t["clean"],
        t["corrupt"],
        target,
        scope,
        sweep,
        site,
        "attribution",
    )


# -- direct logit attribution ------------------------------------------------------------------------------
def logit_attribution(session: Session, target=None):
    """:func:`attnscope.core.analysis.head_effects.logit_attribution` on the MLX backend (the hand-written
    families are pre-norm with an RMSNorm before the unembedding and no logit scale), in float64 from the
    run's float32 activations."""
    target = he.make_target(session) if target is None else target
    sites = _sites(session)
    info = session.info
    D, H, L = info.head_dim, info.n_heads, info.n_layers
    ids = session.ids[: target.position + 1]
    logits, got = sites.capture(ids, ("input", "z", "mlp", "resid"), last=True)
    resid = got[("resid", L - 1)][-1].astype(np.float64)
    w_norm, eps = sites.final_norm()
    s_h = np.sqrt(np.mean(resid * resid) + eps)  # the final norm's scale, frozen at this residual
    toks = [target.token] + ([target.other] if target.kind == "logit_diff" else [])
    W = sites.unembedding(toks)
    u = W[0] - (W[1] if target.kind == "logit_diff" else 0.0)
    v = w_norm * u / s_h  # f(c) · u == c · v: the frozen norm and the unembedding direction in one

    heads = np.zeros((L, H))
    attn_bias = np.zeros(L)
    mlp = np.zeros(L)
    emb = got[("input", 0)][-1].astype(np.float64)
    total = emb.copy()
    for i in range(L):
        w_o, b_o = sites.out_proj(i)
        z = got[("z", i)][-1].astype(np.float64)
        per_head = np.stack([w_o[:, h * D : (h + 1) * D] @ z[h * D : (h + 1) * D] for h in range(H)])
        heads[i] = per_head @ v
        if b_o is not None:
            attn_bias[i] = float(b_o @ v)
            total = total + b_o
        m = got[("mlp", i)][-1].astype(np.float64)
        mlp[i] = float(m @ v)
        total = total + per_head.sum(0) + m
    err = float(np.linalg.norm(total - resid) / max(float(np.linalg.norm(resid)), 1e-30))
    if err > 1e-3:
        raise UnsupportedModelError(
            f"{info.architecture}: the residual stream is not the sum of embedding, head and MLP outputs "
            f"(relative difference {err:.1e}), so direct logit attribution is not defined for it"
        )
    x = np.asarray(logits, dtype=np.float64)
    logit = float(x[target.token] - (x[target.other] if target.kind == "logit_diff" else 0.0))
    result = he.LogitAttribution(heads, attn_bias, mlp, float(emb @ v), 0.0, logit, target, err)
    if abs(result.total - logit) > 1e-3 * max(1.0, abs(logit)):
        raise UnsupportedModelError(
            f"{info.architecture}: its logits are not the unembedding of the final norm's output "
            f"(parts sum to {result.total:.4f}, the logit is {logit:.4f}): direct logit attribution is not defined for it"
        )
    return result


# -- logit lens ---------------------------------------------------------------------------------------------
def logit_lens(session: Session, positions: Sequence[int] | None = None, k: int = 5):
    """:func:`attnscope.core.analysis.logit_lens.logit_lens` on the MLX backend."""
    pos = lens_positions(session, positions, k)
    sites = _sites(session)
    final, resid = sites.lens(session.ids[: max(pos) + 1], pos)
    final_ids = np.argmax(final, axis=-1)
    tops, probs, ranks, fprob = [], [], [], []
    for h in resid:
        pr = sites.unembed_probs(h)
        order = np.argsort(-pr, axis=-1)
        tops.append(order[:, :k])
        probs.append(np.take_along_axis(pr, order[:, :k], -1))
        fp = pr[np.arange(len(pos)), final_ids]
        fprob.append(fp)
        ranks.append((pr > fp[:, None]).sum(-1))
    return LogitLens(
        np.asarray(pos),
        np.asarray(tops),
        np.asarray(probs),
        final_ids.astype(np.int64),
        np.asarray(ranks),
        np.asarray(fprob),
    )


# registered under the MLX backend's name (its class's entry in the backend registry)
he.BACKEND_IMPLS[registry.name_for("attnscope.core.backends.mlx_backend", "MlxBackend")] = sys.modules[
    __name__
]
