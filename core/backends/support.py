"""Which model families each backend runs, readable without importing the backend (the picker asks
before a model is opened; :mod:`attnscope.core.backends.mlx_arch` refuses with the same list when loading)."""

from __future__ import annotations

MLX_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")  # transformers model_type values


def backend_problem(architecture: str, backend: str) -> str | None:
    """Why ``backend`` cannot run a model of family ``architecture`` (one line), or None when it can
    or when the family is unknown ("": the load itself says what is wrong). The torch backend runs
    every family the catalog marks supported."""
    from attnscope.core.backends.registry import SPECS  # the registry imports MLX_FAMILIES from here

    spec = SPECS.get(backend)
    return None if spec is None else spec.problem(architecture)
