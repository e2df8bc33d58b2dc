"""KV-cache accounting (and the naive attention matrix's memory), for any model configuration.

KV-cache bytes = 2 × n_layers × n_kv_heads × head_dim × seq_len × batch × bytes_per_element
(DESIGN.md; handbook §7 "MQA and GQA: shrinking the KV cache"). The factor 2 is K and V.

* MHA caches one K and one V per query head (``n_kv_heads = n_heads``); GQA one per group of
  query heads (Ainslie et al. 2023); MQA a single one (``n_kv_heads = 1``, Shazeer 2019).
* MLA (DeepSeek-V2, Liu et al. 2024, §2.1 and Table 1) caches one compressed latent of
  ``kv_latent_dim`` (their ``d_c``) per token and layer, plus a decoupled RoPE key of
  ``rope_head_dim`` (``d_h^R``) shared by all heads: ``(d_c + d_h^R) × n_layers`` elements per
  token, no factor 2 (K and V are both reconstructed from the latent).

Units: bytes (ints). :func:`format_bytes` prints decimal units (kB, MB, GB: the handbook's
"21.5 GB") or binary ones (KiB, MiB, GiB: what seed 002 calls "256 MB per head").

The calculator-facing API is :class:`KVConfig` (one model's cache geometry: per token, per
layer, total, projection to a maximum context, the context that fits a budget) and
:func:`compare_schemes` (the same model under MHA / GQA / MQA / MLA). The GUI's KV panel and
``attnscope kv`` use them; the seeds' figures are reproduced from them in
:mod:`core.worked_examples`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

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


def _check_sizes(**sizes: int) -> None:
    for name, v in sizes.items():
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, got {v!r}")
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")


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
    _check_sizes(n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, seq_len=seq_len, batch=batch)
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch * dtype_bytes(dtype)


def mla_cache_bytes(
    n_layers: int, kv_latent_dim: int, rope_head_dim: int, seq_len: int, dtype: str = "bf16", batch: int = 1
) -> int:
    """Bytes of an MLA cache: ``(kv_latent_dim + rope_head_dim) × n_layers × seq_len × batch × bytes``.

    DeepSeek-V2 (``d_c = 512``, ``d_h^R = 64``, 60 layers) caches 576 elements per token and
    layer, against ``2 × 128 × 128 = 32768`` for MHA with its 128 heads of 128.

    Raises:
        ValueError: a negative size or an unknown dtype.
    """
    _check_sizes(n_layers=n_layers, kv_latent_dim=kv_latent_dim, rope_head_dim=rope_head_dim,
                 seq_len=seq_len, batch=batch)
    return (kv_latent_dim + rope_head_dim) * n_layers * seq_len * batch * dtype_bytes(dtype)


def attention_matrix_bytes(
    seq_q: int, seq_kv: int | None = None, n_heads: int = 1, batch: int = 1, dtype: str = "fp32"
) -> int:
    """Bytes of one layer's materialised attention matrix ``(batch, n_heads, seq_q, seq_kv)``.

    What naive attention writes to memory and FlashAttention never does (handbook §5 "the memory
    wall"; seed 002 "The memory problem"). Examples: 8192² in fp32 is 256 MiB per head, 16 GiB
    for 64 heads; B = 8, H = 32, T = 8192 in bf16 is 34.4 GB.

    Raises:
        ValueError: a negative size or an unknown dtype.
    """
    seq_kv = seq_q if seq_kv is None else seq_kv
    _check_sizes(seq_q=seq_q, seq_kv=seq_kv, n_heads=n_heads, batch=batch)
    return batch * n_heads * seq_q * seq_kv * dtype_bytes(dtype)


SCHEMES = ("MHA", "GQA", "MQA", "MLA")


@dataclass(frozen=True)
class KVConfig:
    """One model's KV-cache geometry.

    Attributes:
        n_layers: attention layers that keep a cache.
        n_kv_heads: K/V heads per layer (ignored for MLA).
        head_dim: elements per head.
        n_heads: query heads; defaults to ``n_kv_heads`` (MHA). Must be a multiple of it.
        dtype: cache element type name (``"bf16"``, ``"fp16"``, ``"fp32"``, ``"fp8"``...).
        batch: sequences cached side by side.
        kv_latent_dim: MLA latent ``d_c``; when set the cache is MLA's (see module notes).
        rope_head_dim: MLA decoupled RoPE key width ``d_h^R`` (0 when not MLA).
        name: free label (model name) for views.

    Raises:
        ValueError: negative sizes, an unknown dtype, ``n_heads`` not a multiple of ``n_kv_heads``.
    """

    n_layers: int
    n_kv_heads: int
    head_dim: int
    n_heads: int | None = None
    dtype: str = "bf16"
    batch: int = 1
    kv_latent_dim: int | None = None
    rope_head_dim: int = 0
    name: str = ""

    def __post_init__(self):
        if self.n_heads is None:
            object.__setattr__(self, "n_heads", self.n_kv_heads)
        _check_sizes(n_layers=self.n_layers, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim,
                     n_heads=self.n_heads, batch=self.batch, kv_latent_dim=self.kv_latent_dim,
                     rope_head_dim=self.rope_head_dim)
        dtype_bytes(self.dtype)
        if self.kv_latent_dim is None and (self.n_kv_heads == 0 or self.n_heads % self.n_kv_heads):
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")

    @classmethod
    def from_info(cls, info, dtype: str | None = None, batch: int = 1) -> KVConfig:
        """From a :class:`core.models.ModelInfo` (or anything with its attention attributes)."""
        return cls(n_layers=info.n_layers, n_kv_heads=info.n_kv_heads, head_dim=info.head_dim,
                   n_heads=info.n_heads, dtype=dtype or str(getattr(info, "dtype", "bf16")), batch=batch,
                   name=getattr(info, "name", ""))

    @property
    def scheme(self) -> str:
        """``"MLA"``, ``"MHA"`` (a K/V head per query head), ``"MQA"`` (one) or ``"GQA"``."""
        if self.kv_latent_dim is not None:
            return "MLA"
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    @property
    def group_size(self) -> int:
        """Query heads per K/V head (1 for MHA; ``n_heads`` for MQA)."""
        return self.n_heads // self.n_kv_heads if self.n_kv_heads else 0

    @property
    def elements_per_token_per_layer(self) -> int:
        """Cached elements per token in one layer, one sequence (K and V together)."""
        if self.kv_latent_dim is not None:
            return self.kv_latent_dim + self.rope_head_dim
        return 2 * self.n_kv_heads * self.head_dim

    @property
    def bytes_per_token(self) -> int:
        """Bytes one more token adds to the cache, all layers, whole batch."""
        return self.elements_per_token_per_layer * self.n_layers * self.batch * dtype_bytes(self.dtype)

    def bytes_per_layer(self, seq_len: int) -> int:
        """One layer's cache at ``seq_len`` tokens, whole batch (bytes)."""
        _check_sizes(seq_len=seq_len)
        return self.elements_per_token_per_layer * seq_len * self.batch * dtype_bytes(self.dtype)

    def total_bytes(self, seq_len: int) -> int:
        """The whole cache at ``seq_len`` tokens (bytes); equals :func:`kv_cache_bytes` for MHA/GQA/MQA."""
        return self.bytes_per_layer(seq_len) * self.n_layers

    def project(self, seq_lens) -> np.ndarray:
        """Total bytes at each of ``seq_lens`` (int64 array): the cache grows linearly with context."""
        t = np.asarray(seq_lens, dtype=np.int64)
        if (t < 0).any():
            raise ValueError("sequence lengths must be >= 0")
        return t * np.int64(self.bytes_per_token)

    def max_seq_len(self, budget_bytes: float) -> int:
        """The longest context whose cache fits in ``budget_bytes`` (0 if not even one token)."""
        if budget_bytes < 0:
            raise ValueError(f"budget must be >= 0 bytes, got {budget_bytes}")
        per = self.bytes_per_token
        return int(budget_bytes // per) if per else 0

    def with_kv_heads(self, n_kv_heads: int) -> KVConfig:
        """The same model with ``n_kv_heads`` K/V heads (MHA/GQA/MQA; not MLA)."""
        return replace(self, n_kv_heads=n_kv_heads, kv_latent_dim=None, rope_head_dim=0)

    def with_mla(self, kv_latent_dim: int, rope_head_dim: int = 0) -> KVConfig:
        """The same model with an MLA cache of ``kv_latent_dim + rope_head_dim`` per token and layer."""
        return replace(self, kv_latent_dim=kv_latent_dim, rope_head_dim=rope_head_dim)

    def describe(self) -> str:
        """One line, e.g. ``"80 layers × 8 KV heads × head_dim 128, bf16 (GQA, group 8)"``."""
        if self.kv_latent_dim is not None:
            geo = f"{self.n_layers} layers × (latent {self.kv_latent_dim} + rope {self.rope_head_dim})"
            extra = "MLA"
        else:
            geo = f"{self.n_layers} layers × {self.n_kv_heads} KV heads × head_dim {self.head_dim}"
            extra = self.scheme + (f", group {self.group_size}" if self.scheme == "GQA" else "")
        batch = f", batch {self.batch}" if self.batch != 1 else ""
        return f"{geo}, {self.dtype}{batch} ({extra})"


def default_gqa_kv_heads(n_heads: int) -> int | None:
    """K/V heads for a representative GQA variant of a model with ``n_heads`` query heads.

    8 when it divides ``n_heads`` (Llama-2-70B, Llama 3, Mistral: the handbook's "GQA-8"), else
    the largest divisor of ``n_heads`` below 8 and above 1; None when there is none (1, 2, primes).
    """
    if n_heads > 8 and n_heads % 8 == 0:
        return 8
    cands = [d for d in range(2, min(8, n_heads - 1) + 1) if n_heads % d == 0]
    return cands[-1] if cands else None


@dataclass(frozen=True)
class SchemeRow:
    """One line of a scheme comparison (all sizes in bytes)."""

    scheme: str
    label: str
    config: KVConfig
    seq_len: int
    bytes_per_token: int
    bytes_per_layer: int
    total_bytes: int
    vs_mha: float  # MHA bytes / these bytes (1.0 for MHA, 8.0 for a cache 8× smaller)
    is_given: bool  # the configuration the comparison was asked for


def compare_schemes(
    config: KVConfig,
    seq_len: int,
    *,
    gqa_kv_heads: int | None = None,
    kv_latent_dim: int | None = None,
    rope_head_dim: int = 0,
) -> list[SchemeRow]:
    """The same model (layers, query heads, head_dim, dtype, batch) under MHA, GQA, MQA (and MLA).

    Args:
        config: the model; its own scheme's row is marked ``is_given``.
        seq_len: tokens cached.
        gqa_kv_heads: K/V heads of the GQA row; default the config's own when it is GQA, else
            :func:`default_gqa_kv_heads` (no GQA row when that is None).
        kv_latent_dim, rope_head_dim: add an MLA row (default: the config's own when it is MLA).

    Returns:
        Rows in the order MHA, GQA, MQA, MLA (those that apply).

    Example (handbook §7): ``compare_schemes(KVConfig(80, 8, 128, n_heads=64), 8192)`` gives
    21.5 GB, 2.7 GB and 0.34 GB.
    """
    _check_sizes(seq_len=seq_len)
    base = config.with_kv_heads(config.n_heads)  # MHA: one K/V head per query head
    if gqa_kv_heads is None:
        gqa_kv_heads = config.n_kv_heads if config.scheme == "GQA" else default_gqa_kv_heads(config.n_heads)
    if kv_latent_dim is None and config.kv_latent_dim is not None:
        kv_latent_dim, rope_head_dim = config.kv_latent_dim, config.rope_head_dim
    variants: list[tuple[str, str, KVConfig]] = [("MHA", "MHA", base)]
    if gqa_kv_heads is not None and 1 < gqa_kv_heads < config.n_heads:
        variants.append(("GQA", f"GQA-{gqa_kv_heads}", base.with_kv_heads(gqa_kv_heads)))
    if config.n_heads > 1:
        variants.append(("MQA", "MQA", base.with_kv_heads(1)))
    if kv_latent_dim is not None:
        variants.append(("MLA", f"MLA-{kv_latent_dim}", base.with_mla(kv_latent_dim, rope_head_dim)))
    mha_total = base.total_bytes(seq_len)
    rows = []
    for scheme, label, cfg in variants:
        total = cfg.total_bytes(seq_len)
        given = (cfg.n_kv_heads == config.n_kv_heads and cfg.kv_latent_dim == config.kv_latent_dim
                 and cfg.rope_head_dim == config.rope_head_dim)
        rows.append(SchemeRow(scheme, label, cfg, seq_len, cfg.bytes_per_token, cfg.bytes_per_layer(seq_len),
                              total, (mha_total / total) if total else float("inf"), given))
    return rows


_DECIMAL = ("B", "kB", "MB", "GB", "TB", "PB")
_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float, *, binary: bool = False, digits: int = 3) -> str:
    """``n`` bytes with ``digits`` significant digits: ``"21.5 GB"`` or, binary, ``"256 MiB"``."""
    if n < 0:
        return "-" + format_bytes(-n, binary=binary, digits=digits)
    base, units = (1024.0, _BINARY) if binary else (1000.0, _DECIMAL)
    i, x = 0, float(n)
    while i < len(units) - 1 and float(f"{x:.{digits}g}") >= base:  # 999.95 kB prints as 1 MB
        x /= base
        i += 1
    if i == 0:
        return f"{int(n)} B"
    s = f"{float(f'{x:.{digits}g}'):f}".rstrip("0").rstrip(".")  # significant digits, no exponent
    return f"{s} {units[i]}"
