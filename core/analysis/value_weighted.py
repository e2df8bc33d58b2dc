"""The value-weighted scale: attention weighed by the size of what it moves.

Kobayashi, Kuribayashi, Yokoi & Inui, EMNLP 2020, "Attention is Not Only a Weight: Analyzing
Transformers with Vector Norms", eq. (5)-(6): head ``h``'s output at query ``i`` is
``Σ_j α_ij · f_h(x_j)`` with ``f_h(x_j) = v_j W_O^h`` (key ``j``'s value through head ``h``'s
slice of the output projection, ``W_O^h = o_proj.weight[:, h·D:(h+1)·D]ᵀ``). The size of key
``j``'s contribution is therefore::

    vw[i, j] = α_ij · ‖v_j W_O^h‖                       (float32, same units as the residual)

and, row-normalised (``normalise=True``), ``vw[i, j] / Σ_j' vw[i, j']``: the *share* of the
head's output norm budget that key ``j`` gets (a distribution again, so it can be compared with
Jensen–Shannon like the weights). A sink can take 90 % of a row's weight while its value is
almost zero: its value-weighted share is then small.

Cost: the norms are one number per (head, key), ``O(T · D · hidden)`` per head from the KV cache's
values and ``o_proj`` (the backends' ``value_norms(layer)``), so the scale costs ``O(T)`` on top of
a map. Biases of ``o_proj`` are shared by every key and left out (as in the paper); the values
already contain ``v_proj``'s bias.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core.analysis.aggregate import _check_cancel
from attnscope.core.analysis.remotable import remotable
from attnscope.core.errors import SessionError

if TYPE_CHECKING:
    from attnscope.core.session import Session

ATTENTION = "attention"
VALUE_WEIGHTED = "value-weighted"
WEIGHTINGS = (ATTENTION, VALUE_WEIGHTED)


def check_weighting(weighting: str) -> str:
    """``weighting`` if it is ``"attention"`` or ``"value-weighted"``.

    Raises:
        ValueError: anything else (one line naming the choices).
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}: choose attention or value-weighted")
    return weighting


@remotable
def value_norms(session: Session, layer: int) -> np.ndarray:
    """``‖v_j W_O^h‖`` for every query head ``h`` and key ``j`` of ``layer``: ``(n_heads, seq_len)`` float32.

    Raises:
        SessionError: nothing run yet, or the backend cannot compute them.
        IndexError: ``layer`` out of range.
    """
    session._require_run()
    fn = getattr(session.backend, "value_norms", None)
    if fn is None:
        raise SessionError(f"the {session.backend.name} backend has no value norms")
    try:
        return np.asarray(fn(layer), dtype=np.float32)
    except RuntimeError as e:
        raise SessionError(str(e)) from None


def apply_norms(
    w: np.ndarray, norms: np.ndarray, normalise: bool = False, row_totals: np.ndarray | None = None
) -> np.ndarray:
    """Value-weighted map from weights ``w (n_q, n_k)`` and the keys' norms ``norms (n_k,)``; float32.

    ``normalise`` divides each row by its total ``Σ_j α_ij ‖v_j W_O^h‖``: by ``row_totals (n_q,)``
    when given (a tile of columns needs the totals of whole rows), else by the row sums of the
    result. Rows whose total is 0 (fully masked) stay 0, never NaN.
    """
    out = np.asarray(w, dtype=np.float32) * np.asarray(norms, dtype=np.float32)[None, :]
    if not normalise:
        return out
    tot = out.sum(axis=1, dtype=np.float64) if row_totals is None else np.asarray(row_totals, np.float64)
    safe = np.where(tot > 0, tot, 1.0)
    return np.where(tot[:, None] > 0, out / safe[:, None], 0.0).astype(np.float32)


@remotable
def value_weighted(
    session: Session,
    layer: int,
    head: int,
    rows: slice | None = None,
    cols: slice | None = None,
    normalise: bool = False,
    norms: np.ndarray | None = None,
) -> np.ndarray:
    """One head's value-weighted map ``(n_q, n_k)`` float32 for ``rows × cols`` (module docstring).

    ``norms`` (the layer's :func:`value_norms`) may be passed to reuse them. With ``normalise`` and a
    column tile, the row totals come from the whole rows (exact, one extra row band product).

    Raises:
        SessionError, IndexError: as :meth:`attnscope.core.session.Session.weights`.
    """
    norms = value_norms(session, layer) if norms is None else norms
    n_k = norms.shape[1]
    c = slice(0, n_k) if cols is None else slice(*cols.indices(n_k)[:2])
    w = session.weights(layer, head, rows, c)
    totals = None
    if normalise and (c.start, c.stop) != (0, n_k):
        full = session.weights(layer, head, rows, None)
        totals = full.astype(np.float64) @ norms[head].astype(np.float64)
    return apply_norms(w, norms[head, c], normalise, totals)


@remotable
def value_weighted_sink_rows(
    session: Session,
    key: int = 0,
    normalise: bool = True,
    block_rows: int = 256,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> np.ndarray:
    """Per query row, key ``key``'s value-weighted share ``(n_layers, n_heads, seq_len)`` float64:
    ``α_i,key ‖v_key W_O^h‖ / Σ_j α_ij ‖v_j W_O^h‖`` (``normalise``) or ``α_i,key ‖v_key W_O^h‖``.
    Rows ``i < key`` (which cannot see the key) are 0.

    The row totals need whole rows: ``O(T²)`` per head, computed in bands of ``block_rows`` rows
    (peak ``block_rows × T`` float32), never a ``T × T`` map. ``progress(done, n_layers × n_heads)``
    after each head; ``cancelled()`` checked between heads.

    Raises:
        SessionError: nothing run yet. Cancelled: ``cancelled()`` became true.
    """
    L, H, T = session.info.n_layers, session.info.n_heads, session.seq_len
    out = np.zeros((L, H, T), dtype=np.float64)
    if T <= key:
        return out
    for layer in range(L):
        if not session.info.arch.has_map(layer):  # a hybrid model's layer with no map: NaN (trace.base)
            out[layer] = np.nan
            if progress is not None:
                progress((layer + 1) * H, L * H)
            continue
        norms = value_norms(session, layer).astype(np.float64)  # (H, T)
        for h in range(H):
            _check_cancel(cancelled)
            for r0 in range(key, T, block_rows):
                r = slice(r0, min(r0 + block_rows, T))
                w = session.weights(layer, h, r, None).astype(np.float64)  # (band, T)
                num = w[:, key] * norms[h, key]
                if normalise:
                    tot = w @ norms[h]
                    num = np.where(tot > 0, num / np.where(tot > 0, tot, 1.0), 0.0)
                out[layer, h, r] = num
            if progress is not None:
                progress(layer * H + h + 1, L * H)
    return out


@remotable
def value_weighted_sink_scores(
    session: Session,
    key: int = 0,
    normalise: bool = True,
    block_rows: int = 256,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> np.ndarray:
    """Value-weighted sink mass ``(n_layers, n_heads)`` float64: the mean over rows ``i > key`` of
    :func:`value_weighted_sink_rows` (0 when there is no such row). Same costs and errors."""
    rows = value_weighted_sink_rows(session, key, normalise, block_rows, progress, cancelled)
    T = rows.shape[-1]
    if T <= key + 1:
        return np.zeros(rows.shape[:2])
    return rows[..., key + 1 :].mean(axis=-1)


@remotable
def value_weighted_tile(
    session: Session,
    layer: int,
    head: int,
    mode: str = "head",
    rows: slice | None = None,
    cols: slice | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> np.ndarray:
    """Row-normalised value-weighted map for ``rows × cols``, averaged over the heads ``mode`` names
    (:func:`attnscope.core.analysis.aggregate.heads_in`: one head, its KV group, its layer, all layers); ``(n_q, n_k)`` float32.

    Each head's rows are normalised over their whole row first (so an aggregate is a mean of
    distributions, like the attention aggregates). ``cancelled`` is checked between heads.

    Raises:
        ValueError: unknown mode. IndexError: layer/head out of range. SessionError: nothing run.
        Cancelled: ``cancelled()`` became true.
    """
    from attnscope.core.analysis.aggregate import heads_in

    pairs = heads_in(session.info, layer, head, mode)
    acc: np.ndarray | None = None
    norms_of: dict[int, np.ndarray] = {}
    for lyr, h in pairs:
        _check_cancel(cancelled)
        if lyr not in norms_of:
            norms_of.clear()
            norms_of[lyr] = value_norms(session, lyr)
        w = value_weighted(session, lyr, h, rows, cols, normalise=True, norms=norms_of[lyr]).astype(
            np.float64
        )
        acc = w if acc is None else acc + w
    assert acc is not None, "heads_in() gives at least one head"
    return (acc / len(pairs)).astype(np.float32)
