"""Load a safetensors folder straight into a weight-only int8/int4 model, one tensor at a time.

Why not ``from_pretrained`` then :func:`attnscope.core.loading.quantize.quantize_model`: transformers
memory-maps each safetensors file and keeps bf16 parameters as views of the map, so the whole float
checkpoint is resident (file pages count in RSS) before, and while, its linear layers are quantised.
Measured on the Llama-3.2-1B-shaped bf16 folder: peak RSS 5.45 GB at int8 against 3.31 GB unquantised;
for an 8B model that is ≈ 16 GB of bf16 pages plus ≈ 9 GB of int8 weights. transformers'
``TorchAoConfig`` quantises tensor by tensor but keeps the maps too (4.12 GB, module docstring of
:mod:`attnscope.core.loading.quantize`).

Here instead (:func:`load_quantised`):

1. the model is built with its parameters on the meta device (``accelerate.init_empty_weights``;
   buffers such as RoPE's ``inv_freq`` are built for real, as ``from_pretrained`` does);
2. each tensor is read with ``readinto`` from the file (no memory map: page-cache pages are not the
   process's RSS), cast to the load dtype, moved to the device and set as the parameter;
3. a linear layer :func:`~attnscope.core.loading.quantize.linear_targets` names is quantised with the
   same torchao config as :func:`~attnscope.core.loading.quantize.quantize_model` as soon as its
   weight is set, so at most one float weight matrix (plus the float tensors kept unquantised:
   embeddings, norms, ``lm_head``) is in memory at a time.

The result equals ``from_pretrained`` + ``quantize_model`` bit for bit (the same float weights go
through the same torchao transform; ``tests/integration/test_stream_load.py``), so the capture stays exact for
the model that ran. A folder whose checkpoint names do not match the model's parameters one to one
(transformers renames some families' keys while loading), or that holds no safetensors, is not
streamed: :func:`load_quantised` returns None and the caller loads it the ordinary way.

The quantised tensors are cached after the first load (:mod:`attnscope.core.loading.quant_cache`):
later loads of the same checkpoint, dtype and mode read them back instead of quantising again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from attnscope.core.loading.safetensors_header import read_header, read_tensor


def safetensors_files(folder: Path) -> list[Path]:
    """The folder's safetensors files the loader reads (:func:`attnscope.core.loading.weight_files.weight_files`:
    the index's shards in name order, or the single file); [] if none."""
    from attnscope.core.loading.weight_files import weight_files

    return [f for f in weight_files(Path(folder)) if f.suffix == ".safetensors"]


def _set(model, key: str, t, is_buffer: bool) -> None:
    import torch

    prefix, _, leaf = key.rpartition(".")
    mod = model.get_submodule(prefix) if prefix else model
    if is_buffer:
        mod._buffers[leaf] = t
    else:
        mod._parameters[leaf] = torch.nn.Parameter(t, requires_grad=False)


def load_quantised(
    folder,
    mode: str,
    dtype: str,
    device: str,
    attn_implementation: str,
    progress=None,
    cache: bool = True,
    notes: list[str] | None = None,
):
    """Build the folder's causal LM with its decoder linear layers weight-only ``mode``, streaming.

    Args:
        folder: a Hugging Face model folder with ``config.json`` and safetensors weights.
        mode: ``"int8"`` or ``"int4"`` (:data:`attnscope.core.loading.quantize.MODES`).
        dtype: the load (activation) dtype name, e.g. ``"bfloat16"``; float tensors are cast to it.
        device: ``"cpu"``, ``"cuda"``, ...; each tensor is moved there before it is quantised.
        attn_implementation: the name registered with transformers' attention interface.
        progress: ``progress(message, fraction)`` per tensor (fraction 0–1 of the bytes read).
        cache: read the quantised weights from, or after quantising write them to, the cache of
            quantised weights (:mod:`attnscope.core.loading.quant_cache`; a cached load calls no
            quantiser and gives the same tensors bit for bit).
        notes: where given, one line is appended when the cache could not be written.

    Returns:
        ``(model, runtime_line)`` in eval mode on ``device``: the same model and line
        ``from_pretrained`` + :func:`~attnscope.core.loading.quantize.quantize_model` give; or None
        when the folder cannot be streamed (no safetensors; checkpoint names that do not map one to
        one onto the model's parameters), and the caller should load it the ordinary way.

    Raises:
        ModelLoadError: torchao fails, or the model's device cannot run ``mode`` (as quantize_model).
        ValueError / OSError: an unreadable or truncated safetensors file.
    """
    import torch
    from accelerate import init_empty_weights
    from attnscope.core.loading import quantize as q
    from attnscope.core.loading import text_only
    from transformers import AutoConfig, AutoModelForCausalLM

    files = safetensors_files(Path(folder))
    if not files:
        return None
    headers = [read_header(p) for p in files]
    cfg = AutoConfig.from_pretrained(folder)
    multimodal = text_only.is_multimodal(cfg)
    if multimodal:  # the language model alone, its tensors renamed; the vision tower's never read
        cfg = text_only.text_config(cfg)
        headers = [(start, text_only.language_header(h)) for start, h in headers]
    with init_empty_weights():  # parameters on meta; buffers (RoPE inv_freq) real, as from_pretrained
        if multimodal:
            model = text_only.causal_lm_class(cfg)._from_config(
                cfg, dtype=getattr(torch, dtype), attn_implementation=attn_implementation
            )
        else:
            model = AutoModelForCausalLM.from_config(
                cfg, dtype=getattr(torch, dtype), attn_implementation=attn_implementation
            )
    params = dict(model.named_parameters(remove_duplicate=False))
    buffers = dict(model.named_buffers())
    ckpt = {k for _, h in headers for k in h}
    tied = set(model.get_expanded_tied_weights_keys(all_submodels=True)) if cfg_ties(cfg) else set()
    missing = set(params) - ckpt - tied
    unexpected = ckpt - set(params) - set(buffers)
    if missing or unexpected:
        return None
    from attnscope.core.loading.load_report import mismatch_line

    why = mismatch_line(
        [
            (k, tuple(e["shape"]), tuple(params[k].shape))
            for _, h in headers
            for k, e in h.items()
            if k in params and tuple(e["shape"]) != tuple(params[k].shape)
        ]
    )
    if why is not None:  # _set would put the checkpoint's shape in silently
        from attnscope.core.errors import ModelLoadError

        raise ModelLoadError(f"cannot load {Path(folder).name}: {why}")
    q.check_device(mode, torch.device(device), getattr(torch, dtype))
    targets = set(q.linear_targets(model))
    mods = dict(model.named_modules())
    if mode == "int4":  # torchao skips weights whose rows do not split into groups
        targets = {n for n in targets if mods[n].in_features % q.INT4_GROUP == 0}
    quantize_ = q._import_torchao()
    config = q._config(mode, torch.device(device).type)
    from attnscope.core.loading import quant_cache

    folder_name = Path(folder).name
    cached = None
    if cache:
        try:
            cached = quant_cache.entry_dir(Path(folder), files, mode, dtype, torch.device(device).type)
        except OSError:  # a checkpoint file vanished: load it the usual way (and fail there)
            cached = None
    hit = (
        cached is not None
        and quant_cache.is_complete(cached)
        and quant_cache.load_into(
            model,
            cached,
            ckpt,
            device,
            mode,
            _set,
            set(params),
            None if progress is None else lambda m, f: progress(f"Loading {folder_name} at {mode}: {m}", f),
        )
    )
    total = sum(sum(e["data_offsets"][1] - e["data_offsets"][0] for e in h.values()) for _, h in headers)
    done = 0
    last_layer: str | None = None
    sources = [] if hit else list(zip(files, headers, strict=True))  # a cache hit set every tensor
    with torch.no_grad():
        for path, (start, header) in sources:
            with open(path, "rb") as f:
                for key, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                    t = read_tensor(f, start, entry)
                    if t.is_floating_point():
                        t = t.to(device=device, dtype=getattr(torch, dtype))
                    else:
                        t = t.to(device=device)
                    _set(model, key, t, is_buffer=key not in params)
                    del t
                    owner = key.rpartition(".")[0]
                    if key.endswith(".weight") and owner in targets:
                        parent, _, child = owner.rpartition(".")
                        layer = decoder_layer(owner)
                        if layer != last_layer:  # the previous layer's temporaries: give them back
                            release_freed()
                            last_layer = layer
                        q.quantize_one(quantize_, mods[parent] if parent else model, child, config, mode)
                    done += entry["data_offsets"][1] - entry["data_offsets"][0]
                    if progress is not None:
                        progress(f"Loading {Path(folder).name} at {mode}: {key}", done / max(total, 1))
    release_freed()
    if tied:
        model.tie_weights()
    left = [n for n, p in model.named_parameters(remove_duplicate=False) if p.device.type == "meta"]
    if left:
        raise ValueError(f"weights missing from the checkpoint: {', '.join(left[:3])}")
    if cached is not None and not hit:
        note = quant_cache.write(
            model,
            sorted(ckpt),
            cached,
            {
                "folder": str(Path(folder).resolve()),
                "mode": mode,
                "dtype": dtype,
                "device": torch.device(device).type,
                "key": cached.name,
                "torchao": q.library_version(),
            },
            None if progress is None else lambda m, f: progress(f"Caching {folder_name} at {mode}: {m}", f),
        )
        if note is not None:
            if notes is not None:
                notes.append(note)
            if progress is not None:
                progress(note, 1.0)
    model.to(device)  # the buffers built on the CPU
    model.eval()
    block_output_projection(model)
    return model, q.runtime_line(model, mode, targets)


LM_HEAD_ROWS = 16384  # vocabulary rows per block of the blocked lm_head (block_output_projection)


def block_output_projection(model, rows: int = LM_HEAD_ROWS) -> None:
    """Make ``model``'s output projection (``lm_head``, a plain ``nn.Linear``) compute its logits in
    blocks of ``rows`` vocabulary rows, concatenated.

    Why: torch's CPU bfloat16 matmul of one row against the whole ``(vocab, hidden)`` matrix makes a
    transient copy of that matrix (measured: +0.53 GB for a 128,256 × 2,048 bf16 ``lm_head``, +1.05 GB
    at hidden 4,096: most of what kept the 8B int8 prefill's peak above 11 GB); per block the copy is
    a block's. Each logit is the same dot product either way (tests/integration/test_stream_load.py: logits equal
    bit for bit). A model without a plain ``lm_head`` Linear is left as it is.
    """
    import types

    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear or head.weight.shape[0] <= rows:
        return

    def forward(self, x):
        w, b = self.weight, self.bias
        parts = [
            torch.nn.functional.linear(x, w[i : i + rows], None if b is None else b[i : i + rows])
            for i in range(0, w.shape[0], rows)
        ]
        return torch.cat(parts, dim=-1)

    # deliberately this one module's forward (an instance attribute), not nn.Linear's
    head.forward = types.MethodType(forward, head)  # type: ignore[method-assign]


def decoder_layer(name: str) -> str:
    """The decoder layer a module name belongs to: its prefix up to the first all-digit part
    (``"model.layers.3.mlp.up_proj"`` -> ``"model.layers.3"``), or the name itself if none."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return name


_TRIM: list[Callable[[int], int] | None] = []  # glibc's malloc_trim once looked up, or None


def release_freed() -> None:
    """Give the C heap's free pages back to the OS (glibc ``malloc_trim``; a no-op elsewhere).

    torchao's quantisation allocates float temporaries between the int8 results; glibc keeps the
    freed holes in its heap, so without this the RSS grew by ≈ 6× a layer's int8 size per layer
    (measured: a 253 MB bf16 checkpoint, 8 layers of hidden 1024, loaded at int8 to 924 MB resident;
    508 MB after one ``malloc_trim``). :func:`load_quantised` trims once per decoder layer (and once at
    the end), not after every weight: a trim hands the pages back, so the next weight's temporaries
    fault them in again, zeroed. Measured side by side on a 329 MB bf16 checkpoint (8 layers, hidden
    1,024), alternating, load average 5.2–5.5: per weight 13.6 / 11.8 s, peak 0.62–0.64 GB; per layer
    2.3 / 4.1 s, peak 0.62–0.69 GB (never trimming: 4.5–5.8 s, peak 0.96–1.12 GB).
    """
    if not _TRIM:
        import ctypes
        import ctypes.util

        try:
            _TRIM.append(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim)
        except (OSError, AttributeError):  # not glibc (macOS, Windows, musl): nothing to trim
            _TRIM.append(None)
    if _TRIM[0] is not None:
        _TRIM[0](0)


def cfg_ties(cfg) -> bool:
    """Whether the config ties the output embedding to the input one (text config for composites)."""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return bool(getattr(text, "tie_word_embeddings", getattr(cfg, "tie_word_embeddings", False)))
