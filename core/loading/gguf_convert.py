"""GGUF → safetensors, tensor by tensor, straight to the load dtype (no float32 state dict).

transformers' own GGUF loader (``load_gguf_checkpoint``) dequantises every tensor of the file
into one float32 state dict before the model sees any of it: a 4.9 GB Llama-3.1-8B Q4_K_M needs
more than 32 GB of RAM. This module does the same conversion one tensor at a time, reusing
transformers' own pieces so the result is the same numbers in the same places:

* config: :func:`transformers.AutoConfig.from_pretrained` with ``gguf_file=`` (metadata only), plus
  what transformers drops and llama.cpp reads (head size, Gemma 3's scale, RoPE scaling from the
  metadata and from ``rope_freqs`` / ``rope_factors_*``: :mod:`attnscope.core.loading.gguf_config`);
* tokenizer: :func:`transformers.AutoTokenizer.from_pretrained` with ``gguf_file=``, with the
  pre-tokenizer the file names (``tokenizer.ggml.pre``: :mod:`attnscope.core.loading.gguf_tokenizer`);
* names: :func:`transformers.modeling_gguf_pytorch_utils.get_gguf_hf_weights_map` on the model
  built on the ``meta`` device (no memory);
* per-architecture fix-ups (Llama q/k rows back in Hugging Face order — the inverse of
  llama.cpp's permute —, Gemma norms ``w − 1``, GPT-2 transposes ...): transformers'
  ``TENSOR_PROCESSORS[architecture].process``;
* dequantisation: :func:`gguf.quants.dequantize` (float32), then ``.to(dtype)``: exactly
  transformers' ``torch.from_numpy(weights).to(torch_dtype)``, so float32 is bit-exact and
  bfloat16/float16 are transformers' float32 values rounded (round-to-nearest-even).

What the file holds that none of this reads (:func:`attnscope.core.loading.gguf_keys.unread`) is
named in one note. The notes and :data:`CONVERSION_VERSION` are recorded in the folder's
``attnscope_source.json``: a folder made by an older conversion is not current
(:func:`is_current`) and is converted again.

Tensors are written to safetensors shards of at most ``shard_bytes`` as they come (plus
``model.safetensors.index.json`` when there is more than one shard); the file's pages are released
after each tensor (``madvise(MADV_DONTNEED)``) and tensors over :data:`CHUNK_BYTES` at float32 are
dequantised in row blocks, so peak RSS is about one shard plus one row block, whatever the model's
size. Everything goes to ``<out>.partial-<pid>`` first and is renamed at the end: an interrupted
or cancelled conversion is never mistaken for a finished one.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
from pathlib import Path

import numpy as np
from attnscope.core.loading.progress import ProgressFn, no_progress

#: bumped whenever a conversion of the same file would differ (config, tokenizer or weights), so
#: cached folders made before are converted again (2: head size, scale, RoPE scaling, pre-tokenizer)
CONVERSION_VERSION = 2
SOURCE = "attnscope_source.json"
SHARD_BYTES = 2 * 10**9  # ≤ 2 GB per safetensors shard
CHUNK_BYTES = 256 << 20  # tensors larger than this at float32 are dequantised in row blocks
# transformers processors whose process() acts row by row (elementwise or no-op) except on q/k/qkv
_ROWWISE = ("TensorProcessor", "LlamaTensorProcessor", "Gemma2TensorProcessor", "NemotronTensorProcessor")
_WHOLE = (".attn_q.", ".attn_k.", ".attn_qkv.")


def _torch_dtype(dtype: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def gguf_architecture(reader) -> str:
    """``general.architecture`` of an open :class:`gguf.GGUFReader` (transformers' ``read_field``)."""
    from transformers.modeling_gguf_pytorch_utils import read_field

    return str(read_field(reader, "general.architecture")[0])


def tensor_plan(gguf_path: Path, config=None):
    """``(reader, processor, name_map, config)`` for a GGUF: what transformers' loader would use.

    ``name_map`` maps GGUF tensor names (``blk.0.attn_q.weight``) to Hugging Face parameter names
    (``model.layers.0.self_attn.q_proj.weight``), from the model built on the meta device.
    """
    import torch
    from attnscope.core.loading.gguf_config import gguf_config
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    gguf_path = Path(gguf_path)
    if config is None:
        config, _notes = gguf_config(gguf_path)
    reader = GGUFReader(gguf_path)
    arch = gguf_architecture(reader)
    # transformers builds the processor from the config dict it parsed from the same metadata
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())
    with torch.device("meta"):
        meta_model = AutoModelForCausalLM.from_config(config)
    # llama.cpp stores Mistral as "llama" (tensor names included); gguf-py has no "mistral" arch, so
    # transformers' own loader fails on these files (NotImplementedError): map them as llama.
    model_type = "llama" if config.model_type == "mistral" else None
    name_map = get_gguf_hf_weights_map(meta_model, processor, model_type=model_type)
    return reader, processor, name_map, config


def _release(reader, t) -> None:
    """Drop the file pages of tensor ``t`` from this process (they are re-read if touched again)."""
    mm = getattr(reader.data, "_mmap", None)
    if mm is None or not hasattr(mm, "madvise"):
        return
    start = int(t.data_offset) & ~(mmap.PAGESIZE - 1)
    end = min(len(mm), int(t.data_offset) + int(t.n_bytes))
    try:
        mm.madvise(mmap.MADV_DONTNEED, start, max(0, end - start))
    except (OSError, ValueError):
        pass


def iter_tensors(
    gguf_path: Path, dtype: str = "float32", config=None, progress: ProgressFn = no_progress, plan=None
):
    """Yield ``(hf_name, torch.Tensor at dtype)`` for every weight of a GGUF, one at a time.

    ``progress(message, fraction)`` is called before each tensor (fraction of the file's bytes
    done, in [0, 1]); it may raise (e.g. :class:`attnscope.core.errors.Cancelled`) to stop between tensors.
    ``plan``: :func:`tensor_plan`'s result when the caller has it already.
    """
    import torch
    from gguf.quants import dequantize

    tdt = _torch_dtype(dtype)
    reader, processor, name_map, config = plan if plan is not None else tensor_plan(gguf_path, config)
    total = sum(int(t.n_bytes) for t in reader.tensors) or 1
    done = 0
    rowwise = type(processor).__name__ in _ROWWISE
    for i, t in enumerate(reader.tensors):
        progress(f"tensor {i + 1}/{len(reader.tensors)}: {t.name}", done / total)
        extra: dict = {"tensors": {}}
        data = t.data
        n_f32 = int(t.n_elements) * 4
        if rowwise and data.ndim == 2 and n_f32 > CHUNK_BYTES and not any(k in t.name for k in _WHOLE):
            hf = name_map.get(t.name)
            if hf is not None:
                rows = max(1, CHUNK_BYTES // max(1, n_f32 // data.shape[0]))
                out = None
                for r0 in range(0, data.shape[0], rows):
                    w = processor.process(
                        weights=dequantize(data[r0 : r0 + rows], t.tensor_type),
                        name=t.name,
                        tensor_key_mapping=name_map,
                        parsed_parameters=extra,
                    ).weights
                    block = torch.from_numpy(np.array(w, copy=True)).to(tdt)
                    if out is None:
                        out = torch.empty((data.shape[0], *block.shape[1:]), dtype=tdt)
                    out[r0 : r0 + block.shape[0]] = block
                    del w, block
                _release(reader, t)
                done += int(t.n_bytes)
                yield hf, out
                continue
        res = processor.process(
            weights=dequantize(data, t.tensor_type),
            name=t.name,
            tensor_key_mapping=name_map,
            parsed_parameters=extra,
        )
        for name, tensor in extra["tensors"].items():  # processors that store a tensor themselves
            yield name, tensor.to(tdt)
        if res.name is not None and res.name in name_map:
            w = res.weights
            yield name_map[res.name], torch.from_numpy(np.array(w, copy=True)).to(tdt)
        del res
        _release(reader, t)
        done += int(t.n_bytes)
    progress("all tensors converted", 1.0)


def plan_notes(gguf_path: Path, config, name_map) -> list[str]:
    """The note naming what the file holds that the conversion does not read (``[]`` if nothing)."""
    from attnscope.core.loading.gguf_keys import unread, unread_note
    from attnscope.core.loading.gguf_meta import read_gguf_header

    note = unread_note(*unread(read_gguf_header(gguf_path), config.model_type, name_map))
    return [note] if note else []


def is_current(folder: Path) -> bool:
    """Whether ``folder``'s ``attnscope_source.json`` says it was made by this :data:`CONVERSION_VERSION`."""
    try:
        meta = json.loads((Path(folder) / SOURCE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("conversion") == CONVERSION_VERSION


def conversion_notes(folder: Path) -> list[str]:
    """The notes the conversion of ``folder`` recorded (what the file holds that is not reproduced)."""
    try:
        meta = json.loads((Path(folder) / SOURCE).read_text())
    except (OSError, ValueError):
        return []
    notes = meta.get("notes") if isinstance(meta, dict) else None
    return [str(n) for n in notes] if isinstance(notes, list) else []


def convert(
    gguf_path: Path,
    out: Path,
    dtype: str = "float32",
    progress: ProgressFn = no_progress,
    shard_bytes: int = SHARD_BYTES,
    source: dict | None = None,
) -> Path:
    """Convert ``gguf_path`` into the Hugging Face folder ``out`` (config, tokenizer, safetensors at ``dtype``).

    Args:
        dtype: "float32", "bfloat16" or "float16": every tensor is stored at this dtype.
        progress: ``(message, fraction in [0, 1])`` per tensor; raising in it cancels the conversion
            (the partial folder is removed, ``out`` is untouched).
        shard_bytes: largest shard in bytes (one tensor larger than this gets a shard of its own).
        source: written as ``attnscope_source.json`` (where the folder came from), with
            ``conversion`` (:data:`CONVERSION_VERSION`) and ``notes`` (:func:`conversion_notes`) added.

    Returns:
        ``out``. If another process finished the same conversion first, its folder is kept.

    Raises:
        Whatever transformers or gguf raise for a file they cannot read; what ``progress`` raises.
    """
    from attnscope.core.loading.gguf_config import gguf_config
    from attnscope.core.loading.gguf_tokenizer import gguf_tokenizer
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    gguf_path, out = Path(gguf_path), Path(out)
    tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        progress("reading config and tokenizer", 0.0)
        config, notes = gguf_config(gguf_path)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        tok, tok_notes = gguf_tokenizer(gguf_path)
        plan = tensor_plan(gguf_path, config)
        notes += tok_notes + plan_notes(gguf_path, config, plan[2])
        shards: list[dict[str, str]] = []
        current: dict = {}
        size = 0
        total_size = 0

        def flush():
            nonlocal current, size
            if current:
                name = f"shard-{len(shards):05d}.safetensors"
                save_file(current, str(tmp / name), metadata={"format": "pt"})
                shards.append({k: name for k in current})
                current, size = {}, 0

        for name, tensor in iter_tensors(gguf_path, dtype, config, progress, plan=plan):
            nbytes = tensor.numel() * tensor.element_size()
            if current and size + nbytes > shard_bytes:
                flush()
            current[name] = tensor.contiguous()
            size += nbytes
            total_size += nbytes
        flush()
        n = len(shards)
        weight_map = {}
        for i, m in enumerate(shards):
            final = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            (tmp / next(iter(m.values()))).rename(tmp / final)
            weight_map.update({k: final for k in m})
        if n > 1:
            (tmp / "model.safetensors.index.json").write_text(
                json.dumps(
                    {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))},
                    indent=2,
                )
            )
        config.dtype = dtype
        config.save_pretrained(tmp)
        try:
            GenerationConfig.from_model_config(config).save_pretrained(tmp)
        except Exception:  # noqa: BLE001 - a generation config is optional
            pass
        tok.save_pretrained(tmp)
        (tmp / SOURCE).write_text(json.dumps(dict(source or {}, conversion=CONVERSION_VERSION, notes=notes)))
        if out.exists():  # another process converted the same file meanwhile: keep its folder
            shutil.rmtree(tmp, ignore_errors=True)
            return out
        tmp.rename(out)
        return out
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
