"""What a model's attention softmax does beyond ``softmax(q·k·scale + mask)``, read off a Trace.

Two variants exist among the supported families (docs/how-it-works.md), and both are recorded per
layer by the torch trace as the forward ran (:meth:`attnscope.core.trace.torch_trace.TorchTrace.record`):

* **soft-capping** (Gemma 2): scores ``cap·tanh(s / cap)`` before the mask and softmax;
* **learned sinks** (gpt-oss): one logit per query head in every row's denominator, a no-op slot
  that takes ``exp(sink_h − lse_i)`` of row ``i``'s mass and moves no value (Xiao et al. 2023,
  "Efficient Streaming Language Models with Attention Sinks", §3.3: a learnable sink token; gpt-oss
  model card: "a learned bias in the denominator of the softmax").

Traces that record neither (MLX, older remote engines) read as plain softmax everywhere here.
"""

from __future__ import annotations

import numpy as np
from attnscope.core.errors import AttnScopeError


def _recorded(rec, name: str):
    """``rec.name``, or None when the record has none or keeps it elsewhere (a remote engine's stand-in
    records raise :class:`attnscope.core.errors.SessionError`: the tensors stay on the engine)."""
    try:
        return getattr(rec, name, None)
    except AttnScopeError:
        return None


def layer_softcap(trace, layer: int) -> float | None:
    """The attention-logit cap ``layer`` applied, or None (no cap, or a trace that records none)."""
    layers = getattr(trace, "layers", None) or []
    if not 0 <= layer < len(layers):
        return None
    cap = _recorded(layers[layer], "softcap")
    return None if cap is None else float(cap)


def softcaps(trace) -> tuple[float | None, ...]:
    """Every layer's cap (None where none), ``()`` for a trace without layers."""
    return tuple(layer_softcap(trace, i) for i in range(len(getattr(trace, "layers", None) or [])))


def model_softcap(trace) -> float | None:
    """The cap when every capped layer shares one (Gemma 2 does), the largest one otherwise, None if none."""
    caps = [c for c in softcaps(trace) if c is not None]
    return max(caps) if caps else None


def has_learned_sinks(trace) -> bool:
    """True when some layer of ``trace`` recorded learned sink logits."""
    return any(_recorded(r, "sinks") is not None for r in getattr(trace, "layers", None) or [])


def learned_sink_logits(trace, layer: int) -> np.ndarray | None:
    """``(n_heads,)`` float64 learned sink logits of ``layer``, or None."""
    layers = getattr(trace, "layers", None) or []
    if not 0 <= layer < len(layers) or _recorded(layers[layer], "sinks") is None:
        return None
    return np.asarray(layers[layer].sinks.detach().cpu().double().numpy())


def learned_sink_rows(trace) -> np.ndarray | None:
    """Share of every row's softmax mass on the learned sink, ``(n_layers, n_heads, T)`` float32, or
    None when the model has no learned sinks. Row ``i`` of head ``h``: ``exp(sink_h − lse_i)``,
    ``1 − Σ_j w_ij`` over the real keys (:meth:`attnscope.core.trace.torch_trace.TorchTrace.learned_sink_share`);
    0 in layers without sinks. Linear in T.
    """
    if not has_learned_sinks(trace):
        return None
    return np.stack([trace.learned_sink_share(layer) for layer in range(trace.n_layers)]).astype(np.float32)


def describe(trace) -> str:
    """One line on the softmax variant, ``""`` for plain softmax, e.g. ``"scores soft-capped:
    50·tanh(s/50)"`` or ``"learned sinks: one logit per query head joins the softmax denominator"``."""
    parts = []
    cap = model_softcap(trace)
    if cap is not None:
        parts.append(f"scores soft-capped: {cap:g}·tanh(s/{cap:g}) before the softmax")
    if has_learned_sinks(trace):
        parts.append("learned sinks: one logit per query head joins the softmax denominator")
    return "; ".join(parts)


def metadata(trace, layer: int | None = None, head: int | None = None) -> dict:
    """The softmax variant for an export sidecar: ``{"softcap", "learned_sinks"}`` and, for one
    ``layer`` (and ``head``), that layer's cap and the head's sink logit."""
    out: dict = {"softcap": model_softcap(trace), "learned_sinks": has_learned_sinks(trace)}
    if layer is not None:
        out["layer_softcap"] = layer_softcap(trace, layer)
        logits = learned_sink_logits(trace, layer)
        if head is not None:
            out["learned_sink_logit"] = None if logits is None else float(logits[head])
    return out
