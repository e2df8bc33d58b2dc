"""mlx-lm's own model code on the MLX backend, with AttnScope's attention path hooked in.

For the families in :data:`attnscope.core.backend_registry.MLX_LM_FAMILIES` the MLX backend builds
the model with ``mlx_lm.utils.load_model`` (mlx-lm's projections, RoPE, norms, MLP and
mixture-of-experts routing: its ``models/<family>.py``) instead of writing its own. Every mlx-lm
attention layer calls ``scaled_dot_product_attention(queries, keys, values, cache, scale, mask)``
from ``mlx_lm.models.base``, imported by name into the family's module; :func:`hook` replaces that
name in every loaded ``mlx_lm.models`` module with :func:`_traced_sdpa`, which, while
:class:`MlxLmCausalLM` runs a forward, computes the output and the LSE with
:func:`attnscope.core.attention.fused_mlx.sdpa_with_lse_mlx` (the same call the hand-written models
make: float32 scores on the CPU, the exact-LSE parts for the Trace) under the layer's own mask,
records the layer's post-RoPE queries and LSE in the :class:`attnscope.core.trace.mlx_trace.MlxTrace`,
and otherwise (no forward of ours running) calls mlx-lm's own function unchanged.

* The layer index comes from the cache object the layer was given (one
  :class:`attnscope.core.backends.mlx_arch.KVCache` per layer, ours: full length, trimmed by moving
  its offset, so step back costs nothing and the Trace reads the keys from it).
* The mask is the layer's own from the Hugging Face config (``layer_types`` and ``sliding_window``,
  read by transformers: :func:`layer_windows`), bottom-right aligned causal, or causal within a
  sliding window; mlx-lm's mask argument is not used (it is the same where mlx-lm implements the
  window, and mlx-lm's Phi-3 omits the window transformers applies).
* transformers 5 writes RoPE settings as ``rope_parameters``; mlx-lm 0.32 reads ``rope_theta`` and
  ``rope_scaling``: :func:`mlx_lm_config` passes them on in mlx-lm's names.

tests/core/test_mlx_lm.py compares logits (1e-4) and every head's weights (1e-5) with the torch backend.
mlx-lm is optional (``pip install 'attnscope[mlx]'``): import this module only where
``import mlx_lm`` works.
"""

from __future__ import annotations

import importlib
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from attnscope.core.attention.fused_mlx import sdpa_with_lse_mlx
from attnscope.core.errors import ModelLoadError, UnsupportedModelError

_STATE = threading.local()  # .ctx: the _Forward running on this thread, or absent


@dataclass
class _Forward:
    layer_of: dict[int, int]  # id(cache) -> layer index
    windows: tuple[int | None, ...]
    trace: Any


def _traced_sdpa(queries, keys, values, cache, scale, mask, sinks=None, **kw):
    """mlx-lm's ``scaled_dot_product_attention`` as AttnScope runs it (module docstring)."""
    ctx: _Forward | None = getattr(_STATE, "ctx", None)
    layer = None if ctx is None else ctx.layer_of.get(id(cache))
    if ctx is None or layer is None:
        return _ORIGINAL(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks, **kw)
    if sinks is not None:
        raise UnsupportedModelError("learned attention sinks are not implemented by the MLX backend")
    window = ctx.windows[layer]
    out, lse = sdpa_with_lse_mlx(
        queries, keys, values, scale=scale, mask="causal" if window is None else window, parts=True
    )
    if ctx.trace is not None and ctx.trace.enabled:
        ctx.trace.record(layer, queries, lse, cache, scale, window)
    return out


_ORIGINAL: Any = None


def hook() -> None:
    """Point every loaded ``mlx_lm.models.*`` module's ``scaled_dot_product_attention`` at
    :func:`_traced_sdpa` (idempotent; call after importing a family's module)."""
    global _ORIGINAL
    base = importlib.import_module("mlx_lm.models.base")
    if _ORIGINAL is None:
        _ORIGINAL = base.scaled_dot_product_attention
    for name, mod in list(sys.modules.items()):
        if (
            name.startswith("mlx_lm.models.")
            and getattr(mod, "scaled_dot_product_attention", None) is _ORIGINAL
        ):
            mod.scaled_dot_product_attention = _traced_sdpa  # type: ignore[attr-defined]


def mlx_lm_config(cfg: dict) -> dict:
    """The entries of a transformers-5 ``config.json`` that mlx-lm 0.32 reads under other names:
    ``rope_parameters`` as ``rope_theta`` and ``rope_scaling`` (``{"type", ...}`` when not the
    default RoPE); per-layer-type RoPE (Gemma 3) as ``rope_theta``/``rope_scaling`` of the full
    layers and ``rope_local_base_freq`` of the sliding ones; Gemma 3's ``layer_types`` as mlx-lm's
    ``sliding_window_pattern``.

    Raises:
        UnsupportedModelError: layer types mlx-lm's periodic pattern cannot express.
    """
    out: dict = {}
    rp = cfg.get("rope_parameters")

    def flat(p: dict, theta_key: str, scaling: bool) -> None:
        if p.get("rope_theta") is not None:
            out[theta_key] = float(p["rope_theta"])
        kind = p.get("rope_type", p.get("type")) or "default"
        if scaling and kind != "default":
            out["rope_scaling"] = {**{k: v for k, v in p.items() if k != "rope_theta"}, "type": kind}

    if isinstance(rp, dict) and rp and all(isinstance(v, dict) for v in rp.values()):
        if "full_attention" in rp:
            flat(rp["full_attention"], "rope_theta", True)
        if "sliding_attention" in rp:
            flat(rp["sliding_attention"], "rope_local_base_freq", False)
    elif isinstance(rp, dict):
        flat(rp, "rope_theta", True)
    types = cfg.get("layer_types")
    if cfg.get("model_type") == "gemma3_text" and isinstance(types, list) and types:
        if "full_attention" not in types:
            pattern = len(types) + 1
        else:
            pattern = types.index("full_attention") + 1
        expect = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(len(types))
        ]
        if types != expect:
            raise UnsupportedModelError(
                "these Gemma 3 layer types are not one periodic pattern, which mlx-lm's model needs: "
                "use --backend torch"
            )
        out["sliding_window_pattern"] = pattern
    return out


def layer_windows(cfg: dict) -> tuple[int | None, ...]:
    """Each layer's sliding window (keys a query sees, itself included; None = global) as
    transformers runs the config: ``layer_types`` where the config class sets them, else its
    ``sliding_window`` in every layer (Mistral, Mixtral, Phi-3)."""
    from transformers import AutoConfig

    tc = AutoConfig.for_model(**cfg)
    n = int(tc.num_hidden_layers)
    window = getattr(tc, "sliding_window", None)
    types = getattr(tc, "layer_types", None)
    if getattr(tc, "use_sliding_window", True) is False:
        window = None
    if types:
        return tuple(window if t == "sliding_attention" else None for t in types)
    return (window,) * n


@dataclass
class LmArgs:
    """The geometry the MLX backend reads off a model (``MlxBackend.args``), for an mlx-lm model."""

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    tie_word_embeddings: bool
    windows: tuple[int | None, ...]

    @property
    def sliding_window(self) -> int | None:
        return next((w for w in self.windows if w is not None), None)

    def layer_window(self, layer: int) -> int | None:
        return self.windows[layer]


def _watched(cls):
    """A subclass of decoder-layer class ``cls`` that queues the layer's output for the forward's
    non-finite check (:class:`attnscope.core.trace.mlx_trace.MlxFiniteWatch`)."""

    def __call__(self, *args, **kwargs):
        out = cls.__call__(self, *args, **kwargs)
        ctx = getattr(_STATE, "ctx", None)
        watch = getattr(getattr(ctx, "trace", None), "finite", None)
        if watch is not None:
            watch.check(self._attnscope_layer, "hidden states", out[0] if isinstance(out, tuple) else out)
        return out

    return type(f"Watched{cls.__name__}", (cls,), {"__call__": __call__})


class MlxLmCausalLM:
    """An mlx-lm model behind the interface of :class:`attnscope.core.backends.mlx_arch.CausalLM`:
    ``model(ids, caches, trace, last_only)`` → logits ``(B, L, vocab)``, ``.args``, ``.model.layers``
    (each with ``self_attn.o_proj``), ``parameters()``, ``named_modules()``."""

    def __init__(self, lm: nn.Module, args: LmArgs):
        self.lm, self.args = lm, args
        self.model = lm.model if hasattr(lm, "model") else lm.language_model.model
        for i, layer in enumerate(self.model.layers):
            layer._attnscope_layer = i
            layer.__class__ = _watched(type(layer))

    def parameters(self):
        return self.lm.parameters()

    def named_modules(self):
        return self.lm.named_modules()

    def __call__(self, ids: mx.array, caches: list, trace=None, last_only: bool = False) -> mx.array:
        _STATE.ctx = _Forward({id(c): i for i, c in enumerate(caches)}, self.args.windows, trace)
        try:
            logits = self.lm(ids, cache=caches)
        finally:
            _STATE.ctx = None
        return logits[:, -1:] if last_only else logits


def load(folder: Path, cfg: dict, dtype) -> MlxLmCausalLM:
    """Build ``folder``'s model with mlx-lm (``mlx_lm.utils.load_model``, strict: every weight
    name and shape must match), cast its float weights to ``dtype`` (packed quantised weights
    stay as they are) and hook it (:func:`hook`).

    Raises:
        ModelLoadError: mlx-lm refuses the config or the weights (its first line).
    """
    from mlx_lm.utils import load_model
    from transformers import AutoConfig

    tc = AutoConfig.for_model(**cfg)
    # every field as transformers reads it (a transformers-5 config.json leaves defaults and
    # aliases such as Qwen3-MoE's num_experts out; mlx-lm's ModelArgs require them), then the
    # RoPE and layer-type entries in mlx-lm's names
    full = {k: v for k, v in tc.to_dict().items() if v is not None}
    for alias in getattr(tc, "attribute_map", {}) or {}:
        if getattr(tc, alias, None) is not None:
            full[alias] = getattr(tc, alias)
    full.update(mlx_lm_config(cfg))
    try:
        lm, _ = load_model(Path(folder), lazy=False, strict=True, model_config=full)
    except UnsupportedModelError:
        raise
    except Exception as e:  # noqa: BLE001 - mlx-lm's own error, said in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"mlx-lm cannot load {Path(folder).name}: {first}") from None
    lm.set_dtype(dtype, predicate=lambda t: mx.issubdtype(t, mx.floating))
    mx.eval(lm.parameters())
    hook()
    n_heads = int(tc.num_attention_heads)
    args = LmArgs(
        model_type=str(cfg["model_type"]),
        hidden_size=int(tc.hidden_size),
        num_hidden_layers=int(tc.num_hidden_layers),
        n_heads=n_heads,
        n_kv_heads=int(getattr(tc, "num_key_value_heads", None) or n_heads),
        head_dim=int(getattr(tc, "head_dim", None) or tc.hidden_size // n_heads),
        vocab_size=int(tc.vocab_size),
        max_position_embeddings=int(getattr(tc, "max_position_embeddings", 0) or 0),
        rope_theta=float((getattr(tc, "rope_parameters", None) or {}).get("rope_theta", 10000.0)),
        tie_word_embeddings=bool(getattr(tc, "tie_word_embeddings", False)),
        windows=layer_windows(cfg),
    )
    return MlxLmCausalLM(lm, args)
