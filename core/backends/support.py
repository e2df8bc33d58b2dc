"""Which model families the MLX backend runs, readable without importing it: the registry's spec says so
(:func:`attnscope.core.backends.registry.problem`, which the picker asks before a model is opened) and
:mod:`attnscope.core.backends.mlx_arch` refuses with the same list when loading."""

from __future__ import annotations

MLX_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")  # transformers model_type values
