"""Will this model fit? Memory a model needs at a chosen context, against the memory free now.

    total = weights + KV cache + capture buffers + runtime

* weights: ``n_params × bytes(dtype)`` at the load dtype, for a folder and a GGUF alike (a GGUF
  is converted tensor by tensor straight to the load dtype, :mod:`attnscope.core.loading.gguf_convert`). ``dtype``
  ``"auto"`` is resolved per model by :func:`attnscope.core.loading.precision.entry_dtype` (the checkpoint's own
  precision, float32 where the device has no fast bf16/fp16 matmul and float32 fits).
  With ``--quantize`` (:mod:`attnscope.core.loading.quantize`) the decoder's linear weights take
  :data:`QUANT_BYTES` bytes each (int8: 1; int4: ½ + a bfloat16 scale and zero per 128) and the
  rest (embeddings, ``lm_head``, norms: :func:`embedding_params`) stays at the load dtype.
* runtime: what the process holds besides (Python, torch/transformers or MLX, the tokenizer,
  one prefill chunk's activations, the allocator's slack): :data:`RUNTIME_BYTES`, measured.
* KV cache: ``2 × n_layers × n_kv_heads × head_dim × T × bytes(dtype)`` (:func:`attnscope.core.kv_formula.kv_cache_bytes`);
  for multi-head latent attention the latent cache (:func:`attnscope.core.kv_formula.mla_cache_bytes`),
  and the capture keeps the per-head keys rebuilt from it (``n_layers × n_heads × head_dim × T``).
* mixture-of-experts: every expert's weights count (``n_params`` sums the checkpoint's tensors), not
  only the ones a token runs through; a multimodal checkpoint counts its language model only
  (:mod:`attnscope.core.loading.text_only`: the vision tower is not loaded).
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
from functools import lru_cache
from pathlib import Path

from attnscope.core import backend_registry as registry
from attnscope.core.kv_formula import dtype_bytes, kv_cache_bytes
from attnscope.core.loading.free_memory import free_memory

TIGHT_FRACTION = 0.8
# LOAD_COPY: a bfloat16/float16 checkpoint loaded at a wider dtype (float32) holds the file's pages
# (memory-mapped, counted in RSS) beside the converted copy until the load ends: measured with
# tests/make_synthetic.py's Llama-3.2-1B --layers 2 (384 M parameters, 0.77 GB bf16) at float32, peak
# RSS 2.66 GB during the load against 1.91 GB after it: 0.75 GB more, the file's size. Real-size runs
# showed the same ~40 % over the old estimate (Qwen3-30B-A3B 11.31 GB vs 8.10, Gemma-3-12B 10.25 vs
# 7.37, DeepSeek-V2-Lite 13.53 vs 9.68); at the checkpoint's own dtype nothing is copied.
# Bytes per decoder linear weight at each --quantize mode (scales: int8 one per output row, ≈ 0;
# int4 a bfloat16 scale and zero per group of 128 weights: 4 / 128 byte).
QUANT_BYTES = {"int8": 1.0, "int4": 0.5 + 4 / 128}
# Peak RSS besides weights, KV cache and capture, per backend. torch: measured on this project's
# CPU machine (`attnscope bench`, peak RSS of the capture prefill minus the three terms above):
# Llama-3.2-1B-shaped bf16 at 2048 tokens 0.63 GB. Quantised models need nothing more since the
# streamed load computes lm_head in row blocks (stream_load.block_output_projection; before, torch's
# one-row bf16 matmul copied lm_head whole): 1B int8 at 512 tokens 2.22 GB peak (estimate 2.16 GB),
# 8B int8 10.49 GB (estimate 9.89 GB), both measured 1 Dec 2026 after that change.
# MLX (CPU build): 0.4 GB, not measured at real size.
RUNTIME_BYTES = {name: registry.get(name).runtime_bytes for name in registry.names()}
FITS, TIGHT, NO_FIT, UNKNOWN = "fits", "tight", "does not fit", "unknown"
LSE_BYTES = 8  # LSE rows are float64 whatever the model dtype (the traces' lse(): core/trace/torch_trace.py)


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
    runtime_bytes: int = 0  # the process besides weights, cache and capture (RUNTIME_BYTES)
    quantize: str = "none"  # the --quantize mode the weights were counted at
    # held only while loading: a half-precision checkpoint's pages beside their wider copy (LOAD_COPY)
    load_copy_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """The peak: weights and runtime, plus the larger of what comes after the load (KV cache
        and capture) and what the load holds beside the weights (:attr:`load_copy_bytes`)."""
        after = self.kv_cache_bytes + self.capture_bytes
        return self.weights_bytes + self.runtime_bytes + max(after, self.load_copy_bytes)

    def summary(self) -> str:
        """One line: ``fits: 1.2 GB of 20.1 GB free RAM (weights 0.5 GB, KV 0.3 GB, capture 0.4 GB)``."""
        free = (
            f"{human_bytes(self.free_bytes)} free {self.memory}"
            if self.free_bytes is not None
            else f"free {self.memory} unknown"
        )
        return (
            f"{self.verdict}: {human_bytes(self.total_bytes)} of {free} (weights {human_bytes(self.weights_bytes)}, "
            f"KV cache {human_bytes(self.kv_cache_bytes)}, capture {human_bytes(self.capture_bytes)} at {self.context} tokens"
            f"{f', runtime {human_bytes(self.runtime_bytes)}' if self.runtime_bytes else ''}"
            f"{f'; {human_bytes(self.load_copy_bytes)} more while loading' if self.load_copy_bytes else ''})"
        )


def human_bytes(n: int | None) -> str:
    """``1.23 GB`` style (decimal units, as file managers show sizes; None → ``?``): 3 significant
    digits through :func:`attnscope.core.units.format_bytes`, so 999,999 B is ``1.00 MB``, never ``1000.0 kB``."""
    from attnscope.core.units import format_bytes

    return format_bytes(n)


def capture_bytes(n_layers: int, n_heads: int, head_dim: int, seq_len: int, dtype: str = "float32") -> int:
    """Bytes the Trace holds at ``seq_len`` tokens: per layer q rows (``n_heads × T × head_dim``,
    model dtype) + LSE rows (``n_heads × T``, float64)."""
    return n_layers * n_heads * seq_len * (head_dim * dtype_bytes(dtype) + LSE_BYTES)


def weights_bytes(
    n_params: int,
    fmt: str = "hf",
    dtype: str = "float32",
    quantize: str = "none",
    linear_params: int | None = None,
) -> int:
    """Bytes of the loaded weights at ``dtype`` (a GGUF too: it is converted to the load dtype).

    With ``quantize`` ``"int8"``/``"int4"``, ``linear_params`` of them (the decoder's linear
    weights; default: all) take :data:`QUANT_BYTES` bytes each, the rest ``dtype``'s.
    """
    if quantize in (None, "", "none"):
        return int(n_params) * dtype_bytes(dtype)
    lin = int(n_params) if linear_params is None else max(0, min(int(linear_params), int(n_params)))
    return int(lin * QUANT_BYTES[quantize]) + (int(n_params) - lin) * dtype_bytes(dtype)


_PACKED_BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}  # GGUF types MLX keeps packed (core/backends/mlx_gguf.py)


def mlx_packed_bytes(path, dtype: str) -> int | None:
    """Weight bytes of a GGUF the MLX backend keeps packed: Q4_0/Q4_1 ½ byte and Q8_0 1 byte per
    weight, plus a scale and a bias at ``dtype`` per 32; float tensors at ``dtype``. None when the
    file has another quantised type (then it is converted: :func:`weights_bytes`) or is unreadable."""
    try:
        return _mlx_packed_bytes(str(path), dtype, Path(path).stat().st_mtime_ns)
    except OSError:
        return None


@lru_cache(maxsize=512)
def _mlx_packed_bytes(path: str, dtype: str, _mtime: int) -> int | None:
    try:
        from attnscope.core.loading.gguf_meta import read_gguf_header

        tensors = read_gguf_header(path).tensors
    except Exception:  # noqa: BLE001 - unreadable: not packed, the conversion estimate applies
        return None
    b = dtype_bytes(dtype)
    total, packed = 0.0, False
    for t in tensors:
        bits = _PACKED_BITS.get(t.type_name)
        if bits is not None:
            total += t.n_elements * (bits / 8 + 2 * b / 32)
            packed = True
        elif t.type_name in ("F32", "F16", "BF16"):
            total += t.n_elements * b
        else:
            return None
    return int(total) if packed else None


def mlx_folder_packed_bytes(path, dtype: str) -> int | None:
    """Weight bytes of an mlx-lm quantised folder as the MLX backend holds it: the packed ``uint32``
    words as stored, every float tensor (scales, biases, norms) at ``dtype`` (it casts them on load),
    over the files the loader reads (:func:`attnscope.core.loading.weight_files.weight_files`). None when
    unreadable."""
    from attnscope.core.loading.safetensors_header import check_safetensors
    from attnscope.core.loading.weight_files import weight_files

    try:
        total = 0
        for f in weight_files(Path(path)):
            for k, v in check_safetensors(f).items():
                if k == "__metadata__" or not isinstance(v, dict):
                    continue
                begin, end = v["data_offsets"]
                n = 1
                for d in v["shape"]:
                    n *= int(d)
                total += (
                    int(end - begin) if v["dtype"] in ("U32", "I32", "U8", "I8") else n * dtype_bytes(dtype)
                )
        return total
    except Exception:  # noqa: BLE001 - unreadable: the plain estimate applies
        return None


def embedding_params(path, fmt: str = "hf") -> int | None:
    """Parameters outside the decoder's linear layers that matter for size: the input embedding,
    plus ``lm_head`` when it is not tied to it (``vocab × hidden`` each). Read from config.json
    (``vocab_size``, ``hidden_size``, ``tie_word_embeddings``) or the GGUF's ``token_embd`` /
    ``output`` tensors; None when unreadable. Cached per (path, mtime)."""
    try:
        p = Path(path)
        cfg_path = p / "config.json" if fmt != "gguf" else p
        return _embedding_params(str(p), fmt, cfg_path.stat().st_mtime_ns)
    except OSError:
        return None


@lru_cache(maxsize=512)
def _embedding_params(path: str, fmt: str, _mtime: int) -> int | None:
    import json

    try:
        if fmt == "gguf":
            from attnscope.core.loading.gguf_meta import read_gguf_header

            sizes = {t.name: t.n_elements for t in read_gguf_header(path).tensors}
            if "token_embd.weight" not in sizes:
                return None
            return int(sizes["token_embd.weight"]) + int(sizes.get("output.weight", 0))
        cfg = json.loads((Path(path) / "config.json").read_text())
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
        vocab, hidden = int(text["vocab_size"]), int(text["hidden_size"])
        tied = text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True))
        return vocab * hidden * (1 if tied else 2)
    except Exception:  # noqa: BLE001 - any unreadable metadata: unknown, the estimate counts all as linear
        return None


def expert_params(path, fmt: str = "hf") -> int:
    """Parameters of a mixture-of-experts checkpoint's routed experts (tensors under ``.experts.``,
    per expert or fused; GGUF ``*_exps`` tensors), which ``--quantize`` leaves at the load dtype:
    transformers runs them as fused 3-D parameters, not the ``nn.Linear`` layers
    :func:`attnscope.core.loading.quantize.linear_targets` quantises. 0 for a dense model or when
    unreadable. Cached per (path, mtime)."""
    try:
        p = Path(path)
        return _expert_params(str(p), fmt, (p if fmt == "gguf" else p / "config.json").stat().st_mtime_ns)
    except OSError:
        return 0


@lru_cache(maxsize=512)
def _expert_params(path: str, fmt: str, _mtime: int) -> int:
    import math

    try:
        if fmt == "gguf":
            from attnscope.core.loading.gguf_meta import read_gguf_header

            return sum(int(t.n_elements) for t in read_gguf_header(path).tensors if "_exps" in t.name)
        from attnscope.core.loading.safetensors_header import check_safetensors

        total = 0
        for shard in sorted(Path(path).glob("*.safetensors")):
            for k, v in check_safetensors(shard).items():
                if ".experts." in k and isinstance(v, dict):
                    total += math.prod(int(d) for d in v.get("shape", []))
        return total
    except Exception:  # noqa: BLE001 - unreadable: counted as linear (the estimate's old behaviour)
        return 0


def estimate(
    *,
    n_params: int,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    context: int,
    fmt: str = "hf",
    backend: str = registry.DEFAULT,
    device: str = "cpu",
    dtype: str = "float32",
    free_bytes: int | None = None,
    memory: str | None = None,
    quantize: str = "none",
    linear_params: int | None = None,
    runtime: bool = True,
) -> FitEstimate:
    """Fit estimate from a model's geometry. ``free_bytes`` overrides the measurement (tests, or a
    caller that must count the model still loaded). ``quantize``/``linear_params``: see
    :func:`weights_bytes`; ``runtime=False`` leaves :data:`RUNTIME_BYTES` out.

    Raises:
        ValueError: a negative size, or an unknown dtype or quantisation.
    """
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    quantize = quantize or "none"
    if quantize != "none" and quantize not in QUANT_BYTES:
        raise ValueError(f"unknown quantisation {quantize!r}")
    w = weights_bytes(n_params, fmt, dtype, quantize, linear_params)
    rt = registry.get(backend).runtime_bytes if runtime else 0
    kv = kv_cache_bytes(n_layers, n_kv_heads, head_dim, context, dtype)
    cap = capture_bytes(n_layers, n_heads, head_dim, context, dtype)
    if free_bytes is None:
        free_bytes, measured = free_memory(backend, device)
        memory = memory or measured
    memory = memory or registry.get(backend).memory
    verdict = _verdict(w + kv + cap + rt, free_bytes)
    return FitEstimate(
        w, kv, cap, free_bytes, memory, int(context), dtype, verdict, runtime_bytes=rt, quantize=quantize
    )


def _verdict(total: int, free_bytes: int | None) -> str:
    if free_bytes is None:
        return UNKNOWN
    if total <= TIGHT_FRACTION * free_bytes:
        return FITS
    return TIGHT if total <= free_bytes else NO_FIT


def estimate_entry(
    entry,
    context: int,
    backend: str = registry.DEFAULT,
    device: str = "cpu",
    dtype: str = "auto",
    free_bytes: int | None = None,
    memory: str | None = None,
    quantize: str = "none",
) -> FitEstimate:
    """:func:`estimate` for a :class:`attnscope.core.loading.catalog_entry.CatalogEntry` (``context`` capped at its max context)
    at ``dtype``; ``"auto"`` is the dtype this entry would load at (:func:`attnscope.core.loading.precision.entry_dtype`),
    recorded with its reason in the estimate. ``quantize`` (``none|int8|int4``) counts the decoder's
    linear weights at that size (int4 loads at bfloat16: :func:`attnscope.core.loading.quantize.load_dtype`)."""
    from dataclasses import replace

    from attnscope.core.loading.precision import entry_dtype

    ctx = min(context, entry.max_context) if entry.max_context else context
    spec = registry.get(backend)
    dev = f"{spec.device_prefix}-{device}" if spec.device_prefix else device
    dtype, reason = entry_dtype(entry, dtype, dev, free_bytes)
    quantize = quantize or "none"
    linear = None
    if quantize != "none":
        from attnscope.core.loading.quantize import load_dtype

        dtype, forced = load_dtype(quantize, dtype)
        reason = f"{dtype}: {forced}" if forced else reason
        emb = embedding_params(entry.path, entry.format)
        # a MoE model's experts stay at the load dtype (expert_params): every expert counts at full size
        linear = (
            None if emb is None else max(0, entry.n_params - emb - expert_params(entry.path, entry.format))
        )
    packed = (
        mlx_packed_bytes(entry.path, dtype)
        if spec.packs_gguf and entry.format == "gguf" and quantize == "none"
        else None
    )
    if spec.checkpoint_quant == "mlx-lm" and entry.format == "hf" and entry.quantised:  # stays packed
        packed = mlx_folder_packed_bytes(entry.path, dtype)
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
        quantize=quantize,
        linear_params=linear,
    )
    latent = int(getattr(entry, "kv_latent_dim", 0) or 0)
    if latent:  # MLA: the cache holds the latent; the Trace keeps the per-head keys rebuilt from it
        from attnscope.core.kv_formula import mla_cache_bytes

        kv = mla_cache_bytes(entry.n_layers, latent, int(entry.rope_head_dim or 0), ctx, dtype)
        rebuilt = entry.n_layers * entry.n_heads * entry.head_dim * ctx * dtype_bytes(dtype)
        est = replace(est, kv_cache_bytes=kv, capture_bytes=est.capture_bytes + rebuilt)
        est = replace(est, verdict=_verdict(est.total_bytes, est.free_bytes))
    file_dtype = getattr(entry, "checkpoint_dtype", "") or ""
    if (
        entry.format == "hf"
        and quantize == "none"
        and packed is None
        and not entry.quantised
        and file_dtype in ("bfloat16", "float16")
        and dtype_bytes(dtype) > dtype_bytes(file_dtype)
    ):  # the file's pages stay mapped beside the wider copy until the load ends (LOAD_COPY)
        est = replace(est, load_copy_bytes=int(entry.n_params) * dtype_bytes(file_dtype))
        est = replace(est, verdict=_verdict(est.total_bytes, est.free_bytes))
    if packed is not None:  # kept quantised: at its packed size (mlx_packed_bytes)
        est = replace(
            est,
            weights_bytes=packed,
            verdict=_verdict(est.total_bytes - est.weights_bytes + packed, est.free_bytes),
        )
    return replace(est, dtype_reason=reason)
