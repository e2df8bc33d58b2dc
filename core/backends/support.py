"""Which model families the MLX backend runs, readable without importing it: the registry's spec says so
(:func:`attnscope.core.backends.registry.problem`, which the picker and ``attnscope models`` ask before a
model is opened) and the backend refuses with the same list when loading.

Two sources of model code: the hand-written models of :mod:`attnscope.core.backends.mlx_arch`
(:data:`MLX_OWN_FAMILIES`), and mlx-lm's own ``models/<family>.py`` with AttnScope's attention path
hooked in (:mod:`attnscope.core.backends.mlx_lm_arch`, :data:`MLX_LM_FAMILIES`: the families whose
exactness against the torch backend tests/test_mlx_lm.py proves), which run when mlx-lm is installed.
"""

from __future__ import annotations

import importlib.util

MLX_OWN_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")  # transformers model_type values
#: run through mlx-lm's model code (tests/test_mlx_lm.py): mixture-of-experts, Phi-3, Gemma 3 text
MLX_LM_FAMILIES = ("mixtral", "qwen3_moe", "phi3", "gemma3_text")


def mlx_lm_installed() -> bool:
    """Whether ``mlx_lm`` can be imported (found, not imported: no MLX import here)."""
    try:
        return importlib.util.find_spec("mlx_lm") is not None
    except (ImportError, ValueError):
        return False


#: every family the MLX backend runs here (mlx-lm's only where it is installed)
MLX_FAMILIES = MLX_OWN_FAMILIES + (MLX_LM_FAMILIES if mlx_lm_installed() else ())
