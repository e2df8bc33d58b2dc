"""Maps to draw: one head or a mean over heads, cropped to a decode step, exact or max-pooled.

Aggregates (docs/window.md): the element-wise **mean of exact weights** over a set of query
heads,

    mean[i, j] = (1 / |H|) · Σ_{(l, h) ∈ H} w_{l,h}[i, j]

with ``H`` one head, the query heads of a GQA group (``h // group_size == kv``), every head of a
layer, or every head of every layer. Each row of a mean is still a probability distribution
(a mean of distributions), so the fixed [0, 1] colour range stays meaningful. Heads are
recomputed one at a time from the Trace (peak memory: one map plus the accumulator).

Long prompts: :func:`pooled_map` builds the overview of an ``n × n`` map as the max over
near-equal blocks (:mod:`attnscope.core.analysis.pooling`) while computing the exact map in row blocks, so it never
holds more than ``block_rows × n`` weights per head. Zoomed-in regions are then exact tiles
(:func:`map_tile`): the stored LSE makes a tile exact without the rest of its row
(FlashAttention-2 §3.1, ``P = exp(S − L)``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core.analysis.pooling import block_edges
from attnscope.core.analysis.remotable import remotable
from attnscope.core.arch import arch_of
from attnscope.core.errors import Cancelled

if TYPE_CHECKING:
    from attnscope.core.session import Session

MODES = ("head", "group", "layer", "all")
MODE_LABELS = {
    "head": "Single head",
    "group": "Mean of KV group",
    "layer": "Mean of layer",
    "all": "Mean of all layers",
}
LONG_PROMPT = 1024  # above this many tokens the heatmap shows a pooled overview + exact tiles
OVERVIEW = 1024  # pooled overview size (pixels per side)


def heads_in(info, layer: int, head: int, mode: str = "head") -> list[tuple[int, int]]:
    """The ``(layer, head)`` pairs averaged by ``mode`` for the selection ``(layer, head)``.

    Raises:
        ValueError: unknown mode. IndexError: layer or head out of range.
    """
    if mode not in MODES:
        raise ValueError(f"unknown aggregate {mode!r}; choose one of {', '.join(MODES)}")
    if not 0 <= layer < info.n_layers:
        raise IndexError(f"layer {layer} out of range 0..{info.n_layers - 1}")
    if not 0 <= head < info.n_heads:
        raise IndexError(f"head {head} out of range 0..{info.n_heads - 1}")
    arch = arch_of(info)
    if mode == "head":
        return [(layer, head)]
    if mode == "group":
        return [(layer, h) for h in arch.group(arch.kv_head(head))]
    if mode == "layer":
        return [(layer, h) for h in range(info.n_heads)]
    # "model": every head of every layer with a map (a hybrid model's other layers have none)
    return [(lyr, h) for lyr in arch.attention_layers for h in range(info.n_heads)]


def describe(info, layer: int, head: int, mode: str = "head") -> str:
    """Title text, e.g. ``"Layer 3 · mean of KV group 1 (q3, q4, q5)"``."""
    arch = arch_of(info)
    kv = arch.kv_head(head)
    if mode == "head":
        return f"Layer {layer} · query head {head} (reads KV head {kv})"
    if mode == "group":
        members = ", ".join(f"q{h}" for h in arch.group(kv))
        return f"Layer {layer} · mean of KV group {kv} ({members})"
    if mode == "layer":
        return f"Layer {layer} · mean of all {info.n_heads} query heads"
    n_att = len(arch.attention_layers)
    if n_att != info.n_layers:
        return f"Mean of all {n_att * info.n_heads} heads of the {n_att} attention layers"
    return f"Mean of all {info.n_layers * info.n_heads} heads of {info.n_layers} layers"


def _check_cancel(cancelled: Callable[[], bool] | None) -> None:
    if cancelled is not None and cancelled():
        raise Cancelled("cancelled")


@remotable
def map_tile(
    session: Session,
    layer: int,
    head: int,
    mode: str = "head",
    rows: slice | None = None,
    cols: slice | None = None,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Exact (mean) weights for ``rows × cols``, ``(n_q, n_k)`` float32.

    ``rows``/``cols`` default to the whole sequence. ``progress(heads_done, n_heads_in_mean)`` after
    each head. Raises what ``session.weights`` raises, and :class:`attnscope.core.errors.Cancelled` when
    ``cancelled()`` turns true between heads.
    """
    pairs = heads_in(session.info, layer, head, mode)
    if len(pairs) > 1:  # one batched block per layer (attnscope.core.analysis.blocked), float64 accumulator
        from attnscope.core.analysis.blocked import mean_band
        from attnscope.core.trace.base import as_slice

        session.weights(layer, head, slice(0, 1), slice(0, 1))  # the session's own checks (ran, range)
        r, c = as_slice(rows, session.seq_len), as_slice(cols, session.seq_len)
        last = [0]

        def each_head(done):
            if progress is not None:
                for i in range(last[0] + 1, done + 1):
                    progress(i, len(pairs))
            last[0] = done

        return mean_band(session.trace, pairs, r, c, cancelled=cancelled, progress=each_head).cpu().numpy()
    acc: np.ndarray | None = None
    for i, (lyr, h) in enumerate(pairs):
        _check_cancel(cancelled)
        w = session.weights(lyr, h, rows, cols)
        if acc is None:
            acc = w.astype(np.float32 if len(pairs) == 1 else np.float64)
        else:
            acc += w
        if progress is not None:
            progress(i + 1, len(pairs))
    assert acc is not None, "heads_in() gives at least one head"
    if len(pairs) > 1:
        acc /= len(pairs)
    return acc.astype(np.float32, copy=False)


@remotable
def map_at(
    session: Session,
    layer: int,
    head: int,
    mode: str = "head",
    n: int | None = None,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Exact (mean) map of the first ``n`` positions, ``(n, n)`` float32 (``n`` = seq_len by default).

    With ``n = n_prompt + t`` this is the map as it was after ``t`` decode steps
    (:mod:`attnscope.core.analysis.timeline` explains why cropping is exact). ``progress`` as in :func:`map_tile`.
    """
    n = session.seq_len if n is None else n
    if not 1 <= n <= session.seq_len:
        raise IndexError(f"n={n} out of range 1..{session.seq_len}")
    return map_tile(session, layer, head, mode, slice(0, n), slice(0, n), cancelled, progress)


@dataclass(frozen=True)
class PooledMap:
    """Max-pooled overview of an ``n × n`` map.

    Attributes:
        image: ``(R, C)`` float32; cell ``(a, b)`` is the max of the exact map over rows
            ``row_edges[a]:row_edges[a+1]`` and cols ``col_edges[b]:col_edges[b+1]``.
        row_edges, col_edges: int64 block edges, ``R + 1`` and ``C + 1`` values from 0 to ``n``.
        n: side of the full map.
        pooling: ``"max"`` (the default: one-cell features such as a sink column survive) or
            ``"mean"`` (block mean, masked cells as 0).
        done: fraction of the row bands computed, 1.0 for a finished overview; a partial one
            (progressive display, :mod:`attnscope.core.analysis.blocked`) has the missing rows filled from the
            nearest computed ones.
    """

    image: np.ndarray
    row_edges: np.ndarray
    col_edges: np.ndarray
    n: int
    pooling: str = "max"
    done: float = 1.0

    @property
    def partial(self) -> bool:
        return self.done < 1.0


@remotable
def pooled_map(
    session: Session,
    layer: int,
    head: int,
    mode: str = "head",
    n: int | None = None,
    out: int = OVERVIEW,
    block_rows: int | None = None,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    *,
    pooling: str = "max",
    out_cols: int | None = None,
    partial: Callable[[PooledMap], None] | None = None,
) -> PooledMap:
    """Pooled overview (``out × out_cols`` at most, ``out_cols`` = ``out`` by default) of the exact
    ``n × n`` (mean) map.

    Computed in row bands by :mod:`attnscope.core.analysis.blocked` (``block_rows`` rows, or as many as its memory
    budget allows), all the heads of a layer per batched block: peak memory a few tens of MB, never
    ``n × n``. Equals ``attnscope.core.analysis.pooling.max_pool(map_at(...), out, out)`` (``mean_pool`` for
    ``pooling="mean"``). ``progress(done, total)`` after each head of each band (``total`` = bands
    × heads in the mean); ``partial(PooledMap)`` with a coarse-to-fine display copy after each
    band but the last (``done`` < 1).
    """
    from attnscope.core.analysis import blocked

    n = session.seq_len if n is None else n
    if not 1 <= n <= session.seq_len:
        raise IndexError(f"n={n} out of range 1..{session.seq_len}")
    pairs = heads_in(session.info, layer, head, mode)
    session.weights(layer, head, slice(0, 1), slice(0, 1))  # the session's own checks (ran, range)
    re, ce = block_edges(n, out), block_edges(n, out if out_cols is None else out_cols)
    on_partial: Callable[[np.ndarray, float], None] | None
    if partial is not None:

        def on_partial(img, frac):
            partial(PooledMap(img, re, ce, n, pooling, frac))
    else:
        on_partial = None
    if len(pairs) == 1:
        image = blocked.pooled_heads(
            session.trace,
            layer,
            [head],
            n,
            out,
            out_cols,
            pooling,
            block_rows=block_rows,
            cancelled=cancelled,
            progress=progress,
            partial=None if on_partial is None else lambda img, f: on_partial(img[0], f),
        )[0]
    else:
        image, re, ce = blocked.pooled_mean(
            session.trace,
            pairs,
            n,
            out,
            out_cols,
            pooling,
            block_rows=block_rows,
            cancelled=cancelled,
            progress=progress,
            partial=on_partial,
        )
    return PooledMap(image, re, ce, n, pooling)


def robust_max(w: np.ndarray, q: float = 99.5) -> float:
    """Upper colour level for an "auto" range: the ``q``-th percentile of the non-zero weights.

    Not the plain max: every causal map has ``w[0, 0] = 1`` (row 0 sees only key 0), so the max
    is always 1 and would just repeat the fixed range. Returns 1.0 for an all-zero map; never
    less than 1e-6.
    """
    nz = np.asarray(w)[np.asarray(w) > 0]
    if nz.size == 0:
        return 1.0
    return float(max(np.percentile(nz, q), 1e-6))


@remotable
def layer_robust_max(
    session: Session,
    layer: int,
    n: int | None = None,
    q: float = 99.5,
    cancelled: Callable[[], bool] | None = None,
    max_rows: int = 512,
) -> float:
    """Shared upper level for the heads of ``layer``: the max of :func:`robust_max` over its heads.

    For long sequences only the last ``max_rows`` rows are used (they see the most keys).
    """
    n = session.seq_len if n is None else n
    rows = slice(max(0, n - max_rows), n)
    best = 1e-6
    for h in range(session.info.n_heads):
        _check_cancel(cancelled)
        best = max(best, robust_max(session.weights(layer, h, rows, slice(0, n)), q))
    return best


@remotable
def thumbnails(
    session: Session,
    n: int | None = None,
    size: int = 40,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    *,
    pooling: str = "max",
    partial: Callable[[np.ndarray, float], None] | None = None,
) -> np.ndarray:
    """Max-pooled maps of every head over the first ``n`` positions (a decode step, see
    :mod:`attnscope.core.analysis.timeline`), ``(n_layers, n_heads, P, P)`` float32 with ``P = min(n, size)``.

    One layer at a time, all its heads per batched block (:func:`attnscope.core.analysis.blocked.thumbnails`): peak
    memory a few tens of MB. ``progress(heads_done, n_layers × n_heads)`` once per head as each
    layer completes; ``partial(thumbs, fraction)`` after each layer but the last. Raises
    :class:`attnscope.core.errors.Cancelled` when ``cancelled()`` turns true (checked per block).
    """
    from attnscope.core.analysis import blocked

    n = session.seq_len if n is None else n
    if not 1 <= n <= session.seq_len:
        raise IndexError(f"n={n} out of range 1..{session.seq_len}")
    session.weights(
        session.info.arch.attention_layers[0], 0, slice(0, 1), slice(0, 1)
    )  # the session's checks (ran)
    return blocked.thumbnails(
        session.trace, n, size, pooling, cancelled=cancelled, progress=progress, partial=partial
    )
