"""KV-cache accounting.

KV-cache bytes = 2 × n_layers × n_kv_heads × head_dim × seq_len × batch × bytes_per_element
(DESIGN.md; handbook §7 "MQA and GQA: shrinking the KV cache"). The factor 2 is K and V.
"""

from __future__ import annotations

DTYPE_BYTES: dict[str, int] = {
    "fp32": 4, "float32": 4,
    "fp16": 2, "float16": 2,
    "bf16": 2, "bfloat16": 2,
    "fp8": 1, "int8": 1,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name (``"bf16"``, ``"float32"``, ``"torch.float16"``...).

    Raises:
        ValueError: unknown dtype name.
    """
    key = str(dtype).removeprefix("torch.").removeprefix("mlx.core.").lower()
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(set(DTYPE_BYTES))}")
    return DTYPE_BYTES[key]


def kv_cache_bytes(
    n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int, dtype: str = "bf16", batch: int = 1
) -> int:
    """Bytes held by a KV cache of ``seq_len`` tokens.

    ``2 × n_layers × n_kv_heads × head_dim × seq_len × batch × bytes(dtype)``.

    Example (handbook §7): a 70B model (80 layers, head_dim 128) at 8192 tokens in bf16 holds
    21.5 GB with 64 KV heads (MHA), 2.7 GB with 8 (GQA), 0.34 GB with 1 (MQA).

    Raises:
        ValueError: a negative size or an unknown dtype.
    """
    for name, v in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
                    ("seq_len", seq_len), ("batch", batch)):
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch * dtype_bytes(dtype)
