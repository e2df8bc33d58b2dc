"""Max-pooling of attention maps for overviews and thumbnails.

A long map (T = 8192 → 67 M cells) cannot be drawn crisply; its overview is the *max* over each
block of cells, so a single strong weight (a sink column, a previous-token diagonal) stays visible
instead of being averaged away. Exact tiles are then recomputed on zoom (:meth:`TorchTrace.weights`
with ``rows``/``cols``).
"""

from __future__ import annotations

import numpy as np


def block_edges(n: int, out: int) -> np.ndarray:
    """``out + 1`` integer edges splitting ``range(n)`` into ``out`` near-equal blocks (``out <= n``)."""
    out = max(1, min(out, n))
    return np.linspace(0, n, out + 1).round().astype(int)


def max_pool(w: np.ndarray, out_rows: int, out_cols: int) -> np.ndarray:
    """Max over near-equal blocks: ``(R, C)`` → ``(min(R, out_rows), min(C, out_cols))`` float32."""
    w = np.asarray(w, dtype=np.float32)
    re, ce = block_edges(w.shape[0], out_rows), block_edges(w.shape[1], out_cols)
    rows = np.maximum.reduceat(w, re[:-1], axis=0)
    return np.maximum.reduceat(rows, ce[:-1], axis=1)


def mean_pool(w: np.ndarray, out_rows: int, out_cols: int) -> np.ndarray:
    """Mean over the same near-equal blocks as :func:`max_pool` (masked cells count as 0): float32.

    Blurs one-cell features (a sink column, a diagonal) by the block size; :func:`max_pool` keeps them.
    """
    w = np.asarray(w, dtype=np.float64)
    re, ce = block_edges(w.shape[0], out_rows), block_edges(w.shape[1], out_cols)
    sums = np.add.reduceat(np.add.reduceat(w, re[:-1], axis=0), ce[:-1], axis=1)
    return (sums / (np.diff(re)[:, None] * np.diff(ce)[None, :])).astype(np.float32)
