"""Blocked aggregates for long maps: head-grid thumbnails, means over heads, pooled overviews.

A view of a long prompt never needs ``heads × T × T`` weights at once. Every function here walks
the map in *row bands* (a few hundred query rows, sized so one band of all the heads in a call fits
``budget`` float32 elements), computes each band for all the wanted heads of a layer with one
batched matmul (:meth:`attnscope.core.trace.torch_trace.TorchTrace.weights_block`: torch on the trace's device,
bfloat16 matmul where the model is bfloat16), and pools it into the output at once:

* **max pooling** (the default; a sink column or a diagonal one cell wide survives it): per head,
  the max of the *log*-weights ``q·k·scale − lse`` over each block, exponentiated once at the end
  (``exp`` is monotone, so ``max exp(x) = exp(max x)``): no exponential per cell at all.
* **mean pooling**: the block mean of the weights (masked cells count as 0), one ``exp`` per cell.
* **means over heads** (KV group, layer, all layers; :mod:`attnscope.core.analysis.aggregate`): per band, the weights
  of each layer's heads summed into one ``band × n`` accumulator, then pooled.

Causal structure is used, not computed: a band of rows ``r0:r1`` sees only keys ``< r1`` (and, for a
sliding-window layer of width ``W``, keys ``> r0 − W``), so the upper triangle (and, for Gemma's
local layers, everything outside the window band) is never multiplied.

Bands run in coarse-to-fine order (:func:`coarse_to_fine`: first, middle, quarters, ...): a
``partial`` callback receives a display copy after each band, with rows not computed yet filled
from the nearest computed row, so a long view shows its whole structure early and sharpens.
``cancelled()`` is checked before every block; it raises :class:`attnscope.core.errors.Cancelled`.

Results equal the direct computation (``attnscope.core.analysis.pooling.max_pool(map_at(...))`` etc., see
``tests/test_blocked.py``) up to float32 summation order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from attnscope.core.analysis.pooling import block_edges
from attnscope.core.errors import Cancelled

POOLINGS = ("max", "mean")
BUDGET = 1 << 24  # float32 elements per band block (64 MB): heads × band rows × visible keys

Partial = Callable[[np.ndarray, float], None]  # (display copy, fraction of the work done)


class _ThreadsForLoad:
    """Run torch on one thread while the machine is oversubscribed (1-minute load average above
    1.5 × the cores), restoring the thread count after.

    Measured here (2 cores, load average 19-23 from other processes): the mean of 270 heads at
    T = 300 took 21.8 s on torch's 2 threads and 2.5 s on one, because every op waits at a barrier
    for the thread the scheduler preempted. Nested uses keep the outermost setting.
    """

    depth = 0

    def __enter__(self):
        import os

        _ThreadsForLoad.depth += 1
        self.saved = None
        if _ThreadsForLoad.depth == 1 and torch.get_num_threads() > 1:
            try:
                busy = os.getloadavg()[0] > 1.5 * (os.cpu_count() or 1)
            except OSError:
                busy = False
            if busy:
                self.saved = torch.get_num_threads()
                torch.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        _ThreadsForLoad.depth -= 1
        if self.saved is not None:
            torch.set_num_threads(self.saved)
        return False


def _check(cancelled: Callable[[], bool] | None) -> None:
    if cancelled is not None and cancelled():
        raise Cancelled("cancelled")


def block(
    trace,
    layer: int,
    heads: Sequence[int],
    rows: slice,
    cols: slice,
    *,
    log: bool = False,
    fast: bool = False,
) -> torch.Tensor:
    """``(len(heads), n_q, n_k)`` float32 torch weights (or log-weights, ``-inf`` masked) of ``layer``.

    Every trace has ``weights_block`` (torch: one batched matmul; MLX: stacked exact heads).
    """
    return trace.weights_block(layer, heads, rows, cols, log=log, fast=fast)


def visible_cols(trace, layer: int, r0: int, r1: int) -> tuple[int, int]:
    """Key range ``[c0, c1)`` any of the rows ``r0:r1`` of ``layer`` can see (causal, sliding window)."""
    window = trace.layers[layer].sliding_window
    c0 = 0 if window is None else max(0, r0 - window + 1)
    return c0, r1


def coarse_to_fine(n: int) -> list[int]:
    """``0 .. n-1`` in coarse-to-fine order: 0, then the middle, the quarters, the eighths, ...

    (the bit-reversal / van der Corput order: every prefix is spread evenly over the range).
    """
    if n <= 1:
        return list(range(n))
    bits = int(np.ceil(np.log2(n)))
    rev = [int(f"{i:0{bits}b}"[::-1], 2) for i in range(1 << bits)]
    return [i for i in rev if i < n]


def bands(n: int, n_heads: int, block_rows: int | None = None, budget: int = BUDGET) -> list[tuple[int, int]]:
    """Row bands ``(r0, r1)`` covering ``0..n``: ``block_rows`` rows each, or as many as keep
    ``n_heads × rows × n`` within ``budget`` float32 elements (at least 1 row)."""
    rows = block_rows if block_rows else max(1, budget // max(1, n_heads * n))
    rows = max(1, min(rows, n))
    return [(a, min(n, a + rows)) for a in range(0, n, rows)]


def fill_missing_rows(image: np.ndarray, done: np.ndarray) -> np.ndarray:
    """A display copy of ``image`` (rows on axis -2) with rows where ``done`` is False copied from
    the nearest done row (ties go up). Returns ``image`` unchanged when no row is done."""
    done = np.asarray(done, bool)
    if done.all() or not done.any():
        return image.copy()
    idx = np.flatnonzero(done)
    rows = np.arange(done.size)
    pos = np.searchsorted(idx, rows)
    left, right = idx[(pos - 1).clip(0, len(idx) - 1)], idx[pos.clip(0, len(idx) - 1)]
    nearest = np.where(np.abs(rows - left) <= np.abs(right - rows), left, right)
    return image[..., nearest, :].copy()


class _Pooler:
    """Pools bands of ``(H, n_q, n_k)`` values into ``(H, R, C)`` block maxima or sums.

    ``log``: values are log-weights (max pooling only; the output is exponentiated by :meth:`image`).
    """

    def __init__(self, n_heads: int, n: int, out_rows: int, out_cols: int, pooling: str, log: bool, device):
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; choose {' or '.join(POOLINGS)}")
        self.pooling, self.log, self.n = pooling, log, n
        self.re, self.ce = block_edges(n, out_rows), block_edges(n, out_cols)
        R, C = len(self.re) - 1, len(self.ce) - 1
        fill = float("-inf") if log else 0.0
        self.out = torch.full(
            (n_heads, R, C), fill, dtype=torch.float32 if pooling == "max" else torch.float64, device=device
        )
        self.col_id = torch.from_numpy(np.searchsorted(self.ce, np.arange(n), side="right") - 1).to(device)
        self.row_id = np.searchsorted(self.re, np.arange(n), side="right") - 1
        self.rows_done = np.zeros(R, bool)

    def add(self, v: torch.Tensor, r0: int, c0: int, heads: slice | None = None) -> None:
        """Pool ``v`` ``(h, n_q, n_k)``: rows ``r0..``, cols ``c0..`` into heads ``heads`` of the output."""
        heads = slice(None) if heads is None else heads
        nq, nk = v.shape[1], v.shape[2]
        if nq == 0 or nk == 0:
            return
        ids = self.col_id[c0 : c0 + nk].expand(v.shape[0], nk)
        a, a_last = int(self.row_id[r0]), int(self.row_id[r0 + nq - 1])
        for blk in range(a, a_last + 1):
            lo, hi = max(int(self.re[blk]), r0) - r0, min(int(self.re[blk + 1]), r0 + nq) - r0
            seg = v[:, lo:hi]
            red = seg.amax(dim=1) if self.pooling == "max" else seg.sum(dim=1, dtype=torch.float64)
            dst = self.out[heads, blk]  # (h, C)
            acc = torch.full_like(dst, float("-inf") if self.log else 0.0)
            acc.scatter_reduce_(1, ids, red.to(acc.dtype), reduce="amax" if self.pooling == "max" else "sum")
            self.out[heads, blk] = torch.maximum(dst, acc) if self.pooling == "max" else dst + acc

    def mark(self, r0: int, r1: int) -> None:
        self.rows_done[int(self.row_id[r0]) : int(self.row_id[r1 - 1]) + 1] = True

    def image(self) -> np.ndarray:
        """``(H, R, C)`` float32 pooled weights."""
        out = self.out
        if self.log:
            out = torch.exp(out)
        if self.pooling == "mean":
            rows = torch.from_numpy(np.diff(self.re)).to(out.device, torch.float64)
            cols = torch.from_numpy(np.diff(self.ce)).to(out.device, torch.float64)
            out = out / (rows[:, None] * cols[None, :])
        return out.float().cpu().numpy()


def _load_aware(fn):
    import functools

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        with _ThreadsForLoad():
            return fn(*a, **kw)

    return wrapper


def _order(band_list: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [band_list[i] for i in coarse_to_fine(len(band_list))]


@_load_aware
def pooled_heads(
    trace,
    layer: int,
    heads: Sequence[int],
    n: int,
    out_rows: int,
    out_cols: int | None = None,
    pooling: str = "max",
    *,
    block_rows: int | None = None,
    budget: int = BUDGET,
    fast: bool = True,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    partial: Partial | None = None,
) -> np.ndarray:
    """Per-head pooled maps of the first ``n`` positions of ``layer``: ``(len(heads), R, C)`` float32,
    ``R = min(n, out_rows)``, ``C = min(n, out_cols)`` (default ``out_rows``).

    Cell ``(h, a, b)`` is the max (or mean, masked cells as 0) of head ``heads[h]``'s exact weights
    over rows ``block_edges(n, R)[a:a+2]`` and cols ``block_edges(n, C)[b:b+2]``. Peak extra memory
    about ``budget`` float32 elements (plus the output). ``progress(done, total)`` after each band,
    ``partial(image, fraction)`` with a display copy (:func:`fill_missing_rows`).

    Raises:
        ValueError: unknown pooling. IndexError: layer/head out of range or ``n`` beyond the trace.
        Cancelled: ``cancelled()`` turned true.
    """
    out_cols = out_rows if out_cols is None else out_cols
    heads = list(heads)
    _check_n(trace, n)
    log = pooling == "max"
    pool = _Pooler(len(heads), n, out_rows, out_cols, pooling, log, _device(trace))
    plan = _order(bands(n, len(heads), block_rows, budget))
    for k, (r0, r1) in enumerate(plan):
        _check(cancelled)
        c0, c1 = visible_cols(trace, layer, r0, r1)
        pool.add(block(trace, layer, heads, slice(r0, r1), slice(c0, c1), log=log, fast=fast), r0, c0)
        pool.mark(r0, r1)
        if progress is not None:
            progress(k + 1, len(plan))
        if partial is not None and k + 1 < len(plan):
            partial(fill_missing_rows(pool.image(), pool.rows_done), (k + 1) / len(plan))
    return pool.image()


def _by_layer(pairs: Sequence[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for layer, head in pairs:
        out.setdefault(int(layer), []).append(int(head))
    return out


def _device(trace):
    for rec in getattr(trace, "layers", []):
        keys = getattr(rec, "keys", None)
        if isinstance(keys, torch.Tensor):
            return keys.device
    return torch.device("cpu")


def _check_n(trace, n: int) -> None:
    if not 1 <= n <= trace.seq_len:
        raise IndexError(f"n={n} out of range 1..{trace.seq_len}")


@_load_aware
def mean_band(
    trace,
    pairs: Sequence[tuple[int, int]],
    rows: slice,
    cols: slice,
    *,
    fast: bool = False,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """Exact mean weights over the ``(layer, head)`` ``pairs`` for ``rows × cols``: ``(n_q, n_k)``
    float32 torch (float64 accumulator over layers; one batched block per layer, only the keys the
    layer's mask lets the rows see). ``progress(heads_done)`` after each layer."""
    groups = _by_layer(pairs)
    nq, nk = rows.stop - rows.start, cols.stop - cols.start
    acc = torch.zeros((nq, nk), dtype=torch.float64, device=_device(trace))
    done = 0
    for layer, heads in groups.items():
        _check(cancelled)
        v0, v1 = visible_cols(trace, layer, rows.start, rows.stop)
        c0, c1 = max(cols.start, v0), min(cols.stop, v1)
        if c1 > c0:
            w = block(trace, layer, heads, rows, slice(c0, c1), fast=fast)
            acc[:, c0 - cols.start : c1 - cols.start] += w.sum(dim=0, dtype=torch.float64)
        done += len(heads)
        if progress is not None:
            progress(done)
    return (acc / max(1, len(pairs))).float()


@_load_aware
def pooled_mean(
    trace,
    pairs: Sequence[tuple[int, int]],
    n: int,
    out_rows: int,
    out_cols: int | None = None,
    pooling: str = "max",
    *,
    block_rows: int | None = None,
    budget: int = BUDGET,
    fast: bool = True,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    partial: Partial | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pooled overview of the mean over heads ``pairs`` of the ``n × n`` map: ``(image (R, C) float32,
    row_edges, col_edges)``. ``image[a, b]`` = max (or mean) of the exact mean map over the block.

    ``progress(done, total)`` counts heads × bands (one call per head of each band, as
    :func:`attnscope.core.analysis.aggregate.pooled_map` always has); ``partial`` as in :func:`pooled_heads`.
    Raises as :func:`pooled_heads`.
    """
    out_cols = out_rows if out_cols is None else out_cols
    _check_n(trace, n)
    per_layer = max(len(h) for h in _by_layer(pairs).values())
    pool = _Pooler(1, n, out_rows, out_cols, pooling, False, _device(trace))
    plan = _order(bands(n, per_layer + 2, block_rows, budget))
    total = len(plan) * len(pairs)
    for k, (r0, r1) in enumerate(plan):
        base = k * len(pairs)

        def head_progress(done, base=base):
            if progress is not None:
                for i in range(head_progress.last + 1, done + 1):
                    progress(base + i, total)
                head_progress.last = done

        head_progress.last = 0
        m = mean_band(
            trace, pairs, slice(r0, r1), slice(0, r1), fast=fast, cancelled=cancelled, progress=head_progress
        )
        pool.add(m[None], r0, 0)
        pool.mark(r0, r1)
        if partial is not None and k + 1 < len(plan):
            partial(fill_missing_rows(pool.image()[0], pool.rows_done), (k + 1) / len(plan))
    return pool.image()[0], pool.re, pool.ce


@_load_aware
def thumbnails(
    trace,
    n: int,
    size: int = 40,
    pooling: str = "max",
    *,
    budget: int = BUDGET,
    fast: bool = True,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    partial: Partial | None = None,
) -> np.ndarray:
    """Pooled maps of every head over the first ``n`` positions: ``(n_layers, n_heads, P, P)`` float32,
    ``P = min(n, size)``. One layer at a time, all its heads per batched block; ``progress(heads_done,
    n_layers × n_heads)`` once per head as each layer completes; ``partial(thumbs, fraction)`` after
    each layer but the last (layers not done yet are zeros)."""
    _check_n(trace, n)
    return layer_by_layer(
        trace.n_layers,
        trace.n_heads,
        min(n, size),
        lambda layer: pooled_heads(
            trace,
            layer,
            range(trace.n_heads),
            n,
            size,
            size,
            pooling,
            budget=budget,
            fast=fast,
            cancelled=cancelled,
        ),
        progress=progress,
        partial=partial,
    )


def layer_by_layer(
    n_layers: int,
    n_heads: int,
    P: int,
    layer_fn: Callable[[int], np.ndarray],
    *,
    progress: Callable[[int, int], None] | None = None,
    partial: Partial | None = None,
) -> np.ndarray:
    """``(n_layers, n_heads, P, P)`` float32 thumbnails filled one layer at a time by ``layer_fn(layer)``
    (``(n_heads, P, P)``); ``progress(heads_done, n_layers × n_heads)`` once per head as each layer
    completes, ``partial(copy, fraction)`` after each layer but the last (later layers are zeros)."""
    out = np.zeros((n_layers, n_heads, P, P), dtype=np.float32)
    for layer in range(n_layers):
        out[layer] = layer_fn(layer)
        if progress is not None:
            for h in range(n_heads):
                progress(layer * n_heads + h + 1, n_layers * n_heads)
        if partial is not None and layer + 1 < n_layers:
            partial(out.copy(), (layer + 1) / n_layers)
    return out
