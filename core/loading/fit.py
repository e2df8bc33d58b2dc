"""Will this model fit? Memory a model needs at a chosen context, against the memory free now.

    total = weights + KV cache + capture buffers

* weights: ``n_params × bytes(dtype)`` at the load dtype, for a folder and a GGUF alike (a GGUF
  is converted tensor by tensor straight to the load dtype, :mod:`attnscope.core.loading.gguf_convert`). ``dtype``
  ``"auto"`` is resolved per model by :func:`attnscope.core.loading.precision.entry_dtype` (the checkpoint's own
  precision, float32 where the device has no fast bf16/fp16 matmul and float32 fits).
* KV cache: ``2 × n_layers × n_kv_heads × head_dim × T × bytes(dtype)`` (:func:`attnscope.core.analysis.kv_formula.kv_cache_bytes`).
* capture buffers (:class:`attnscope.core.trace.torch_trace.TorchTrace`): per layer the post-RoPE query rows,
  ``n_heads × T × head_dim`` elements in the model's dtype (float32 by default, as the Trace keeps
  the query tensor the layer produced), plus the LSE rows, ``n_heads × T`` float32.

Free memory: on CPU (and on MLX, whose memory is unified) the system's available RAM
(``psutil.virtual_memory().available`` where psutil is installed, else ``MemAvailable`` from
``/proc/meminfo``); on CUDA the device's free memory (``torch.cuda.mem_get_info``).

Verdict: ``fits`` when the total is at most :data:`TIGHT_FRACTION` of free memory (the rest is
left for activations, the tokenizer and the framework), ``tight`` up to all of it, ``does not fit``
beyond, ``unknown`` when free memory cannot be read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnscope.core.analysis.kv_formula import dtype_bytes, kv_cache_bytes

TIGHT_FRACTION = 0.8
FITS, TIGHT, NO_FIT, UNKNOWN = "fits", "tight", "does not fit", "unknown"
LSE_BYTES = 4  # LSE rows are float32 whatever the model dtype


@dataclass(frozen=True)
class FitEstimate:
    """Memory a model needs at ``context`` tokens on ``device``; every size in bytes."""

    weights_bytes: int
    kv_cache_bytes: int
    capture_bytes: int
    free_bytes: int | None  # None: could not be read
    memory: str  # what free_bytes measures: "RAM", "unified memory", "VRAM (cuda:0)"
    context: int
    dtype: str
    verdict: str  # FITS / TIGHT / NO_FIT / UNKNOWN
    dtype_reason: str = ""  # why ``dtype`` (attnscope.core.loading.precision.choose_dtype), for "auto"

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.capture_bytes

    def summary(self) -> str:
        """One line: ``fits: 1.2 GB of 20.1 GB free RAM (weights 0.5 GB, KV 0.3 GB, capture 0.4 GB)``."""
        free = (
            f"{human_bytes(self.free_bytes)} free {self.memory}"
            if self.free_bytes is not None
            else f"free {self.memory} unknown"
        )
        return (
            f"{self.verdict}: {human_bytes(self.total_bytes)} of {free} (weights {human_bytes(self.weights_bytes)}, "
            f"KV cache {human_bytes(self.kv_cache_bytes)}, capture {human_bytes(self.capture_bytes)} at {self.context} tokens)"
        )


def human_bytes(n: int | None) -> str:
    """``1.23 GB`` style (decimal units, as file managers show sizes; None → ``?``): 3 significant
    digits through :func:`attnscope.core.units.format_bytes`, so 999,999 B is ``1.00 MB``, never ``1000.0 kB``."""
    from attnscope.core.units import format_bytes

    return format_bytes(n)


def capture_bytes(n_layers: int, n_heads: int, head_dim: int, seq_len: int, dtype: str = "float32") -> int:
    """Bytes the Trace holds at ``seq_len`` tokens: per layer q rows (``n_heads × T × head_dim``,
    model dtype) + LSE rows (``n_heads × T``, float32)."""
    return n_layers * n_heads * seq_len * (head_dim * dtype_bytes(dtype) + LSE_BYTES)


def _meminfo_available(path: str = "/proc/meminfo") -> int | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def free_memory(backend: str = "torch", device: str = "cpu") -> tuple[int | None, str]:
    """``(free bytes or None, what was measured)`` for ``backend`` on ``device``.

    CUDA: ``torch.cuda.mem_get_info`` of that device (None when CUDA is not available). CPU and
    MLX: available system RAM (psutil if installed, else /proc/meminfo; None elsewhere).
    """
    if backend == "torch" and str(device).startswith("cuda"):
        try:
            import torch

            if not torch.cuda.is_available():
                return None, "VRAM (no CUDA device)"
            dev = torch.device(device)
            idx = dev.index if dev.index is not None else torch.cuda.current_device()
            free, _total = torch.cuda.mem_get_info(idx)
            return int(free), f"VRAM (cuda:{idx})"
        except Exception:  # noqa: BLE001 - a broken driver reads as "unknown", never as a crash
            return None, "VRAM"
    label = "unified memory" if backend == "mlx" else "RAM"
    try:
        import psutil

        return int(psutil.virtual_memory().available), label
    except ImportError:
        return _meminfo_available(), label


def weights_bytes(n_params: int, fmt: str = "hf", dtype: str = "float32") -> int:
    """Bytes of the loaded weights at ``dtype`` (a GGUF too: it is converted to the load dtype)."""
    return int(n_params) * dtype_bytes(dtype)


def estimate(
    *,
    n_params: int,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    context: int,
    fmt: str = "hf",
    backend: str = "torch",
    device: str = "cpu",
    dtype: str = "float32",
    free_bytes: int | None = None,
    memory: str | None = None,
) -> FitEstimate:
    """Fit estimate from a model's geometry. ``free_bytes`` overrides the measurement (tests, or a
    caller that must count the model still loaded).

    Raises:
        ValueError: a negative size, or an unknown dtype.
    """
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    w = weights_bytes(n_params, fmt, dtype)
    kv = kv_cache_bytes(n_layers, n_kv_heads, head_dim, context, dtype)
    cap = capture_bytes(n_layers, n_heads, head_dim, context, dtype)
    if free_bytes is None:
        free_bytes, measured = free_memory(backend, device)
        memory = memory or measured
    memory = memory or ("unified memory" if backend == "mlx" else "RAM")
    total = w + kv + cap
    if free_bytes is None:
        verdict = UNKNOWN
    elif total <= TIGHT_FRACTION * free_bytes:
        verdict = FITS
    elif total <= free_bytes:
        verdict = TIGHT
    else:
        verdict = NO_FIT
    return FitEstimate(w, kv, cap, free_bytes, memory, int(context), dtype, verdict)


def estimate_entry(
    entry,
    context: int,
    backend: str = "torch",
    device: str = "cpu",
    dtype: str = "auto",
    free_bytes: int | None = None,
    memory: str | None = None,
) -> FitEstimate:
    """:func:`estimate` for a :class:`attnscope.core.loading.catalog.CatalogEntry` (``context`` capped at its max context)
    at ``dtype``; ``"auto"`` is the dtype this entry would load at (:func:`attnscope.core.loading.precision.entry_dtype`),
    recorded with its reason in the estimate."""
    from dataclasses import replace

    from attnscope.core.loading.precision import entry_dtype

    ctx = min(context, entry.max_context) if entry.max_context else context
    dev = f"mlx-{device}" if backend == "mlx" else device
    dtype, reason = entry_dtype(entry, dtype, dev, free_bytes)
    est = estimate(
        n_params=entry.n_params,
        n_layers=entry.n_layers,
        n_heads=entry.n_heads,
        n_kv_heads=entry.n_kv_heads,
        head_dim=entry.head_dim,
        context=ctx,
        fmt=entry.format,
        backend=backend,
        device=device,
        dtype=dtype,
        free_bytes=free_bytes,
        memory=memory,
    )
    return replace(est, dtype_reason=reason)
