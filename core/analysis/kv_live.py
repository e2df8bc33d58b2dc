"""The live KV cache of a session: actual tensor bytes per layer, next to the formula.

:mod:`attnscope.core.kv_formula` does the accounting for any configuration (``2 × n_layers × n_kv_heads ×
head_dim × seq_len × batch × bytes``, docs/tabs/kv.md); this module measures what the running
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
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core.analysis.remotable import remotable
from attnscope.core.kv_formula import KVConfig, SchemeRow, compare_schemes

if TYPE_CHECKING:
    from attnscope.core.session import Session


def layer_windows(backend) -> tuple[int | None, ...]:
    """Per-layer sliding windows of the loaded model (keys; None = global), ``n_layers`` entries:
    :meth:`attnscope.core.backends.base.Backend.layer_windows` (torch: the transformers config's
    ``layer_types`` + ``sliding_window``; MLX: ``ModelArgs.layer_window``)."""
    return tuple(backend.layer_windows())


def live_layer_bytes(backend) -> np.ndarray:
    """Bytes the KV cache tensors of each layer hold now (K and V), ``(n_layers,)`` int64:
    :meth:`attnscope.core.backends.base.Backend.kv_layer_bytes` (torch: ``numel × element_size`` of
    the ``DynamicCache`` tensors; MLX: each layer cache's ``nbytes()``, cached positions only)."""
    return np.asarray(backend.kv_layer_bytes(), dtype=np.int64)


def live_state_bytes(backend) -> np.ndarray:
    """Bytes the recurrent / convolution states of each layer hold now, ``(n_layers,)`` int64: a hybrid
    model's linear-attention, Mamba and convolution layers (docs/how-it-works.md "Hybrid models"), counted apart from
    the KV cache (:meth:`attnscope.core.backends.torch_backend.TorchBackend.state_layer_bytes`); zeros for
    a backend or model without such layers."""
    fn = getattr(backend, "state_layer_bytes", None)
    if fn is None:
        return np.zeros(int(backend.info.n_layers), dtype=np.int64)
    return np.asarray(fn(), dtype=np.int64)


def cache_dtype(session: Session) -> str:
    """Element type of the session's cache, as a :mod:`attnscope.core.kv_formula` dtype name (e.g. ``"float32"``)."""
    return str(session.backend.cache_dtype())


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
        config: the model's :class:`attnscope.core.kv_formula.KVConfig` in the cache's dtype, with its windows.
        max_context: the model's maximum context (tokens; 0 when unknown).
        schemes_now: MHA / GQA / MQA rows at ``seq_len`` (what the model needs, windows kept).
        schemes_max: the same at ``max_context``.
        state_layer_bytes: ``(n_layers,)`` int64, bytes of the recurrent / convolution states of a hybrid
            model's other layers (linear attention, Mamba, short convolution): fixed-size, not part of the
            KV cache, nor of ``total_bytes``; zeros for a model with attention layers only.
        kv_layers: the real indices of the layers that keep a KV cache (every layer unless hybrid).
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
    state_layer_bytes: np.ndarray | None = None
    kv_layers: tuple[int, ...] = ()

    @property
    def state_bytes(self) -> int:
        """Bytes of all recurrent / convolution states (0 without hybrid layers)."""
        return 0 if self.state_layer_bytes is None else int(np.asarray(self.state_layer_bytes).sum())

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


@remotable
def kv_live(session: Session) -> KVLive:
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
        state_layer_bytes=live_state_bytes(session.backend),
        kv_layers=session.info.arch.attention_layers,
    )
