"""The MLX Trace: :class:`attnscope.core.trace.torch_trace.TorchTrace`'s public API over MLX arrays.

Per attention layer it keeps the post-RoPE query rows and their log-sum-exp (LSE) as MLX arrays,
appended as prefill chunks and decode steps arrive, and a reference to the layer's KV cache
(:class:`attnscope.core.backends.mlx_arch.KVCache`): keys are read from the cache when a view asks, never
copied. Holding the cache rather than a key array also lets MLX update the preallocated key
buffer in place (a live reference to an old slice would force a copy on every decode step).

Exact weights on demand (FlashAttention-2, Dao 2023, §3.1: ``P = exp(S − L)``)::

    weights[i, j] = exp((q_i · k_j · scale + mask_ij − m_i) − ℓ_i)        (float32)

with the LSE kept as its two parts, the row max ``m`` and ``ℓ = log Σ exp(s − m)`` (see
:func:`attnscope.core.attention.fused_mlx.sdpa_with_lse_mlx`): one float32 ``lse = m + ℓ`` would be off by half an
ulp of ``m``, 0.001 at ``|m| ≈ 3·10⁴``, in every weight of the row (docs/exactness.md).

Every public method returns numpy float32 (bool for :meth:`MlxTrace.allowed`). MLX arrays belong to
the thread whose stream made them: call the trace from the thread that runs the backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np
from attnscope.core.attention.masks import causal_allowed
from attnscope.core.checks import index
from attnscope.core.trace.base import TraceGeometry, as_slice
from attnscope.core.trace.finite import FiniteWatch

if TYPE_CHECKING:
    from attnscope.core.backends.mlx_arch import KVCache


class MlxFiniteWatch(FiniteWatch):
    """:class:`attnscope.core.trace.finite.FiniteWatch` over MLX arrays: ``max(|x|)`` per tensor,
    kept lazy (the backend evaluates :meth:`pending` with the chunk's logits), read as one
    ``mx.stack`` in one transfer (:meth:`flush`)."""

    def _reduce(self, tensor):
        if (
            not isinstance(tensor, mx.array)
            or not mx.issubdtype(tensor.dtype, mx.floating)
            or tensor.size == 0
        ):
            return None
        return mx.max(mx.abs(tensor))

    def _read(self, reductions: list) -> list[float]:
        return [float(x) for x in np.array(mx.stack(reductions).astype(mx.float32)).tolist()]


@dataclass
class MlxLayerRecord:
    """What one attention layer recorded."""

    q_chunks: list[mx.array] = field(default_factory=list)  # each (n_heads, L_i, D), model dtype
    lse_chunks: list[mx.array] = field(default_factory=list)  # each (n_heads, L_i) float32: m, the row max
    ell_chunks: list[mx.array] = field(
        default_factory=list
    )  # each (n_heads, L_i) float32: ℓ = log Σ exp(s − m)
    cache: KVCache | None = None  # the layer's KV cache (fetch_keys() -> (n_kv_heads, S, D))
    scale: float = 1.0
    sliding_window: int | None = None

    def q(self) -> mx.array:
        if len(self.q_chunks) > 1:
            self.q_chunks = [mx.concatenate(self.q_chunks, axis=1)]
        return self.q_chunks[0]

    def lse(self) -> mx.array:
        """The row max ``m`` of every row, ``(n_heads, rows)`` float32 (the LSE is ``m + ell()``)."""
        if len(self.lse_chunks) > 1:
            self.lse_chunks = [mx.concatenate(self.lse_chunks, axis=1)]
        return self.lse_chunks[0]

    def ell(self) -> mx.array:
        """``ℓ = log Σ exp(s − m)`` of every row, ``(n_heads, rows)`` float32."""
        if len(self.ell_chunks) > 1:
            self.ell_chunks = [mx.concatenate(self.ell_chunks, axis=1)]
        return self.ell_chunks[0]

    def n_rows(self) -> int:
        return sum(c.shape[1] for c in self.q_chunks)

    @property
    def keys(self) -> mx.array | None:
        """``(n_kv_heads, S, D)`` cached post-RoPE keys (a view of the cache), None before any run."""
        return None if self.cache is None or self.cache.keys is None else self.cache.fetch_keys()


class MlxTrace(TraceGeometry):
    """Captured queries + LSE for every layer of an MLX model, weights on demand.

    Args:
        n_layers, n_heads, n_kv_heads, head_dim: the model's attention geometry.

    Raises:
        ValueError: ``n_heads`` not a multiple of ``n_kv_heads``.
    """

    def __init__(self, n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int):
        self._set_arch(n_layers, n_heads, n_kv_heads, head_dim)  # ValueError: not a multiple
        self.enabled = True
        self.layers = [MlxLayerRecord() for _ in range(n_layers)]
        self.finite = MlxFiniteWatch()  # non-finite values of this sequence's forwards

    def reserve(self, n_rows: int, dtype=None, device=None) -> None:
        """Accepted for API parity with :meth:`attnscope.core.trace.torch_trace.TorchTrace.reserve`; nothing to do here.

        MLX arrays are immutable values: rows arrive as one array per chunk and are concatenated
        (once) when a view reads them, so there is no buffer to grow in advance.
        """

    # -- recording (called from the attention module, inside the forward) -----------------------
    def record(
        self, layer: int, query: mx.array, lse: mx.array, cache, scale: float, sliding_window: int | None
    ) -> None:
        """Append one forward's rows for ``layer``.

        Args:
            query: ``(1, n_heads, L, D)`` post-RoPE queries of the new rows (lazy is fine: the
                backend evaluates :meth:`pending` with the logits).
            lse: the LSE of those rows as its parts ``(m, ℓ)``, each ``(1, n_heads, L)`` float32
                (``sdpa_with_lse_mlx(..., parts=True)``), or one ``(1, n_heads, L)`` float32 LSE
                (kept as ``m = lse, ℓ = 0``: exact only to its own float32 rounding).
            cache: the layer's KV cache, already holding positions ``0 .. S-1``.
        """
        if not self.enabled:
            return
        rec = self.layers[layer]
        m, ell = lse if isinstance(lse, tuple) else (lse, mx.zeros_like(lse))
        L = query.shape[2]
        # queries, the L new keys (the cache's last rows) and the LSE m + ℓ (attnscope.core.trace.finite)
        self.finite.check_attention(layer, query, cache.keys[..., : cache.offset, :], m + ell, L)
        rec.q_chunks.append(query[0])
        rec.lse_chunks.append(m[0])
        rec.ell_chunks.append(ell[0])
        rec.cache = cache
        rec.scale = float(scale)
        rec.sliding_window = sliding_window

    def pending(self) -> list[mx.array]:
        """The newest chunk of every layer (for ``mx.eval`` together with the logits)."""
        out = []
        for rec in self.layers:
            if rec.q_chunks:
                out += [rec.q_chunks[-1], rec.lse_chunks[-1], rec.ell_chunks[-1]]
        return out

    def reset(self) -> None:
        self.layers = [MlxLayerRecord() for _ in range(self.n_layers)]
        self.finite = MlxFiniteWatch()

    def truncate(self, n: int) -> None:
        """Forget every row at position ``>= n`` (step back); the cache trims its own keys."""
        for rec in self.layers:
            if rec.n_rows() > n:
                rec.q_chunks, rec.lse_chunks, rec.ell_chunks = (
                    [rec.q()[:, :n]],
                    [rec.lse()[:, :n]],
                    [rec.ell()[:, :n]],
                )

    # -- queries (seq_len, kv_head, allowed: attnscope.core.trace.base.TraceGeometry) ----------------------
    def _scores(self, layer: int, head: int, rows, cols):
        rec = self._rec(layer)
        kv = self.kv_head(head)
        keys = rec.keys
        T, S = rec.n_rows(), keys.shape[1]
        r, c = as_slice(rows, T, "rows"), as_slice(cols, S, "cols")
        q = rec.q()[head, r.start : r.stop].astype(mx.float32)  # (n_q, D)
        k = keys[kv, c.start : c.stop].astype(mx.float32)  # (n_k, D)
        s = (q @ k.T) * rec.scale  # (n_q, n_k) scaled scores
        allowed = mx.array(self.allowed(layer, r, c))
        return s, allowed, rec, r

    def scores(
        self, layer: int, head: int, rows: slice | None = None, cols: slice | None = None
    ) -> np.ndarray:
        """Scaled scores ``q·kᵀ·scale`` before softmax, ``-inf`` where masked; (n_q, n_k) float32."""
        s, allowed, _, _ = self._scores(layer, head, rows, cols)
        return np.array(mx.where(allowed, s, -mx.inf))

    def weights(
        self, layer: int, head: int, rows: slice | None = None, cols: slice | None = None
    ) -> np.ndarray:
        """Exact attention weights of one head, shape ``(n_q, n_k)`` float32.

        A tile (``rows``, ``cols`` sub-ranges) is exact on its own thanks to the stored LSE.
        Rows over all columns sum to 1; masked cells are 0.

        Raises:
            IndexError: layer or head out of range. RuntimeError: nothing captured yet.
        """
        s, allowed, rec, r = self._scores(layer, head, rows, cols)
        m = rec.lse()[head, r.start : r.stop][:, None]
        ell = rec.ell()[head, r.start : r.stop][:, None]
        return np.array(mx.where(allowed, mx.exp((s - m) - ell), 0.0))

    # weights_block: TraceGeometry's, which stacks weights() per head (exact float32 whatever ``fast``)

    def lse(self, layer: int) -> np.ndarray:
        """LSE rows of ``layer``, ``(n_heads, T)`` float64 (``m + ℓ`` added in float64)."""
        rec = self._rec(layer)
        return np.array(rec.lse()).astype(np.float64) + np.array(rec.ell()).astype(np.float64)

    def weight_on_key(self, key: int = 0) -> np.ndarray:
        """Weight every query row of every head puts on key position ``key``.

        Returns ``(n_layers, n_heads, T)`` float32; rows that cannot see ``key`` are 0.
        Cost: O(layers × heads × T × D), no T × T work.
        """
        out = []
        for layer in range(self.n_layers):
            rec = self._rec(layer)
            index("key", key, rec.keys.shape[1])  # OutOfRange: MLX indexing does not bounds-check
            q = rec.q().astype(mx.float32)  # (H, T, D)
            k0 = rec.keys[:, key].astype(mx.float32)  # (Hkv, D)
            k0 = k0[mx.array(self.arch.kv_heads())]  # (H, D): each head's KV row, tiny
            s = (q * k0[:, None, :]).sum(axis=-1) * rec.scale  # (H, T)
            w = mx.exp((s - rec.lse()) - rec.ell())
            vis = causal_allowed(np.arange(q.shape[1]), np.array([key]), rec.sliding_window)[:, 0]
            out.append(mx.where(mx.array(vis)[None, :], w, 0.0))
        return np.array(mx.stack(out))
