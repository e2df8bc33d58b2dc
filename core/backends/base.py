"""What every backend offers (:class:`Backend`), and the chunked prefill loop they share.

A backend owns one model, its KV cache and a :class:`attnscope.core.trace.base.Trace`; the
:class:`attnscope.core.session.Session` and every analysis talk to it only through this protocol, never
through its model or cache objects (those differ per framework: a transformers model and
``DynamicCache`` for torch, an :mod:`attnscope.core.backends.mlx_arch` model and per-layer ``KVCache``
for MLX). :mod:`attnscope.core.backend_registry` maps a backend's name to its class.

A new backend: a class with these members (``tests/integration/test_engine_seams.py`` checks both shipped ones
against the protocol, members and signatures), an entry in the registry, and a Trace that
subclasses :class:`attnscope.core.trace.base.TraceGeometry` (selection rules, head mapping, mask and
sink scores come with it; the backend provides the tensor maths).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import numpy as np
from attnscope.core.errors import Cancelled

PREFILL_CHUNK = 512  # tokens per prefill chunk: progress and cancel happen between chunks

ProgressCb = Callable[[int, int], None]  # (tokens done, tokens in this forward)
CancelCb = Callable[[], bool]


@runtime_checkable
class Backend(Protocol):
    """A model runner with a KV cache and a Trace. Not thread-safe: call it from one thread.

    Attributes:
        name: the registry name (``"torch"``, ``"mlx"``), shown to the user.
        info: :class:`attnscope.core.loading.model_info.ModelInfo` of the loaded model.
        tokenizer: a transformers tokenizer.
        trace: the :class:`attnscope.core.trace.base.Trace` the forwards fill.
        device: a short string (``"cpu"``, ``"cuda:0"``, ``"mlx:cpu"``).
        seq_len: positions in the KV cache (= rows of the trace).
        notices: what the backend did by itself to keep the maps exact (e.g. a RoPE recompute).
        supports_overrides: whether :meth:`fork` takes ``overrides`` (experiments that change the
            mask or scale of every layer; :mod:`attnscope.core.analysis.experiments`).
        memo: results computed from the model's weights alone (e.g. induction scores), kept as long
            as the backend (the model) lives; keys are chosen by the analysis that stores them.
    """

    name: str
    info: Any
    tokenizer: Any
    trace: Any
    device: str
    seq_len: int
    notices: list
    supports_overrides: bool
    memo: dict

    def forward(
        self,
        ids: list[int],
        progress: ProgressCb | None = None,
        cancelled: CancelCb | None = None,
        all_logits: bool = False,
    ) -> np.ndarray:
        """Feed ``ids`` after the cached positions; logits float32, ``(vocab,)`` of the last position
        or ``(len(ids), vocab)`` with ``all_logits``. Raises Cancelled (cache rolled back)."""
        ...

    def truncate(self, n: int) -> None:
        """Drop positions ``>= n`` from the KV cache and the Trace."""
        ...

    def reset(self) -> None:
        """Empty KV cache and Trace."""
        ...

    def kv_cache_bytes(self) -> int:
        """Bytes the KV cache's K and V tensors hold now (all layers)."""
        ...

    def kv_layer_bytes(self) -> np.ndarray:
        """``(n_layers,)`` int64: bytes each layer's K and V tensors hold now."""
        ...

    def cache_dtype(self) -> str:
        """Element type of the cached keys as a :mod:`attnscope.core.kv_formula` dtype name."""
        ...

    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window in keys (None = global), ``n_layers`` entries."""
        ...

    def value_norms(self, layer: int) -> np.ndarray:
        """``‖v_j W_O^h‖``, ``(n_heads, seq_len)`` float32 (:mod:`attnscope.core.analysis.value_weighted`)."""
        ...

    def fork(self, overrides: Any = None, capture: bool = True) -> AbstractContextManager[Backend]:
        """A backend on the same model with its own empty KV cache and Trace, for the ``with`` block;
        this backend's cache and Trace are untouched. Raises UnsupportedModelError for ``overrides``
        when :attr:`supports_overrides` is False."""
        ...

    def release_weights(self) -> None:
        """Drop the model's weights; the Trace, cache and logits stay (weights still readable)."""
        ...


def chunked_forward(
    ids: Sequence[int] | np.ndarray,
    chunk: int,
    run_chunk: Callable[[Any], np.ndarray],
    rollback: Callable[[], None],
    progress: ProgressCb | None = None,
    cancelled: CancelCb | None = None,
    all_logits: bool = False,
) -> np.ndarray:
    """The prefill loop every backend runs: ``ids`` in chunks of ``chunk`` tokens.

    ``cancelled()`` is checked before each chunk, ``progress(done, total)`` called after each;
    ``run_chunk(chunk_ids)`` (a slice of ``ids``) runs one forward and returns its logits, ``(len(chunk_ids), vocab)``
    float32 (or only the last row, ``(1, vocab)``, without ``all_logits``). On any exception
    (Cancelled included) ``rollback()`` restores the cache and Trace, then the exception propagates.

    Returns:
        ``(vocab,)`` float32 logits of the last position, or ``(len(ids), vocab)`` with ``all_logits``.

    Raises:
        Cancelled: ``cancelled()`` became true before a chunk.
    """
    outs = []
    try:
        for c0 in range(0, len(ids), chunk):
            if cancelled is not None and cancelled():
                raise Cancelled("prefill cancelled")
            outs.append(run_chunk(ids[c0 : c0 + chunk]))
            if progress is not None:
                progress(min(c0 + chunk, len(ids)), len(ids))
    except BaseException:
        rollback()
        raise
    return np.concatenate(outs, axis=0) if all_logits else outs[-1][-1]
