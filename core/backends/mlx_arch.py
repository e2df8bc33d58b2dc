"""Small self-contained MLX decoder models: the Llama family (Llama, Mistral, SmolLM2) and Qwen2 / Qwen3.

Written after mlx-lm's ``models/llama.py`` / ``qwen3.py`` and checked against transformers'
``modeling_llama.py``, ``modeling_mistral.py``, ``modeling_qwen2.py``, ``modeling_qwen3.py``
(tests/core/test_mlx_backend.py compares logits and attention weights with the torch backend).

* :class:`ModelArgs` reads a Hugging Face ``config.json`` dict (known keys only; derived values in
  ``__post_init__``) and refuses any setting this code does not implement
  (:class:`attnscope.core.errors.UnsupportedModelError`) instead of silently ignoring it.
* Module names mirror the Hugging Face checkpoint keys (``model.layers.3.self_attn.q_proj.weight``),
  so a safetensors file in Hugging Face row order loads without renaming. (GGUF files order the
  q/k projection rows for the "traditional" interleaved RoPE; the default GGUF reaches us through
  transformers' conversion, which undoes that permutation, so rows here are always HF order.)
* RoPE is the Hugging Face "rotate_half" (non-interleaved) convention:
  ``mx.fast.rope(..., traditional=False)`` with explicit frequencies computed exactly as
  transformers computes ``inv_freq`` (float32), so positions agree to ~1e-6 even at 8k.
* Attention runs through :func:`attnscope.core.attention.fused_mlx.sdpa_with_lse_mlx`: the output from
  ``mx.fast.scaled_dot_product_attention`` (GQA native, no K/V copies) and, since the fused op
  does not return the log-sum-exp (LSE) a Trace needs, the LSE of the new rows computed alongside
  from ``q · kᵀ`` in float32: O(L × S) per head for the L new rows only (L = 1 in decode).
* Keys are cached after RoPE (mlx-lm convention): the cache holds exactly what the model attends to.

Shapes: ``x (B, L, hidden)``; ``q (B, n_heads, L, head_dim)``; ``k, v (B, n_kv_heads, S, head_dim)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from attnscope.core.attention.fused_mlx import sdpa_with_lse_mlx
from attnscope.core.backend_registry import MLX_OWN_FAMILIES
from attnscope.core.errors import UnsupportedModelError

# the hand-written families (attnscope.core.backend_registry; the registry's list adds mlx-lm's)
FAMILIES = MLX_OWN_FAMILIES

# Defaults of each family's transformers config class (transformers 5), used when config.json
# omits a key (not always mlx-lm's: Mistral / Qwen default to 8 / 32 KV heads, not n_heads). tests/core/test_mlx_backend.py checks them against the config classes themselves.
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "tie_word_embeddings": False},
    "mistral": {
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096 * 32,
        "tie_word_embeddings": False,
        "sliding_window": 4096,
        "num_key_value_heads": 8,
    },
    "qwen2": {
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "num_key_value_heads": 32,
    },
    "qwen3": {
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "head_dim": 128,
        "num_key_value_heads": 32,
    },
}
DEFAULT_ROPE_THETA = 10000.0  # transformers' RotaryEmbeddingConfigMixin.default_theta
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")  # longrope: one factor set only

# Keys that change the computation in other families; if a config sets them to a non-neutral
# value, refusing is better than silently computing something else.
_NEUTRAL = {
    "attn_logit_softcapping": (None,),
    "final_logit_softcapping": (None,),
    "partial_rotary_factor": (None, 1.0),
    "attention_multiplier": (None, 1.0),
    "embedding_multiplier": (None, 1.0),
    "residual_multiplier": (None, 1.0),
    "logits_scaling": (None, 1.0),
    "query_pre_attn_scalar": (None,),
    "no_rope_layers": (None,),
    "use_qk_norm": (None, False),
    "rope_interleaved": (None, False),
}


@dataclass
class ModelArgs:
    """The fields of a Hugging Face ``config.json`` that the MLX models use.

    Build with :meth:`from_dict`. ``rope_theta`` is read from ``rope_parameters`` (transformers 5)
    or ``rope_scaling`` (older) first and the top-level ``rope_theta`` second, as transformers does.
    """

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    rms_norm_eps: float
    # None (the default) is filled in by __post_init__ (num_attention_heads; hidden_size // heads;
    # from the family below), so after construction these read as their types: the ignores say so
    num_key_value_heads: int = None  # type: ignore[assignment]
    head_dim: int = None  # type: ignore[assignment]
    max_position_embeddings: int = 2048
    rope_theta: float = DEFAULT_ROPE_THETA
    rope_type: str = "default"
    rope_parameters: dict = field(default_factory=dict)
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    sliding_window: int | None = None
    use_sliding_window: bool = False
    max_window_layers: int | None = None
    layer_types: list[str] = None  # type: ignore[assignment]

    def __post_init__(self):
        if self.model_type not in FAMILIES:
            raise UnsupportedModelError(
                f"the MLX backend does not implement {self.model_type!r} (it runs {', '.join(FAMILIES)}): use --backend torch"
            )
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise UnsupportedModelError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of num_key_value_heads={self.num_key_value_heads}"
            )
        if self.hidden_act != "silu":
            raise UnsupportedModelError(
                f"hidden_act={self.hidden_act!r} is not implemented by the MLX backend (only silu)"
            )
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"RoPE type {self.rope_type!r} is not implemented by the MLX backend (supported: {', '.join(SUPPORTED_ROPE_TYPES)}): use --backend torch"
            )
        if self.model_type in ("qwen2", "qwen3"):
            # transformers: sliding_window only counts when use_sliding_window; layer_types
            # default to sliding for layers >= max_window_layers.
            if not self.use_sliding_window:
                self.sliding_window = None
            if self.layer_types is None:
                self.layer_types = [
                    "sliding_attention"
                    if self.sliding_window is not None and i >= (self.max_window_layers or 0)
                    else "full_attention"
                    for i in range(self.num_hidden_layers)
                ]
        elif self.model_type == "mistral":
            # transformers' MistralAttention passes config.sliding_window (may be None) in every
            # layer and ignores layer_types (alternating layers are the Ministral class)
            self.layer_types = [
                "sliding_attention" if self.sliding_window else "full_attention"
            ] * self.num_hidden_layers
        else:  # llama: no sliding window
            self.sliding_window = None
            self.layer_types = ["full_attention"] * self.num_hidden_layers
        if len(self.layer_types) != self.num_hidden_layers:
            raise UnsupportedModelError(
                f"layer_types lists {len(self.layer_types)} layers, the model has {self.num_hidden_layers}"
            )
        bad = set(self.layer_types) - {"full_attention", "sliding_attention"}
        if bad:
            raise UnsupportedModelError(f"layer types {sorted(bad)} are not implemented by the MLX backend")

    @classmethod
    def from_dict(cls, cfg: dict) -> ModelArgs:
        """Build from a parsed ``config.json``; unknown keys are ignored unless they change the math.

        Raises:
            UnsupportedModelError: a family, activation, RoPE type or setting this code does not run.
            KeyError: a required key (``hidden_size``, ...) is missing.
        """
        model_type = cfg.get("model_type")
        if model_type not in FAMILIES:
            raise UnsupportedModelError(
                f"the MLX backend does not implement {model_type!r} (it runs {', '.join(FAMILIES)}): use --backend torch"
            )
        for key, neutral in _NEUTRAL.items():
            if cfg.get(key) not in neutral:
                raise UnsupportedModelError(
                    f"config sets {key}={cfg[key]!r}, which the MLX backend does not implement"
                )
        d = dict(_FAMILY_DEFAULTS[model_type])
        known = cls.__dataclass_fields__.keys() - {"rope_theta", "rope_type", "rope_parameters"}
        # an explicit null means "none" for these (Mistral v0.3: "sliding_window": null = full
        # attention) and "use the default" for every other key, as in transformers
        nullable = {"sliding_window", "num_key_value_heads", "head_dim", "layer_types", "max_window_layers"}
        d.update({k: v for k, v in cfg.items() if k in known and (v is not None or k in nullable)})
        # RoPE: transformers 5 keeps everything in rope_parameters; older configs use a top-level
        # rope_theta plus rope_scaling ({"type"/"rope_type": ..., "factor": ...}) or null.
        rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        if not isinstance(rp, dict):
            raise UnsupportedModelError(f"cannot read rope parameters {rp!r}")
        if rp and all(isinstance(v, dict) for v in rp.values()):
            raise UnsupportedModelError(
                "per-layer-type RoPE parameters are not implemented by the MLX backend"
            )
        theta = rp.get("rope_theta", cfg.get("rope_theta"))
        d["rope_theta"] = float(theta) if theta is not None else DEFAULT_ROPE_THETA
        d["rope_type"] = rp.get("rope_type", rp.get("type")) or "default"
        d["rope_parameters"] = dict(rp)
        if rp.get("partial_rotary_factor", 1.0) != 1.0:
            raise UnsupportedModelError("partial rotary embeddings are not implemented by the MLX backend")
        if d["rope_type"] == "longrope" and (
            rp.get("short_factor") != rp.get("long_factor") or rp.get("attention_factor") != 1.0
        ):
            # one set of divisors and no attention factor (a GGUF's rope_freqs kept as they are,
            # attnscope.core.loading.gguf_config) is position-independent; Phi-3's two sets are not
            raise UnsupportedModelError(
                "longrope RoPE with two factor sets or an attention factor is not implemented by the "
                "MLX backend: use --backend torch"
            )
        return cls(**d)

    # -- derived --------------------------------------------------------------------------------
    @property
    def n_heads(self) -> int:
        return self.num_attention_heads

    @property
    def n_kv_heads(self) -> int:
        return self.num_key_value_heads

    @property
    def qkv_bias(self) -> bool:
        """Bias on q/k/v projections: always in Qwen2, ``attention_bias`` in Llama/Qwen3, never in Mistral."""
        return {"qwen2": True, "mistral": False}.get(self.model_type, self.attention_bias)

    @property
    def o_bias(self) -> bool:
        return {"qwen2": False, "mistral": False}.get(self.model_type, self.attention_bias)

    @property
    def has_mlp_bias(self) -> bool:
        return self.model_type == "llama" and self.mlp_bias

    @property
    def qk_norm(self) -> bool:
        """Qwen3 applies RMSNorm over head_dim to q and k before RoPE."""
        return self.model_type == "qwen3"

    def layer_window(self, layer: int) -> int | None:
        """Sliding window of ``layer`` (keys a query sees, itself included), None for full attention."""
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    def inv_freq(self) -> np.ndarray:
        """RoPE inverse frequencies ``(head_dim // 2,)`` float32, computed as transformers does.

        ``default``: ``1 / theta^(2i/d)``; ``linear``: divided by ``factor``; ``llama3``: the
        Llama 3.1 smooth low/high-frequency rescaling (transformers ``_compute_llama3_parameters``);
        ``longrope`` with one factor set: ``1 / (factor_i · theta^(2i/d))``.
        """
        d = self.head_dim
        exps = np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / np.float32(d)
        inv = (np.float32(1.0) / (np.float32(self.rope_theta) ** exps)).astype(np.float32)
        rp = self.rope_parameters
        if self.rope_type == "linear":
            inv = inv / np.float32(rp["factor"])
        elif self.rope_type == "longrope":  # transformers _compute_longrope_parameters, one factor set
            inv = (
                np.float32(1.0)
                / (np.asarray(rp["short_factor"], np.float32) * np.float32(self.rope_theta) ** exps)
            ).astype(np.float32)
        elif self.rope_type == "llama3":
            factor, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
            old = rp.get("original_max_position_embeddings", self.max_position_embeddings)
            low_wl, high_wl = old / lo, old / hi
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > low_wl, inv / factor, inv)
            smooth = (old / wavelen - lo) / (hi - lo)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
            inv = np.where(medium, smoothed, scaled).astype(np.float32)
        return inv.astype(np.float32)


# -- KV cache -------------------------------------------------------------------------------------
class KVCache:
    """One layer's keys (post-RoPE) and values, preallocated in steps of :attr:`step` positions.

    After mlx-lm's ``models/cache.py``: ``offset`` positions are valid; ``trim``/``truncate``
    only move the offset (later writes overwrite), so stepping back costs nothing.
    """

    step = 256

    def __init__(self):
        self.keys: mx.array | None = None  # (1, n_kv_heads, capacity, head_dim)
        self.values: mx.array | None = None
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Append ``keys, values (1, n_kv_heads, L, D)``; return all ``offset + L`` cached positions."""
        prev, n = self.offset, keys.shape[2]
        if self.keys is None or prev + n > self.keys.shape[2]:
            B, h, _, d = keys.shape
            grow = ((n + self.step - 1) // self.step) * self.step
            new_k = mx.zeros((B, h, grow, d), keys.dtype)
            new_v = mx.zeros((B, h, grow, values.shape[3]), values.dtype)
            if self.keys is None or self.values is None:
                self.keys, self.values = new_k, new_v
            else:
                self.keys = mx.concatenate([self.keys[..., :prev, :], new_k], axis=2)
                self.values = mx.concatenate([self.values[..., :prev, :], new_v], axis=2)
        self.offset = prev + n
        assert self.keys is not None and self.values is not None  # allocated above
        self.keys[..., prev : self.offset, :] = keys
        self.values[..., prev : self.offset, :] = values
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    def truncate(self, n: int) -> None:
        """Keep positions ``< n``."""
        self.offset = max(0, min(self.offset, n))

    def fetch_keys(self) -> mx.array:
        """The valid keys, ``(n_kv_heads, offset, head_dim)`` (a slice of the cache, no copy)."""
        if self.keys is None:
            raise RuntimeError("the KV cache is empty")
        return self.keys[0, :, : self.offset, :]

    def nbytes(self) -> int:
        """Bytes of the valid positions of K and V (the preallocated tail is not counted)."""
        if self.keys is None or self.values is None:
            return 0
        _, h, _, d = self.keys.shape
        return self.offset * h * (d + self.values.shape[3]) * self.keys.itemsize

    def state(self) -> list[mx.array]:
        return [] if self.keys is None or self.values is None else [self.keys, self.values]

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        """What an mlx-lm model asks its cache for (``create_attention_mask``): ``"causal"``, None
        for one row; the attention hook applies the layer's own mask instead
        (:mod:`attnscope.core.backends.mlx_lm_arch`)."""
        return None if n == 1 else "causal"


# -- intervention seams -----------------------------------------------------------------------------
@dataclass
class LayerEdit:
    """What one layer's forward replaces and records, as data (the seams that
    :mod:`attnscope.core.backends.mlx_interventions` drives: head ablation, patching, the logit lens).

    Sites (``(B, L, width)`` each): ``"q"``, ``"k"``, ``"v"``: q_proj's / k_proj's / v_proj's outputs
    (``n_heads·D`` / ``n_kv_heads·D`` wide, head ``h`` at ``[h·D, (h+1)·D)``; before QK-norm and RoPE);
    ``"z"``: o_proj's input (each head's ``Σ_j α_ij v_j``); ``"attn"``: o_proj's output; ``"mlp"``: the
    MLP's output; ``"input"`` / ``"resid"``: the layer's input / output hidden states.

    Attributes:
        replace: ``{site: (mask, value)}``: where ``mask`` (bool, broadcast to the site's shape) is True the
            site takes ``value`` (broadcast likewise, cast to the site's dtype): heads are column blocks, a
            position a row, a batch row one unit.
        add: ``{site: delta}`` added to the site first (a zero delta changes nothing: gradients).
        record: sites whose values (after ``add`` and ``replace``) are kept in ``kept``.
    """

    replace: dict[str, tuple[mx.array, mx.array]] = field(default_factory=dict)
    add: dict[str, mx.array] = field(default_factory=dict)
    record: tuple[str, ...] = ()
    kept: dict[str, mx.array] = field(default_factory=dict)

    def site(self, name: str, x: mx.array) -> mx.array:
        """``x`` at site ``name`` with this edit applied (and kept where recorded)."""
        if name in self.add:
            x = x + self.add[name]
        r = self.replace.get(name)
        if r is not None:
            x = mx.where(r[0], r[1].astype(x.dtype), x)
        if name in self.record:
            self.kept[name] = x
        return x


# -- attention ------------------------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.scale = self.head_dim**-0.5
        self.sliding_window = args.layer_window(layer_idx)
        h, d = args.hidden_size, args.head_dim
        self.q_proj = nn.Linear(h, args.n_heads * d, bias=args.qkv_bias)
        self.k_proj = nn.Linear(h, args.n_kv_heads * d, bias=args.qkv_bias)
        self.v_proj = nn.Linear(h, args.n_kv_heads * d, bias=args.qkv_bias)
        self.o_proj = nn.Linear(args.n_heads * d, h, bias=args.o_bias)
        if args.qk_norm:
            self.q_norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
            self.k_norm = nn.RMSNorm(d, eps=args.rms_norm_eps)
        self._qk_norm = args.qk_norm

    def __call__(
        self, x: mx.array, cache: KVCache, rope_freqs: mx.array, trace=None, edit: LayerEdit | None = None
    ) -> mx.array:
        B, L, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # (B, L, heads·D)
        if edit is not None:  # the query / key / value seams (LayerEdit)
            q, k, v = edit.site("q", q), edit.site("k", k), edit.site("v", v)
        q = q.reshape(B, L, self.n_heads, self.head_dim)  # (B, L, H, D)
        k = k.reshape(B, L, self.n_kv_heads, self.head_dim)
        v = v.reshape(B, L, self.n_kv_heads, self.head_dim)
        if self._qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))  # (B, heads, L, D)
        offset = cache.offset
        q = mx.fast.rope(
            q, self.head_dim, traditional=False, base=None, scale=1.0, offset=offset, freqs=rope_freqs
        )
        k = mx.fast.rope(
            k, self.head_dim, traditional=False, base=None, scale=1.0, offset=offset, freqs=rope_freqs
        )
        keys, values = cache.update_and_fetch(k, v)  # (B, Hkv, S, D), S = offset + L
        # causal (bottom-right aligned), or causal + sliding window of W keys (an int mask)
        mask = "causal" if self.sliding_window is None else self.sliding_window
        # The LSE is lazy: when the trace is off nothing asks for it and MLX never computes it.
        out, lse = sdpa_with_lse_mlx(q, keys, values, scale=self.scale, mask=mask, parts=True)  # lse = (m, ℓ)
        if trace is not None and trace.enabled:
            trace.record(self.layer_idx, q, lse, cache, self.scale, self.sliding_window)
        z = out.transpose(0, 2, 1, 3).reshape(B, L, -1)  # (B, L, H·D): head h at [h·D, (h+1)·D)
        if edit is None:
            return self.o_proj(z)
        return edit.site("attn", self.o_proj(edit.site("z", z)))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        b = args.has_mlp_bias
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=b)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=b)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=b)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(args, layer_idx)
        self.mlp = MLP(args)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, x, cache, rope_freqs, trace=None, edit: LayerEdit | None = None):
        if edit is None:
            h = x + self.self_attn(self.input_layernorm(x), cache, rope_freqs, trace)
            return h + self.mlp(self.post_attention_layernorm(h))
        x = edit.site("input", x)
        h = x + self.self_attn(self.input_layernorm(x), cache, rope_freqs, trace, edit)
        return edit.site("resid", h + edit.site("mlp", self.mlp(self.post_attention_layernorm(h))))


class Decoder(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [DecoderLayer(args, i) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class CausalLM(nn.Module):
    """``model.*`` + ``lm_head`` (absent when tied to the embeddings), as in the HF checkpoint."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = Decoder(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self._rope_freqs = mx.array(1.0 / args.inv_freq())  # periods, as mx.fast.rope's freqs expects

    def __call__(
        self,
        ids: mx.array,
        caches: list,  # KVCache per layer (or anything with offset and update_and_fetch)
        trace=None,
        last_only: bool = False,
        edits: list[LayerEdit | None] | None = None,
    ) -> mx.array:
        """Logits ``(B, L, vocab)`` (``(B, 1, vocab)`` with ``last_only``) for ``ids (B, L)`` int32.

        ``edits``: one :class:`LayerEdit` (or None) per layer: what the layer's seams replace and record.
        """
        return self.from_layer(self.model.embed_tokens(ids), 0, caches, trace, last_only, edits)

    def from_layer(
        self,
        x: mx.array,
        start: int,
        caches: list,
        trace=None,
        last_only: bool = False,
        edits: list[LayerEdit | None] | None = None,
    ) -> mx.array:
        """Logits for hidden states ``x (B, L, hidden)`` entering layer ``start``: layers ``start..`` run
        (with ``caches[start:]``), then the final norm and the unembedding (:meth:`unembed`)."""
        watch = getattr(trace, "finite", None)  # attnscope.core.trace.mlx_trace.MlxFiniteWatch
        layers = self.model.layers
        for i in range(start, len(layers)):
            edit = None if edits is None else edits[i]
            x = layers[i](x, caches[i], self._rope_freqs, trace, edit)
            if watch is not None:
                watch.check(i, "hidden states", x)  # one lazy max(|x|), read with the logits
        if last_only:
            x = x[:, -1:]
        return self.unembed(x)

    def unembed(self, x: mx.array) -> mx.array:
        """The final norm and the unembedding: ``(..., hidden)`` -> ``(..., vocab)`` logits."""
        x = self.model.norm(x)
        if self.args.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(x)
        return self.lm_head(x)
