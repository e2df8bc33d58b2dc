"""KV-cache accounting (and the naive attention matrix's memory), for any model configuration.

KV-cache bytes = 2 × n_layers × n_kv_heads × head_dim × seq_len × batch × bytes_per_element
(Shazeer 2019 for MQA, Ainslie et al. 2023 for GQA). The factor 2 is K and V.

* MHA caches one K and one V per query head (``n_kv_heads = n_heads``); GQA one per group of
  query heads (Ainslie et al. 2023); MQA a single one (``n_kv_heads = 1``, Shazeer 2019).
* MLA (DeepSeek-V2, Liu et al. 2024, §2.1 and Table 1) caches one compressed latent of
  ``kv_latent_dim`` (their ``d_c``) per token and layer, plus a decoupled RoPE key of
  ``rope_head_dim`` (``d_h^R``) shared by all heads: ``(d_c + d_h^R) × n_layers`` elements per
  token, no factor 2 (K and V are both reconstructed from the latent).

Sliding windows (Mistral, Gemma 2/3, Qwen2 with ``use_sliding_window``): a layer whose
queries see only the last ``W`` keys needs only those ``W`` keys cached, so

    KV bytes = Σ_layers 2 × n_kv_heads × head_dim × min(seq_len, W_l) × batch × bytes

with ``W_l = ∞`` for a global (full-attention) layer (transformers' ``DynamicSlidingWindowLayer``
keeps the window, ``DynamicLayer`` everything). :class:`KVConfig` carries the per-layer windows
(``windows``); :func:`config_layer_windows` reads them from a transformers config or a
``config.json`` dict. Gemma 3 270M (18 layers, 1 KV head of 256, windows of 512 on 15 layers) in
float32 at 1252 tokens: 23.4 MB, against 46.2 MB for a cache that keeps every key.

Units: bytes (ints). :func:`format_bytes` prints decimal units (kB, MB, GB: the handbook's
"21.5 GB") or binary ones (KiB, MiB, GiB: what the PyTorch walk-through calls "256 MB per head").

The calculator-facing API is :class:`KVConfig` (one model's cache geometry: per token, per
layer, total, projection to a maximum context, the context that fits a budget) and
:func:`compare_schemes` (the same model under MHA / GQA / MQA / MLA). The GUI's KV panel and
``attnscope kv`` use them; the seeds' figures are reproduced from them in
:mod:`attnscope.core.analysis.worked_examples`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from attnscope.core.errors import BadArgument, WrongType

DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "float32": 4,
    "fp16": 2,
    "float16": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "int8": 1,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name (``"bf16"``, ``"float32"``, ``"torch.float16"``...).

    Raises:
        ValueError: unknown dtype name.
    """
    key = str(dtype).removeprefix("torch.").removeprefix("mlx.core.").lower()
    if key not in DTYPE_BYTES:
        raise BadArgument(f"unknown dtype {dtype!r}; expected one of {sorted(set(DTYPE_BYTES))}")
    return DTYPE_BYTES[key]


def _check_sizes(**sizes: int | None) -> None:
    for name, v in sizes.items():
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise WrongType(f"{name} must be an integer, got {v!r}")  # also a ValueError and a TypeError
        if v < 0:
            raise BadArgument(f"{name} must be >= 0, got {v}")


def kv_cache_bytes(
    n_layers: int,
    n_kv_heads: int,
    head_dim: int,
    seq_len: int,
    dtype: str = "bf16",
    batch: int = 1,
    windows=None,
) -> int:
    """Bytes held by a KV cache of ``seq_len`` tokens.

    ``2 × n_layers × n_kv_heads × head_dim × seq_len × batch × bytes(dtype)``; with ``windows``
    (one entry per layer: a window in keys, or None for a global layer) each layer holds
    ``min(seq_len, W_l)`` tokens instead of ``seq_len``.

    Example (docs/tabs/kv.md, the Llama-2-70B preset): a 70B model (80 layers, head_dim 128) at 8192 tokens in bf16 holds
    21.5 GB with 64 KV heads (MHA), 2.7 GB with 8 (GQA), 0.34 GB with 1 (MQA).

    Raises:
        BadArgument (a ValueError): a negative size or an unknown dtype. WrongType (a ValueError and
        a TypeError): a size that is not an int (bools refused).
    """
    _check_sizes(n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, seq_len=seq_len, batch=batch)
    if windows is not None:
        return KVConfig(
            n_layers, n_kv_heads, head_dim, dtype=dtype, batch=batch, windows=tuple(windows)
        ).total_bytes(seq_len)
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
    _check_sizes(
        n_layers=n_layers,
        kv_latent_dim=kv_latent_dim,
        rope_head_dim=rope_head_dim,
        seq_len=seq_len,
        batch=batch,
    )
    return (kv_latent_dim + rope_head_dim) * n_layers * seq_len * batch * dtype_bytes(dtype)


def attention_matrix_bytes(
    seq_q: int, seq_kv: int | None = None, n_heads: int = 1, batch: int = 1, dtype: str = "fp32"
) -> int:
    """Bytes of one layer's materialised attention matrix ``(batch, n_heads, seq_q, seq_kv)``.

    What naive attention writes to memory and FlashAttention never does (Dao et al. 2022,
    FlashAttention). Examples: 8192² in fp32 is 256 MiB per head, 16 GiB
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
        windows: per-layer sliding windows (``n_layers`` entries, keys; None = a global layer), or
            None when no layer has one. A windowed layer caches ``min(seq_len, W)`` tokens.

    Raises:
        ValueError: negative sizes, an unknown dtype, ``n_heads`` not a multiple of ``n_kv_heads``,
            ``windows`` of the wrong length or with a window < 1.
    """

    n_layers: int
    n_kv_heads: int
    head_dim: int
    # None (the default) means n_kv_heads (MHA): __post_init__ fills it in, so it reads as an int
    n_heads: int = None  # type: ignore[assignment]
    dtype: str = "bf16"
    batch: int = 1
    kv_latent_dim: int | None = None
    rope_head_dim: int = 0
    name: str = ""
    windows: tuple[int | None, ...] | None = None

    def __post_init__(self):
        if self.n_heads is None:
            object.__setattr__(self, "n_heads", self.n_kv_heads)
        if self.windows is not None:
            ws = tuple(None if w is None else w for w in self.windows)
            if len(ws) != self.n_layers:
                raise BadArgument(f"windows lists {len(ws)} layers, the model has {self.n_layers}")
            for w in ws:
                if w is not None and (isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1):
                    raise BadArgument(f"a sliding window must be an integer >= 1 (or None), got {w!r}")
            ws = tuple(None if w is None else int(w) for w in ws)
            object.__setattr__(self, "windows", ws if any(w is not None for w in ws) else None)
        _check_sizes(
            n_layers=self.n_layers,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            n_heads=self.n_heads,
            batch=self.batch,
            kv_latent_dim=self.kv_latent_dim,
            rope_head_dim=self.rope_head_dim,
        )
        dtype_bytes(self.dtype)
        if self.kv_latent_dim is None and (self.n_kv_heads == 0 or self.n_heads % self.n_kv_heads):
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")

    @classmethod
    def from_info(cls, info, dtype: str | None = None, batch: int = 1, windows=None) -> KVConfig:
        """From a :class:`attnscope.core.loading.model_info.ModelInfo` (or anything with its attention attributes).

        ``windows``: the per-layer sliding windows (:func:`config_layer_windows`); a ModelInfo alone
        does not say which layers slide, so without them the cache counts every key in every layer.
        A hybrid model (``info.layer_kinds``, docs/how-it-works.md "Hybrid models") counts its attention layers only:
        its linear-attention / Mamba / convolution layers keep a fixed-size state, no KV cache
        (``windows`` may list every layer; those of the other layers are dropped).
        A model with multi-head latent attention (``info.kv_latent_dim`` > 0: DeepSeek-V2/V3) gets its
        MLA cache, latent + decoupled RoPE key per token and layer, which is what its cache holds.
        """
        from attnscope.core.arch import arch_of

        try:
            att = arch_of(info).attention_layers
        except (AttributeError, TypeError, ValueError):
            att = tuple(range(info.n_layers))
        if windows is not None and len(att) != info.n_layers and len(tuple(windows)) == info.n_layers:
            windows = tuple(tuple(windows)[i] for i in att)
        latent = int(getattr(info, "kv_latent_dim", 0) or 0)
        return cls(
            n_layers=len(att),
            n_kv_heads=info.n_kv_heads,
            head_dim=info.head_dim,
            n_heads=info.n_heads,
            dtype=dtype or str(getattr(info, "dtype", "bf16")),
            batch=batch,
            name=getattr(info, "name", ""),
            windows=None if windows is None else tuple(windows),
            kv_latent_dim=latent or None,
            rope_head_dim=int(getattr(info, "rope_head_dim", 0) or 0) if latent else 0,
        )

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
    def token_layer_bytes(self) -> int:
        """Bytes of one token in one layer, whole batch (K and V)."""
        return self.elements_per_token_per_layer * self.batch * dtype_bytes(self.dtype)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one more token adds to the cache while no window is full: every layer, whole batch."""
        return self.token_layer_bytes * self.n_layers

    @property
    def n_windowed(self) -> int:
        """Layers with a sliding window (0 when none)."""
        return 0 if self.windows is None else sum(w is not None for w in self.windows)

    @property
    def steady_bytes_per_token(self) -> int:
        """Bytes one more token adds once every window is full: the global layers only."""
        return self.token_layer_bytes * (self.n_layers - self.n_windowed)

    def layer_tokens(self, seq_len: int) -> np.ndarray:
        """Tokens each layer caches at ``seq_len``: ``min(seq_len, W_l)``, ``(n_layers,)`` int64."""
        _check_sizes(seq_len=seq_len)
        if self.windows is None:
            return np.full(self.n_layers, seq_len, dtype=np.int64)
        return np.array([seq_len if w is None else min(seq_len, w) for w in self.windows], dtype=np.int64)

    def layer_bytes(self, seq_len: int) -> np.ndarray:
        """Each layer's cache at ``seq_len`` tokens, whole batch: ``(n_layers,)`` int64 bytes."""
        return self.layer_tokens(seq_len) * np.int64(self.token_layer_bytes)

    def bytes_per_layer(self, seq_len: int) -> int:
        """One global (full-attention) layer's cache at ``seq_len`` tokens, whole batch (bytes).

        With sliding windows, :meth:`layer_bytes` gives every layer's own figure.
        """
        _check_sizes(seq_len=seq_len)
        return self.elements_per_token_per_layer * seq_len * self.batch * dtype_bytes(self.dtype)

    def total_bytes(self, seq_len: int) -> int:
        """The whole cache at ``seq_len`` tokens (bytes): Σ over layers of ``min(seq_len, W_l)``
        tokens; equals :func:`kv_cache_bytes` (for MHA/GQA/MQA)."""
        if self.windows is None:
            return self.bytes_per_layer(seq_len) * self.n_layers
        return int(self.layer_bytes(seq_len).sum())

    def without_windows(self) -> KVConfig:
        """The same geometry with every key kept in every layer (what a plain cache holds)."""
        return replace(self, windows=None)

    def project(self, seq_lens) -> np.ndarray:
        """Total bytes at each of ``seq_lens`` (int64 array). Linear in the context without windows;
        with windows piecewise linear, bending at each window (see :meth:`breakpoints`)."""
        t = np.asarray(seq_lens, dtype=np.int64)
        if (t < 0).any():
            raise ValueError("sequence lengths must be >= 0")
        if self.windows is None:
            return t * np.int64(self.bytes_per_token)
        full = np.int64(self.n_layers - self.n_windowed) * t
        for w in self.windows:
            if w is not None:
                full = full + np.minimum(t, np.int64(w))
        return full * np.int64(self.token_layer_bytes)

    def breakpoints(self, upto: int) -> np.ndarray:
        """Sequence lengths ``0 … upto`` where :meth:`project` bends (the windows below ``upto``),
        sorted int64: plotting :meth:`project` at them draws the exact curve."""
        ws = {w for w in (self.windows or ()) if w is not None and 0 < w < upto}
        return np.array(sorted({0, int(upto)} | ws), dtype=np.int64)

    def max_seq_len(self, budget_bytes: float) -> int | None:
        """The longest context whose cache fits in ``budget_bytes`` (0 if not even one token).

        None when every layer has a window and even the full windows fit: any context does.
        """
        if budget_bytes < 0:
            raise ValueError(f"budget must be >= 0 bytes, got {budget_bytes}")
        per = self.bytes_per_token
        if not per:
            return 0
        if self.windows is None:
            return int(budget_bytes // per)
        steady = self.steady_bytes_per_token
        w_max = max(w for w in self.windows if w is not None)
        if steady == 0 and self.total_bytes(w_max) <= budget_bytes:
            return None
        lo, hi = 0, w_max + (int(budget_bytes // steady) + 1 if steady else 0) + 1
        while lo < hi:  # the largest T with total_bytes(T) <= budget (total is nondecreasing)
            mid = (lo + hi + 1) // 2
            if self.total_bytes(mid) <= budget_bytes:
                lo = mid
            else:
                hi = mid - 1
        return lo

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
        return f"{geo}, {self.dtype}{batch} ({extra}){self.describe_windows(prefix='; ')}"

    def describe_windows(self, prefix: str = "") -> str:
        """``"15 of 18 layers keep a 512-key window (layers 0–4, 6–10, 12–16)"`` ('' without windows)."""
        if self.windows is None:
            return ""
        by_w: dict[int, list[int]] = {}
        for i, w in enumerate(self.windows):
            if w is not None:
                by_w.setdefault(w, []).append(i)
        parts = [
            f"{len(ls)} of {self.n_layers} layers keep a {w:,}-key window (layers {format_ranges(ls)})"
            for w, ls in sorted(by_w.items())
        ]
        return prefix + "; ".join(parts)


def format_ranges(indices, limit: int = 6) -> str:
    """Sorted ints as ranges: ``[0, 1, 2, 3, 4, 6, 7]`` → ``"0–4, 6–7"``; after ``limit`` ranges ``"…"``."""
    xs = sorted(set(int(i) for i in indices))
    runs: list[tuple[int, int]] = []
    for x in xs:
        if runs and x == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], x)
        else:
            runs.append((x, x))
    text = [f"{a}" if a == b else f"{a}–{b}" for a, b in runs]
    return ", ".join(text[:limit]) + (", …" if len(text) > limit else "")


def _get(config, key: str, default=None):
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def config_layer_windows(config, n_layers: int | None = None) -> tuple[int | None, ...]:
    """Per-layer sliding windows of a transformers config (or a ``config.json`` dict), as the model
    applies them: one entry per layer, the window in keys (a query sees itself and the ``W − 1``
    keys before it) or None for a global layer.

    * ``layer_types`` (transformers ≥ 4.5x: Gemma 2/3, Qwen2/3, Cohere2, GPT-OSS...): the
      ``"sliding_attention"`` layers get ``sliding_window``; other types (full, chunked) none.
    * Qwen2/Qwen3 style ``use_sliding_window: false`` switches the window off; without
      ``layer_types`` the layers from ``max_window_layers`` on slide.
    * Gemma 3 ``config.json`` without ``layer_types``: every ``sliding_window_pattern``-th layer is
      global.
    * Otherwise (Mistral, Mixtral, Phi-3, Starcoder2): ``sliding_window`` on every layer.

    Raises:
        ValueError: ``layer_types`` of another length than the model's layers.
    """
    n = int(
        n_layers
        if n_layers is not None
        else (_get(config, "num_hidden_layers") or _get(config, "n_layer") or 0)
    )
    w = _get(config, "sliding_window")
    if _get(config, "use_sliding_window", True) is False or not w:
        return (None,) * n
    w = int(w)
    types = _get(config, "layer_types")
    if types and _get(config, "model_type") != "mistral":  # MistralAttention ignores layer_types
        if len(types) != n:
            raise ValueError(f"layer_types lists {len(types)} layers, the model has {n}")
        return tuple(w if t == "sliding_attention" else None for t in types)
    if _get(config, "use_sliding_window") is True and _get(config, "max_window_layers") is not None:
        first = int(_get(config, "max_window_layers"))
        return tuple(w if i >= first else None for i in range(n))
    pattern = _get(config, "sliding_window_pattern")
    if pattern:
        return tuple(None if (i + 1) % int(pattern) == 0 else w for i in range(n))
    return (w,) * n


def sliding_layers_from_spec(spec: str, n_layers: int) -> tuple[bool, ...]:
    """Which layers slide, from a short text: ``"all"``; ``"none"``; ``"5:1"`` (5 sliding layers
    then 1 global, repeated: Gemma 3); ``"0-4,6-10,12"`` (layer indices and ranges, 0-based).

    Raises:
        ValueError: text not of these forms, or a layer outside ``0 .. n_layers − 1``.
    """
    s = str(spec).strip().lower().replace("–", "-").replace(" ", "")
    if s in ("", "all"):
        return (True,) * n_layers
    if s == "none":
        return (False,) * n_layers
    if ":" in s:
        a, _, b = s.partition(":")
        if not (a.isdigit() and b.isdigit()) or int(a) + int(b) == 0:
            raise ValueError(f"sliding layers {spec!r}: expected 'SLIDING:GLOBAL' such as '5:1'")
        period = int(a) + int(b)
        return tuple(i % period < int(a) for i in range(n_layers))
    chosen: set[int] = set()
    for part in s.split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"sliding layers {spec!r}: expected 'all', 'none', 'S:G' or a list like '0-4,6'")
        lo_i, hi_i = int(lo), int(hi) if dash else int(lo)
        if hi_i < lo_i or hi_i >= n_layers:
            raise ValueError(f"sliding layers {spec!r}: layers run 0..{n_layers - 1}")
        chosen.update(range(lo_i, hi_i + 1))
    return tuple(i in chosen for i in range(n_layers))


def windows_from_spec(window: int | None, spec: str, n_layers: int) -> tuple[int | None, ...] | None:
    """Per-layer windows for :class:`KVConfig` from a window (None/0 = none) and a layer spec
    (:func:`sliding_layers_from_spec`). Raises ValueError as that does, or for a window < 0."""
    if window is None or window == 0:
        return None
    if window < 0:
        raise ValueError(f"sliding window must be >= 1 keys, got {window}")
    return tuple(window if s else None for s in sliding_layers_from_spec(spec, n_layers))


def windows_spec(windows) -> str:
    """Inverse of :func:`sliding_layers_from_spec` for display: ``"all"``, ``"5:1"`` or a list."""
    if not windows or all(w is None for w in windows):
        return "none"
    flags = [w is not None for w in windows]
    if all(flags):
        return "all"
    for period in range(2, len(flags) + 1):
        a = sum(flags[:period])
        if all(f == (i % period < a) for i, f in enumerate(flags)) and 0 < a < period:
            return f"{a}:{period - a}"
    return (
        format_ranges([i for i, f in enumerate(flags) if f], limit=10**6).replace("–", "-").replace(" ", "")
    )


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

    Example (docs/tabs/kv.md): ``compare_schemes(KVConfig(80, 8, 128, n_heads=64), 8192)`` gives
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
        given = (
            cfg.n_kv_heads == config.n_kv_heads
            and cfg.kv_latent_dim == config.kv_latent_dim
            and cfg.rope_head_dim == config.rope_head_dim
        )
        rows.append(
            SchemeRow(
                scheme,
                label,
                cfg,
                seq_len,
                cfg.bytes_per_token,
                cfg.bytes_per_layer(seq_len),
                total,
                (mha_total / total) if total else float("inf"),
                given,
            )
        )
    return rows


def format_bytes(n: float, *, binary: bool = False, digits: int = 3) -> str:
    """``n`` bytes with ``digits`` significant digits: ``"21.5 GB"`` or, binary, ``"256 MiB"``,
    ``"1.00 MiB"`` (the one formatter, :func:`attnscope.core.units.format_bytes`; see there for unit boundaries)."""
    from attnscope.core.units import format_bytes as _format

    return _format(n, binary=binary, digits=digits)
