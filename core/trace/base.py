"""What every trace offers (:class:`Trace`) and what the torch and MLX traces share
(:class:`TraceGeometry`): selection rules, the GQA head mapping, the applied mask, the sink scores
and the weight on a set of keys; each trace adds only its tensor maths.

Kept free of torch and MLX so that either backend imports only its own array library.

Layers with no map (docs/how-it-works.md "Hybrid models"). A hybrid model's trace is indexed by the REAL layer index:
``arch.layer_kinds`` says what each layer computes and ``arch.attention_layers`` lists the softmax-attention
ones. Per-layer queries (``weights``, ``scores``, ``lse``, ``allowed``…) on a layer with no map raise
:class:`attnscope.core.errors.NoAttentionMap` with one line (``layer 2: linear attention, no map``). The
all-layer summaries (``weight_on_key``, ``row_mass``, ``diagonal``, ``sink_scores``, and every analysis
built on them) keep their ``(n_layers, n_heads, …)`` shape and put NaN in the rows of the layers with
no map: index ``l`` is always layer ``l``, and a view that sees a NaN row marks that layer instead
of drawing it (:func:`map_layers` gives the rows that are real).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from attnscope.core.arch import ArchConfig
from attnscope.core.attention.masks import causal_allowed
from attnscope.core.checks import index, span, whole
from attnscope.core.errors import BadArgument, OutOfRange


def as_slice(sel: slice | None, n: int, name: str = "rows/cols") -> slice:
    """``sel`` resolved against length ``n`` (None = everything) as ``slice(start, stop)``, checked by
    :func:`attnscope.core.checks.span` (``name`` is the argument the message names).

    Raises:
        WrongType (a TypeError): not a slice. BadArgument (a ValueError): a strided selection (tiles
        are contiguous row/column ranges). OutOfRange (an IndexError): a bound outside ``-n .. n``.
    """
    return span(name, sel, n)


def key_positions(trace, positions: Sequence[int]) -> list[int]:
    """``positions`` sorted, duplicates dropped, checked against ``trace.seq_len``.

    Raises:
        IndexError: a position outside ``0 .. T - 1``.
    """
    pos = sorted({int(p) for p in positions})
    T = trace.seq_len
    if any(p < 0 or p >= T for p in pos):
        raise OutOfRange(
            f"key positions must be in 0..{T - 1}, got {[p for p in pos if p < 0 or p >= T][:5]}"
        )
    return pos


def map_layers(obj) -> tuple[int, ...]:
    """The real indices of the layers of ``obj`` (a trace, a ModelInfo, an ArchConfig) that have an attention
    map (:attr:`attnscope.core.arch.ArchConfig.attention_layers`; every layer for a model with no hybrid
    layers)."""
    from attnscope.core.arch import arch_of

    return arch_of(obj).attention_layers


def empty_rows(trace, *tail: int) -> np.ndarray:
    """``(n_layers, n_heads, *tail)`` float32 zeros, NaN in the rows of layers with no map (the
    module docstring's convention)."""
    out = np.zeros((trace.n_layers, trace.n_heads, *tail), dtype=np.float32)
    for layer in range(trace.n_layers):
        if not trace.arch.has_map(layer):
            out[layer] = np.nan
    return out


def summed_weight_on_keys(trace, positions: list[int]) -> np.ndarray:
    """``Σ_p trace.weight_on_key(p)``, ``(n_layers, n_heads, T)`` float32: the row mass of any trace that
    offers ``weight_on_key`` (``positions`` as :func:`key_positions` returns them; zeros when empty, NaN rows
    for layers with no map)."""
    if not positions:
        return empty_rows(trace, trace.seq_len)
    return np.sum([trace.weight_on_key(p) for p in positions], axis=0).astype(np.float32)


class TraceGeometry:
    """Queries common to :class:`attnscope.core.trace.torch_trace.TorchTrace` and :class:`attnscope.core.trace.mlx_trace.MlxTrace`.

    A subclass provides ``arch`` (:class:`attnscope.core.arch.ArchConfig`) and ``layers``: one record per
    layer with ``n_rows()`` (query positions captured), ``keys`` (``(n_kv_heads, S, head_dim)``, or
    None before the first forward) and ``sliding_window`` (int or None).
    """

    arch: ArchConfig
    layers: list[Any]  # the subclass's per-layer records

    # -- the subclass's tensor maths ------------------------------------------------------------------
    def weights(
        self, layer: int, head: int, rows: slice | None = None, cols: slice | None = None
    ) -> np.ndarray:
        """Exact weights of one head, ``(n_q, n_k)`` float32 (each trace computes them)."""
        raise NotImplementedError

    def weight_on_key(self, key: int = 0) -> np.ndarray:
        """Weight on key ``key``, ``(n_layers, n_heads, T)`` float32 (each trace computes it)."""
        raise NotImplementedError

    def _set_arch(
        self, n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int, layer_kinds: Sequence[str] = ()
    ) -> None:
        """Set :attr:`arch` and its counts as attributes (``n_layers`` … ``group_size``); ``layer_kinds``
        as :attr:`attnscope.core.arch.ArchConfig.layer_kinds` (empty: every layer attention).

        Raises:
            ValueError: ``n_heads`` not a multiple of ``n_kv_heads``.
        """
        self.arch = ArchConfig(n_layers, n_heads, n_kv_heads, head_dim, tuple(layer_kinds))
        self.n_layers, self.n_heads, self.n_kv_heads, self.head_dim = n_layers, n_heads, n_kv_heads, head_dim
        self.group_size = self.arch.group_size

    @property
    def seq_len(self) -> int:
        first = next(iter(self.arch.attention_layers), None)
        return self.layers[first].n_rows() if self.layers and first is not None else 0

    def kv_head(self, head: int) -> int:
        """The KV head query head ``head`` reads (:meth:`attnscope.core.arch.ArchConfig.kv_head`).

        Raises:
            IndexError: ``head`` outside ``0 .. n_heads - 1``.
        """
        return self.arch.kv_head(head)

    def _rec(self, layer: int):
        index("layer", layer, self.n_layers)  # OutOfRange, WrongType
        self.arch.check_map(layer)  # NoAttentionMap: a hybrid model's layer with no softmax attention
        rec = self.layers[layer]
        if not rec.n_rows() or rec.keys is None:
            raise RuntimeError("nothing captured yet: run a prompt first")
        return rec

    # -- summaries shared by every trace (the tensor maths is the subclass's weight_on_key) -----------
    def sink_scores(self, key: int = 0) -> np.ndarray:
        """Sink score per head, ``(n_layers, n_heads)`` float32.

        Definition (docs/window.md, Sinks): the mean over query rows ``i >= 1`` of the weight
        on key 0 (row 0 can only attend to itself, so it is left out). For ``key > 0`` the mean
        is over rows ``i > key``; zeros when no row comes after ``key``. NaN rows for layers with no
        map (module docstring).
        """
        w = self.weight_on_key(key)
        if w.shape[-1] <= key + 1:
            return empty_rows(self)
        return w[..., key + 1 :].mean(axis=-1)

    def row_mass(self, positions: Sequence[int]) -> np.ndarray:
        """Total weight every row of every head puts on the keys at ``positions``.

        Returns ``(n_layers, n_heads, T)`` float32; row ``i`` sums ``w[i, j]`` over ``j`` in
        ``positions`` (duplicates counted once) that it may see (``j <= i``, inside a sliding
        window). Cost O(layers × heads × T × len(positions) × D), no T × T work.

        Raises:
            IndexError: a position outside ``0 .. T - 1``. RuntimeError: nothing captured yet.
        """
        pos = key_positions(self, positions)
        if not pos:
            return empty_rows(self, self.seq_len)
        return self._row_mass(pos)

    def _row_mass(self, positions: list[int]) -> np.ndarray:
        """:meth:`row_mass` of valid, sorted, distinct ``positions`` (a trace with a batched product
        overrides this)."""
        return summed_weight_on_keys(self, positions)

    def diagonal(self, offset: int) -> np.ndarray:
        """Weight each row puts on the key ``offset`` positions before it, every layer and head.

        Returns ``(n_layers, n_heads, T)`` float32; ``out[l, h, i] = w[i, i − offset]``, 0 where
        ``i < offset`` or the key is outside the layer's sliding window.

        Raises:
            ValueError: negative offset. RuntimeError: nothing captured yet.
        """
        if whole("offset", offset) < 0:
            raise BadArgument(f"offset must be >= 0, got {offset}")
        if offset >= self.seq_len:
            return empty_rows(self, self.seq_len)
        return self._diagonal(offset)

    def _diagonal(self, offset: int, block: int = 256) -> np.ndarray:
        """:meth:`diagonal` (``0 <= offset < T``) through :meth:`weights` tiles of ``block`` rows: the
        diagonal of each ``(n, n)`` tile (a trace with a batched product overrides this)."""
        T = self.seq_len
        out = empty_rows(self, T)
        for layer in self.arch.attention_layers:
            for head in range(self.n_heads):
                for r0 in range(offset, T, block):
                    r1 = min(T, r0 + block)
                    c0 = r0 - offset
                    w = self.weights(layer, head, slice(r0, r1), slice(c0, r1 - offset))  # (n, n)
                    out[layer, head, r0:r1] = np.diagonal(w)
        return out

    def weights_block(
        self,
        layer: int,
        heads,
        rows: slice | None = None,
        cols: slice | None = None,
        *,
        log: bool = False,
        fast: bool = False,
    ):
        """Weights of several query heads of ``layer``: ``(len(heads), n_q, n_k)`` float32 torch tensor
        (the blocked path of :mod:`attnscope.core.analysis.blocked`; ``heads`` None = all). This generic
        one stacks :meth:`weights` per head (exact float32 whatever ``fast``; the MLX trace uses it);
        :meth:`attnscope.core.trace.torch_trace.TorchTrace.weights_block` does one batched product.
        ``log=True`` gives log-weights, ``-inf`` where masked.

        Raises:
            IndexError: layer or a head out of range, or no heads. RuntimeError: nothing captured yet.
        """
        import torch  # the blocked path's tensor type (torch is a dependency of every install)

        heads = list(range(self.n_heads)) if heads is None else [whole("head", h) for h in heads]
        if not heads:
            raise OutOfRange("no heads selected: pass heads=None for all, or a list of head indices")
        w = torch.from_numpy(np.stack([self.weights(layer, h, rows, cols) for h in heads]))  # (h, n_q, n_k)
        return torch.log(w) if log else w

    # -- the softmax variant (soft-capping, learned sinks), as each layer recorded it --------------
    def softcap(self, layer: int) -> float | None:
        """The attention-logit cap ``layer`` applied (Gemma 2: scores ``cap·tanh(s/cap)``), or None."""
        cap = getattr(self._rec(layer), "softcap", None)
        return None if cap is None else float(cap)

    @property
    def softcaps(self) -> tuple[float | None, ...]:
        """Every layer's recorded cap (None: no cap, or not recorded yet)."""
        return tuple(getattr(r, "softcap", None) for r in self.layers)

    @property
    def has_learned_sinks(self) -> bool:
        """True when some recorded layer has learned sink logits (gpt-oss)."""
        return any(getattr(r, "sinks", None) is not None for r in self.layers)

    def learned_sinks(self, layer: int) -> np.ndarray | None:
        """``(n_heads,)`` float64 learned sink logits of ``layer`` (gpt-oss), or None."""
        sinks = getattr(self._rec(layer), "sinks", None)
        if sinks is None:
            return None
        if hasattr(sinks, "cpu"):  # a torch tensor (kept on the layer's device)
            sinks = sinks.detach().cpu().double().numpy()
        return np.asarray(sinks, dtype=np.float64)

    def learned_sink_share(self, layer: int) -> np.ndarray:
        """Share of each row's softmax mass that went to the learned sink, ``(n_heads, T)`` float32.

        ``exp(sink_h − lse'_i)`` with ``lse'`` the recorded LSE, which includes the sink
        (:func:`attnscope.core.attention.fused.add_learned_sinks`): exactly ``1 − Σ_j w_ij`` over the
        real keys (transformers' eager gpt-oss softmax drops this column). Zeros for a layer without
        learned sinks.

        Raises:
            IndexError: layer out of range. RuntimeError: nothing captured yet.
        """
        lse = self.lse(layer)  # (H, T) float64
        sinks = self.learned_sinks(layer)
        if sinks is None:
            return np.zeros(lse.shape, dtype=np.float32)
        with np.errstate(over="ignore"):
            return np.exp(sinks[:, None] - lse).astype(np.float32)

    def lse(self, layer: int) -> np.ndarray:
        """LSE rows of ``layer``, ``(n_heads, T)`` float64 (each trace reads its store)."""
        raise NotImplementedError

    def allowed(self, layer: int, rows: slice | None = None, cols: slice | None = None) -> np.ndarray:
        """Boolean mask that was applied to ``layer``: causal (+ sliding window), shape ``(n_q, n_k)``,
        bottom-right aligned (query ``i`` sees key ``j`` iff ``j <= i``; docs/how-it-works.md; attnscope.core.attention.masks)."""
        rec = self._rec(layer)
        T, S = rec.n_rows(), rec.keys.shape[1]
        r, c = as_slice(rows, T, "rows"), as_slice(cols, S, "cols")
        return causal_allowed(np.arange(r.start, r.stop), np.arange(c.start, c.stop), rec.sliding_window)


@runtime_checkable
class Trace(Protocol):
    """What a forward pass leaves behind so that any head's weights can be recomputed exactly
    (:mod:`attnscope.core.trace.torch_trace` explains the maths). Every query returns numpy on the host
    (``weights_block``: a float32 torch tensor, for :mod:`attnscope.core.analysis.blocked`).

    Attributes:
        arch: the attention geometry (:class:`attnscope.core.arch.ArchConfig`), and its counts
            ``n_layers``, ``n_heads``, ``n_kv_heads``, ``head_dim``, ``group_size``.
        enabled: record in forwards (False: the forwards run, nothing is kept).
        layers: one record per layer with ``n_rows()``, ``keys`` and ``sliding_window``.
        seq_len: rows captured (= positions in the KV cache).
    """

    arch: ArchConfig
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    group_size: int
    enabled: bool
    layers: list
    seq_len: int

    # -- recording (the backend's attention calls these inside its forward) -----------------------
    def record(
        self, layer: int, query: Any, lse: Any, keys: Any, scale: float, sliding_window: int | None, /
    ) -> None:
        """Append one forward's query rows and LSE for ``layer``; ``keys``: the cache's keys (torch) or
        the layer's cache (MLX)."""
        ...

    def reserve(self, n_rows: int, dtype: Any = ..., device: Any = ...) -> None:
        """Make room for ``n_rows`` rows per layer (optional: recording grows too)."""
        ...

    def reset(self) -> None:
        """Forget every row."""
        ...

    def truncate(self, n: int) -> None:
        """Forget every row at position ``>= n``."""
        ...

    # -- queries ----------------------------------------------------------------------------------
    def kv_head(self, head: int) -> int:
        """The KV head query head ``head`` reads."""
        ...

    def allowed(self, layer: int, rows: slice | None = None, cols: slice | None = None) -> np.ndarray:
        """The mask that was applied, ``(n_q, n_k)`` bool."""
        ...

    def scores(
        self, layer: int, head: int, rows: slice | None = None, cols: slice | None = None
    ) -> np.ndarray:
        """Scaled scores before softmax, ``-inf`` where masked, ``(n_q, n_k)`` float32."""
        ...

    def weights(
        self, layer: int, head: int, rows: slice | None = None, cols: slice | None = None
    ) -> np.ndarray:
        """Exact attention weights of one head, ``(n_q, n_k)`` float32."""
        ...

    def weights_block(
        self,
        layer: int,
        heads: Any,
        rows: slice | None = None,
        cols: slice | None = None,
        *,
        log: bool = False,
        fast: bool = False,
    ) -> Any:
        """Weights of several heads of ``layer``, ``(len(heads), n_q, n_k)`` float32 torch tensor."""
        ...

    def lse(self, layer: int) -> np.ndarray:
        """LSE rows of ``layer``, ``(n_heads, T)`` float64."""
        ...

    def weight_on_key(self, key: int = 0) -> np.ndarray:
        """Weight every row of every head puts on key ``key``, ``(n_layers, n_heads, T)`` float32."""
        ...

    def row_mass(self, positions: Sequence[int]) -> np.ndarray:
        """Total weight on the keys at ``positions``, ``(n_layers, n_heads, T)`` float32."""
        ...

    def diagonal(self, offset: int) -> np.ndarray:
        """Weight each row puts on the key ``offset`` before it, ``(n_layers, n_heads, T)`` float32."""
        ...

    def sink_scores(self, key: int = 0) -> np.ndarray:
        """Mean weight on ``key`` over the rows after it, ``(n_layers, n_heads)`` float32."""
        ...
