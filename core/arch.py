"""The attention geometry of a model and the one place the query-head -> KV-head mapping is written.

Grouped-query attention (Ainslie et al. 2023, "GQA"): ``n_heads`` query heads share ``n_kv_heads``
key/value heads in contiguous groups of ``group_size = n_heads // n_kv_heads``; query head ``h``
reads KV head ``h // group_size`` (the grouping transformers' ``repeat_kv`` and mlx-lm's
``mx.repeat(..., axis=1)`` imply; docs/how-it-works.md). MHA is ``group_size = 1``, MQA
``n_kv_heads = 1``.

Everything that maps heads (the traces, the analyses, the views' labels) asks an
:class:`ArchConfig`: :meth:`ArchConfig.kv_head`, :meth:`ArchConfig.group`. :func:`arch_of` builds one
from anything with the four attention attributes (a :class:`attnscope.core.loading.model_info.ModelInfo`,
a trace).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

# What a decoder layer computes (docs/how-it-works.md "Hybrid models"): softmax attention layers have an attention map;
# the others of a hybrid model (linear attention, state-space / Mamba, short convolution) have none.
# "attention_mamba" (Falcon-H1) runs softmax attention and a Mamba mixer side by side in one layer: it
# has a map and a recurrent state.
ATTENTION_KINDS: tuple[str, ...] = ("attention", "sliding_attention", "attention_mamba")
# Kinds that carry a recurrent or convolution state instead of (or beside) a KV cache
STATE_KINDS = ("linear_attention", "mamba", "conv", "attention_mamba")
# How the window and the error lines name each kind
KIND_LABELS = {
    "attention": "softmax attention",
    "sliding_attention": "sliding-window attention",
    "chunked_attention": "chunked attention",
    "attention_mamba": "attention + Mamba in parallel",
    "linear_attention": "linear attention",
    "mamba": "Mamba (state space)",
    "conv": "short convolution",
}


def kind_label(kind: str) -> str:
    """How a layer kind is named to the user (``"linear attention"``); an unknown kind as it is."""
    return KIND_LABELS.get(kind, kind.replace("_", " "))


@dataclass(frozen=True)
class ArchConfig:
    """Attention geometry: counts of layers and heads, head size in elements.

    Raises:
        ValueError: a count below 1, or ``n_heads`` not a multiple of ``n_kv_heads``.
    """

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int = 0
    # per decoder layer, by real layer index: "attention", "sliding_attention", or a kind with no map
    # ("linear_attention", "mamba", "conv", ...); () when every layer is softmax attention
    layer_kinds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.n_heads < 1 or self.n_kv_heads < 1 or self.n_layers < 0:
            raise ValueError(
                f"attention geometry needs n_heads, n_kv_heads >= 1 (got {self.n_heads}, {self.n_kv_heads})"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")

    def layer_kind(self, layer: int) -> str:
        """What layer ``layer`` computes (``"attention"`` when :attr:`layer_kinds` is empty)."""
        return self.layer_kinds[layer] if self.layer_kinds else "attention"

    def has_map(self, layer: int) -> bool:
        """Whether layer ``layer`` is softmax attention (so has an attention map)."""
        return self.layer_kind(layer) in ATTENTION_KINDS

    def has_state(self, layer: int) -> bool:
        """Whether layer ``layer`` keeps a recurrent or convolution state (:data:`STATE_KINDS`)."""
        return self.layer_kind(layer) in STATE_KINDS

    @functools.cached_property
    def attention_layers(self) -> tuple[int, ...]:
        """The real indices of the layers that have an attention map, ascending."""
        return tuple(i for i in range(self.n_layers) if self.has_map(i))

    @property
    def is_hybrid(self) -> bool:
        """Whether some layer has no attention map or keeps a recurrent / convolution state."""
        return any(not self.has_map(i) or self.has_state(i) for i in range(self.n_layers))

    def no_map_line(self, layer: int) -> str:
        """The one line that says layer ``layer`` has no map: ``"layer 2: linear attention, no map"``."""
        return f"layer {layer}: {kind_label(self.layer_kind(layer))}, no map"

    def check_map(self, layer: int) -> int:
        """``layer`` when it has an attention map.

        Raises:
            NoAttentionMap (a BadArgument): the layer is linear attention, Mamba or a convolution
                (:meth:`no_map_line`). OutOfRange / WrongType: not a layer index.
        """
        from attnscope.core.checks import index
        from attnscope.core.errors import NoAttentionMap

        layer = index("layer", layer, self.n_layers)
        if not self.has_map(layer):
            raise NoAttentionMap(self.no_map_line(layer))
        return layer

    def map_layer_near(self, layer: int, direction: int = 0) -> int:
        """The attention layer to show for a request of ``layer``: ``layer`` itself when it has a map, else
        the next one up (``direction > 0``), down (``< 0``) or the nearest (``0``, ties upwards), falling
        back to the nearest when there is none that way. ``layer`` when no layer has a map."""
        att = self.attention_layers
        if not att or layer in att:
            return layer
        up = [i for i in att if i > layer]
        down = [i for i in att if i < layer]
        if direction > 0 and up:
            return up[0]
        if direction < 0 and down:
            return down[-1]
        return min(att, key=lambda i: (abs(i - layer), -i))

    def describe_layers(self) -> str:
        """One phrase for the picker and status bar: ``"2 of 8 layers attention (6 linear attention)"``;
        ``""`` when every layer is softmax attention with no state."""
        if not self.is_hybrid:
            return ""
        n_att = len(self.attention_layers)
        others: dict[str, int] = {}
        for i in range(self.n_layers):
            k = self.layer_kind(i)
            if not self.has_map(i) or k == "attention_mamba":
                others[k] = others.get(k, 0) + 1
        rest = ", ".join(f"{n} {kind_label(k)}" for k, n in others.items())
        return f"{n_att} of {self.n_layers} layers attention ({rest})"

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 for MHA, ``n_heads`` for MQA)."""
        return self.n_heads // self.n_kv_heads

    def kv_head(self, head: int) -> int:
        """The KV head query head ``head`` reads: ``head // group_size``.

        Raises:
            OutOfRange (an IndexError): ``head`` outside ``0 .. n_heads - 1``. WrongType (a
            TypeError): not a whole number.
        """
        from attnscope.core.checks import index

        head = index("head", head, self.n_heads)
        return head // self.group_size

    def group(self, kv_head: int) -> range:
        """The query heads that read KV head ``kv_head``: ``range(kv·g, (kv + 1)·g)``.

        Raises:
            IndexError: ``kv_head`` outside ``0 .. n_kv_heads - 1``.
        """
        kv_head = int(kv_head)
        if not 0 <= kv_head < self.n_kv_heads:
            raise IndexError(f"KV head {kv_head} out of range 0..{self.n_kv_heads - 1}")
        g = self.group_size
        return range(kv_head * g, (kv_head + 1) * g)

    def kv_heads(self) -> np.ndarray:
        """``(n_heads,)`` int64: the KV head of every query head (``kv_heads()[h] == kv_head(h)``)."""
        return np.arange(self.n_heads, dtype=np.int64) // self.group_size


def arch_of(obj) -> ArchConfig:
    """The :class:`ArchConfig` of ``obj``: ``obj`` itself or its own ``arch`` when it has one, else one built from its
    ``n_layers``, ``n_heads``, ``n_kv_heads`` (and ``head_dim``, 0 when absent) attributes.

    Raises:
        AttributeError: ``obj`` lacks a head count. ValueError: see :class:`ArchConfig`.
    """
    if isinstance(obj, ArchConfig):
        return obj
    arch = getattr(obj, "arch", None)
    if isinstance(arch, ArchConfig):
        return arch
    return ArchConfig(
        int(obj.n_layers),
        int(obj.n_heads),
        int(obj.n_kv_heads),
        int(getattr(obj, "head_dim", 0) or 0),
        tuple(getattr(obj, "layer_kinds", ()) or ()),
    )


# transformers' per-layer type names (``config.layer_types`` / ``layers_block_type``) -> our kinds
_KIND_NAMES = {
    "full_attention": "attention",
    "attention": "attention",
    "global_attention": "attention",
    "sliding_attention": "sliding_attention",
    "local_attention": "sliding_attention",
    "chunked_attention": "chunked_attention",
    "linear_attention": "linear_attention",
    "mamba": "mamba",
    "mamba2": "mamba",
    "conv": "conv",
    "short_conv": "conv",
}
ATTENTION_KINDS = (*ATTENTION_KINDS, "chunked_attention")
# transformers 5 names every recurrent layer "linear_attention" (configuration_utils' legacy remap turns
# "mamba" into it): the families whose recurrent layers are Mamba-2 mixers, by model_type
_MAMBA_FAMILIES = {"granitemoehybrid", "falcon_h1", "bamba", "zamba2", "nemotron_h", "jamba"}


def layer_kinds_of(config) -> tuple[str, ...]:
    """Per-layer kinds of a transformers config (its text config for a multimodal one), by real layer
    index, from ``layer_types`` (Qwen3-Next, Qwen3.5, LFM2, Granite 4, Gemma 3, gpt-oss…) or
    ``layers_block_type`` (Falcon-H1); unknown names are kept as they are (a kind with no map). ``()`` when
    the config names no layer types (every layer softmax attention). ``config``: a transformers config or
    a parsed config.json dict.

    Per family (transformers 5 modeling code): Qwen3-Next / Qwen3.5 ``linear_attention`` is a Gated
    DeltaNet (kind ``linear_attention``); Granite 4 ``linear_attention`` is a Mamba-2 mixer (``mamba``);
    LFM2 ``conv`` is a gated short convolution (``conv``); Falcon-H1 ``hybrid`` runs attention and a
    Mamba-2 mixer in parallel in every layer (``attention_mamba``)."""
    if isinstance(config, dict):  # a parsed config.json (the catalog reads those): its text config
        text = config.get("text_config")
        c = text if isinstance(text, dict) else config
        types = c.get("layer_types") or c.get("layers_block_type")
        n, model_type = c.get("num_hidden_layers"), c.get("model_type") or config.get("model_type", "")
        k = c.get("full_attention_interval")  # Qwen3-Next / Qwen3.5 written without layer_types
        if not types and isinstance(n, int) and isinstance(k, int) and k > 0:
            types = ["linear_attention" if (i + 1) % k else "full_attention" for i in range(n)]
    else:
        get_text = getattr(config, "get_text_config", None)
        if callable(get_text):
            config = get_text()
        types = getattr(config, "layer_types", None) or getattr(config, "layers_block_type", None)
        n, model_type = getattr(config, "num_hidden_layers", None), getattr(config, "model_type", "")
    if not types and model_type == "falcon_h1" and isinstance(n, int):  # its config.json names no types
        types = ["hybrid"] * n
    if not isinstance(types, list | tuple) or not types:
        return ()
    mamba = model_type in _MAMBA_FAMILIES
    names = dict(_KIND_NAMES, hybrid="attention_mamba")
    if mamba:
        names["linear_attention"] = "mamba"
    kinds = tuple(names.get(str(t), str(t)) for t in types)
    if isinstance(n, int) and len(kinds) > n:  # some configs list extra (e.g. multi-token-prediction) layers
        kinds = kinds[:n]
    return kinds
