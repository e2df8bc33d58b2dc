"""The Trace: what a forward pass leaves behind so that any head's weights can be recomputed exactly.

Per attention layer the Trace keeps the post-RoPE query rows and their log-sum-exp (LSE), both
appended as prefill chunks and decode steps arrive, plus a *reference* to the layer's key tensor
in the KV cache (the tensor the model itself attends to: read, never copied). Nothing of size
layers × heads × T × T is ever stored.

Exact weights on demand (FlashAttention-2, Dao 2023, §3.1: ``P = exp(S − L)``)::

    weights[i, j] = exp(q_i · k_j · scale + mask_ij − lse_i)        (float32)

Row-wise summaries need no T × T work: the mass head ``h`` puts on key 0 (the attention sink,
Xiao et al. 2023) is ``exp(q_i · k_0 · scale − lse_i)``, linear in T.

Two families change the softmax, and every recomputation here follows (docs/how-it-works.md):

* soft-capping (Gemma 2): the score is ``cap·tanh(q·k·scale / cap)``; the layer's cap is recorded
  and applied by :func:`attnscope.core.attention.fused.softcap_scores` wherever a score is formed;
* learned sinks (gpt-oss): one logit per query head joins every row's denominator; the recorded
  LSE includes it (``lse' = logaddexp(lse, sink_h)``), so the formula above is unchanged, the rows
  sum to ``1 − exp(sink_h − lse')``, and that missing mass is :meth:`TorchTrace.learned_sink_share`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from attnscope.core.attention.fused import MaskCache, softcap_scores
from attnscope.core.attention.masks import causal_allowed
from attnscope.core.checks import index, whole
from attnscope.core.errors import OutOfRange
from attnscope.core.trace.base import TraceGeometry, as_slice, empty_rows
from attnscope.core.trace.finite import FiniteWatch

# Rows of spare room a growing trace adds beyond what is asked (decode steps append one row each).
HEADROOM_ROWS = 256


class _RowStore:
    """Query rows and LSE of every layer in two preallocated tensors, grown geometrically.

    ``q`` is ``(n_layers, n_heads, capacity, D)`` in the model's dtype, ``lse`` ``(n_layers,
    n_heads, capacity)`` float64 (:func:`attnscope.core.attention.fused.exact_lse`: a float32 LSE at ``|lse| ≈ 3·10⁴``
    is off by 0.001, which every weight of its row inherits; float64 costs ``8 / (D × bytes of q)``
    of the q store, 1/32 for float32 q with D = 64). One allocation per prefill (not one per layer and chunk) keeps
    the capture out of the C heap's fragmentation: the measured peak RSS growth of a 2048-token
    prefill on SmolLM2 was 270-560 MB with per-chunk tensors for 236 MB of q + KV data.
    """

    def __init__(self, n_layers: int, n_heads: int, head_dim: int):
        self.shape = (n_layers, n_heads, head_dim)
        self.q: torch.Tensor | None = None
        self.lse: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return 0 if self.q is None else self.q.shape[2]

    def ensure(self, n_rows: int, keep: int, dtype: torch.dtype, device) -> None:
        """Room for ``n_rows`` rows; the first ``keep`` rows of every layer survive a regrowth."""
        if (
            self.q is not None
            and n_rows <= self.capacity
            and self.q.dtype == dtype
            and self.q.device.type == device.type
            and device.index in (None, self.q.device.index)
        ):
            return
        L, H, D = self.shape
        cap = max(n_rows + HEADROOM_ROWS, self.capacity + self.capacity // 4)
        q = torch.empty((L, H, cap, D), dtype=dtype, device=device)
        lse = torch.empty((L, H, cap), dtype=torch.float64, device=device)
        if self.q is not None and self.lse is not None and keep:
            q[:, :, :keep] = self.q[:, :, :keep]
            lse[:, :, :keep] = self.lse[:, :, :keep]
        self.q, self.lse = q, lse


@dataclass
class LayerRecord:
    """What one attention layer recorded: its rows of the trace's q/LSE store, the cache's keys."""

    keys: torch.Tensor | None = None  # (n_kv_heads, S, D), the cache's tensor
    scale: float = 1.0
    sliding_window: int | None = None
    rows: int = 0
    layer: int = 0
    store: _RowStore | None = None
    softcap: float | None = None  # Gemma 2: scores are cap·tanh(s/cap)
    sinks: torch.Tensor | None = None  # gpt-oss: (n_heads,) float64 learned sink logits, in the LSE

    def cap(self, s: torch.Tensor) -> torch.Tensor:
        """Scaled scores made what the softmax saw, in place: ``cap·tanh(s/cap)`` or ``s`` unchanged."""
        return softcap_scores(s, self.softcap)

    def q(self) -> torch.Tensor:
        """``(n_heads, rows, D)`` post-RoPE queries (a view of the store: read it, don't keep it)."""
        assert self.store is not None and self.store.q is not None, "read after record()"
        return self.store.q[self.layer, :, : self.rows]

    def lse(self) -> torch.Tensor:
        """``(n_heads, rows)`` float64 LSE (a view of the store)."""
        assert self.store is not None and self.store.lse is not None, "read after record()"
        return self.store.lse[self.layer, :, : self.rows]

    def n_rows(self) -> int:
        return self.rows


def _wide(lse: torch.Tensor) -> bool:
    """True when some finite LSE exceeds :data:`attnscope.core.attention.fused.LSE_FP32_EXACT` in magnitude."""
    from attnscope.core.attention.fused import LSE_FP32_EXACT

    return bool(torch.nan_to_num(lse.abs(), posinf=0.0).amax() > LSE_FP32_EXACT) if lse.numel() else False


class TorchTrace(TraceGeometry):
    """Captured queries + LSE for every layer of a torch model, weights on demand.

    Args:
        n_layers, n_heads, n_kv_heads, head_dim: the model's attention geometry.

    All public methods return numpy float32 arrays on the host.
    """

    def __init__(
        self, n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int, layer_kinds: tuple[str, ...] = ()
    ):
        # layer_kinds: a hybrid model's per-layer kinds; rows are indexed by the real layer index
        # (attnscope.core.trace.base, "Layers with no map")
        self._set_arch(n_layers, n_heads, n_kv_heads, head_dim, layer_kinds)  # ValueError: not a multiple
        self.enabled = True
        self.mask_cache = MaskCache()  # the forwards' structural masks, built once per chunk (fused)
        self.overrides: Any = None  # experiments' attention hook (TorchBackend.fork; hf_attention reads it)
        self.reset()

    def reserve(self, n_rows: int, dtype: torch.dtype, device) -> None:
        """Make room for ``n_rows`` rows per layer in one allocation (the backend calls this before
        a forward, with the sequence length it will reach). Optional: :meth:`record` grows too."""
        self._store.ensure(n_rows, max(r.rows for r in self.layers), dtype, torch.device(device))

    # -- recording (called from the attention function, inside the model's forward) -----------
    def record(
        self,
        layer: int,
        query: torch.Tensor,
        lse: torch.Tensor,
        key: torch.Tensor,
        scale: float,
        sliding_window: int | None,
        *,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        """Append one forward's rows for ``layer``.

        Args:
            query: ``(1, n_heads, L, D)`` post-RoPE queries of the new rows.
            lse: ``(1, n_heads, L)`` LSE of those rows, float64 from
                :func:`attnscope.core.attention.fused.exact_lse` (a float32 one is stored as it is, widened);
                with learned sinks, the LSE that includes them.
            key: ``(1, n_kv_heads, S, D)`` all cached keys, positions ``0 .. S-1``.
            softcap: the layer's attention-logit cap (Gemma 2), or None.
            sinks: the layer's learned sink logits ``(n_heads,)`` (gpt-oss), or None.
        """
        if not self.enabled:
            return
        rec = self.layers[layer]
        n, L = rec.rows, query.shape[2]
        self.finite.check_attention(layer, query, key, lse, L)  # attnscope.core.trace.finite
        st = rec.store = self._store_on(query.device)
        if st.q is None or n + L > st.capacity or st.q.dtype != query.dtype:  # else: reserved already
            st.ensure(n + L, max(r.rows for r in self.layers), query.dtype, query.device)
        assert st.q is not None and st.lse is not None  # allocated by ensure()
        st.q[layer, :, n : n + L] = query[0].detach()
        st.lse[layer, :, n : n + L] = lse[0].detach()
        rec.rows = n + L
        rec.keys = key[0].detach()
        rec.scale = float(scale)
        rec.sliding_window = sliding_window
        rec.softcap = None if softcap is None else float(softcap)
        if sinks is None:
            rec.sinks = None
        elif rec.sinks is None or rec.sinks.device != query.device:  # a parameter: the same every call
            rec.sinks = sinks.detach().reshape(-1).to(device=query.device, dtype=torch.float64).clone()

    def _store_on(self, device: torch.device) -> _RowStore:
        """The row store on ``device``: the main one, or (a model spread by ``--device-map``,
        :mod:`attnscope.core.loading.device_map`) one per further device, so each layer's rows stay beside its keys
        and a tile is computed there; only the tile comes to the host. A further store is indexed
        by layer like the main one (rows of layers elsewhere are never written, so cost nothing
        on the CPU and, on CUDA, take address space the allocator reserves: n_layers × capacity)."""
        main = self._store
        if main.q is None or (main.q.device.type == device.type and main.q.device.index == device.index):
            return main
        key = str(device)
        if key not in self._device_stores:
            self._device_stores[key] = _RowStore(self.n_layers, self.n_heads, self.head_dim)
        return self._device_stores[key]

    def reset(self) -> None:
        self.finite = FiniteWatch()  # non-finite values of this sequence's forwards
        self._store = _RowStore(self.n_layers, self.n_heads, self.head_dim)
        self._device_stores: dict[str, _RowStore] = {}
        self.layers = [LayerRecord(layer=i, store=self._store) for i in range(self.n_layers)]

    def truncate(self, n: int) -> None:
        """Forget every row at position ``>= n`` (step back); keys are cropped by the cache."""
        for rec in self.layers:
            if rec.n_rows() > n:
                rec.rows = n
                if rec.keys is not None:
                    rec.keys = rec.keys[:, :n]

    # -- queries (seq_len, kv_head, allowed: attnscope.core.trace.base.TraceGeometry) ----------------------
    def _scores_t(
        self, layer: int, head: int, rows, cols
    ) -> tuple[torch.Tensor, torch.Tensor, LayerRecord, slice]:
        rec = self._rec(layer)
        kv = self.kv_head(head)
        T, S = rec.n_rows(), rec.keys.shape[1]
        r, c = as_slice(rows, T, "rows"), as_slice(cols, S, "cols")
        q = rec.q()[head, r].float()  # (n_q, D)
        k = rec.keys[kv, c].float()  # (n_k, D)
        s = (q @ k.T) * rec.scale  # (n_q, n_k) scaled scores
        allowed = torch.from_numpy(self.allowed(layer, r, c)).to(s.device)
        return s, allowed, rec, r

    def scores(
        self,
        layer: int,
        head: int,
        rows: slice | None = None,
        cols: slice | None = None,
        *,
        raw: bool = False,
    ) -> np.ndarray:
        """Scores the softmax saw, ``-inf`` where masked; (n_q, n_k) float32.

        ``q·kᵀ·scale``, soft-capped to ``cap·tanh(q·kᵀ·scale / cap)`` in a layer with a cap
        (Gemma 2) unless ``raw`` (the scaled scores before the cap). A learned sink is not a key:
        its logit is :meth:`learned_sinks`.
        """
        s, allowed, rec, _ = self._scores_t(layer, head, rows, cols)
        if not raw:
            rec.cap(s)
        return s.masked_fill(~allowed, float("-inf")).cpu().numpy()

    def weights(
        self, layer: int, head: int, rows: slice | None = None, cols: slice | None = None
    ) -> np.ndarray:
        """Exact attention weights of one head, shape ``(n_q, n_k)`` float32.

        A tile (``rows``, ``cols`` sub-ranges) is exact on its own thanks to the stored LSE: no
        other column of its rows is needed. Rows over all columns sum to 1 (to 1 minus the
        :meth:`learned_sink_share` in a model with learned sinks); masked cells are 0.

        Raises:
            IndexError: layer or head out of range. RuntimeError: nothing captured yet.
        """
        rec = self._rec(layer)
        kv = self.kv_head(head)
        T, S = rec.n_rows(), rec.keys.shape[1]
        r, c = as_slice(rows, T, "rows"), as_slice(cols, S, "cols")
        lse = rec.lse()[head, r]  # (n_q,) float64
        # Large scores (|lse| > 16) are formed in float64: their float32 rounding would be > 1e-6
        # of every weight of the row (attnscope.core.attention.fused.LSE_FP32_EXACT, docs/exactness.md).
        dt = torch.float64 if _wide(lse) else torch.float32
        q = rec.q()[head, r].to(dt)  # (n_q, D)
        k = rec.keys[kv, c].to(dt)  # (n_k, D)
        w = rec.cap(torch.matmul(q, k.T).mul_(rec.scale))  # (n_q, n_k) scores (capped: Gemma 2)
        if rec.q().dtype in (torch.float16, torch.bfloat16):
            # The model path keeps the CPU kernel's LSE of half-precision inputs (~5e-5 off, so
            # prefill runs at the kernel's speed): rebuild these rows' LSE from float32 scores
            # over every key they see, reusing this tile's scores when it spans them all.
            lse = self._row_lse(rec, head, r, q, w if (c.start, c.stop) == (0, S) else None)
        w.sub_(lse.to(dt)[:, None]).exp_()
        # Causal (+ window) mask in place, as bands of the tile: query position r.start + i sees
        # key c.start + j iff j - i <= r.start - c.start (and > that - window). Same mask as
        # causal_allowed, without building an (n_q, n_k) boolean array (2048² here: ~4 ms).
        diag = r.start - c.start
        w.tril_(diag)
        if rec.sliding_window is not None:
            w.triu_(diag - rec.sliding_window + 1)
        return w.float().cpu().numpy()

    def _row_lse(
        self, rec: LayerRecord, head: int, r: slice, q: torch.Tensor, scores: torch.Tensor | None
    ) -> torch.Tensor:
        """``(n_q,)`` float64 LSE of rows ``r`` of query head ``head`` from the stored q (``(n_q, D)``,
        float32/64) and every key of its KV head, under the layer's causal (+ window) mask, cap and
        learned sink; ``scores`` are the rows' (capped) scores over all keys when the caller has them."""
        if scores is None:
            assert rec.keys is not None, "a recorded layer holds its keys"
            kv = self.kv_head(head)
            scores = rec.cap(torch.matmul(q, rec.keys[kv].to(q.dtype).T).mul_(rec.scale))  # (n_q, S)
        s = scores.clone()
        diag = r.start  # query position r.start + i sees key j iff j - i <= r.start
        n_q, S = s.shape
        i = torch.arange(n_q, device=s.device)[:, None]
        j = torch.arange(S, device=s.device)[None, :]
        allowed = j - i <= diag
        if rec.sliding_window is not None:
            allowed &= j - i > diag - rec.sliding_window
        s.masked_fill_(~allowed, float("-inf"))
        lse = torch.logsumexp(s.double(), dim=-1)
        if rec.sinks is not None:  # gpt-oss: the sink's logit joins the denominator
            lse = torch.logaddexp(lse, rec.sinks[head].to(lse.device).expand_as(lse))
        return lse

    def weights_block(
        self,
        layer: int,
        heads,
        rows: slice | None = None,
        cols: slice | None = None,
        *,
        log: bool = False,
        fast: bool = False,
    ) -> torch.Tensor:
        """Weights of several query heads of ``layer`` at once: ``(len(heads), n_q, n_k)`` float32 torch
        tensor on the trace's device (the blocked path of :mod:`attnscope.core.analysis.blocked`).

        One batched matmul over the heads (each reads its KV head ``h // group_size``; the keys
        are gathered, ``n_k × D`` per head, never ``n_q × n_k`` extra). ``log=True`` returns the
        log-weights ``q·k·scale − lse`` with ``-inf`` where masked (no exponential: a max over a
        block of log-weights, exponentiated once, is the max of the weights). ``fast=True`` runs
        the matmul in the model's dtype when that is bfloat16 (scores then carry bf16 rounding,
        ~3 significant digits: for overviews, never for exact tiles or exports); float32
        otherwise. Same mask as :meth:`weights`.

        Raises:
            IndexError: layer or a head out of range. RuntimeError: nothing captured yet.
        """
        rec = self._rec(layer)
        heads = list(range(self.n_heads)) if heads is None else [whole("head", h) for h in heads]
        kvs = [self.kv_head(h) for h in heads]  # OutOfRange: a head out of range
        T, S = rec.n_rows(), rec.keys.shape[1]
        r, c = as_slice(rows, T, "rows"), as_slice(cols, S, "cols")
        q_all, keys = rec.q(), rec.keys
        dt = q_all.dtype if fast and q_all.dtype == torch.bfloat16 else torch.float32
        if not heads:
            raise OutOfRange("no heads selected: pass heads=None for all, or a list of head indices")
        if heads == list(range(heads[0], heads[0] + len(heads))):
            q = q_all[heads[0] : heads[0] + len(heads), r]  # (h, n_q, D) view
        else:
            q = q_all[heads][:, r]  # (h, n_q, D)
        kv_idx = torch.tensor(kvs, device=keys.device)
        k = keys[:, c].index_select(0, kv_idx)  # (h, n_k, D)
        lse = rec.lse()[heads][:, r].float()  # (h, n_q)
        if rec.softcap is not None:  # Gemma 2: the cap sits between the product and the LSE
            w = rec.cap(torch.bmm(q.to(dt), k.to(dt).transpose(1, 2)).float().mul_(rec.scale))
            w.sub_(lse[:, :, None])  # (h, n_q, n_k)
        elif dt == torch.float32:  # one pass: w = scale · q·kᵀ − lse (baddbmm broadcasts the LSE column)
            w = torch.baddbmm(
                -lse[:, :, None].expand(-1, -1, k.shape[1]),
                q.float(),
                k.float().transpose(1, 2),
                alpha=rec.scale,
            )  # (h, n_q, n_k)
        else:
            w = torch.bmm(q.to(dt), k.to(dt).transpose(1, 2)).float().mul_(rec.scale)  # (h, n_q, n_k)
            w.sub_(lse[:, :, None])
        diag = r.start - c.start  # query position r.start + i sees key c.start + j iff j - i <= diag
        if log:  # -inf only where a mask can apply: right of column diag, left of the window's edge
            nq, nk = w.shape[1], w.shape[2]
            i = torch.arange(nq, device=w.device)[:, None]
            lo = max(0, diag + 1)
            if lo < nk:
                j = torch.arange(lo, nk, device=w.device)[None, :]
                w[..., lo:].masked_fill_((j - i) > diag, float("-inf"))
            if rec.sliding_window is not None:
                edge = diag - rec.sliding_window  # masked iff j - i <= edge
                hi = min(nk, edge + nq)
                if hi > 0:
                    j = torch.arange(0, hi, device=w.device)[None, :]
                    w[..., :hi].masked_fill_((j - i) <= edge, float("-inf"))
            return w
        w.exp_().tril_(diag)
        if rec.sliding_window is not None:
            w.triu_(diag - rec.sliding_window + 1)
        return w

    def lse(self, layer: int) -> np.ndarray:
        """LSE rows of ``layer``, ``(n_heads, T)`` float64."""
        return self._rec(layer).lse().double().cpu().numpy()

    def weight_on_key(self, key: int = 0) -> np.ndarray:
        """Weight every query row of every head puts on key position ``key``.

        Returns ``(n_layers, n_heads, T)`` float32; rows that cannot see ``key`` (``i < key`` or
        outside a sliding window) are 0; layers with no map are NaN. Cost: O(layers × heads × T × D),
        no T × T work.
        """
        out = []
        for layer in range(self.n_layers):
            if not self.arch.has_map(layer):  # a hybrid model's layer with no map: a NaN row
                out.append(torch.full((self.n_heads, self.seq_len), float("nan")))
                continue
            rec = self._rec(layer)
            index("key", key, rec.keys.shape[1])  # OutOfRange (a negative key would read from the end)
            dt = torch.float64 if _wide(rec.lse()) else torch.float32
            q = rec.q().to(dt)  # (H, T, D)
            k0 = rec.keys[:, key].to(dt)  # (Hkv, D)
            k0 = k0[torch.from_numpy(self.arch.kv_heads()).to(k0.device)]  # (H, D): each head's KV row, tiny
            s = rec.cap(torch.einsum("htd,hd->ht", q, k0) * rec.scale)
            w = torch.exp(s - rec.lse().to(dt)).float()
            vis = torch.from_numpy(
                causal_allowed(np.arange(q.shape[1]), np.array([key]), rec.sliding_window)[:, 0]
            )
            out.append(w.masked_fill(~vis.to(w.device)[None, :], 0.0))
        return torch.stack([o.cpu() for o in out]).numpy()  # layers may sit on several devices (device_map)

    def _row_mass(self, positions: list[int]) -> np.ndarray:
        """:meth:`attnscope.core.trace.base.TraceGeometry.row_mass` in one product per layer: the rows'
        scores against the ``P`` selected keys, ``(H, T, P)``, GQA by viewing q as ``(Hkv, G, T, D)``."""
        out = []
        G = self.group_size
        idx = torch.tensor(positions)
        for layer in range(self.n_layers):
            if not self.arch.has_map(layer):  # a hybrid model's layer with no map: a NaN row
                out.append(torch.full((self.n_heads, self.seq_len), float("nan")))
                continue
            rec = self._rec(layer)
            q = rec.q().float()  # (H, T, D)
            H, Tq, D = q.shape
            k = rec.keys[:, idx.to(rec.keys.device)].float()  # (Hkv, P, D)
            s = (
                torch.einsum("kgtd,kpd->kgtp", q.reshape(-1, G, Tq, D), k).reshape(H, Tq, len(positions))
                * rec.scale
            )  # (H, T, P)
            w = torch.exp(rec.cap(s) - rec.lse().float()[..., None])  # (H, T, P)
            seen = causal_allowed(np.arange(Tq), np.array(positions), rec.sliding_window)  # (T, P)
            vis = torch.from_numpy(seen).to(w.device)
            out.append(w.masked_fill(~vis[None], 0.0).sum(-1))
        return torch.stack([o.cpu() for o in out]).numpy().astype(np.float32)

    def _diagonal(self, offset: int, block: int = 256) -> np.ndarray:
        """:meth:`attnscope.core.trace.base.TraceGeometry.diagonal` as one dot product per row: row ``i``
        against key ``i − offset``, GQA by viewing q as ``(Hkv, G, T − off, D)`` (``block`` unused)."""
        T = self.seq_len
        out = empty_rows(self, T)  # NaN rows for a hybrid model's layers with no map
        G = self.group_size
        for layer in self.arch.attention_layers:
            rec = self._rec(layer)
            q = rec.q().float()[:, offset:]  # (H, T − off, D)
            H, n, D = q.shape
            k = rec.keys[:, : T - offset].float()  # (Hkv, T − off, D): key i − off for row i
            s = torch.einsum("kgtd,ktd->kgt", q.reshape(-1, G, n, D), k).reshape(H, n) * rec.scale
            w = torch.exp(rec.cap(s) - rec.lse().float()[:, offset:])
            if rec.sliding_window is not None and offset >= rec.sliding_window:
                w = torch.zeros_like(w)
            out[layer, :, offset:] = w.cpu().numpy()
        return out
