"""Which floating-point precision a model loads at: ``--dtype auto|float32|bfloat16|float16``.

``auto`` (the default) is the checkpoint's own precision:

* a model folder: its config's ``dtype`` (``torch_dtype`` in older configs), else the dtype most of
  its safetensors hold, else float32;
* a GGUF (:func:`gguf_checkpoint_dtype`): float32 when its weight matrices are F32, float16 for F16,
  bfloat16 for BF16 and for quantised types (Q4_0, Q8_0, Q4_K ...: 2 bytes per weight after
  dequantisation instead of 4).

Two refinements, each stated in the reason string the status bar and the export sidecar show:

* a *small* quantised GGUF (float32 weights ≤ :data:`SMALL_FLOAT32_BYTES`, e.g. the embedded
  SmolLM2-135M, 0.54 GB) loads at float32: a dequantised block value ``d·q + m`` (fp16 scale times
  a small integer plus an fp16 offset) is exact in float32 but is rounded by bfloat16 (8-bit
  mantissa), and at this size the halving buys nothing a machine notices;
* where the device has no fast matmul at the checkpoint's half precision (a CPU without the
  ``avx512_bf16``/``amx_bf16`` flags, or the ARM ``bf16`` feature; a CUDA GPU for which
  :func:`torch.cuda.is_bf16_supported` is false), ``auto`` picks float32 if the float32 weights
  fit in the memory available, and keeps the half precision (saying so) if they do not.

* ``auto`` never picks a precision the family is known to overflow in (:data:`OVERFLOWS`: Gemma in
  float16, whose hidden states pass float16's largest value, 65504, in transformers' own forward):
  a float16 Gemma checkpoint loads at bfloat16 where the device has a fast bfloat16 matmul, else at
  float32 (else bfloat16), and the reason says why.

An explicit float32/bfloat16/float16 is always obeyed (the reason names a known overflow). This module never imports torch at import
time and never loads a weight.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from attnscope.core.loading.checkpoint_dtype import (
    check_choice,
    config_dtype,
    gguf_checkpoint_dtype,
    gguf_is_quantised,
    normalise,
)

SMALL_FLOAT32_BYTES = 1 << 30  # quantised GGUFs at most this big at float32 load at float32

#: model_type (``_text`` suffix dropped) → precisions its forward is known to overflow in. Gemma's
#: activations are trained in bfloat16 and exceed float16's 65504: Gemma 3 270M's hidden states
#: reach inf in layer 8 at float16 (transformers' eager forward; attnscope.core.trace.finite names it)
OVERFLOWS: dict[str, tuple[str, ...]] = {
    "gemma": ("float16",),
    "gemma2": ("float16",),
    "gemma3": ("float16",),
    "gemma3n": ("float16",),
}


def overflows(family: str | None, dtype: str) -> bool:
    """True when ``family`` (a model_type: ``"gemma3_text"``, ``"gemma3"``) is known to overflow at ``dtype``."""
    fam = str(family or "").lower().removesuffix("_text")
    return dtype in OVERFLOWS.get(fam, ())


def _overflow_note(family: str, dtype: str) -> str:
    return (
        f"{family} is known to overflow at {dtype} (its hidden states pass float16's largest value, "
        "65504, and the maps turn non-finite)"
    )


# -- what the hardware does fast ------------------------------------------------------------------------
@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux ``/proc/cpuinfo`` ``flags``/``Features``; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, val = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(val.split())
    return frozenset(flags)


def cpu_half_support(
    dtype: str, flags: frozenset[str] | None = None, machine: str | None = None, system: str | None = None
) -> tuple[bool, str]:
    """Whether this CPU has a fast matmul at ``dtype`` ("bfloat16" or "float16"), and the evidence.

    x86: ``avx512_bf16`` or ``amx_bf16`` for bfloat16, ``avx512_fp16`` or ``amx_fp16`` for float16.
    ARM (Linux ``Features``): ``bf16`` for bfloat16, ``fphp``/``asimdhp`` for float16. Apple
    silicon (macOS arm64) has both. Without readable flags the answer is False ("not known").
    """
    flags = cpu_flags() if flags is None else flags
    machine = (machine or platform.machine()).lower()
    system = system or platform.system()
    if system == "Darwin" and machine in ("arm64", "aarch64"):
        return True, "Apple silicon"
    if machine in ("arm64", "aarch64"):
        wanted = ("bf16",) if dtype == "bfloat16" else ("fphp", "asimdhp")
    else:
        wanted = ("avx512_bf16", "amx_bf16") if dtype == "bfloat16" else ("avx512_fp16", "amx_fp16")
    have = [f for f in wanted if f in flags]
    if have:
        return True, f"CPU flag {have[0]}"
    if not flags:
        return False, "the CPU's features could not be read"
    return False, f"this CPU has no {' or '.join(wanted)} flag"


def device_half_support(dtype: str, device: str) -> tuple[bool, str]:
    """Whether ``device`` ("cpu", "cuda[:N]", "mps", "mlx-gpu", "mlx-cpu") runs ``dtype`` matmuls fast."""
    kind = device.split(":")[0]
    if kind in ("cpu", "mlx-cpu"):
        return cpu_half_support(dtype)
    if kind == "cuda":
        if dtype == "float16":
            return True, "CUDA"
        import torch

        ok = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        return (
            ok,
            "torch.cuda.is_bf16_supported()"
            if ok
            else "this GPU has no bf16 support (torch.cuda.is_bf16_supported() is false)",
        )
    return True, kind  # mps, mlx on the Apple GPU


def available_bytes(device: str) -> int | None:
    """Memory a load may use on ``device`` (bytes; :func:`attnscope.core.loading.free_memory.free_memory`), None if unknown."""
    from attnscope.core import backend_registry as registry
    from attnscope.core.loading.free_memory import free_memory

    return free_memory(registry.for_device(device).name, device)[0]


# -- the decision -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    """What :func:`choose_dtype` needs to know about a checkpoint (read from metadata only)."""

    dtype: str | None  # its own float precision ("bfloat16"...), None when it does not say
    n_params: int = 0
    quantised: bool = False  # a GGUF with quantised weight matrices
    origin: str = ""  # where ``dtype`` came from, for the reason ("config dtype", "GGUF Q4_1")
    family: str = ""  # transformers model_type ("gemma3_text"), for :data:`OVERFLOWS`


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def choose_dtype(
    requested: str,
    checkpoint: Checkpoint,
    device: str = "cpu",
    free_bytes: int | None = None,
    half_support: tuple[bool, str] | None = None,
) -> tuple[str, str]:
    """The dtype a model loads at, and why (one line for the status bar and the sidecar).

    Args:
        requested: ``"auto"`` or an explicit dtype (obeyed as is).
        checkpoint: the checkpoint's own precision and size (:func:`inspect_checkpoint`).
        device: torch device string, or ``"mlx-gpu"``/``"mlx-cpu"``.
        free_bytes: memory available to the load; default :func:`available_bytes` of ``device``.
        half_support: ``(fast, evidence)`` override of :func:`device_half_support` (tests).

    Returns:
        ``(dtype, reason)``, dtype one of :data:`DTYPES`.

    Raises:
        ModelLoadError: ``requested`` is not one of :data:`CHOICES`.
    """
    requested = check_choice(requested)
    if requested != "auto":
        warn = (
            f"; {_overflow_note(checkpoint.family, requested)}"
            if overflows(checkpoint.family, requested)
            else ""
        )
        return requested, f"{requested}: asked for (--dtype {requested}){warn}"
    own = checkpoint.dtype or "float32"
    src = f" ({checkpoint.origin})" if checkpoint.origin else ""
    if checkpoint.dtype is None:
        return "float32", f"float32: the checkpoint declares no dtype{src}"
    if own == "float32":
        return "float32", f"float32: the checkpoint's own precision{src}"
    f32 = 4 * int(checkpoint.n_params)
    if checkpoint.quantised and checkpoint.n_params and f32 <= SMALL_FLOAT32_BYTES:
        return "float32", (
            f"float32: a small quantised model{src} ({_gb(f32)} at float32) keeps its dequantised "
            "weights exact (bfloat16 would round them)"
        )
    if overflows(checkpoint.family, own):
        return _avoid_overflow(own, checkpoint, src, device, free_bytes, half_support)
    fast, why = half_support if half_support is not None else device_half_support(own, device)
    if fast:
        return own, f"{own}: the checkpoint's own precision{src}; {why}"
    free = available_bytes(device) if free_bytes is None else free_bytes
    if not checkpoint.n_params or (free is not None and f32 <= free):
        room = f", {_gb(f32)} of {_gb(free)} available" if free is not None and checkpoint.n_params else ""
        return (
            "float32",
            f"float32: the checkpoint is {own}{src} but {why} (no fast {own} matmul), and float32 fits{room}",
        )
    if free is None:  # the free memory is unknown: the checkpoint's own precision is the safe choice
        return own, (
            f"{own}: the checkpoint's own precision{src}; {why}, and float32 ({_gb(f32)}) may not fit "
            "(free memory unknown)"
        )
    return own, (
        f"{own}: the checkpoint's own precision{src}; {why}, but float32 ({_gb(f32)}) would not fit "
        f"in {_gb(free)}"
    )


def _avoid_overflow(
    own: str,
    checkpoint: Checkpoint,
    src: str,
    device: str,
    free_bytes: int | None,
    half_support: tuple[bool, str] | None,
) -> tuple[str, str]:
    """:func:`choose_dtype` for a checkpoint whose own precision its family overflows in: bfloat16
    where the device has a fast bfloat16 matmul (or the weights would not fit at float32), else float32."""
    note = f"the checkpoint is {own}{src} but {_overflow_note(checkpoint.family, own)}"
    fast, why = half_support if half_support is not None else device_half_support("bfloat16", device)
    if fast and not overflows(checkpoint.family, "bfloat16"):
        return "bfloat16", f"bfloat16: {note}; {why}"
    f32 = 4 * int(checkpoint.n_params)
    free = available_bytes(device) if free_bytes is None else free_bytes
    if not checkpoint.n_params or free is None or f32 <= free:
        return "float32", f"float32: {note}; {why} (no fast bfloat16 matmul)"
    return "bfloat16", f"bfloat16: {note}; {why}, and float32 ({_gb(f32)}) would not fit in {_gb(free)}"


def inspect_checkpoint(model) -> Checkpoint:
    """Read a model reference's own precision from metadata (config.json, safetensors or GGUF headers).

    ``model``: None/"default" (the embedded model, or the folder ``ATTNSCOPE_DEFAULT_MODEL`` names),
    a ``.gguf`` file or an HF folder. Unreadable references give ``Checkpoint(None)``: the load
    that follows reports the real error.
    """
    from attnscope.core.loading.resolve import default_gguf_path

    try:
        if model is None or str(model) in ("", "default"):
            pre = os.environ.get("ATTNSCOPE_DEFAULT_MODEL", "")
            path = Path(pre) if pre not in ("", "default") else default_gguf_path()
        else:
            path = Path(model).expanduser()
        if path.is_file():
            from attnscope.core.loading.gguf_meta import model_type_of, read_gguf_header

            h = read_gguf_header(path)
            return Checkpoint(
                gguf_checkpoint_dtype(h),
                h.n_params,
                gguf_is_quantised(h),
                f"GGUF {h.quant_name()}",
                model_type_of(h),
            )
        from attnscope.core.loading.describe_model import describe_hf_folder

        e = describe_hf_folder(path)
        cfg = json.loads((path / "config.json").read_text())
        d = config_dtype(cfg)
        family = str(cfg.get("model_type") or (cfg.get("text_config") or {}).get("model_type") or "")
        return Checkpoint(
            d or normalise(e.dtype), e.n_params, False, "config dtype" if d else "safetensors", family
        )
    except Exception:
        return Checkpoint(None)


def decide(model, requested: str = "auto", device: str = "cpu") -> tuple[str, str]:
    """:func:`choose_dtype` for a model reference (see :func:`inspect_checkpoint`)."""
    if check_choice(requested) != "auto":  # obeyed; the checkpoint only names a known overflow
        return choose_dtype(requested, Checkpoint(None, family=inspect_checkpoint(model).family), device)
    return choose_dtype("auto", inspect_checkpoint(model), device)


def entry_checkpoint(entry) -> Checkpoint:
    """:class:`Checkpoint` of a :class:`attnscope.core.loading.catalog_entry.CatalogEntry` (metadata the catalog read already)."""
    origin = f"GGUF {entry.dtype}" if entry.format == "gguf" else "config dtype"
    own, quantised = (
        normalise(getattr(entry, "checkpoint_dtype", "")),
        # dequantised on load (a GGUF); an mlx-lm folder stays packed and loads at its own dtype
        bool(getattr(entry, "quantised", False)) and entry.format == "gguf",
    )
    if own is None and entry.format == "gguf":  # an entry built without them: read the file type name
        own = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(
            str(entry.dtype).upper(), "bfloat16"
        )
        quantised = str(entry.dtype).upper() not in ("F32", "F16", "BF16")
    elif own is None:
        own = normalise(entry.dtype)
    return Checkpoint(own, int(entry.n_params), quantised, origin, str(getattr(entry, "architecture", "")))


def entry_dtype(
    entry,
    requested: str = "auto",
    device: str = "cpu",
    free_bytes: int | None = None,
    half_support: tuple[bool, str] | None = None,
) -> tuple[str, str]:
    """``(dtype, reason)`` a catalog entry loads at for ``requested`` (:func:`choose_dtype`)."""
    return choose_dtype(requested, entry_checkpoint(entry), device, free_bytes, half_support)
