"""The live KV cache of a session: actual tensor bytes per layer, next to the formula.

:mod:`core.kv` does the accounting for any configuration (``2 × n_layers × n_kv_heads ×
head_dim × seq_len × batch × bytes``, handbook §7); this module measures what the running
session's cache tensors really hold and puts it beside that formula, the same model under MHA /
GQA / MQA, and the projection to the model's maximum context.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.kv import KVConfig, SchemeRow, compare_schemes


def live_layer_bytes(backend) -> np.ndarray:
    """Bytes the KV cache tensors of each layer hold now (K and V), ``(n_layers,)`` int64.

    Torch: ``numel × element_size`` of each layer's key and value tensors in the
    ``DynamicCache``; MLX: each layer cache's ``nbytes()`` (cached positions only).
    """
    n = backend.info.n_layers
    out = np.zeros(n, dtype=np.int64)
    if backend.name == "torch":
        for i, layer in enumerate(backend.cache.layers[:n]):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if t is not None and t.numel():
                    out[i] += t.numel() * t.element_size()
        return out
    caches = getattr(backend, "caches", None)
    if caches is not None:
        for i, c in enumerate(caches[:n]):
            out[i] = int(c.nbytes())
        return out
    raise ValueError(f"cannot measure the KV cache of backend {backend.name!r}")


def cache_dtype(session) -> str:
    """Element type of the session's cache, as a :mod:`core.kv` dtype name (e.g. ``"float32"``)."""
    b = session.backend
    if b.name == "torch":
        for layer in b.cache.layers:
            k = getattr(layer, "keys", None)
            if k is not None and k.numel():
                return str(k.dtype).removeprefix("torch.")
    return str(session.info.dtype)


@dataclass(frozen=True)
class KVLive:
    """The session's KV cache now, and what the same model would hold under other schemes.

    Attributes:
        seq_len: cached positions.
        layer_bytes: ``(n_layers,)`` int64, measured bytes per layer (K + V).
        total_bytes: their sum (bytes).
        formula_bytes: ``2 × n_layers × n_kv_heads × head_dim × seq_len × bytes`` (bytes).
        config: the model's :class:`core.kv.KVConfig` in the cache's dtype.
        max_context: the model's maximum context (tokens; 0 when unknown).
        schemes_now: MHA / GQA / MQA rows at ``seq_len``.
        schemes_max: the same at ``max_context``.
    """

    seq_len: int
    layer_bytes: np.ndarray
    total_bytes: int
    formula_bytes: int
    config: KVConfig
    max_context: int
    schemes_now: tuple[SchemeRow, ...]
    schemes_max: tuple[SchemeRow, ...]

    @property
    def bytes_per_token(self) -> int:
        return self.config.bytes_per_token


def kv_live(session) -> KVLive:
    """Measure the session's KV cache (engine thread). Works before a prompt too (all zeros)."""
    cfg = KVConfig.from_info(session.info, dtype=cache_dtype(session))
    layer_bytes = live_layer_bytes(session.backend)
    T = session.seq_len
    max_ctx = int(session.info.max_context or 0)
    return KVLive(
        seq_len=T, layer_bytes=layer_bytes, total_bytes=int(layer_bytes.sum()),
        formula_bytes=cfg.total_bytes(T), config=cfg, max_context=max_ctx,
        schemes_now=tuple(compare_schemes(cfg, T)), schemes_max=tuple(compare_schemes(cfg, max_ctx)),
    )
