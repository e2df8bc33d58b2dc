"""What the GUI and CLI show about a loaded model (:class:`ModelInfo`), built from a transformers config
by :func:`info_from_config` for every backend (``info`` of :class:`attnscope.core.backends.base.Backend`)."""

from __future__ import annotations

from dataclasses import dataclass

from attnscope.core.arch import ArchConfig
from attnscope.core.errors import ModelLoadError
from attnscope.core.loading import attention_kind


@dataclass(frozen=True)
class ModelInfo:
    """What the GUI and CLI show about a loaded model. Sizes in elements, memory in bytes."""

    name: str
    source: str
    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_size: int
    max_context: int
    rope_theta: float | None
    sliding_window: int | None
    vocab_size: int
    dtype: str
    n_params: int = 0
    has_chat_template: bool = False
    quantization_file: str = (
        ""  # how the checkpoint file stores weights: "Q4_K_M", "MLX 4-bit (group 64)", ""
    )
    quantization_runtime: str = (
        ""  # how they run: attnscope.core.loading.quantize.quantize_model's line, "" when unquantised
    )
    # --device-map the model was loaded with ("auto" | "balanced" | "sequential", "custom" for an explicit
    # dict, "" for one device) and the parameter bytes it put on each placement (attnscope.core.loading.device_map)
    device_map: str = ""
    device_placement: tuple[tuple[str, int], ...] = ()
    dtype_reason: str = ""  # why it loaded at ``dtype`` (attnscope.core.loading.precision.choose_dtype), shown in the status bar
    load_note: str = ""  # one line about the load, e.g. that the quantised-weights cache was not written
    layer_kinds: tuple[
        str, ...
    ] = ()  # per decoder layer (attnscope.core.arch.ArchConfig.layer_kinds); () = all attention
    # multi-head latent attention (DeepSeek-V2/V3, attnscope.core.loading.attention_kind): the cache holds
    # a latent of kv_latent_dim + the decoupled RoPE key of rope_head_dim per token and layer; 0 otherwise
    kv_latent_dim: int = 0
    rope_head_dim: int = 0
    v_head_dim: int = 0  # value head size where it differs from head_dim (MLA), else 0
    n_experts: int = 0  # mixture-of-experts: routed experts per MoE layer, and how many run per token
    experts_active: int = 0
    attention_kind: str = ""  # one line: "GQA 32/8 · 128 experts, 8 active" (attention_kind.describe)

    @property
    def arch(self) -> ArchConfig:
        """The attention geometry (:class:`attnscope.core.arch.ArchConfig`): head mapping, group size."""
        return ArchConfig(self.n_layers, self.n_heads, self.n_kv_heads, self.head_dim, self.layer_kinds)

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.arch.group_size

    def kv_head(self, head: int) -> int:
        """The KV head query head ``head`` reads (:meth:`attnscope.core.arch.ArchConfig.kv_head`)."""
        return self.arch.kv_head(head)

    def group(self, kv_head: int) -> range:
        """The query heads reading KV head ``kv_head`` (:meth:`attnscope.core.arch.ArchConfig.group`)."""
        return self.arch.group(kv_head)


def info_from_config(
    config, name: str, source: str, dtype: str, n_params: int = 0, has_chat_template: bool = False
) -> ModelInfo:
    """Build :class:`ModelInfo` from a transformers config (any decoder-only family); ``layer_kinds`` from
    :func:`attnscope.core.arch.layer_kinds_of` (what each layer of a hybrid model computes)."""
    from attnscope.core.arch import layer_kinds_of

    n_heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    n_layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    if n_heads is None or n_layers is None or hidden is None:
        sizes = (("num_attention_heads", n_heads), ("num_hidden_layers", n_layers), ("hidden_size", hidden))
        missing = ", ".join(k for k, v in sizes if v is None)
        raise ModelLoadError(f"cannot read {name}: its config gives no {missing}")
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    head_dim = getattr(config, "head_dim", None) or hidden // n_heads
    geo = attention_kind.geometry(config)
    if geo.kv_latent_dim:  # MLA: per-head keys rebuilt from the latent reach the attention function
        n_kv, head_dim = n_heads, geo.head_dim
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = theta if theta is not None else getattr(config, "rope_theta", None)
    max_ctx = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 0)
    return ModelInfo(
        name=name,
        source=source,
        architecture=config.model_type,
        n_layers=int(n_layers),
        n_heads=int(n_heads),
        n_kv_heads=int(n_kv),
        head_dim=int(head_dim),
        hidden_size=int(hidden),
        max_context=int(max_ctx or 0),  # 0: the config states no context length
        rope_theta=float(theta) if theta is not None else None,
        sliding_window=getattr(config, "sliding_window", None),
        vocab_size=int(config.vocab_size),
        dtype=dtype,
        n_params=n_params,
        has_chat_template=has_chat_template,
        layer_kinds=layer_kinds_of(config),
        kv_latent_dim=geo.kv_latent_dim,
        rope_head_dim=geo.rope_head_dim,
        v_head_dim=geo.v_head_dim,
        n_experts=geo.n_experts,
        experts_active=geo.experts_active,
        attention_kind=attention_kind.describe(geo),
    )
