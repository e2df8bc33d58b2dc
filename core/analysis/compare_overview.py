"""Overviews of a long Compare head (A, B and A − B) that keep one-cell features.

A and B are max-pooled like the heatmap's overview (:func:`attnscope.core.analysis.pooling.max_pool`, same near-equal
blocks, :func:`attnscope.core.analysis.pooling.block_edges`). A − B is pooled by the *signed max-|d|* reduction: each
block shows the difference of largest magnitude in it, with its sign, so a sink column or a
diagonal that changed between the runs survives the overview (a mean would blur it by the block
size, and max(A) − max(B) can be 0 where the two maps differ at different cells of one block).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from attnscope.core.analysis.pooling import block_edges

BAND_CELLS = 1 << 22  # cells of one run's map computed at a time (16 MB float32)


def signed_absmax_pool(d: np.ndarray, out_rows: int, out_cols: int) -> np.ndarray:
    """Per near-equal block, the entry of largest ``|d|`` with its sign: ``(R, C)`` →
    ``(min(R, out_rows), min(C, out_cols))`` float32 (blocks as :func:`attnscope.core.analysis.pooling.max_pool`).

    Ties between ``+x`` and ``-x`` keep ``+x``.
    """
    d = np.asarray(d, dtype=np.float32)
    re, ce = block_edges(d.shape[0], out_rows), block_edges(d.shape[1], out_cols)
    hi = np.maximum.reduceat(np.maximum.reduceat(d, re[:-1], axis=0), ce[:-1], axis=1)
    lo = np.minimum.reduceat(np.minimum.reduceat(d, re[:-1], axis=0), ce[:-1], axis=1)
    return np.where(hi >= -lo, hi, lo).astype(np.float32)


@dataclass(frozen=True)
class PairOverview:
    """Pooled A, B and A − B of one head over the aligned ``n × n``.

    Attributes:
        a, b: ``(R, C)`` float32 block maxima of A's and B's maps.
        d: ``(R, C)`` float32 signed max-|A − B| per block (:func:`signed_absmax_pool`).
        row_edges, col_edges: int block edges (``R + 1``, ``C + 1`` values from 0 to ``n``).
        n: side of the aligned map.
    """

    a: np.ndarray
    b: np.ndarray
    d: np.ndarray
    row_edges: np.ndarray
    col_edges: np.ndarray
    n: int


def pooled_pair(
    maps: Callable[[slice], tuple[np.ndarray, np.ndarray]],
    n: int,
    out: int,
    cancelled: Callable[[], bool] | None = None,
) -> PairOverview:
    """Overview of A, B and A − B, ``out × out`` blocks at most, from ``maps(rows) -> (wa, wb)``
    (each ``len(rows) × n`` float32, e.g. :func:`attnscope.core.analysis.compare_runs.head_maps`), in bands of whole row
    blocks of about :data:`BAND_CELLS` cells: never a whole ``n × n`` map.

    Equals ``max_pool(A)``, ``max_pool(B)`` and ``signed_absmax_pool(A - B)`` of the whole maps.

    Raises:
        attnscope.core.errors.Cancelled: ``cancelled()`` turned true between bands.
    """
    re, ce = block_edges(n, out), block_edges(n, out)
    R = len(re) - 1
    per = max(1, BAND_CELLS // max(1, n * int(np.diff(re).max())))  # row blocks per band
    pa: list[np.ndarray] = []
    pb: list[np.ndarray] = []
    pd: list[np.ndarray] = []
    for a0 in range(0, R, per):
        if cancelled is not None and cancelled():
            from attnscope.core.errors import Cancelled

            raise Cancelled("cancelled")
        a1 = min(R, a0 + per)
        r0, r1 = int(re[a0]), int(re[a1])
        wa, wb = maps(slice(r0, r1))
        wa, wb = np.asarray(wa, np.float32), np.asarray(wb, np.float32)
        loc = re[a0:a1] - r0
        for w, acc in ((wa, pa), (wb, pb)):
            acc.append(np.maximum.reduceat(np.maximum.reduceat(w, loc, axis=0), ce[:-1], axis=1))
        d = wa - wb
        hi = np.maximum.reduceat(np.maximum.reduceat(d, loc, axis=0), ce[:-1], axis=1)
        lo = np.minimum.reduceat(np.minimum.reduceat(d, loc, axis=0), ce[:-1], axis=1)
        pd.append(np.where(hi >= -lo, hi, lo))
    return PairOverview(
        np.concatenate(pa).astype(np.float32),
        np.concatenate(pb).astype(np.float32),
        np.concatenate(pd).astype(np.float32),
        re,
        ce,
        n,
    )


def block_of(edges: np.ndarray, i: int) -> int:
    """Index of the block of ``edges`` holding position ``i``."""
    return int(np.searchsorted(edges, i, side="right") - 1)
