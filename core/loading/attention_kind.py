"""What a decoder's attention is, read from its transformers config: one geometry and one line.

* GQA / MHA / MQA: ``n_heads`` query heads over ``n_kv_heads`` key/value heads (Ainslie et al. 2023).
* MLA, multi-head latent attention (DeepSeek-V2, Liu et al. 2024, §2.1): keys and values are
  rebuilt per head from a cached latent of ``kv_lora_rank`` (``d_c``) per token, plus a decoupled
  RoPE key of ``qk_rope_head_dim`` (``d_h^R``) shared by all heads. transformers' attention function
  receives per-head keys of ``qk_nope_head_dim + qk_rope_head_dim`` and values of ``v_head_dim``
  for every query head (``n_kv_heads = n_heads`` there), while the cache holds the latent only.
* Mixture-of-experts: routed experts per MoE layer (``num_local_experts`` / ``num_experts`` /
  ``n_routed_experts``) and experts per token (``num_experts_per_tok``); shared experts beside
  them (``n_shared_experts``, or one ``shared_expert_intermediate_size`` expert).
* Hybrid models: the per-layer kinds (:func:`attnscope.core.arch.layer_kinds_of`); layers that are
  not softmax attention have no map.

:func:`describe` writes the line the picker, ``attnscope models`` and the status bar show, e.g.
``GQA 32/4 · 128 experts, 8 active``, ``MLA 16 heads (latent 512 + RoPE 64) · 64 experts, 6 active``,
``MQA 4/1``, ``GQA 16/4 · 8 of 32 layers attention``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionGeometry:
    """The attention of one decoder. Counts; head sizes in elements; 0 where it does not apply."""

    n_layers: int = 0
    n_heads: int = 0
    n_kv_heads: int = 0  # KV heads as the attention function receives them (n_heads for MLA)
    head_dim: int = 0  # key/query head size (MLA: qk_nope_head_dim + qk_rope_head_dim)
    v_head_dim: int = 0  # value head size where it differs from head_dim, else 0
    kv_latent_dim: int = 0  # MLA latent d_c (kv_lora_rank); 0: not MLA
    rope_head_dim: int = 0  # MLA decoupled RoPE key size d_h^R
    n_experts: int = 0  # routed experts per MoE layer; 0: dense
    experts_active: int = 0  # routed experts each token runs through
    shared_experts: int = 0  # experts every token runs through besides
    attention_layers: int = 0  # layers with softmax attention (== n_layers unless hybrid)


def _pos_int(v) -> int:
    try:
        return max(0, int(v or 0))
    except (TypeError, ValueError):
        return 0


def geometry(config) -> AttentionGeometry:
    """:class:`AttentionGeometry` of a transformers config (its text config for a multimodal one).
    Never raises: fields the config lacks are 0."""
    from attnscope.core.arch import ATTENTION_KINDS, layer_kinds_of

    get = getattr(config, "get_text_config", None)
    c = get() if callable(get) else config
    g = lambda *names: next((_pos_int(getattr(c, n, 0)) for n in names if _pos_int(getattr(c, n, 0))), 0)  # noqa: E731
    n_layers = g("num_hidden_layers", "n_layer")
    n_heads = g("num_attention_heads", "n_head")
    hidden = g("hidden_size", "n_embd")
    n_kv = g("num_key_value_heads") or n_heads
    head_dim = g("head_dim") or (hidden // n_heads if n_heads else 0)
    latent, rope, v_dim = g("kv_lora_rank"), 0, 0
    if latent:
        rope = g("qk_rope_head_dim")
        head_dim = g("qk_nope_head_dim") + rope
        n_kv = n_heads
        v_dim = g("v_head_dim")
        v_dim = 0 if v_dim == head_dim else v_dim
    n_experts = g("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
    active = g("num_experts_per_tok", "moe_topk", "moe_k") if n_experts else 0
    shared = 0
    if n_experts:
        shared = g("n_shared_experts", "num_shared_experts", "moe_num_shared_experts") or (
            1 if g("shared_expert_intermediate_size") else 0
        )
    try:
        kinds = layer_kinds_of(c)
    except (TypeError, ValueError, AttributeError):
        kinds = ()
    attn = sum(k in ATTENTION_KINDS for k in kinds) if kinds else n_layers
    return AttentionGeometry(
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        v_head_dim=v_dim,
        kv_latent_dim=latent,
        rope_head_dim=rope,
        n_experts=n_experts,
        experts_active=active,
        shared_experts=shared,
        attention_layers=attn,
    )


def heads_line(n_heads: int, n_kv_heads: int) -> str:
    """``"GQA 32/8"``, ``"MHA 12"``, ``"MQA 4/1"``; ``""`` when the counts are unknown."""
    if not n_heads or not n_kv_heads:
        return ""
    if n_kv_heads == n_heads:
        return f"MHA {n_heads}"
    return f"{'MQA' if n_kv_heads == 1 else 'GQA'} {n_heads}/{n_kv_heads}"


def describe(geo: AttentionGeometry) -> str:
    """The one-line attention kind (module docstring); ``""`` when the head counts are unknown."""
    if geo.kv_latent_dim:
        head = f"MLA {geo.n_heads} heads (latent {geo.kv_latent_dim} + RoPE {geo.rope_head_dim})"
    else:
        head = heads_line(geo.n_heads, geo.n_kv_heads)
    if not head:
        return ""
    parts = [head]
    if geo.n_layers and geo.attention_layers != geo.n_layers:
        parts.append(f"{geo.attention_layers} of {geo.n_layers} layers attention")
    if geo.n_experts:
        moe = (
            f"{geo.n_experts} experts, {geo.experts_active} active"
            if geo.experts_active
            else f"{geo.n_experts} experts"
        )
        if geo.shared_experts:
            moe += f" + {geo.shared_experts} shared"
        parts.append(moe)
    return " · ".join(parts)
