"""The MLX backend: the torch backend's API on MLX (Apple silicon GPU; CPU elsewhere).

The model is one of the small self-contained MLX models in :mod:`attnscope.core.backends.mlx_arch`
(Llama family incl. SmolLM2 and Mistral, Qwen2, Qwen3), loaded from the same Hugging Face folder
the torch backend uses (:func:`attnscope.core.loading.resolve.resolve`: the default GGUF is converted once into
safetensors in Hugging Face row order). Attention is fused (``mx.fast.scaled_dot_product_attention``)
and every layer records its post-RoPE query rows and their LSE in an :class:`attnscope.core.trace.mlx_trace.MlxTrace`.

Threads: MLX streams belong to the thread that created them, so create the backend and call
``forward``/``truncate``/``reset`` and the trace from ONE thread (the GUI's engine thread);
``forward`` raises RuntimeError when called from another thread.

On Linux the ``mlx[cpu]`` wheel links the reference (netlib) BLAS and has no fused attention
kernel: there this backend is a correctness path, several times slower than torch on the same CPU
(SmolLM2-135M, 2 cores: a 19-token prefill ≈ 1.0 s vs 0.12 s, a decode step ≈ 80 ms vs 40 ms);
speed matters on Apple silicon.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from attnscope.core import backend_registry as registry
from attnscope.core.backend_registry import MLX_LM_FAMILIES, mlx_lm_installed
from attnscope.core.backends.base import PREFILL_CHUNK as BASE_CHUNK
from attnscope.core.backends.base import chunked_forward
from attnscope.core.backends.mlx_arch import CausalLM, KVCache, ModelArgs
from attnscope.core.backends.mlx_gguf import describe as describe_packed
from attnscope.core.backends.mlx_gguf import gguf_path_of, load_packed, logical_params
from attnscope.core.errors import ModelLoadError, UnsupportedModelError
from attnscope.core.errors import first_line as _first_line
from attnscope.core.ids import as_token_ids
from attnscope.core.loading.attention_kind import heads_line
from attnscope.core.loading.model_info import ModelInfo
from attnscope.core.loading.progress import ProgressFn
from attnscope.core.loading.quantize import file_quantization
from attnscope.core.loading.quiet import quiet_transformers
from attnscope.core.loading.resolve import DEFAULT_MODEL_NAME, is_default_ref, model_source, resolve
from attnscope.core.trace import finite
from attnscope.core.trace.mlx_trace import MlxTrace

PREFILL_CHUNK = BASE_CHUNK  # tokens per prefill chunk (this module's name: tests set it per backend)
DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def mlx_device() -> str:
    """``"mlx:gpu"`` when MLX runs on a GPU (Metal), else ``"mlx:cpu"``."""
    return "mlx:gpu" if mx.default_device().type == mx.DeviceType.gpu else "mlx:cpu"


def load_weights(folder, args: ModelArgs, dtype) -> dict[str, mx.array]:
    """Read the ``*.safetensors`` files the loader reads (:func:`attnscope.core.loading.weight_files.weight_files`:
    not a second copy such as ``consolidated.safetensors``) as MLX arrays cast to ``dtype``.

    Drops buffers that are not parameters (``rotary_emb.inv_freq``) and a saved ``lm_head.weight``
    when embeddings are tied.

    Raises:
        ModelLoadError: no safetensors (``pytorch_model.bin`` only) or an unreadable file.
    """
    from attnscope.core.loading.weight_files import weight_files

    files = [f for f in weight_files(folder) if f.suffix == ".safetensors"]
    if not files:
        raise ModelLoadError(
            f"{folder} has no *.safetensors weights: the MLX backend cannot read pytorch_model.bin"
        )
    weights: dict[str, mx.array] = {}
    for f in files:
        try:
            weights.update(cast(dict[str, mx.array], mx.load(str(f))))  # a .safetensors: {name: array}
        except Exception as e:
            raise ModelLoadError(f"cannot read {f.name}: {_first_line(e)}") from None
    weights = {k: v for k, v in weights.items() if not k.endswith("rotary_emb.inv_freq")}
    if args.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
        for part in ("scales", "biases"):  # an mlx-lm quantised, tied lm_head
            weights.pop(f"lm_head.{part}", None)
    # packed quantised weights (uint32) stay as they are; scales, biases and float weights take dtype
    return {
        k: v.astype(dtype) if v.dtype != dtype and mx.issubdtype(v.dtype, mx.floating) else v
        for k, v in weights.items()
    }


def build_model(args: ModelArgs, weights: dict[str, mx.array], quantization: dict | None = None) -> CausalLM:
    """Construct the MLX model and load ``weights`` strictly (every name and shape must match).

    ``quantization``: an mlx-lm config's ``{"group_size", "bits"[, "mode"]}``: every layer whose
    ``<name>.scales`` is among ``weights`` becomes ``nn.QuantizedLinear`` / ``QuantizedEmbedding``
    first (mlx-lm's ``load_model`` does the same), so the packed weights load as they are.

    Raises:
        ModelLoadError: missing, unexpected or mis-shaped tensors (the first few are named).
    """
    from mlx.utils import tree_flatten

    model = CausalLM(args)
    if quantization:
        try:
            nn.quantize(
                model,
                group_size=int(quantization["group_size"]),
                bits=int(quantization["bits"]),
                mode=quantization.get("mode", "affine"),
                # mlx-lm's per-layer overrides: ``quantization[<layer path>] = {"group_size", "bits"}``
                class_predicate=lambda p, m: (
                    hasattr(m, "to_quantized")
                    and f"{p}.scales" in weights
                    and (quantization[p] if isinstance(quantization.get(p), dict) else True)
                ),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ModelLoadError(
                f"cannot read the MLX quantization {quantization!r}: {_first_line(e)}"
            ) from None
    expected = dict(tree_flatten(model.parameters()))
    missing = sorted(expected.keys() - weights.keys())
    extra = sorted(weights.keys() - expected.keys())
    if missing or extra:
        parts = []
        if missing:
            parts.append(
                f"missing {len(missing)} tensor(s) ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"
            )
        if extra:
            parts.append(
                f"unexpected {len(extra)} tensor(s) ({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''})"
            )
        raise ModelLoadError(
            f"the weights do not match a {args.model_type} model of this config: {'; '.join(parts)}"
        )
    for k, v in expected.items():
        if weights[k].shape != v.shape:
            raise ModelLoadError(
                f"tensor {k} has shape {tuple(weights[k].shape)}, the config implies {tuple(v.shape)}"
            )
    model.load_weights(list(weights.items()), strict=True)
    model.eval()
    mx.eval(model.parameters())
    return model


MLX_GROUP = 64  # weights per scale/bias group for --quantize on MLX (mlx-lm's default)


def quantize_mlx(model: CausalLM | Any, bits: int, group_size: int = MLX_GROUP) -> str:
    """``mlx.nn.quantize`` the decoder layers' ``nn.Linear`` (not embeddings, not lm_head) in place,
    affine ``bits``-bit with one scale and bias per ``group_size`` weights; return the description
    recorded as the runtime quantisation. Layers whose input size ``group_size`` does not divide stay float."""

    def pick(path: str, m) -> bool:
        return (
            isinstance(m, nn.Linear)
            and path.startswith("model.layers.")
            and m.weight.shape[-1] % group_size == 0
        )

    n = 0

    def count(path, m):
        nonlocal n
        ok = pick(path, m)
        n += ok
        return ok

    # an mlx-lm model (attnscope.core.backends.mlx_lm_arch) is quantised in its own module tree
    target: Any = getattr(model, "lm", model)
    nn.quantize(target, group_size=group_size, bits=bits, class_predicate=count)
    mx.eval(model.parameters())
    return f"int{bits} weight-only (mlx.nn.quantize, groups of {group_size}), {n} linear layers"


def float_weight(layer) -> mx.array:
    """A linear layer's weight as a float ``(out, in)`` array: ``mx.dequantize`` of a ``QuantizedLinear``'s
    packed weight (scales and biases per group), the weight itself otherwise."""
    if hasattr(layer, "scales"):
        return mx.dequantize(
            layer.weight,
            layer.scales,
            layer.get("biases"),
            group_size=layer.group_size,
            bits=layer.bits,
            mode=getattr(layer, "mode", "affine"),
        )
    return layer.weight


def attention_line(cfg: dict, args) -> str:
    """The model's attention kind (:func:`attnscope.core.loading.attention_kind.describe` of its
    config, ``"GQA 4/2 · 4 experts, 2 active"``); the heads line when transformers cannot build
    the config."""
    from attnscope.core.loading.attention_kind import describe, geometry

    try:
        from transformers import AutoConfig

        return describe(geometry(AutoConfig.for_model(**cfg)))
    except Exception:  # noqa: BLE001 - a GGUF's converted config or an unusual one: the heads line
        return heads_line(args.n_heads, args.n_kv_heads)


class MlxBackend:
    """Owns an MLX model, its per-layer KV caches and the Trace. One thread: see the module docstring.

    Implements :class:`attnscope.core.backends.base.Backend`."""

    name = registry.name_for(__name__, "MlxBackend")
    supports_overrides = False  # the MLX attention has no experiment hook (fork(overrides=...) refuses)

    def __init__(self, model: CausalLM | Any, tokenizer, info: ModelInfo):
        self.model, self.tokenizer, self.info = model, tokenizer, info
        self.memo: dict = {}  # analyses' results that depend on the model alone (Backend.memo)
        # nothing recomputes by itself on MLX (no length-dependent RoPE); a non-finite forward is
        # said here (attnscope.core.trace.finite.NonFiniteNotice)
        self.notices: list = []
        self.args = model.args
        self.device = mlx_device()
        self.trace = MlxTrace(info.n_layers, info.n_heads, info.n_kv_heads, info.head_dim)
        self._thread = threading.get_ident()
        self.load_seconds = 0.0
        self.reset()

    @classmethod
    def load(
        cls,
        model: str | os.PathLike | None = None,
        dtype: str = "auto",
        progress: ProgressFn | None = None,
        quantize: str = "none",
    ) -> MlxBackend:
        """Load ``model`` (None = embedded default, a .gguf file or an HF folder) for MLX.

        An mlx-lm quantised folder (config ``"quantization": {"group_size", "bits"}``) loads its
        packed weights as ``nn.QuantizedLinear`` (:func:`build_model`).

        Args:
            dtype: "auto" (default: :func:`attnscope.core.loading.precision.decide`), "float32", "bfloat16" or "float16":
                weights, activations and cache
                (a quantised folder's scales and biases too).
            quantize: "none", "int8" or "int4": ``mlx.nn.quantize`` of the decoder's linear layers
                after loading (affine, groups of :data:`MLX_GROUP`; embeddings and lm_head kept),
                ignored for a folder that is quantised already.

        Raises:
            ValueError: unknown dtype.
            ModelLoadError: unusable reference or weights; UnsupportedModelError: a family or
                config setting the MLX models do not implement (message says which).
        """
        from attnscope.core.loading.precision import decide

        dtype, dtype_reason = decide(model, dtype, mlx_device().replace(":", "-"))
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        if quantize not in ("none", "int8", "int4"):
            raise ModelLoadError(f"unknown quantisation {quantize!r}: choose one of none, int8, int4")
        progress = progress or (lambda *_: None)
        t0 = time.perf_counter()
        # a Q4_0/Q4_1/Q8_0 GGUF stays quantised (attnscope.core.backends.mlx_gguf); others convert
        packed, gguf = None, gguf_path_of(model) if quantize == "none" else None
        notes: list[str] = []  # what a GGUF holds that is not reproduced, a cache entry redone
        if gguf is not None:
            try:
                packed = load_packed(gguf, DTYPES[dtype], progress, notes)
            except Exception as e:
                raise ModelLoadError(f"cannot load {gguf.name}: {_first_line(e)}") from None
        if packed is not None:
            assert gguf is not None  # packed weights come from a GGUF only
            cfg, packed_weights, packed_q, tok = packed
            folder, name = gguf, DEFAULT_MODEL_NAME if is_default_ref(model) else gguf.stem
        else:
            folder, name = resolve(model, progress, dtype, backend=cls.name, notes=notes)
            progress(f"Loading {name} for MLX…", 0.96)
            try:
                cfg = json.loads((folder / "config.json").read_text())
            except (OSError, ValueError) as e:
                raise ModelLoadError(f"cannot read {folder / 'config.json'}: {_first_line(e)}") from None
        file_q = cfg.get("quantization") if isinstance(cfg.get("quantization"), dict) else None
        m: Any
        args: Any  # ModelArgs, or mlx_lm_arch.LmArgs for an mlx-lm family
        if packed is None and cfg.get("model_type") in MLX_LM_FAMILIES:
            # mlx-lm's model code with our attention hooked in (attnscope.core.backends.mlx_lm_arch)
            if not mlx_lm_installed():
                raise UnsupportedModelError(
                    f"the MLX backend runs {cfg['model_type']} through mlx-lm, which is not installed: "
                    "pip install mlx-lm"
                )
            from attnscope.core.backends import mlx_lm_arch

            m = mlx_lm_arch.load(folder, cfg, DTYPES[dtype])
            args = m.args
        else:
            try:
                args = ModelArgs.from_dict(cfg)
            except KeyError as e:
                raise ModelLoadError(f"{folder / 'config.json'} lacks {e.args[0]!r}") from None
        if packed is None and cfg.get("model_type") in MLX_LM_FAMILIES:
            runtime = ""
        elif packed is not None:
            if args.tie_word_embeddings:
                packed_weights = {k: v for k, v in packed_weights.items() if not k.startswith("lm_head.")}
            m = build_model(args, packed_weights, packed_q)
            runtime = describe_packed(packed_q, file_quantization(gguf))
        else:
            m = build_model(args, load_weights(folder, args, DTYPES[dtype]), file_q)
            runtime = ""
        if file_q:
            runtime = f"MLX {file_q['bits']}-bit (group {file_q['group_size']}, nn.QuantizedLinear)"
        elif quantize != "none":
            runtime = quantize_mlx(m, 8 if quantize == "int8" else 4)
        quiet_transformers()
        from transformers import AutoTokenizer

        try:
            if packed is None:
                tok = AutoTokenizer.from_pretrained(folder)
        except Exception as e:
            raise ModelLoadError(f"cannot load the tokenizer of {name}: {_first_line(e)}") from None
        info = ModelInfo(
            name=name,
            source=model_source(model),
            architecture=args.model_type,
            n_layers=args.num_hidden_layers,
            n_heads=args.n_heads,
            n_kv_heads=args.n_kv_heads,
            head_dim=args.head_dim,
            hidden_size=args.hidden_size,
            max_context=args.max_position_embeddings,
            rope_theta=args.rope_theta,
            sliding_window=args.sliding_window,
            vocab_size=args.vocab_size,
            dtype=dtype,
            n_params=logical_params(m),  # quantised weights at their float count
            has_chat_template=bool(getattr(tok, "chat_template", None)),
            quantization_file=file_quantization(folder if file_q or packed else model_source(model)),
            quantization_runtime=runtime,
            dtype_reason=dtype_reason,
            load_note="; ".join(notes),
            # the attention kind as the torch load says it (heads; experts of an mlx-lm MoE family)
            attention_kind=attention_line(cfg, args),
        )
        backend = cls(m, tok, info)
        backend.load_seconds = time.perf_counter() - t0
        progress(f"{name} ready (MLX, {backend.device}).", 1.0)
        return backend

    # -- state --------------------------------------------------------------------------------
    def reset(self) -> None:
        """Empty KV cache and Trace."""
        self.caches = [KVCache() for _ in range(self.info.n_layers)]
        self.trace.reset()
        self.seq_len = 0

    def _check_thread(self) -> None:
        if threading.get_ident() != self._thread:
            raise RuntimeError(
                "the MLX backend must be used from the thread that created it (MLX streams are per thread)"
            )

    def forward(
        self,
        ids: list[int],
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        all_logits: bool = False,
    ) -> np.ndarray:
        """Feed ``ids`` after the cached positions; return logits, float32.

        Returns ``(vocab,)`` for the last position, or ``(len(ids), vocab)`` with ``all_logits``.
        Long inputs run in chunks of :data:`PREFILL_CHUNK`; ``progress(done, total)`` is called
        after each and ``cancelled()`` checked before each.

        Raises:
            Cancelled: ``cancelled()`` became true (cache and Trace rolled back to where they were).
            ValueError: no ids, ids that are not one flat sequence (a batch), or an id outside
                ``0 .. vocab_size-1``.
            RuntimeError: called from another thread than the one that created the backend.
        """
        self._check_thread()
        ids = as_token_ids(ids)  # one flat sequence: a batch is refused (attnscope.core.ids)
        if len(ids) == 0:
            raise ValueError("no token ids to feed")
        arr = np.asarray(ids, dtype=np.int64)
        if arr.min() < 0 or arr.max() >= self.info.vocab_size:  # MLX gathers do not bounds-check
            raise ValueError(f"token id out of range 0..{self.info.vocab_size - 1}")
        start = self.seq_len

        def run_chunk(part: np.ndarray) -> np.ndarray:
            chunk = mx.array(part[None].astype(np.int32))  # (1, n)
            watch = self.trace.finite  # non-finite values said at once (attnscope.core.trace.finite)
            watch.begin(self.seq_len, self.seq_len + len(part) - 1, DTYPES[self.info.dtype])
            logits = self.model(chunk, self.caches, self.trace, last_only=not all_logits)
            watch.check(None, "logits", logits)
            logits = logits[0].astype(mx.float32)
            mx.eval(
                logits,
                *self.trace.pending(),
                *watch.pending(),
                *(a for c in self.caches for a in c.state()),
            )
            self.seq_len += chunk.shape[1]
            out = np.array(logits)
            finite.note(self.notices, watch)  # the first non-finite tensor, said once
            return out

        return chunked_forward(
            arr, PREFILL_CHUNK, run_chunk, lambda: self._rollback(start), progress, cancelled, all_logits
        )

    def _rollback(self, n: int) -> None:
        # unlike truncate(), also undoes a chunk that failed half-way (some layers recorded)
        for c in self.caches:
            c.truncate(n)
        self.trace.truncate(n)
        self.seq_len = n
        if n == 0:
            self.reset()

    def truncate(self, n: int) -> None:
        """Drop positions ``>= n`` from the KV cache and the Trace (nothing is recomputed)."""
        self._check_thread()
        if n >= self.seq_len:
            return
        if n <= 0:
            self.reset()
            return
        self._rollback(n)

    def value_norms(self, layer: int) -> np.ndarray:
        """``‖v_j W_O^h‖`` for every query head ``h`` and cached key ``j`` of ``layer``: ``(n_heads, seq_len)``
        float32 (see :mod:`attnscope.core.analysis.value_weighted`; Kobayashi et al. 2020), from the cached values and
        ``o_proj``, in float32.

        Raises:
            IndexError: ``layer`` out of range. RuntimeError: nothing cached yet, or another thread.
        """
        self._check_thread()
        if not 0 <= layer < self.info.n_layers:
            raise IndexError(f"layer {layer} out of range 0..{self.info.n_layers - 1}")
        cache = self.caches[layer]
        if cache.values is None or cache.offset == 0:
            raise RuntimeError("nothing cached yet: run a prompt first")
        values = cache.values[0, :, : cache.offset, :].astype(mx.float32)  # (n_kv_heads, S, D)
        w = float_weight(self.model.model.layers[layer].self_attn.o_proj).astype(mx.float32)  # (hidden, H*D)
        H, D = self.info.n_heads, values.shape[-1]
        kv = self.info.kv_head
        out = mx.stack(
            [mx.linalg.norm(values[kv(h)] @ w[:, h * D : (h + 1) * D].T, axis=-1) for h in range(H)]
        )
        return np.array(out, dtype=np.float32)  # (n_heads, S)

    def kv_layer_bytes(self) -> np.ndarray:
        """Bytes of each layer's cached K and V (``KVCache.nbytes()``: cached positions only, the
        preallocated tail not counted), ``(n_layers,)`` int64."""
        n = self.info.n_layers
        out = np.zeros(n, dtype=np.int64)
        for i, c in enumerate(self.caches[:n]):
            out[i] = int(c.nbytes())
        return out

    def kv_cache_bytes(self) -> int:
        """Bytes of the cached positions' K and V (all layers); the preallocated tail is not counted."""
        return int(self.kv_layer_bytes().sum())

    def cache_dtype(self) -> str:
        """The cache's element type: the dtype the model was loaded at (weights, activations, cache)."""
        return str(self.info.dtype)

    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window (``ModelArgs.layer_window``; None = global)."""
        return tuple(self.args.layer_window(i) for i in range(self.info.n_layers))

    @contextmanager
    def fork(self, overrides=None, capture: bool = True) -> Iterator[MlxBackend]:
        """An :class:`MlxBackend` on this model with its own empty caches and Trace (``with`` block);
        ``capture=False`` records nothing.

        Raises:
            UnsupportedModelError: ``overrides`` given (experiments need the torch backend).
        """
        if overrides is not None:
            raise UnsupportedModelError(
                f"experiments need the torch backend (this session runs on {self.name})"
            )
        scratch = MlxBackend(self.model, self.tokenizer, self.info)
        scratch.trace.enabled = capture
        yield scratch

    def release_weights(self) -> None:
        """Drop the model (its weights); Trace, caches and logits stay, so ``trace.weights`` still works."""
        self.model = None  # released: only the trace and caches are read now
