"""analysis"""

# the MLX backend's head analyses register themselves with head_effects (head_effects.BACKEND_IMPLS)
from attnscope.core.analysis import mlx_heads as _mlx_heads  # noqa: F401
