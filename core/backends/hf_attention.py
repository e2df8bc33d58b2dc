"""AttnScope's attention function in transformers' attention interface (the torch backend's seam).

``register_attention()`` adds ``"attnscope"`` to transformers' ``AttentionInterface``; a model loaded
with ``attn_implementation="attnscope"`` then calls :func:`attnscope_attention` in every layer
with post-RoPE queries and the cached keys/values. The function runs the fused kernel
(:func:`attnscope.core.attention.fused.sdpa_with_lse`) and records the new query rows and their LSE in the
Trace the backend set on the layer's module (``module._attnscope_trace``, a
:class:`attnscope.core.trace.torch_trace.TorchTrace`).

The mask: ``register_attention()`` also puts :func:`attnscope_mask` in transformers'
``AttentionMaskInterface``, so that a caller's padding mask reaches the attention function instead
of being dropped (transformers passes ``attention_mask=None`` to a function missing there). The
mask function returns None when every key is real; our function then applies the mask itself:
causal, bottom-right aligned, plus the layer's sliding window (``module.sliding_window``) where it
has one. A padding mask, a custom 4-d mask or a batch of several sequences is refused with one line
(:data:`attnscope.core.ids.BATCH_REFUSAL`): the Trace holds one sequence.

Its own module so that the loader (:func:`attnscope.core.backends.torch_load.load_torch`, which loads a model
with ``attn_implementation=ATTN_NAME``) and the backend (which calls the loader) do not import
each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnscope.core.attention.fused import sdpa_with_lse
from attnscope.core.errors import UnsupportedModelError
from attnscope.core.ids import BATCH_REFUSAL

if TYPE_CHECKING:
    from attnscope.core.trace.torch_trace import TorchTrace

ATTN_NAME = "attnscope"

_registered = False


def attnscope_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: fused attention + capture.

    Args:
        module: the attention module (``layer_idx``, ``sliding_window``, ``is_causal``).
        query: ``(B, n_heads, L, D)`` post-RoPE; key, value: ``(B, n_kv_heads, S, D)`` cached.
        attention_mask: None (what :func:`attnscope_mask` gives when no key is padding).

    Returns:
        ``(out (B, L, n_heads, D), None)`` as transformers expects.

    Soft-capping (Gemma 2 passes ``softcap=``) and learned sinks (gpt-oss passes ``s_aux=``, the
    module's ``sinks`` parameter, one logit per query head) go to the kernel
    (:func:`attnscope.core.attention.fused.sdpa_with_lse`) and into the Trace's record, so that every
    recomputation applies the same cap and the LSE includes the sink.

    Raises:
        UnsupportedModelError: a padding or custom mask, or a batch of several sequences while capturing.
    """
    softcap = kwargs.get("softcap")
    sinks = kwargs.get("s_aux")
    if sinks is None:
        sinks = kwargs.get("sinks")
    if attention_mask is not None:
        kind = "a padding mask" if getattr(attention_mask, "ndim", 2) == 2 else "a custom attention mask"
        raise UnsupportedModelError(f"the model was called with {kind}: {BATCH_REFUSAL}")
    # Mistral passes its window as a keyword only; Qwen2/Gemma set it per layer on the module too. A
    # keyword given as None wins over the module's: EXAONE 4 keeps the window on every layer's module
    # and passes None on its global layers (tests/core/test_families.py, exaone4).
    window = (
        kwargs["sliding_window"] if "sliding_window" in kwargs else getattr(module, "sliding_window", None)
    )
    causal = getattr(module, "is_causal", True)
    capture: TorchTrace | None = getattr(module, "_attnscope_trace", None)
    if query.shape[0] != 1 and capture is not None and capture.enabled:
        raise UnsupportedModelError(
            f"the model was called with a batch of {query.shape[0]} sequences: {BATCH_REFUSAL}"
        )
    overrides = getattr(capture, "overrides", None) if capture is not None else None
    if overrides is not None:  # experiments (attnscope.core.analysis.experiments) may change mask and scale
        out, lse = overrides.attend(module, query, key, value, scaling, window, softcap=softcap, sinks=sinks)
    else:
        # half-precision rows keep the kernel's LSE here; the trace rebuilds it for the rows a view reads
        out, lse = sdpa_with_lse(
            query,
            key,
            value,
            scale=scaling,
            causal=causal,
            sliding_window=window,
            exact_half=False,
            mask_cache=getattr(capture, "mask_cache", None),
            softcap=softcap,
            sinks=sinks,
        )
    if capture is not None:
        capture.record(
            module.layer_idx,
            query,
            lse,
            key,
            scaling if scaling is not None else query.shape[-1] ** -0.5,
            window,
            softcap=softcap,
            sinks=sinks,
        )
    return out.transpose(1, 2).contiguous(), None


def attnscope_mask(
    batch_size,
    q_length,
    kv_length,
    q_offset=0,
    kv_offset=0,
    mask_function=None,
    attention_mask=None,
    **kwargs,
):
    """transformers mask function for ``"attnscope"`` (``AttentionMaskInterface``).

    Args:
        attention_mask: the caller's ``(B, seen + L)`` boolean padding mask, or None.
        kv_length: keys this layer attends to.

    Returns:
        None when there is no padding among the last ``kv_length`` keys (the attention function
        builds the causal / window mask itself), else that ``(B, kv_length)`` boolean mask, which
        :func:`attnscope_attention` refuses: the model path never runs with padding dropped.
    """
    if attention_mask is None:
        return None
    am = attention_mask[:, -kv_length:]
    if am.shape[-1] == kv_length and bool(am.all()):
        return None
    return am


def register_attention() -> None:
    """Register :func:`attnscope_attention` and :func:`attnscope_mask` under ``"attnscope"`` (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, attnscope_attention)
    AttentionMaskInterface.register(ATTN_NAME, attnscope_mask)
    _registered = True
