"""How alike the query heads of a GQA group are, and which KV head they read.

Grouped-query attention (Ainslie et al. 2023): query head
``h`` reads KV head ``h // group_size``, so the ``group_size`` query heads of a group attend over
the *same* keys with different queries. Whether they then look at the same places is measured
row by row with the Jensen–Shannon distance.

Jensen–Shannon distance (Lin 1991; Endres & Schindelin 2003), base 2, between two attention rows
``p`` and ``q`` (distributions over the same keys)::

    m      = (p + q) / 2
    JSD    = ½ Σ_j p_j log2(p_j / m_j) + ½ Σ_j q_j log2(q_j / m_j)      (0 · log 0 = 0)
    JS(p, q) = sqrt(JSD)                                                 ∈ [0, 1]

0 for identical rows, 1 for rows with disjoint support. It is a metric (symmetric, triangle
inequality); ``scipy.spatial.distance.jensenshannon(p, q, base=2)`` computes the same number.

The distance between two *heads* is the mean of JS over query rows ``1 .. n-1``: row 0 sees only
key 0 and is identical (weight 1) in every head, so it carries no information.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core.analysis.aggregate import _check_cancel, robust_max
from attnscope.core.analysis.pooling import max_pool
from attnscope.core.analysis.remotable import remotable

if TYPE_CHECKING:
    from attnscope.core.session import Session


def _js_terms(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Elementwise ``½ p log₂(p/m) + ½ q log₂(q/m)`` with ``m = (p + q)/2`` (0 where ``p`` and ``q`` are 0)."""
    m = 0.5 * (p + q)
    with np.errstate(divide="ignore", invalid="ignore"):
        kp = np.where(p > 0, p * np.log2(np.where(p > 0, p, 1.0) / np.where(m > 0, m, 1.0)), 0.0)
        kq = np.where(q > 0, q * np.log2(np.where(q > 0, q, 1.0) / np.where(m > 0, m, 1.0)), 0.0)
    return 0.5 * kp + 0.5 * kq


def js_distance(p: np.ndarray, q: np.ndarray, axis: int = -1, sink_slot: bool = False) -> np.ndarray:
    """Base-2 Jensen–Shannon distance between distributions along ``axis`` (module docstring).

    Inputs are non-negative and each slice along ``axis`` sums to 1 (attention rows do); they are
    not renormalised. With ``sink_slot`` (a model with learned sinks, gpt-oss: the softmax's missing
    mass sits on the sink slot, :mod:`attnscope.core.trace.softmax_variant`) each slice's residual
    ``1 − Σ`` counts as one more outcome, so the distance is the one between the full softmax
    distributions, sink included; without it the residual is float rounding and is not counted (its
    square root would read as a distance). Computed in float64; returns float64 of the broadcast
    shape without ``axis``, clipped to [0, 1].
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    jsd = _js_terms(p, q).sum(axis=axis)
    if sink_slot:
        rp = np.clip(1.0 - p.sum(axis=axis), 0.0, 1.0)  # the learned sink's share of each slice
        rq = np.clip(1.0 - q.sum(axis=axis), 0.0, 1.0)
        jsd = jsd + _js_terms(rp, rq)
    return np.sqrt(np.clip(jsd, 0.0, 1.0))


def head_distances(
    session: Session,
    layer: int,
    n: int | None = None,
    block_rows: int = 256,
    rows: np.ndarray | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> np.ndarray:
    """Mean JS distance between every pair of query heads of ``layer``, ``(n_heads, n_heads)`` float64.

    Rows ``1 .. n-1`` of the first ``n`` positions (``n`` = seq_len by default), or the given
    ``rows`` (sorted positions ``< n``). Works in bands of ``block_rows`` rows: peak memory
    ``n_heads × block_rows × n`` float32. Diagonal 0, symmetric. A map of one row returns zeros.
    """
    n = session.seq_len if n is None else n
    H = session.info.n_heads
    rows = np.arange(1, n) if rows is None else np.asarray(rows, dtype=np.int64)
    total = np.zeros((H, H), dtype=np.float64)
    if rows.size == 0:
        return total
    # split the row list into contiguous runs, then bands of at most block_rows
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    for run in np.split(rows, breaks):
        for b0 in range(0, run.size, block_rows):
            _check_cancel(cancelled)
            r = slice(int(run[b0]), int(run[min(b0 + block_rows, run.size) - 1]) + 1)
            W = [session.weights(layer, h, r, slice(0, n)).astype(np.float64) for h in range(H)]
            neg_h = [_xlog2x(w).sum(axis=1) for w in W]  # −entropy of each row, bits
            for i in range(H):
                for j in range(i + 1, H):
                    # JSD = H(m) − ½H(p) − ½H(q): one log per cell instead of two
                    jsd = 0.5 * (neg_h[i] + neg_h[j]) - _xlog2x(0.5 * (W[i] + W[j])).sum(axis=1)
                    d = np.sqrt(np.clip(jsd, 0.0, 1.0)).sum()
                    total[i, j] += d
                    total[j, i] += d
    return total / rows.size


def _xlog2x(a: np.ndarray) -> np.ndarray:
    """``a · log2(a)`` with ``0 · log 0 = 0``."""
    out = np.zeros_like(a)
    np.log2(a, out=out, where=a > 0)
    return a * out


def group_summary(dist: np.ndarray, group_size: int) -> tuple[np.ndarray, float, float]:
    """Within-group vs across-group means of a head-distance matrix.

    Returns ``(within, within_mean, across_mean)``: ``within`` ``(n_kv_heads,)`` is the mean
    distance over pairs of distinct heads of each GQA group (NaN for groups of one head);
    ``within_mean`` the mean over all within-group pairs; ``across_mean`` over all pairs of heads
    in different groups (NaN when there is a single group).
    """
    H = dist.shape[0]
    g = max(1, group_size)
    grp = np.arange(H) // g
    iu = np.triu_indices(H, 1)
    same = grp[iu[0]] == grp[iu[1]]
    vals = dist[iu]
    within = np.array([np.mean(vals[same & (grp[iu[0]] == k)]) if g > 1 else np.nan for k in range(H // g)])
    within_mean = float(vals[same].mean()) if same.any() else float("nan")
    across_mean = float(vals[~same].mean()) if (~same).any() else float("nan")
    return within, within_mean, across_mean


def sample_rows(n: int, max_rows: int) -> np.ndarray:
    """Query rows the distances average over: ``1 .. n-1``, or the last ``max_rows`` of them.

    The last rows are taken (one contiguous band, so one exact tile per head): they see the most
    keys, and they are the rows a decode step adds.
    """
    return np.arange(max(1, n - max_rows), n)


def cached_keys(session: Session, layer: int, kv_head: int, n: int | None = None) -> np.ndarray:
    """Post-RoPE keys KV head ``kv_head`` of ``layer`` holds in the KV cache, ``(n, head_dim)`` float32."""
    if not 0 <= kv_head < session.info.n_kv_heads:
        raise IndexError(f"KV head {kv_head} out of range 0..{session.info.n_kv_heads - 1}")
    if not 0 <= layer < session.info.n_layers:
        raise IndexError(f"layer {layer} out of range 0..{session.info.n_layers - 1}")
    keys = session.trace.layers[layer].keys  # (n_kv_heads, S, D): torch tensor or MLX array
    if keys is None:
        raise RuntimeError("nothing captured yet: run a prompt first")
    n = session.seq_len if n is None else n
    k = keys[kv_head, :n]
    if hasattr(k, "detach"):  # torch
        return k.detach().float().cpu().numpy()
    import mlx.core as mx

    return np.array(k.astype(mx.float32), dtype=np.float32)


@dataclass(frozen=True)
class GroupReport:
    """One GQA group of one layer at one step (what the GQA panel draws).

    Attributes:
        layer, kv_head: the selection; heads: the group's query heads.
        n: sequence length shown (``n_prompt + step``).
        maps: ``(group_size, P, P)`` float32, each head's map (exact if ``P == n``, else max-pooled).
        pooled: True when ``maps`` are max-pooled.
        keys: ``(n_k, head_dim)`` float32 cached keys of ``kv_head`` (max-|k| pooled rows if long).
        distances: ``(n_heads, n_heads)`` mean JS distance of the whole layer (base 2).
        within: ``(n_kv_heads,)`` mean within-group distance per group; within_mean, across_mean.
        rows_used: how many query rows the distances average over (all rows 1..n-1, or the last ones).
        layers_within, layers_across: ``(n_layers,)`` the same two means for every layer (on a
            the last ``layer_rows`` rows at most), or None when not asked for.
        auto_max: shared upper colour level of the group's maps (max of
            :func:`attnscope.core.analysis.aggregate.robust_max` over them); keys_absmax: ``max |keys|``.
    """

    layer: int
    kv_head: int
    heads: tuple[int, ...]
    n: int
    maps: np.ndarray
    pooled: bool
    keys: np.ndarray
    distances: np.ndarray
    within: np.ndarray
    within_mean: float
    across_mean: float
    rows_used: int
    layers_within: np.ndarray | None = None
    layers_across: np.ndarray | None = None
    layer_rows: int = 0
    auto_max: float = 1.0
    keys_absmax: float = 1.0


@remotable
def group_report(
    session: Session,
    layer: int,
    kv_head: int,
    n: int | None = None,
    size: int = 256,
    max_rows: int = 512,
    all_layers: bool = False,
    layer_rows: int = 32,
    cancelled: Callable[[], bool] | None = None,
) -> GroupReport:
    """Everything the GQA panel shows for ``(layer, kv_head)`` over the first ``n`` positions.

    Maps larger than ``size`` are max-pooled to ``size × size``; distances use every row
    ``1 .. n-1`` up to ``max_rows`` rows, the last ``max_rows`` beyond (:func:`sample_rows`); the
    per-layer table uses at most the last ``layer_rows`` rows per layer.

    ``session`` may be a :class:`attnscope.core.remote.client.RemoteSession`: the report is then
    computed on the engine (``@remotable``) and arrives identical.

    Raises:
        IndexError: layer or KV head out of range, ``n`` out of range.
    """
    info = session.info
    if not 0 <= layer < info.n_layers:
        raise IndexError(f"layer {layer} out of range 0..{info.n_layers - 1}")
    if not 0 <= kv_head < info.n_kv_heads:
        raise IndexError(f"KV head {kv_head} out of range 0..{info.n_kv_heads - 1}")
    n = session.seq_len if n is None else n
    if not 1 <= n <= session.seq_len:
        raise IndexError(f"n={n} out of range 1..{session.seq_len}")
    g = info.group_size
    heads = tuple(info.group(kv_head))
    per_head = []
    for h in heads:
        _check_cancel(cancelled)
        w = session.weights(layer, h, slice(0, n), slice(0, n))
        per_head.append(max_pool(w, size, size) if n > size else w)
    keys = cached_keys(session, layer, kv_head, n)
    if n > size:  # keep the largest-magnitude value of each block of positions, sign included
        edges = np.linspace(0, n, size + 1).round().astype(int)
        idx = [
            e0 + int(np.argmax(np.abs(keys[e0:e1]).max(axis=1)))
            for e0, e1 in zip(edges[:-1], edges[1:], strict=True)
        ]
        keys = keys[idx]
    rows = sample_rows(n, max_rows)
    dist = head_distances(session, layer, n, rows=rows, cancelled=cancelled)
    within, wm, am = group_summary(dist, g)
    lw = la = None
    if all_layers:
        lw, la, _ = layer_table(session, n, layer_rows, cancelled)
    maps = np.stack(per_head).astype(np.float32)
    return GroupReport(
        layer,
        kv_head,
        heads,
        n,
        maps,
        n > size,
        keys,
        dist,
        within,
        wm,
        am,
        int(rows.size),
        lw,
        la,
        int(sample_rows(n, layer_rows).size) if all_layers else 0,
        max(robust_max(m) for m in maps),
        float(max(np.abs(keys).max(), 1e-6)),
    )


@remotable
def layer_table(
    session: Session, n: int | None = None, max_rows: int = 32, cancelled: Callable[[], bool] | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """Mean within-group and across-group JS distance for every layer.

    Returns ``(within, across, rows_used)``, two ``(n_layers,)`` float64 arrays averaged over
    ``rows_used`` query rows (all rows ``1 .. n-1``, or the last ``max_rows``). Runs on the
    engine for a remote session (``@remotable``).
    """
    info = session.info
    n = session.seq_len if n is None else n
    g = info.group_size
    rows = sample_rows(n, max_rows)
    within, across = np.zeros(info.n_layers), np.zeros(info.n_layers)
    for lyr in range(info.n_layers):
        if not info.arch.has_map(lyr):  # a hybrid model's layer with no map: NaN (attnscope.core.trace.base)
            within[lyr] = across[lyr] = np.nan
            continue
        d = head_distances(session, lyr, n, rows=rows, cancelled=cancelled)
        _, within[lyr], across[lyr] = group_summary(d, g)
    return within, across, int(rows.size)
