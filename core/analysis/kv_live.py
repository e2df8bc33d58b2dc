"""The live KV cache of a session: actual tensor bytes per layer, next to the formula.

:mod:`attnscope.core.analysis.kv_formula` does the accounting for any configuration (``2 × n_layers × n_kv_heads ×
head_dim × seq_len × batch × bytes``, handbook §7); this module measures what the running
session's cache tensors really hold and puts it beside that formula, the same model under MHA /
GQA / MQA, and the projection to the model's maximum context.

Two figures, which differ for a model with sliding windows (Gemma 3: 15 of 18 layers attend to
the last 512 keys only):

* **the model needs**: ``Σ_layers 2 × n_kv_heads × head_dim × min(seq_len, W_l) × bytes``, the
  windows read from the loaded model's config (:func:`layer_windows`);
* **AttnScope keeps**: every key of every layer (a plain ``DynamicCache``), so that each row of
  the prompt stays inspectable also in windowed layers: ``2 × n_layers × … × seq_len × bytes``,
  which is what the tensors measure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from attnscope.core.analysis.kv_formula import KVConfig, SchemeRow, compare_schemes, config_layer_windows


def layer_windows(backend) -> tuple[int | None, ...]:
    """Per-layer sliding windows of the loaded model (keys; None = global), ``n_layers`` entries.

    Torch: from the model's transformers config (:func:`attnscope.core.analysis.kv_formula.config_layer_windows`: ``layer_types``
    + ``sliding_window``, ``use_sliding_window``, Mistral's window on every layer). MLX: the
    backend's own ``ModelArgs.layer_window``. A backend with neither: no windows.
    """
    n = backend.info.n_layers
    args = getattr(backend, "args", None)
    if args is not None and hasattr(args, "layer_window"):
        return tuple(args.layer_window(i) for i in range(n))
    model = getattr(backend, "model", None)
    config = getattr(model, "config", None)
    if config is None:
        return (None,) * n
    config = getattr(config, "get_text_config", lambda: config)()
    return config_layer_windows(config, n)


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
    """Element type of the session's cache, as a :mod:`attnscope.core.analysis.kv_formula` dtype name (e.g. ``"float32"``)."""
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
        formula_bytes: what AttnScope keeps, every key of every layer:
            ``2 × n_layers × n_kv_heads × head_dim × seq_len × bytes`` (equals ``total_bytes``).
        model_bytes: what the model's cache needs, sliding layers capped at their window:
            ``Σ_l 2 × n_kv_heads × head_dim × min(seq_len, W_l) × bytes`` (= ``formula_bytes``
            without windows).
        config: the model's :class:`attnscope.core.analysis.kv_formula.KVConfig` in the cache's dtype, with its windows.
        max_context: the model's maximum context (tokens; 0 when unknown).
        schemes_now: MHA / GQA / MQA rows at ``seq_len`` (what the model needs, windows kept).
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
    model_bytes: int = 0

    @property
    def bytes_per_token(self) -> int:
        """Bytes one more token adds to what AttnScope keeps (every layer)."""
        return self.config.bytes_per_token

    @property
    def kept_config(self) -> KVConfig:
        """The geometry AttnScope's cache has: the model's, every key kept in every layer."""
        return self.config.without_windows()

    @property
    def windowed(self) -> bool:
        """Whether some layer has a sliding window (then the two figures differ past it)."""
        return self.config.windows is not None


def kv_live(session) -> KVLive:
    """Measure the session's KV cache (engine thread). Works before a prompt too (all zeros)."""
    cfg = KVConfig.from_info(session.info, dtype=cache_dtype(session), windows=layer_windows(session.backend))
    layer_bytes = live_layer_bytes(session.backend)
    T = session.seq_len
    max_ctx = int(session.info.max_context or 0)
    return KVLive(
        seq_len=T,
        layer_bytes=layer_bytes,
        total_bytes=int(layer_bytes.sum()),
        formula_bytes=cfg.without_windows().total_bytes(T),
        config=cfg,
        max_context=max_ctx,
        schemes_now=tuple(compare_schemes(cfg, T)),
        schemes_max=tuple(compare_schemes(cfg, max_ctx)),
        model_bytes=cfg.total_bytes(T),
    )
