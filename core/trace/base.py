"""What the torch and MLX traces share: selection rules, the GQA head mapping and the applied mask.

Kept free of torch and MLX so that either backend imports only its own array library.
"""

from __future__ import annotations

import numpy as np
from attnscope.core.arch import ArchConfig
from attnscope.core.attention.masks import causal_allowed


def as_slice(sel: slice | None, n: int) -> slice:
    """``sel`` resolved against length ``n`` (None = everything).

    Raises:
        ValueError: a strided selection (tiles are contiguous row/column ranges).
    """
    if sel is None:
        return slice(0, n)
    start, stop, step = sel.indices(n)
    if step != 1:
        raise ValueError("row/column selections must be contiguous slices")
    return slice(start, stop)


class TraceGeometry:
    """Queries common to :class:`attnscope.core.trace.torch_trace.TorchTrace` and :class:`attnscope.core.trace.mlx_trace.MlxTrace`.

    A subclass provides ``arch`` (:class:`attnscope.core.arch.ArchConfig`) and ``layers``: one record per
    layer with ``n_rows()`` (query positions captured), ``keys`` (``(n_kv_heads, S, head_dim)``, or
    None before the first forward) and ``sliding_window`` (int or None).
    """

    arch: ArchConfig

    def _set_arch(self, n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int) -> None:
        """Set :attr:`arch` and its counts as attributes (``n_layers`` … ``group_size``).

        Raises:
            ValueError: ``n_heads`` not a multiple of ``n_kv_heads``.
        """
        self.arch = ArchConfig(n_layers, n_heads, n_kv_heads, head_dim)
        self.n_layers, self.n_heads, self.n_kv_heads, self.head_dim = n_layers, n_heads, n_kv_heads, head_dim
        self.group_size = self.arch.group_size

    @property
    def seq_len(self) -> int:
        return self.layers[0].n_rows() if self.layers else 0

    def kv_head(self, head: int) -> int:
        """The KV head query head ``head`` reads (:meth:`attnscope.core.arch.ArchConfig.kv_head`).

        Raises:
            IndexError: ``head`` outside ``0 .. n_heads - 1``.
        """
        return self.arch.kv_head(head)

    def _rec(self, layer: int):
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} out of range 0..{self.n_layers - 1}")
        rec = self.layers[layer]
        if not rec.n_rows() or rec.keys is None:
            raise RuntimeError("nothing captured yet: run a prompt first")
        return rec

    def allowed(self, layer: int, rows: slice | None = None, cols: slice | None = None) -> np.ndarray:
        """Boolean mask that was applied to ``layer``: causal (+ sliding window), shape ``(n_q, n_k)``,
        bottom-right aligned (query ``i`` sees key ``j`` iff ``j <= i``; DESIGN.md "Masks")."""
        rec = self._rec(layer)
        T, S = rec.n_rows(), rec.keys.shape[1]
        r, c = as_slice(rows, T), as_slice(cols, S)
        return causal_allowed(np.arange(r.start, r.stop), np.arange(c.start, c.stop), rec.sliding_window)
