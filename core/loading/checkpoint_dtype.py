"""A checkpoint's own precision, read from its metadata: the dtype names AttnScope loads at
(:data:`DTYPES`, ``--dtype``'s :data:`CHOICES`), what a ``config.json`` declares (:func:`config_dtype`)
and what a GGUF's tensor table holds (:func:`gguf_checkpoint_dtype`). Read by the catalog and by
the precision decision (:mod:`attnscope.core.loading.precision`). A leaf of ``core/loading``."""

from __future__ import annotations

from collections import Counter

from attnscope.core.errors import ModelLoadError

DTYPES = ("float32", "bfloat16", "float16")
CHOICES = ("auto", *DTYPES)
_ALIASES = {
    "fp32": "float32",
    "f32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
}

# ggml type ids (gguf.GGMLQuantizationType): F32 = 0, F16 = 1, BF16 = 30; everything else quantised
_GGML_F32, _GGML_F16, _GGML_BF16 = 0, 1, 30


def normalise(dtype: str | None) -> str | None:
    """``"bf16"``/``"torch.bfloat16"``/``"bfloat16"`` → ``"bfloat16"``; None for None or unknown names."""
    if dtype is None:
        return None
    d = str(dtype).strip().lower().removeprefix("torch.")
    d = _ALIASES.get(d, d)
    return d if d in DTYPES else None


def check_choice(dtype: str) -> str:
    """Validate a ``--dtype`` value; returns it normalised.

    Raises:
        ModelLoadError: not one of :data:`CHOICES` (one line naming them).
    """
    if str(dtype).strip().lower() == "auto":
        return "auto"
    d = normalise(dtype)
    if d is None:
        raise ModelLoadError(f"unknown dtype {dtype!r}: choose one of {', '.join(CHOICES)}")
    return d


def config_dtype(cfg: dict) -> str | None:
    """The float dtype a parsed ``config.json`` declares (``dtype``, ``torch_dtype``, also under
    ``text_config``), normalised; None when it declares none."""
    for c in (cfg, cfg.get("text_config") or {}):
        if isinstance(c, dict):
            for key in ("dtype", "torch_dtype"):
                d = normalise(c.get(key))
                if d:
                    return d
    return None


def gguf_checkpoint_dtype(header) -> str:
    """A GGUF's own precision from its tensor table (:class:`attnscope.core.loading.gguf_meta.GGUFHeader`).

    Counted over the weight matrices (tensors of ≥ 2 dims; norms and biases are F32 in every
    file): any quantised matrix → ``"bfloat16"``; else the most common of F32 → ``"float32"``,
    F16 → ``"float16"``, BF16 → ``"bfloat16"``.
    """
    types = Counter(t.type_id for t in header.tensors if len(t.shape) >= 2)
    if not types:
        return "float32"
    if any(t not in (_GGML_F32, _GGML_F16, _GGML_BF16) for t in types):
        return "bfloat16"
    top = types.most_common(1)[0][0]
    return {_GGML_F32: "float32", _GGML_F16: "float16", _GGML_BF16: "bfloat16"}[top]


def gguf_is_quantised(header) -> bool:
    """True when any weight matrix of the GGUF is stored in a quantised (block) type."""
    return any(
        t.type_id not in (_GGML_F32, _GGML_F16, _GGML_BF16) for t in header.tensors if len(t.shape) >= 2
    )
