"""Load a model for the torch backend: resolve the reference (:func:`attnscope.core.loading.resolve.resolve`),
pick the dtype (:func:`attnscope.core.loading.precision.decide`), build it with AttnScope's attention
registered (:mod:`attnscope.core.backends.hf_attention`), optionally quantised
(:mod:`attnscope.core.loading.quantize`, streamed by :mod:`attnscope.core.loading.stream_load`) or
spread over devices (:mod:`attnscope.core.loading.device_map`), and describe it
(:class:`attnscope.core.loading.model_info.ModelInfo`)."""

from __future__ import annotations

import dataclasses
import math
import os

from attnscope.core.errors import ModelLoadError, UnsupportedModelError, first_line
from attnscope.core.loading import support_rule
from attnscope.core.loading.cache_folder import cache_root
from attnscope.core.loading.checks import check_architecture
from attnscope.core.loading.model_info import info_from_config
from attnscope.core.loading.progress import ProgressFn, no_progress
from attnscope.core.loading.quiet import quiet_transformers
from attnscope.core.loading.resolve import model_source, resolve


def _stream_progress(progress: ProgressFn, name: str) -> ProgressFn:
    # the streamed quantised load reports per tensor; the load step owns 0.96-0.99 of the bar
    return lambda _msg, frac: progress(f"Loading and quantising {name}…", 0.96 + 0.03 * frac)


def _logical_numel(p) -> int:
    # a quantised weight's logical shape (torchao subclasses keep it: packed int4 too)
    return int(math.prod(p.shape))


def load_torch(
    model: str | os.PathLike | None,
    device: str = "cpu",
    dtype: str = "auto",
    progress: ProgressFn = no_progress,
    quantize: str = "none",
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
):
    """Load a model for the torch backend with AttnScope's attention registered.

    Returns ``(model, tokenizer, info)``; the model is in eval mode on ``device``. ``quantize``
    (``none|int8|int4``, :mod:`attnscope.core.loading.quantize`) makes its linear layers weight-only int8/int4 after
    loading; int4 loads at bfloat16 (its kernels' activation dtype). ``device_map``
    (``auto|balanced|sequential`` or an explicit dict, :mod:`attnscope.core.loading.device_map`) spreads the layers
    over GPUs, CPU and disk through accelerate instead of moving the model to ``device``, within
    ``max_memory`` (default :func:`attnscope.core.loading.fit_devices.run_budget`: free memory less
    the room the run needs).

    Raises:
        ModelLoadError / UnsupportedModelError: see :func:`resolve`.
    """
    import torch
    from attnscope.core.backends.hf_attention import ATTN_NAME, register_attention
    from attnscope.core.loading import text_only
    from attnscope.core.loading.device_map import check_device_map
    from attnscope.core.loading.device_map import info_fields as dm_record
    from attnscope.core.loading.device_map import load_kwargs as dm_kwargs
    from attnscope.core.loading.lean_import import build_deferred
    from attnscope.core.loading.precision import decide
    from attnscope.core.loading.quantize import check_mode, file_quantization, load_dtype, quantize_model
    from attnscope.core.loading.stream_load import load_quantised
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    quantize = check_mode(quantize)
    dm = device_map if isinstance(device_map, dict) else check_device_map(device_map)
    dtype, dtype_reason = decide(model, dtype, device)  # "auto" -> the checkpoint's own dtype, and why
    dtype, forced = load_dtype(quantize, dtype)
    dtype_reason = f"{dtype}: {forced}" if forced else dtype_reason
    quiet_transformers()
    # e.g. the quantised-weights cache not written (attnscope.core.loading.quant_cache), a damaged
    # conversion-cache entry converted again (convert_gguf)
    notes: list[str] = []
    folder, name = resolve(model, progress, dtype, notes=notes)
    register_attention()
    progress(f"Loading {name}…", 0.96)
    streamed = None
    # the model is built on the meta device, whose torch references ask dynamo to leave them alone
    # and check their arguments against sympy's expressions: that need not import torch's compiler
    # nor sympy (core/loading/lean_import.py, "torch's compiler when used", "sympy when used")
    deferred = build_deferred().__enter__()
    try:
        tok = AutoTokenizer.from_pretrained(folder)
        full_config = AutoConfig.from_pretrained(folder)
        multimodal = text_only.is_multimodal(full_config)
        if multimodal:  # the language model alone: the vision tower is never read
            notes.append(text_only.VISION_NOTE)
        if quantize != "none" and dm is None:  # quantise tensor by tensor: no whole float model
            check_architecture(full_config.model_type)
            streamed = load_quantised(
                folder, quantize, dtype, device, ATTN_NAME, _stream_progress(progress, name), notes=notes
            )
        if streamed is None and isinstance(dm, str) and max_memory is None:
            from attnscope.core.loading.fit_devices import run_budget

            # leave room for the run: accelerate would otherwise fill RAM (or the GPU) with layers
            max_memory = run_budget(full_config, dtype)
        if streamed is None:
            kw = dict(
                dtype=getattr(torch, dtype),
                attn_implementation=ATTN_NAME,
                **dm_kwargs(dm, cache_root() / "offload" / name, max_memory),
            )
            if multimodal:
                m = text_only.from_pretrained(folder, full_config, **kw)
            else:
                m = AutoModelForCausalLM.from_pretrained(folder, **kw)
    except ModelLoadError:
        raise
    except Exception as e:
        raise ModelLoadError(f"cannot load {name}: {first_line(e)}") from None
    finally:
        deferred.__exit__(None, None, None)
    if streamed is not None:
        m, runtime = streamed
        n_params = sum(_logical_numel(p) for p in m.parameters())
    else:
        why = support_rule.loaded_problem(m)
        if why:
            raise UnsupportedModelError(why)
        if dm is None:
            m.to(device)
        m.eval()
        n_params = sum(p.numel() for p in m.parameters())  # before quantising: packed int4 counts halves
        if quantize != "none":
            progress(f"Quantising {name} to {quantize}…", 0.98)
        runtime = quantize_model(m, quantize)
    info = info_from_config(
        m.config,
        name=name,
        source=model_source(model),
        dtype=dtype,
        n_params=n_params,
        has_chat_template=bool(getattr(tok, "chat_template", None)),
    )
    info = dataclasses.replace(
        info,
        architecture=full_config.model_type,  # a multimodal checkpoint's own name ("gemma3"), as the catalog lists it
        quantization_file=file_quantization(info.source),
        **dm_record(m, dm),
        quantization_runtime=runtime,
        dtype_reason=dtype_reason,
        load_note="; ".join(notes),
    )
    progress(f"{name} ready.", 1.0)
    return m, tok, info
