"""A Q4_0 / Q4_1 / Q8_0 GGUF on the MLX backend, kept quantised (``nn.QuantizedLinear``).

``mx.load`` reads these three ggml types as MLX's own affine quantisation, with no dequantisation:
each 32-weight block becomes a packed ``uint32`` row (4 or 8 bits per weight) plus one scale and
one bias per group of 32 (Q4_0: ``d·(q − 8)`` → scale ``d``, bias ``−8d``; Q4_1: ``d·q + m``;
Q8_0: ``d·q`` with ``q`` offset to unsigned, bias ``−128d``). Other types (F32, F16, the k-quants)
come back as float arrays. So a GGUF whose every quantised tensor has one of these types loads
here at its file size, where the conversion path (:func:`attnscope.core.loading.conversion_cache.convert_gguf`)
would dequantise it to a float folder first.

Exactness: scales and biases are stored as float16 in the file; at a float32 load they are cast
to float32 (exact), and ``mx.dequantize`` of every weight then equals ``gguf.quants.dequantize``
bit for bit (``tests/core/test_mlx_gguf_quantised.py``): the same weights the float32 conversion
holds. At bfloat16 the scales are rounded to bfloat16 (the conversion rounds the dequantised
weights instead); at float16 they are exact. Attention is unchanged, so the capture is exact for
the model that ran, as on every path.

Names and row order: the GGUF → Hugging Face name map and the per-architecture processor are
transformers' (:func:`attnscope.core.loading.gguf_convert.tensor_plan`); llama.cpp permutes the q/k
rows of Llama-family models, and since every row is quantised on its own the inverse permutation
(transformers' ``LlamaTensorProcessor._reverse_permute_weights``) applies to the packed rows, the
scales and the biases alike. Architectures whose processor does anything else to a tensor (Gemma's
norms ``w − 1``, ...) are not taken this way: :func:`load_packed` returns None and the caller converts.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import mlx.core as mx

PACKED_TYPES = ("Q4_0", "Q4_1", "Q8_0")  # ggml types mx.load keeps quantised
GGUF_GROUP = 32  # weights per block (scale/bias group) of all three
_PROCESSORS = ("TensorProcessor", "LlamaTensorProcessor")  # processors that only permute q/k rows


def gguf_path_of(model) -> Path | None:
    """The GGUF file a model reference names (the embedded default's too, unless
    ``ATTNSCOPE_DEFAULT_MODEL`` names a pre-converted folder for it), else None."""
    import os

    from attnscope.core.loading.gguf_meta import is_gguf_file
    from attnscope.core.loading.resolve import default_gguf_path, is_default_ref

    if is_default_ref(model):
        pre = os.environ.get("ATTNSCOPE_DEFAULT_MODEL", "")
        return default_gguf_path() if pre in ("", "default") else None
    p = Path(str(model)).expanduser()
    return p if p.is_file() and is_gguf_file(p) else None


def packable(path: Path) -> bool:
    """Whether every quantised tensor of the GGUF at ``path`` has a type of :data:`PACKED_TYPES`
    (the rest being F32/F16/BF16) and at least one has: then it can load packed."""
    from attnscope.core.loading.gguf_meta import read_gguf_header

    types = {t.type_name for t in read_gguf_header(path).tensors}
    return bool(types & set(PACKED_TYPES)) and types <= set(PACKED_TYPES) | {"F32", "F16", "BF16"}


def _unpermute(w: mx.array, n_head: int) -> mx.array:
    """transformers' ``_reverse_permute_weights`` on the rows of ``w`` (any trailing shape)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def load_packed(path: Path, dtype, progress=None, notes: list[str] | None = None):
    """Read a GGUF for MLX keeping its Q4_0/Q4_1/Q8_0 tensors quantised.

    Args:
        path: the .gguf file.
        dtype: the MLX float dtype for float tensors, scales and biases (``mx.float32`` keeps the
            file's values exactly; see the module docstring).
        notes: where given, gets what the file holds that is not reproduced (the same notes as the
            conversion path: :func:`attnscope.core.loading.gguf_convert.plan_notes`, the tokenizer's).

    Returns:
        ``(config dict, weights, quantization, tokenizer)``: ``config`` as the conversion reads the
        GGUF's metadata (:func:`attnscope.core.loading.gguf_config.gguf_config`: ``model_type``, sizes,
        head size, RoPE and its scaling), the tokenizer with the file's pre-tokenizer, ``weights`` under Hugging Face names with
        ``<layer>.scales`` / ``.biases`` next to each packed ``<layer>.weight``, ``quantization``
        the mlx-lm style dict :func:`attnscope.core.backends.mlx_backend.build_model` takes (a
        default plus one ``{"group_size", "bits"}`` entry per packed layer: Q8_0 layers are 8-bit,
        Q4 ones 4-bit); or None when the file is not :func:`packable` or its architecture's
        processor does more than permute q/k rows (the caller then converts it).

    Raises:
        Whatever gguf, transformers or mx.load raise for an unreadable file.
    """
    from attnscope.core.loading.gguf_config import gguf_config
    from attnscope.core.loading.gguf_convert import plan_notes, tensor_plan
    from attnscope.core.loading.gguf_tokenizer import gguf_tokenizer

    path = Path(path)
    if not packable(path):
        return None
    config, found = gguf_config(path)
    reader, processor, name_map, config = tensor_plan(path, config)
    del reader
    if type(processor).__name__ not in _PROCESSORS:
        return None
    if progress is not None:
        progress(f"Reading {path.name} (kept quantised)…", 0.3)
    raw = cast(dict[str, mx.array], mx.load(str(path)))  # a .gguf, no return_metadata: {name: array}
    cfg = config.to_dict()
    n_heads, n_kv = (
        int(cfg["num_attention_heads"]),
        int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
    )
    permute = type(processor).__name__ == "LlamaTensorProcessor"
    weights: dict[str, mx.array] = {}
    quantization: dict = {"group_size": GGUF_GROUP, "bits": 4}
    for key, arr in raw.items():
        stem, _, part = key.rpartition(".")
        gguf_name = f"{stem}.weight" if part in ("scales", "biases") else key
        hf = name_map.get(gguf_name)
        if hf is None:
            continue  # not weights: rope_freqs / rope_factors_* are read into the config (gguf_config)
        hf_stem = hf.rpartition(".")[0]
        if permute and ".attn_q." in key:
            arr = _unpermute(arr, n_heads)
        elif permute and ".attn_k." in key:
            arr = _unpermute(arr, n_kv)
        if mx.issubdtype(arr.dtype, mx.floating) and arr.dtype != dtype:
            arr = arr.astype(dtype)
        weights[f"{hf_stem}.{part}" if part in ("scales", "biases") else hf] = arr
        if part == "scales":  # packed uint32 words per row × 32 / weights per row = bits
            packed = raw[f"{stem}.weight"]
            bits = packed.shape[-1] * 32 // (arr.shape[-1] * GGUF_GROUP)
            quantization[hf_stem] = {"group_size": GGUF_GROUP, "bits": int(bits)}
    tok, tok_notes = gguf_tokenizer(path)
    if notes is not None:
        notes.extend(found + tok_notes + plan_notes(path, config, name_map))
    cfg.pop("quantization_config", None)
    return cfg, weights, quantization, tok


def logical_params(model) -> int:
    """Parameters of an MLX model counting each quantised weight at its logical ``out × in`` size
    (a ``uint32`` word holds ``32 / bits`` weights; ``scales``/``biases`` not counted): the float
    checkpoint's count, as the torch backend reports it."""
    from mlx.utils import tree_flatten

    bits = {p: int(m.bits) for p, m in model.named_modules() if hasattr(m, "scales") and hasattr(m, "bits")}
    n = 0
    flat = cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))  # a list without destination=
    for k, v in flat:
        parent, _, leaf = k.rpartition(".")
        if parent in bits and leaf in ("scales", "biases"):
            continue
        n += int(v.size) * (32 // bits[parent] if parent in bits and leaf == "weight" else 1)
    return n


def describe(quantization: dict, file_type: str) -> str:
    """The runtime line for a packed GGUF: ``"Q4_1 kept packed (mlx QuantizedLinear, groups of 32):
    210 layers (209 4-bit, 1 8-bit)"``."""
    layers = [v for v in quantization.values() if isinstance(v, dict)]
    counts = {b: sum(1 for v in layers if v["bits"] == b) for b in sorted({v["bits"] for v in layers})}
    mix = ", ".join(f"{n} {b}-bit" for b, n in counts.items())
    return (
        f"{file_type} kept packed (mlx QuantizedLinear, groups of {GGUF_GROUP}): {len(layers)} layers ({mix})"
    )
