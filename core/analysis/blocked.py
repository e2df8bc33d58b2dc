"""Blocked aggregates for long maps: head-grid thumbnails, means over heads, pooled overviews.

A view of a long prompt never needs ``heads × T × T`` weights at once. Every function here walks
the map in *row bands* (a few hundred query rows, sized so one band of all the heads in a call fits
``budget`` float32 elements), computes each band for all the wanted heads of a layer in column
*tiles* of about ``TILE`` elements (one batched matmul per tile with the LSE folded into it,
:class:`attnscope.core.analysis.score_blocks.LayerBlocks`; torch on the trace's device), and pools
each tile while it is still in the CPU's cache. A tile multiplies only the rows that can see one of
its keys (:func:`tile_rows`):

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
``tests/core/test_blocked.py``) up to float32 summation order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import torch
from attnscope.core.analysis.pooling import block_edges
from attnscope.core.analysis.score_blocks import LayerBlocks
from attnscope.core.errors import Cancelled

POOLINGS = ("max", "mean")
BUDGET = 1 << 24  # float32 elements per band block (64 MB): heads × band rows × visible keys
TILE = 1 << 20  # float32 elements per computed tile (4 MB): a band is computed in column tiles this size
MIN_TILE_COLS = 256

Partial = Callable[[np.ndarray, float], None]  # (display copy, fraction of the work done)


class torch_threads:
    """Run torch on ``threads`` threads inside the ``with`` block, restoring the count after.

    ``None`` (every view's default) leaves torch's count alone: the number the process's entry point
    set (torch's own default is the number of cores). There is no load-dependent guess: on this
    project's 2-core machine two threads were ~1.8x faster than one while it was quiet and several
    times slower while other processes kept both cores busy (each op waits at a barrier for the
    preempted thread; docs/benchmarks.md "Long prompts"), so the caller who knows the machine chooses
    (``attnscope bench --views --threads``).

    Raises:
        ValueError: ``threads`` < 1.
    """

    def __init__(self, threads: int | None):
        if threads is not None and int(threads) < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        self.threads = None if threads is None else int(threads)
        self.saved: int | None = None

    def __enter__(self):
        if self.threads is not None and self.threads != torch.get_num_threads():
            self.saved = torch.get_num_threads()
            torch.set_num_threads(self.threads)
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            torch.set_num_threads(self.saved)
            self.saved = None
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
        col_id = np.searchsorted(self.ce, np.arange(n), side="right") - 1
        self.col_id = torch.from_numpy(col_id).to(device)
        self.col_np = col_id
        self.row_id = np.searchsorted(self.re, np.arange(n), side="right") - 1
        self.rows_done = np.zeros(R, bool)

    def add(self, v: torch.Tensor, r0: int, c0: int, heads: slice | None = None) -> None:
        """Pool ``v`` ``(h, n_q, n_k)``: rows ``r0..``, cols ``c0..`` into heads ``heads`` of the output.

        Rows then columns, each by :func:`_seg_reduce` (a view's ``amax``/``sum`` when the blocks
        ``v`` spans have one size, a few strided ops otherwise): a handful of torch ops per call,
        whatever the number of output blocks ``v`` spans."""
        heads = slice(None) if heads is None else heads
        nq, nk = v.shape[1], v.shape[2]
        if nq == 0 or nk == 0:
            return
        a, a_last = int(self.row_id[r0]), int(self.row_id[r0 + nq - 1])
        b, b_last = int(self.col_np[c0]), int(self.col_np[c0 + nk - 1])
        rs = np.clip(self.re[a : a_last + 2], r0, r0 + nq) - r0  # v-relative edges of its row blocks
        cs = np.clip(self.ce[b : b_last + 2], c0, c0 + nk) - c0
        red = _seg_reduce(_seg_reduce(v, 1, rs, self.pooling), 2, cs, self.pooling)  # (h, rows, cols)
        dst = self.out[heads, a : a_last + 1, b : b_last + 1]
        if self.pooling == "max":
            torch.maximum(dst, red, out=dst)
        else:
            dst += red

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


def _seg_reduce(x: torch.Tensor, dim: int, edges: np.ndarray, pooling: str) -> torch.Tensor:
    """Max (float32) or sum (float64) of ``x`` over the segments ``edges[i]:edges[i+1]`` of ``dim``.

    One segment: one reduction; segments of one size: a view and one reduction; otherwise, for
    max, ``min(segments, longest)`` element-wise maxima of strided slices (each segment's start +
    t, clamped to its last element: repeats are harmless for a max), for sums a float64 cumulative
    sum differenced at the edges.
    """
    edges = np.asarray(edges, dtype=np.int64)
    k = len(edges) - 1
    sizes = np.diff(edges)
    red = x.amax if pooling == "max" else functools.partial(x.sum, dtype=torch.float64)
    if k == 1:
        return red(dim=dim, keepdim=True)
    if (sizes == sizes[0]).all():
        shape = list(x.shape)
        part = x.narrow(dim, int(edges[0]), int(edges[-1] - edges[0]))
        shape[dim : dim + 1] = [k, int(sizes[0])]
        part = part.reshape(shape)
        return part.amax(dim=dim + 1) if pooling == "max" else part.sum(dim=dim + 1, dtype=torch.float64)
    if pooling == "max":
        longest = int(sizes.max())
        if k <= longest:
            parts = [
                x.narrow(dim, int(e0), int(e1 - e0)) for e0, e1 in zip(edges[:-1], edges[1:], strict=True)
            ]
            return torch.cat([p.amax(dim=dim, keepdim=True) for p in parts], dim=dim)
        starts, last = edges[:-1], edges[1:] - 1
        out = x.index_select(dim, torch.from_numpy(starts).to(x.device))
        for t in range(1, longest):
            idx = torch.from_numpy(np.minimum(starts + t, last)).to(x.device)
            torch.maximum(out, x.index_select(dim, idx), out=out)
        return out
    c = torch.cumsum(x, dim=dim, dtype=torch.float64)
    c = torch.cat([torch.zeros_like(c.narrow(dim, 0, 1)), c], dim=dim)
    e = torch.from_numpy(edges).to(x.device)
    return c.index_select(dim, e[1:]) - c.index_select(dim, e[:-1])


def snap_bands(band_list: list[tuple[int, int]], edges: np.ndarray) -> list[tuple[int, int]]:
    """``band_list`` (contiguous, covering ``0..n``) with each inner boundary moved to the nearest
    of the output's row ``edges`` (bands of whole output rows pool with one reduction; a band
    narrower than one output row keeps its own boundaries)."""
    if len(band_list) < 2 or band_list[0][1] - band_list[0][0] < int(np.diff(edges).max()):
        return band_list
    cuts = [int(edges[np.abs(edges - r1).argmin()]) for _, r1 in band_list[:-1]]
    bounds = sorted({0, band_list[-1][1], *cuts})
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def col_tiles(c0: int, c1: int, width: int, edges: np.ndarray | None) -> list[tuple[int, int]]:
    """``[c0, c1)`` split into tiles about ``width`` wide, inner boundaries on output column ``edges``
    (None: anywhere)."""
    width = max(1, width)
    if c1 - c0 <= width:
        return [(c0, c1)]
    if edges is None:
        edges = np.arange(c0, c1, width)
    inner = edges[(edges > c0) & (edges < c1)]
    out, start = [], c0
    for e in inner:
        if e - start >= width:
            out.append((start, int(e)))
            start = int(e)
    if c1 - start < width // 2 and out:  # a sliver at the end joins the last tile
        out[-1] = (out[-1][0], c1)
    else:
        out.append((start, c1))
    return out


def tile_rows(r0: int, r1: int, t0: int, t1: int, window: int | None) -> tuple[int, int]:
    """The rows of band ``r0:r1`` that see any key of tile ``t0:t1``: causal, row ``p`` sees keys
    ``<= p`` (so ``p >= t0``); a window of ``W`` keys, keys ``> p − W`` (so ``p < t1 + W − 1``). The
    band's other rows are masked over the whole tile: never multiplied (a one-head band of 2,048
    rows wasted a quarter of its matmul on the triangle above the diagonal)."""
    a0 = min(max(r0, t0), r1 - 1)
    a1 = r1 if window is None else max(a0 + 1, min(r1, t1 + window - 1))
    return a0, a1


def _tile_width(h: int, nq: int, tile: int) -> int:
    return max(MIN_TILE_COLS, tile // max(1, h * nq))


def _order(band_list: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [band_list[i] for i in coarse_to_fine(len(band_list))]


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
    tile: int = TILE,
    fast: bool = True,
    threads: int | None = None,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    partial: Partial | None = None,
) -> np.ndarray:
    """Per-head pooled maps of the first ``n`` positions of ``layer``: ``(len(heads), R, C)`` float32,
    ``R = min(n, out_rows)``, ``C = min(n, out_cols)`` (default ``out_rows``).

    Cell ``(h, a, b)`` is the max (or mean, masked cells as 0) of head ``heads[h]``'s exact weights
    over rows ``block_edges(n, R)[a:a+2]`` and cols ``block_edges(n, C)[b:b+2]``. Peak extra memory
    about ``budget`` float32 elements (plus the output); each band is computed and pooled in column
    tiles of about ``tile`` elements (they stay in the CPU's cache between the matmul and the
    pooling: 2x faster here than whole bands). ``progress(done, total)`` after each band,
    ``partial(image, fraction)`` with a display copy (:func:`fill_missing_rows`). ``threads``: torch
    threads for the work (:class:`torch_threads`; None: torch's current count).

    Raises:
        ValueError: unknown pooling. IndexError: layer/head out of range or ``n`` beyond the trace.
        Cancelled: ``cancelled()`` turned true.
    """
    out_cols = out_rows if out_cols is None else out_cols
    heads = list(heads)
    _check_n(trace, n)
    log = pooling == "max"
    pool = _Pooler(len(heads), n, out_rows, out_cols, pooling, log, _device(trace))
    # bands no taller than a tile of MIN_TILE_COLS keys allows (a taller band's tiles leave the cache)
    budget = min(budget, max(1, tile // MIN_TILE_COLS) * n)
    plan = _order(snap_bands(bands(n, len(heads), block_rows, budget), pool.re))
    with torch_threads(threads):
        blocks = LayerBlocks(trace, layer, heads, n, fast=fast)
        for k, (r0, r1) in enumerate(plan):
            c0, c1 = visible_cols(trace, layer, r0, r1)
            blocks.band(r0, r1)
            for t0, t1 in col_tiles(c0, c1, _tile_width(len(heads), r1 - r0, tile), pool.ce):
                a0, a1 = tile_rows(r0, r1, t0, t1, blocks.window)
                _check(cancelled)
                pool.add(_block(blocks, a0, a1, t0, t1, log), a0, t0)
            pool.mark(r0, r1)
            if progress is not None:
                progress(k + 1, len(plan))
            if partial is not None and k + 1 < len(plan):
                partial(fill_missing_rows(pool.image(), pool.rows_done), (k + 1) / len(plan))
    return pool.image()


def _block(blocks: LayerBlocks, r0: int, r1: int, c0: int, c1: int, log: bool = False) -> torch.Tensor:
    """One band's block: the single place the views compute weights (tests count its calls)."""
    return blocks.log(r0, r1, c0, c1) if log else blocks.weights(r0, r1, c0, c1)


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


def mean_band(
    trace,
    pairs: Sequence[tuple[int, int]],
    rows: slice,
    cols: slice,
    *,
    fast: bool = False,
    threads: int | None = None,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """Exact mean weights over the ``(layer, head)`` ``pairs`` for ``rows × cols``: ``(n_q, n_k)``
    float32 torch (each layer's heads summed in float32, at most ``n_heads`` terms of at most 1; the
    layers accumulated in float64; one batched block per layer, only the keys the layer's mask lets
    the rows see). ``progress(heads_done)`` after each layer; ``threads`` as in :func:`pooled_heads`."""
    with torch_threads(threads):
        return _mean_band(trace, _by_layer(pairs), {}, rows, cols, cols.stop, fast, cancelled, progress)


def _mean_band(trace, groups, cache, rows, cols, n, fast, cancelled, progress, tile=TILE) -> torch.Tensor:
    """:func:`mean_band` with the layers' :class:`LayerBlocks` kept in ``cache`` across bands.

    Column tiles outer, layers inner: a tile's accumulator stays in the CPU's cache while every
    layer adds to it. ``progress(heads_done)`` as each layer finishes its last tile."""
    nq, nk = rows.stop - rows.start, cols.stop - cols.start
    acc = torch.zeros((nq, nk), dtype=torch.float64, device=_device(trace))
    n_pairs = sum(len(h) for h in groups.values())
    per_layer = max(len(h) for h in groups.values())
    tiles = col_tiles(cols.start, cols.stop, _tile_width(per_layer, nq, tile), None)
    for ti, (t0, t1) in enumerate(tiles):
        done = 0
        for layer, heads in groups.items():
            v0, v1 = visible_cols(trace, layer, rows.start, rows.stop)
            c0, c1 = max(t0, v0), min(t1, v1)
            if c1 > c0:
                _check(cancelled)
                if layer not in cache:
                    cache[layer] = LayerBlocks(trace, layer, heads, n, fast=fast)
                w = _block(cache[layer], rows.start, rows.stop, c0, c1)  # (h, n_q, c1 - c0)
                acc[:, c0 - cols.start : c1 - cols.start] += w.sum(dim=0) if w.shape[0] > 1 else w[0]
            done += len(heads)
            if progress is not None and ti == len(tiles) - 1:
                progress(done)
    return (acc / max(1, n_pairs)).float()


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
    threads: int | None = None,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    partial: Partial | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pooled overview of the mean over heads ``pairs`` of the ``n × n`` map: ``(image (R, C) float32,
    row_edges, col_edges)``. ``image[a, b]`` = max (or mean) of the exact mean map over the block.

    ``progress(done, total)`` counts heads × bands (one call per head of each band, as
    :func:`attnscope.core.analysis.aggregate.pooled_map` always has); ``partial`` and ``threads`` as in
    :func:`pooled_heads`. Memory: each layer's key side (:class:`LayerBlocks`, SmolLM2's 30 layers
    at n = 8,192: 190 MB) kept across bands, plus one band. Raises as :func:`pooled_heads`.
    """
    out_cols = out_rows if out_cols is None else out_cols
    _check_n(trace, n)
    groups = _by_layer(pairs)
    per_layer = max(len(h) for h in groups.values())
    pool = _Pooler(1, n, out_rows, out_cols, pooling, False, _device(trace))
    plan = _order(bands(n, per_layer + 2, block_rows, budget))
    total = len(plan) * len(pairs)
    cache: dict = {}
    with torch_threads(threads):
        for k, (r0, r1) in enumerate(plan):
            base = k * len(pairs)
            last = [0]  # heads of this band reported so far

            def head_progress(done, base=base, last=last):
                if progress is not None:
                    for i in range(last[0] + 1, done + 1):
                        progress(base + i, total)
                    last[0] = done

            m = _mean_band(
                trace, groups, cache, slice(r0, r1), slice(0, r1), n, fast, cancelled, head_progress
            )
            pool.add(m[None], r0, 0)
            pool.mark(r0, r1)
            if partial is not None and k + 1 < len(plan):
                partial(fill_missing_rows(pool.image()[0], pool.rows_done), (k + 1) / len(plan))
    return pool.image()[0], pool.re, pool.ce


def thumbnails(
    trace,
    n: int,
    size: int = 40,
    pooling: str = "max",
    *,
    budget: int = BUDGET,
    fast: bool = True,
    threads: int | None = None,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    partial: Partial | None = None,
) -> np.ndarray:
    """Pooled maps of every head over the first ``n`` positions: ``(n_layers, n_heads, P, P)`` float32,
    ``P = min(n, size)``. One layer at a time, all its heads per batched block; ``progress(heads_done,
    n_layers × n_heads)`` once per head as each layer completes; ``partial(thumbs, fraction)`` after
    each layer but the last (layers not done yet are zeros); ``threads`` as in :func:`pooled_heads`."""
    _check_n(trace, n)
    with torch_threads(threads):
        return _thumbnails(trace, n, size, pooling, budget, fast, cancelled, progress, partial)


def _thumbnails(trace, n, size, pooling, budget, fast, cancelled, progress, partial) -> np.ndarray:
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
    completes, ``partial(copy, fraction)`` after each layer but the last (later layers are zeros). A
    hybrid model's layer with no map (``layer_fn`` raises NoAttentionMap) is NaN
    (:mod:`attnscope.core.trace.base`, "Layers with no map")."""
    from attnscope.core.errors import NoAttentionMap

    out = np.zeros((n_layers, n_heads, P, P), dtype=np.float32)
    for layer in range(n_layers):
        try:
            out[layer] = layer_fn(layer)
        except NoAttentionMap:
            out[layer] = np.nan
        if progress is not None:
            for h in range(n_heads):
                progress(layer * n_heads + h + 1, n_layers * n_heads)
        if partial is not None and layer + 1 < n_layers:
            partial(out.copy(), (layer + 1) / n_layers)
    return out
