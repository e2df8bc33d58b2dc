"""The attention geometry of a model and the one place the query-head -> KV-head mapping is written.

Grouped-query attention (Ainslie et al. 2023, "GQA"): ``n_heads`` query heads share ``n_kv_heads``
key/value heads in contiguous groups of ``group_size = n_heads // n_kv_heads``; query head ``h``
reads KV head ``h // group_size`` (the grouping transformers' ``repeat_kv`` and mlx-lm's
``mx.repeat(..., axis=1)`` imply; DESIGN.md "Conventions"). MHA is ``group_size = 1``, MQA
``n_kv_heads = 1``.

Everything that maps heads (the traces, the analyses, the views' labels) asks an
:class:`ArchConfig`: :meth:`ArchConfig.kv_head`, :meth:`ArchConfig.group`. :func:`arch_of` builds one
from anything with the four attention attributes (a :class:`attnscope.core.loading.resolve.ModelInfo`,
a trace).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# What a decoder layer computes (README "How it works"): softmax attention layers have an attention map;
# the others of a hybrid model (linear attention, state-space / Mamba, short convolution) have none.
ATTENTION_KINDS: tuple[str, ...] = ("attention", "sliding_attention")


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

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The real indices of the layers that have an attention map, ascending."""
        return tuple(i for i in range(self.n_layers) if self.has_map(i))

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
        int(obj.n_layers), int(obj.n_heads), int(obj.n_kv_heads), int(getattr(obj, "head_dim", 0) or 0)
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


def layer_kinds_of(config) -> tuple[str, ...]:
    """Per-layer kinds of a transformers config (its text config for a multimodal one), by real layer
    index, from ``layer_types`` (Qwen3-Next, Qwen3.5, LFM2, Gemma 3, gpt-oss…) or ``layers_block_type``;
    unknown names are kept as they are (a kind with no map). ``()`` when the config names no layer types
    (every layer softmax attention)."""
    types = getattr(config, "layer_types", None) or getattr(config, "layers_block_type", None)
    n = getattr(config, "num_hidden_layers", None)
    if not isinstance(types, list | tuple) or not types:
        return ()
    kinds = tuple(_KIND_NAMES.get(str(t), str(t)) for t in types)
    if isinstance(n, int) and len(kinds) > n:  # some configs list extra (e.g. multi-token-prediction) layers
        kinds = kinds[:n]
    return kinds
