"""Backends run a model forward and fill a Trace. ``torch`` (CPU / CUDA) and ``mlx`` (Apple silicon, CPU).

A backend offers (see :class:`attnscope.core.backends.torch_backend.TorchBackend`):

* ``info``: :class:`attnscope.core.loading.model_info.ModelInfo`; ``trace``: a Trace (``weights``, ``sink_scores``...);
* ``tokenizer``: a transformers tokenizer;
* ``forward(ids) -> np.ndarray``: feed new token ids, return the last position's logits (float32);
* ``truncate(n)``: drop every position ``>= n`` from the KV cache and the Trace;
* ``reset()``: empty cache and Trace; ``kv_cache_bytes()``: bytes the cache holds now;
* ``device``: a short string ("cpu", "cuda:0", "mlx:cpu").

The protocol, declared: :class:`attnscope.core.backends.base.Backend` (with the chunked prefill loop
both share); the name -> class table, the one list of backends: :mod:`attnscope.core.backend_registry`
(``registry.names()``).
"""
