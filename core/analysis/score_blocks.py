"""Blocks of one layer's exact (log-)weights for the blocked views, the keys prepared once per layer.

``w = exp(q·k·scale − lse)`` for a block of rows × keys of several heads is one batched matmul
when the LSE is folded into it (the "augmented" product, as a bias column in a linear layer):

    [q·scale, −lse] · [k, 1]ᵀ = q·k·scale − lse        (h, n_q, D + 1) @ (h, D + 1, n_k)

so the log-weights come out of the matmul with no extra pass over the ``n_q × n_k`` block (the
plain ``baddbmm(−lse.expand(...), q, kᵀ)`` first writes the broadcast LSE into every cell: on this
project's CPU that copy and its negation took 60 % as long as the matmul itself). The keys side
``[kᵀ; 1]`` (``(h, D + 1, n)`` float32) is built once per layer and sliced per block (a column
slice of a row-major matrix: no copy); the query side once per band (``h × n_q × (D + 1)``).

Exactness: float32 throughout (as :meth:`attnscope.core.trace.torch_trace.TorchTrace.weights_block`):
one rounding of ``q·scale`` (exact for ``scale`` a power of two: D = 64, 256), a float32 dot of
``D + 1`` terms. The weights equal the trace's own :meth:`weights` to ~1e-6 relative (tests/core/test_blocked.py
checks 1e-5). Traces that are not torch traces on their own queries (MLX), ``fast`` blocks of a
bfloat16 trace (bf16 matmul), and soft-capped layers (Gemma 2: ``cap·tanh`` sits between the product
and the LSE, so the LSE cannot be folded into it) go through ``trace.weights_block`` unchanged. Learned
sinks (gpt-oss) need nothing here: they live in the recorded LSE.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch


@functools.lru_cache(maxsize=8)
def _mask(nq: int, nk: int, k: int, upper: bool) -> torch.Tensor:
    """``(nq, nk)`` bool: ``j − i >= k`` (``upper``) or ``j − i <= k`` (CPU; a band's tiles repeat shapes)."""
    ones = torch.ones((nq, nk), dtype=torch.bool)
    return ones.triu_(k) if upper else ones.tril_(k)


class LayerBlocks:
    """(Log-)weight blocks of ``heads`` of ``layer`` over the first ``n`` keys of a trace.

    Memory: the key side, ``G × (D + 1) × n`` float32 (``G`` the KV heads read: SmolLM2 at n = 8,192,
    6.4 MB per layer), plus one ``h × n_q × n_k`` block per call.

    Args:
        trace: a :class:`attnscope.core.trace.torch_trace.TorchTrace` (fast path) or any trace with
            ``weights_block`` (MLX: delegated).
        layer, heads: the layer and its query heads (any order; output axis 0 follows ``heads``).
        n: keys ``0..n-1`` are the ones blocks may read (the view's crop).
        fast: bf16 matmul for a bf16 trace (delegated to ``weights_block(fast=True)``).

    Raises:
        IndexError: layer or a head out of range. RuntimeError: nothing captured yet.
    """

    def __init__(self, trace, layer: int, heads: Sequence[int], n: int, *, fast: bool = False):
        self.trace, self.layer, self.heads, self.fast = trace, int(layer), [int(h) for h in heads], fast
        if not self.heads:
            raise IndexError("no heads selected")
        rec = trace._rec(self.layer)  # range and "ran" checks
        kvs = [trace.kv_head(h) for h in self.heads]  # IndexError for a bad head
        self.window = rec.sliding_window
        q_all = getattr(rec, "q", None)
        self.direct = not (
            callable(q_all)
            and isinstance(rec.keys, torch.Tensor)
            and not (fast and rec.keys.dtype == torch.bfloat16 and rec.q().dtype == torch.bfloat16)
            and getattr(rec, "softcap", None) is None
        )
        if self.direct:
            return
        self.rec = rec
        keys = rec.keys[:, :n]  # (n_kv, n, D) the cache's tensor, a view
        groups = sorted(set(kvs))
        per = [kvs.count(g) for g in groups]
        # GQA without copies: heads sorted by KV head, as many per group -> one (G, m·n_q, D+1) query
        # side against G key sides (query head h reads KV head h // group_size); else one key side per head.
        self.grouped = kvs == sorted(kvs) and len(set(per)) == 1
        self.m = per[0] if self.grouped else 1
        sides = groups if self.grouped else kvs
        kt = (
            keys.index_select(0, torch.tensor(sides, device=keys.device)).float().transpose(1, 2)
        )  # (G, D, n)
        ones = torch.ones((len(sides), 1, kt.shape[2]), dtype=torch.float32, device=keys.device)
        self.kaug = torch.cat([kt, ones], dim=1)  # (G, D + 1, n) contiguous: [kᵀ; 1]

    def band(self, r0: int, r1: int) -> None:
        """Prepare the query side of rows ``r0:r1`` once: blocks of rows inside it slice it. Nothing
        to prepare on the direct path (the trace's ``weights_block`` computes each block)."""
        if self.direct:
            return
        self._q_band = (r0, r1, self._build_qaug(r0, r1))

    def _qaug(self, r0: int, r1: int) -> torch.Tensor:
        """``(G, m·n_q, D + 1)`` float32 ``[q·scale, −lse]`` rows of the heads, ``m`` heads per key side
        (sliced from the current :meth:`band` when it holds the rows)."""
        cached = getattr(self, "_q_band", None)
        if cached is None or not cached[0] <= r0 <= r1 <= cached[1]:
            self.band(r0, r1)
            cached = self._q_band
        q = cached[2][:, r0 - cached[0] : r1 - cached[0]]  # (h, n_q, D + 1)
        h, nq = q.shape[0], q.shape[1]
        return q.reshape(h // self.m, self.m * nq, q.shape[2])  # (G, m·n_q, D + 1); a view for the band

    def _build_qaug(self, r0: int, r1: int) -> torch.Tensor:
        """``(h, n_q, D + 1)`` float32 ``[q·scale, −lse]``."""
        rec, heads = self.rec, self.heads
        q_all, lse_all = rec.q(), rec.lse()
        if heads == list(range(heads[0], heads[0] + len(heads))):
            q, lse = (
                q_all[heads[0] : heads[0] + len(heads), r0:r1],
                lse_all[heads[0] : heads[0] + len(heads), r0:r1],
            )
        else:
            q, lse = q_all[heads][:, r0:r1], lse_all[heads][:, r0:r1]  # (h, n_q, D), (h, n_q)
        h, nq, D = q.shape
        out = torch.empty((h, nq, D + 1), dtype=torch.float32, device=q.device)
        out[..., :-1].copy_(q).mul_(rec.scale)  # q·scale, in float32 whatever the store's dtype
        out[..., -1] = -lse  # −lse (float64 store, rounded once)
        return out

    def _scores(self, r0: int, r1: int, c0: int, c1: int) -> torch.Tensor:
        w = torch.bmm(self._qaug(r0, r1), self.kaug[:, :, c0:c1])  # (G, m·n_q, n_k)
        return w.view(len(self.heads), r1 - r0, c1 - c0)  # (h, n_q, n_k)

    def log(self, r0: int, r1: int, c0: int, c1: int) -> torch.Tensor:
        """``(h, r1 − r0, c1 − c0)`` float32 log-weights ``q·k·scale − lse``, ``-inf`` where masked."""
        if self.direct:
            return self.trace.weights_block(
                self.layer, self.heads, slice(r0, r1), slice(c0, c1), log=True, fast=self.fast
            )
        w = self._scores(r0, r1, c0, c1)  # (h, n_q, n_k)
        diag = r0 - c0  # query r0 + i sees key c0 + j iff j − i <= diag (and > diag − window)
        nq, nk = w.shape[1], w.shape[2]
        lo = max(0, diag + 1)
        if lo < nk:  # only the columns right of the band's first diagonal can be masked
            w[..., lo:].masked_fill_(_mask(nq, nk - lo, diag - lo + 1, True).to(w.device), float("-inf"))
        if self.window is not None:
            edge = diag - self.window  # masked iff j − i <= edge
            hi = min(nk, edge + nq)
            if hi > 0:
                w[..., :hi].masked_fill_(_mask(nq, hi, edge, False).to(w.device), float("-inf"))
        return w

    def weights(self, r0: int, r1: int, c0: int, c1: int) -> torch.Tensor:
        """``(h, r1 − r0, c1 − c0)`` float32 weights (masked cells 0), exponentiated in place."""
        if self.direct:
            return self.trace.weights_block(
                self.layer, self.heads, slice(r0, r1), slice(c0, c1), fast=self.fast
            )
        w = self._scores(r0, r1, c0, c1).exp_()  # (h, n_q, n_k)
        diag = r0 - c0
        w.tril_(diag)
        if self.window is not None:
            w.triu_(diag - self.window + 1)
        return w
