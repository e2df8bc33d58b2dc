"""The Trace: what a forward pass leaves behind so that any head's weights can be recomputed exactly.

Per attention layer the Trace keeps the post-RoPE query rows and their log-sum-exp (LSE), both
appended as prefill chunks and decode steps arrive, plus a *reference* to the layer's key tensor
in the KV cache (the tensor the model itself attends to: read, never copied). Nothing of size
layers × heads × T × T is ever stored.

Exact weights on demand (FlashAttention-2, Dao 2023, §3.1: ``P = exp(S − L)``)::

    weights[i, j] = exp(q_i · k_j · scale + mask_ij − lse_i)        (float32)

Row-wise summaries need no T × T work: the mass head ``h`` puts on key 0 (the attention sink,
handbook §4 "Attention sinks") is ``exp(q_i · k_0 · scale − lse_i)``, linear in T.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from core.masks import causal_allowed


def _as_slice(sel: slice | None, n: int) -> slice:
    if sel is None:
        return slice(0, n)
    start, stop, step = sel.indices(n)
    if step != 1:
        raise ValueError("row/column selections must be contiguous slices")
    return slice(start, stop)


@dataclass
class LayerRecord:
    """What one attention layer recorded. Tensors are views of the model's own buffers."""

    q_chunks: list[torch.Tensor] = field(default_factory=list)  # each (n_heads, L_i, D)
    lse_chunks: list[torch.Tensor] = field(default_factory=list)  # each (n_heads, L_i) float32
    keys: torch.Tensor | None = None  # (n_kv_heads, S, D), the cache's tensor
    scale: float = 1.0
    sliding_window: int | None = None
    _q: torch.Tensor | None = None
    _lse: torch.Tensor | None = None

    def q(self) -> torch.Tensor:
        if self._q is None or self._q.shape[1] != sum(c.shape[1] for c in self.q_chunks):
            self._q = torch.cat(self.q_chunks, dim=1) if len(self.q_chunks) > 1 else self.q_chunks[0]
            self.q_chunks = [self._q]
        return self._q

    def lse(self) -> torch.Tensor:
        if self._lse is None or self._lse.shape[1] != sum(c.shape[1] for c in self.lse_chunks):
            self._lse = torch.cat(self.lse_chunks, dim=1) if len(self.lse_chunks) > 1 else self.lse_chunks[0]
            self.lse_chunks = [self._lse]
        return self._lse

    def n_rows(self) -> int:
        return sum(c.shape[1] for c in self.q_chunks)


class TorchTrace:
    """Captured queries + LSE for every layer of a torch model, weights on demand.

    Args:
        n_layers, n_heads, n_kv_heads, head_dim: the model's attention geometry.

    All public methods return numpy float32 arrays on the host.
    """

    def __init__(self, n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int):
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
        self.n_layers, self.n_heads, self.n_kv_heads, self.head_dim = n_layers, n_heads, n_kv_heads, head_dim
        self.group_size = n_heads // n_kv_heads
        self.enabled = True
        self.layers = [LayerRecord() for _ in range(n_layers)]

    # -- recording (called from the attention function, inside the model's forward) -----------
    def record(
        self,
        layer: int,
        query: torch.Tensor,
        lse: torch.Tensor,
        key: torch.Tensor,
        scale: float,
        sliding_window: int | None,
    ) -> None:
        """Append one forward's rows for ``layer``.

        Args:
            query: ``(1, n_heads, L, D)`` post-RoPE queries of the new rows.
            lse: ``(1, n_heads, L)`` float32 LSE of those rows.
            key: ``(1, n_kv_heads, S, D)`` all cached keys, positions ``0 .. S-1``.
        """
        if not self.enabled:
            return
        rec = self.layers[layer]
        rec.q_chunks.append(query[0].detach())
        rec.lse_chunks.append(lse[0].detach())
        rec.keys = key[0].detach()
        rec.scale = float(scale)
        rec.sliding_window = sliding_window

    def reset(self) -> None:
        self.layers = [LayerRecord() for _ in range(self.n_layers)]

    def truncate(self, n: int) -> None:
        """Forget every row at position ``>= n`` (step back); keys are cropped by the cache."""
        for rec in self.layers:
            if rec.n_rows() > n:
                q, lse = rec.q()[:, :n], rec.lse()[:, :n]
                rec.q_chunks, rec.lse_chunks = [q], [lse]
                rec._q, rec._lse = q, lse
                if rec.keys is not None:
                    rec.keys = rec.keys[:, :n]

    # -- queries ------------------------------------------------------------------------------
    @property
    def seq_len(self) -> int:
        return self.layers[0].n_rows() if self.layers else 0

    def kv_head(self, head: int) -> int:
        """The KV head query head ``head`` reads: ``head // group_size`` (transformers' repeat_kv)."""
        if not 0 <= head < self.n_heads:
            raise IndexError(f"head {head} out of range 0..{self.n_heads - 1}")
        return head // self.group_size

    def _rec(self, layer: int) -> LayerRecord:
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} out of range 0..{self.n_layers - 1}")
        rec = self.layers[layer]
        if not rec.q_chunks or rec.keys is None:
            raise RuntimeError("nothing captured yet: run a prompt first")
        return rec

    def allowed(self, layer: int, rows: slice | None = None, cols: slice | None = None) -> np.ndarray:
        """Boolean mask that was applied to ``layer``: causal (+ sliding window), shape (n_q, n_k)."""
        rec = self._rec(layer)
        T, S = rec.n_rows(), rec.keys.shape[1]
        r, c = _as_slice(rows, T), _as_slice(cols, S)
        return causal_allowed(np.arange(r.start, r.stop), np.arange(c.start, c.stop), rec.sliding_window)

    def _scores_t(self, layer: int, head: int, rows, cols) -> tuple[torch.Tensor, torch.Tensor, LayerRecord, slice]:
        rec = self._rec(layer)
        kv = self.kv_head(head)
        T, S = rec.n_rows(), rec.keys.shape[1]
        r, c = _as_slice(rows, T), _as_slice(cols, S)
        q = rec.q()[head, r].float()  # (n_q, D)
        k = rec.keys[kv, c].float()  # (n_k, D)
        s = (q @ k.T) * rec.scale  # (n_q, n_k) scaled scores
        allowed = torch.from_numpy(self.allowed(layer, r, c)).to(s.device)
        return s, allowed, rec, r

    def scores(self, layer: int, head: int, rows: slice | None = None, cols: slice | None = None) -> np.ndarray:
        """Scaled scores ``q·kᵀ·scale`` before softmax, ``-inf`` where masked; (n_q, n_k) float32."""
        s, allowed, _, _ = self._scores_t(layer, head, rows, cols)
        return s.masked_fill(~allowed, float("-inf")).cpu().numpy()

    def weights(self, layer: int, head: int, rows: slice | None = None, cols: slice | None = None) -> np.ndarray:
        """Exact attention weights of one head, shape ``(n_q, n_k)`` float32.

        A tile (``rows``, ``cols`` sub-ranges) is exact on its own thanks to the stored LSE: no
        other column of its rows is needed. Rows over all columns sum to 1; masked cells are 0.

        Raises:
            IndexError: layer or head out of range. RuntimeError: nothing captured yet.
        """
        rec = self._rec(layer)
        kv = self.kv_head(head)
        T, S = rec.n_rows(), rec.keys.shape[1]
        r, c = _as_slice(rows, T), _as_slice(cols, S)
        q = rec.q()[head, r].float()  # (n_q, D)
        k = rec.keys[kv, c].float()  # (n_k, D)
        w = torch.matmul(q, k.T).mul_(rec.scale)  # (n_q, n_k) scaled scores
        w.sub_(rec.lse()[head, r].float()[:, None]).exp_()
        # Causal (+ window) mask in place, as bands of the tile: query position r.start + i sees
        # key c.start + j iff j - i <= r.start - c.start (and > that - window). Same mask as
        # causal_allowed, without building an (n_q, n_k) boolean array (2048² here: ~4 ms).
        diag = r.start - c.start
        w.tril_(diag)
        if rec.sliding_window is not None:
            w.triu_(diag - rec.sliding_window + 1)
        return w.cpu().numpy()

    def lse(self, layer: int) -> np.ndarray:
        """LSE rows of ``layer``, ``(n_heads, T)`` float32."""
        return self._rec(layer).lse().float().cpu().numpy()

    def weight_on_key(self, key: int = 0) -> np.ndarray:
        """Weight every query row of every head puts on key position ``key``.

        Returns ``(n_layers, n_heads, T)`` float32; rows that cannot see ``key`` (``i < key`` or
        outside a sliding window) are 0. Cost: O(layers × heads × T × D), no T × T work.
        """
        out = []
        for layer in range(self.n_layers):
            rec = self._rec(layer)
            q = rec.q().float()  # (H, T, D)
            k0 = rec.keys[:, key].float()  # (Hkv, D)
            k0 = k0.repeat_interleave(self.group_size, dim=0)  # (H, D): H vectors of D, tiny
            s = torch.einsum("htd,hd->ht", q, k0) * rec.scale
            w = torch.exp(s - rec.lse().float())
            vis = torch.from_numpy(causal_allowed(np.arange(q.shape[1]), np.array([key]), rec.sliding_window)[:, 0])
            out.append(w.masked_fill(~vis.to(w.device)[None, :], 0.0))
        return torch.stack(out).cpu().numpy()

    def sink_scores(self, key: int = 0) -> np.ndarray:
        """Sink score per head, ``(n_layers, n_heads)`` float32.

        Definition (issue "inspector", sinks): the mean over query rows ``i >= 1`` of the weight
        on key 0 (row 0 can only attend to itself, so it is left out). For ``key > 0`` the mean
        is over rows ``i > key``.
        """
        w = self.weight_on_key(key)
        if w.shape[-1] <= key + 1:
            return np.zeros(w.shape[:2], dtype=np.float32)
        return w[..., key + 1 :].mean(axis=-1)
