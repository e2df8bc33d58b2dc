"""Weight-only int8 / int4 quantisation of a torch model's linear layers (``--quantize none|int8|int4``).

What is quantised: every ``nn.Linear`` inside the decoder layers (q/k/v/o projections and the MLP).
Embeddings, norms and ``lm_head`` keep the load dtype: ``lm_head`` is often tied to the embedding
matrix (Llama 3.2 1B, SmolLM2), and quantising it would either untie it (a second copy) or change
the embedding lookups too; the next-token list the app shows comes straight from it.

Attention itself is unchanged: q, k, v come out of quantised projections, then run through
AttnScope's own attention function at the activation dtype, so the Trace (q rows, LSE, cached
keys) is exact *for the quantised model that ran* (tests/core/test_quantize.py: captured weights equal
eager attention of the same quantised model).

Library: torchao (``torchao.quantization.quantize_``)
----------------------------------------------------
Measured here (torch 2.13.0 CPU, 2-core AMD EPYC with avx512_bf16; one ``Linear(2048, 8192)`` on
512 tokens, 3 runs; relative output error against the unquantised layer):

=====================  =============  ===========  =================================
 bfloat16 activations   time / call    rel. error   tensor subclass
=====================  =============  ===========  =================================
 none                    172 ms                      —
 torchao int8            179 ms        0.0049       ``Int8Tensor`` (per-row scale)
 torchao int4 (g128)     321 ms        0.066        ``Int4OpaqueTensor`` (CPU int4pack)
 optimum-quanto int8     518 ms        0.0053       ``WeightQBytesTensor``
 optimum-quanto int4     389 ms        0.066        ``TinyGemmWeightQBitsTensor``
=====================  =============  ===========  =================================

With float32 activations: torchao int8 415 ms (none 461 ms); torchao's CPU int4 kernel falls back
to a path 50× slower (24 s), and optimum-quanto int4 fails outright ("Cannot set version_counter
for inference tensor"). Hence: int4 always runs with bfloat16 activations (:func:`load_dtype`).

On CUDA (torchao docs): ``Int8WeightOnlyConfig`` runs on any GPU; int4 uses
``Int4WeightOnlyConfig(int4_packing_format="tile_packed_to_4d")``, the tinygemm kernel
(``aten._weight_int4pack_mm``, bfloat16) that ships in torch itself, so no extra CUDA library.
optimum-quanto's CUDA path needs a JIT-compiled extension (ninja + a compiler) and its last release
is 0.2.7 (March 2025); torchao is PyTorch's own, released with each torch. torchao wins on both.

Whole model (Llama-3.2-1B-shaped, random bf16 weights, 2.47 GB; 512-token capture prefill; peak
RSS from ``/usr/bin/time -f %M``): none 2.47 GB of weights, peak 2.99 GB; int8 1.50 GB, peak
4.27-4.71 GB, 2.26 GB resident after the prefill; int4 1.04 GB, peak 3.72 GB, when the bf16 model
was loaded whole (its memory-mapped pages resident) before its layers were quantised; loading
through transformers' ``TorchAoConfig`` instead measured 4.12 / 3.52 GB (the mapped checkpoint
stays resident). :func:`attnscope.core.backends.torch_load.load_torch` therefore loads a quantised
model tensor by tensor (:mod:`attnscope.core.loading.stream_load`): no float copy of the whole
checkpoint, peak ≈ the quantised model (docs/real-size.md has the measured figures).
:func:`quantize_model` remains the path for folders that cannot be streamed and for callers that
hold a float model already. Prefill times on this shared 2-core machine (load average 11-20)
varied 3x between identical runs and are not reported as speeds.

Memory per quantised weight: int8 1 byte (+ one scale per output row); int4 0.5 byte + a bf16
scale and zero per group of :data:`INT4_GROUP` weights (4/128 byte). An 8B Llama (7.0 B linear
weights, 1.05 B embedding + lm_head weights at bf16 = 2.1 GB) therefore holds ≈ 9.1 GB at int8 and
≈ 5.8 GB at int4.
"""

from __future__ import annotations

import logging
from importlib import metadata

from attnscope.core.errors import ModelLoadError

MODES = ("none", "int8", "int4")
INT4_GROUP = 128  # weights per int4 scale/zero group (torchao's default and the tinygemm kernels')
LIBRARY = "torchao"
_EXCLUDED = ("lm_head",)  # module names (last component) never quantised


def check_mode(mode: str | None) -> str:
    """Validate a ``--quantize`` value and return it (None means ``"none"``).

    Raises:
        ModelLoadError: not one of :data:`MODES`, or int8/int4 asked for without torchao installed.
    """
    m = "none" if mode in (None, "") else str(mode).strip().lower()
    if m not in MODES:
        raise ModelLoadError(f"unknown quantisation {mode!r}: choose one of {', '.join(MODES)}")
    if m != "none" and library_version() is None:
        raise ModelLoadError(
            f"--quantize {m} needs torchao: pip install 'attnscope[quant]' (or pip install torchao)"
        )
    return m


def library_version() -> str | None:
    """Installed torchao version, or None when it is not installed."""
    try:
        return metadata.version("torchao")
    except metadata.PackageNotFoundError:
        return None


def load_dtype(mode: str, dtype: str) -> tuple[str, str | None]:
    """The activation dtype a model quantised with ``mode`` must load at, and why if it differs.

    int4 kernels (CPU ``_weight_int4pack_mm_for_cpu``, CUDA tinygemm) take bfloat16 activations;
    at float32 the CPU path is ~50× slower (module docstring). int8 runs at any dtype.

    Returns:
        ``(dtype, reason)``; ``reason`` is None when ``dtype`` is kept.
    """
    if mode == "int4" and dtype != "bfloat16":
        return "bfloat16", f"int4 runs with bfloat16 activations (its kernels take bfloat16, not {dtype})"
    return dtype, None


def _import_torchao():
    # torchao logs a warning per CUDA-only extension it cannot load on a CPU build, and torch's
    # pytree a deprecation line per enum: neither is the user's business.
    quiet = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.ERROR)
    try:
        import torchao  # noqa: F401
        from torchao.quantization import quantize_
    finally:
        for lg, lv in zip(quiet, levels, strict=True):
            lg.setLevel(lv)
    return quantize_


def _config(mode: str, device_type: str):
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig

    if mode == "int8":
        return Int8WeightOnlyConfig(set_inductor_config=False)
    if device_type == "cpu":
        from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig

        return PrototypeInt4WeightOnlyConfig(group_size=INT4_GROUP, set_inductor_config=False)
    return Int4WeightOnlyConfig(
        group_size=INT4_GROUP, int4_packing_format="tile_packed_to_4d", set_inductor_config=False
    )


def linear_targets(model) -> list[str]:
    """Names of the ``nn.Linear`` modules :func:`quantize_model` quantises (decoder layers only;
    ``lm_head`` excluded; for int4 only those whose input size is a multiple of :data:`INT4_GROUP`
    are actually converted, see :func:`quantize_model`)."""
    import torch

    return [
        n
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] not in _EXCLUDED
    ]


def is_quantised(t) -> bool:
    """True for a torchao quantised weight (a tensor subclass holding integer data)."""
    return hasattr(t, "qdata")


def tensor_bytes(t) -> int:
    """Bytes a (possibly quantised) tensor holds: the sum of its inner tensors for torchao
    subclasses (``qdata``, scales, zeros), ``numel × element_size`` otherwise."""
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is not None and is_quantised(t):
        names, _ = flatten()
        return sum(tensor_bytes(getattr(t, n)) for n in names if getattr(t, n, None) is not None)
    return t.numel() * t.element_size()


def weight_bytes(model) -> int:
    """Bytes of every parameter and buffer of ``model`` (shared tensors counted once), quantised
    weights at their packed size."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        data = t.data if not is_quantised(t) else t
        key = id(data) if is_quantised(t) else (data.untyped_storage().data_ptr(), data.shape)
        if key in seen:
            continue
        seen.add(key)
        total += tensor_bytes(data)
    return total


def _own_float_tensors(model) -> None:
    """Copy the parameters left unquantised (embeddings, norms, lm_head) out of the checkpoint's
    memory map into memory of their own, tied ones once (``p.data`` keeps each Parameter object, so
    ties hold). Else those few views keep the whole mapped bf16 file resident: measured on the
    1B-shaped model at int8, 2.6 GB of file pages stayed mapped next to 1.6 GB of our own."""
    import torch

    copies: dict[tuple[int, int], torch.Tensor] = {}
    with torch.no_grad():
        for p in model.parameters():
            if is_quantised(p) or p.device.type != "cpu":
                continue
            key = (p.data.untyped_storage().data_ptr(), p.data.storage_offset())
            if key not in copies:
                copies[key] = p.data.clone()
            p.data = copies[key]


def device_map_problem(mode: str, placements) -> str | None:
    """Why ``--quantize mode`` cannot run on a model placed on ``placements`` (a device map's values:
    GPU indices, "cpu", "disk"), or None: quantising needs the whole model on one device."""
    if mode in (None, "", "none") or len(set(map(str, placements))) <= 1:
        return None
    return (
        f"--quantize {mode} with a multi-device --device-map is not supported: "
        "use one of them (int4 of an 8B model fits one 24 GB GPU)"
    )


def quantize_model(model, mode: str) -> str:
    """Quantise ``model``'s linear layers in place (weight-only); return a one-line description.

    Args:
        model: a transformers causal LM already on its device, at the dtype :func:`load_dtype`
            gave (int4: bfloat16).
        mode: ``"none"``, ``"int8"`` (symmetric, one scale per output row) or ``"int4"``
            (asymmetric, a scale and zero per :data:`INT4_GROUP` input weights).

    Returns:
        ``""`` for ``"none"``, else e.g. ``"int8 weight-only (torchao 0.18.0), 112 linear layers"``:
        the ``"runtime"`` quantisation recorded in sidecars and sessions.

    Raises:
        ModelLoadError: unknown mode, torchao missing, the model's device cannot run the mode
            (int4 needs a CPU or a CUDA GPU), or torchao fails (first line of its error).
    """
    mode = check_mode(mode)
    if mode == "none":
        return ""
    import torch

    problem = device_map_problem(mode, (getattr(model, "hf_device_map", None) or {}).values())
    if problem:
        raise ModelLoadError(problem)
    quantize_ = _import_torchao()
    params = [p for p in model.parameters() if not is_quantised(p)]
    device = params[0].device if params else torch.device("cpu")
    check_device(mode, device, model.dtype)
    targets = set(linear_targets(model))
    if mode == "int4":  # torchao skips (with a log line) weights whose rows do not split into groups
        mods = dict(model.named_modules())
        targets = {n for n in targets if mods[n].in_features % INT4_GROUP == 0}
    try:
        quantize_(model, _config(mode, device.type), filter_fn=lambda _m, name: name in targets)
    except Exception as e:  # torchao raises assorted errors for kernels a device lacks
        text = (str(e).strip() or type(e).__name__).splitlines()[0][:200]
        raise ModelLoadError(f"--quantize {mode} failed on {device.type}: {text}") from None
    _own_float_tensors(model)
    return runtime_line(model, mode, targets)


def check_device(mode: str, device, dtype) -> None:
    """Raise ModelLoadError where ``device`` (a torch.device) or the model's ``dtype`` (a torch
    dtype) cannot run ``mode``: int4 needs a CPU or CUDA device and bfloat16 activations."""
    import torch

    if mode == "int4" and device.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"--quantize int4 runs on cpu or cuda, not {device.type}: use --quantize int8")
    if mode == "int4" and dtype != torch.bfloat16:
        raise ModelLoadError(
            f"--quantize int4 needs a bfloat16 model (this one is {dtype}): load it with --dtype bfloat16"
        )


def quantize_one(quantize_, parent, child: str, config, mode: str) -> None:
    """Quantise the linear layer ``parent.<child>`` in place with torchao's ``quantize_`` and the
    config :func:`_config` gave (the streamed loader's step, :mod:`attnscope.core.loading.stream_load`).

    Raises:
        ModelLoadError: torchao fails (first line of its error).
    """
    try:
        quantize_(parent, config, filter_fn=lambda _m, name: name == child)
    except Exception as e:  # torchao raises assorted errors for kernels a device lacks
        text = (str(e).strip() or type(e).__name__).splitlines()[0][:200]
        raise ModelLoadError(f"--quantize {mode} failed: {text}") from None


def runtime_line(model, mode: str, targets: set[str]) -> str:
    """The one-line description :func:`quantize_model` returns, counting the quantised ``targets``.

    Raises:
        ModelLoadError: none of them was quantised.
    """
    n = sum(1 for n, m in model.named_modules() if n in targets and is_quantised(m.weight))
    if n == 0:
        raise ModelLoadError(f"--quantize {mode}: no linear layer of this model could be quantised")
    detail = "per-row scales" if mode == "int8" else f"groups of {INT4_GROUP}"
    return f"{mode} weight-only ({LIBRARY} {library_version()}, {detail}), {n} linear layers"


def file_quantization(source) -> str:
    """How a checkpoint stores its weights, in one short label ("" for a float checkpoint).

    A GGUF: its file type (``"Q4_K_M"``, ``"Q8_0"``; :meth:`attnscope.core.loading.gguf_meta.GGUFHeader.quant_name`);
    a folder whose config.json has ``quantization_config``: the method (``"awq 4-bit"``); an mlx-lm
    folder (``quantization``: ``bits``, ``group_size``): ``"MLX 4-bit (group 64)"``. Never raises:
    an unreadable source gives "".
    """
    import json
    from pathlib import Path

    try:
        p = Path(source)
        if p.is_file():
            from attnscope.core.loading.gguf_meta import read_gguf_header

            return str(read_gguf_header(p).quant_name())
        cfg = json.loads((p / "config.json").read_text())
    except Exception:  # any unreadable or foreign file: no label, the loader reports the real error
        return ""
    q = cfg.get("quantization_config")
    if isinstance(q, dict):
        return file_quantization_label(q)
    q = cfg.get("quantization")
    if isinstance(q, dict):
        return f"MLX {q.get('bits', '?')}-bit (group {q.get('group_size', '?')})"
    return ""


def record(info) -> dict:
    """The ``"quantization"`` entry of a sidecar or session file for a loaded model's
    :class:`attnscope.core.loading.model_info.ModelInfo`: ``{"file": "Q4_K_M", "runtime": "int8 weight-only (torchao …)",
    "mode": "int8"}`` (``""`` where the file is float / the weights run unquantised; ``mode`` is the
    ``--quantize`` value a reopened session loads with)."""
    runtime = getattr(info, "quantization_runtime", "") or ""
    return {
        "file": getattr(info, "quantization_file", "") or "",
        "runtime": runtime,
        "mode": runtime_mode(runtime),
    }


def runtime_mode(runtime: str) -> str:
    """The ``--quantize`` value that reproduces a recorded runtime line: ``"int8"``/``"int4"`` for
    :func:`quantize_model`'s (and the MLX backend's) lines, ``"none"`` otherwise (float, or a
    checkpoint quantised in its file, which reloads as it is)."""
    head = (runtime or "").split(" ", 1)[0]
    return head if head in ("int8", "int4") else "none"


# Pre-quantised Hugging Face checkpoints (config.json "quantization_config"): transformers loads
# each through its own library. method -> (python modules it needs, pip names, needs a CUDA GPU).
# From transformers 5's quantizers (quantizer_awq/gptq/bnb_*/compressed_tensors/torchao.py):
# AWQ and GPTQ kernels come from gptqmodel (GPTQ also needs optimum), bitsandbytes' kernels are
# CUDA, compressed-tensors decompresses on any device, torchao checkpoints run where torchao does.
PREQUANTISED = {
    "awq": (("gptqmodel",), "gptqmodel", True),
    "gptq": (("optimum", "gptqmodel"), "optimum gptqmodel", True),
    "bitsandbytes": (("bitsandbytes",), "bitsandbytes", True),
    "compressed-tensors": (("compressed_tensors",), "compressed-tensors", False),
    "torchao": (("torchao",), "torchao", False),
}
_METHOD_ALIASES = {
    "bitsandbytes_4bit": "bitsandbytes",
    "bitsandbytes_8bit": "bitsandbytes",
    "compressed_tensors": "compressed-tensors",
}


def cuda_available() -> bool:
    """True when torch (a dependency) sees a CUDA GPU."""
    import torch

    return bool(torch.cuda.is_available())


def prequantised_problem(model_type: str, qcfg: dict, cuda: bool | None = None) -> str | None:
    """Why this machine cannot load a checkpoint whose config has ``quantization_config`` = ``qcfg``,
    as one line naming the method and what would run it; None when it can (transformers then
    loads it through that library: :data:`PREQUANTISED`).

    Args:
        cuda: whether a CUDA GPU is there (default: ask torch).
    """
    import importlib.util

    method = str(qcfg.get("quant_method", "unknown")).lower()
    method = _METHOD_ALIASES.get(method, method)
    bits = file_quantization_label(qcfg)
    if method not in PREQUANTISED:
        known = ", ".join(PREQUANTISED)
        return (
            f"{model_type} checkpoint quantised with {method}: AttnScope loads float checkpoints, GGUF, "
            f"and quantised ones of: {known} (or use a float checkpoint with --quantize int8|int4)"
        )
    modules, pip_names, needs_cuda = PREQUANTISED[method]
    cuda = cuda_available() if cuda is None else cuda
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if needs_cuda and not cuda:
        return (
            f"{model_type} checkpoint quantised with {bits}: its kernels ({pip_names}) run on a CUDA GPU, "
            "which this machine does not have (on CPU use a float or GGUF checkpoint, with --quantize int8|int4)"
        )
    if missing:
        return f"{model_type} checkpoint quantised with {bits}: loading it needs {pip_names} (pip install {pip_names})"
    return None


def file_quantization_label(qcfg: dict) -> str:
    """``"awq 4-bit"`` from a ``quantization_config`` dict (method, then bits where it says)."""
    bits = (
        qcfg.get("bits")
        or qcfg.get("w_bit")
        or ("4" if qcfg.get("load_in_4bit") else "8" if qcfg.get("load_in_8bit") else None)
    )
    return f"{qcfg.get('quant_method', 'unknown')}{f' {bits}-bit' if bits else ''}"
