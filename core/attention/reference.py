"""The attention contract and its numpy reference implementation.

Every attention implementation in AttnScope (this one, the torch fused path
:func:`attnscope.core.attention.fused.attention`, the torch tiled online softmax of tests/flash_reference.py (``flash_attention``)
and the MLX ones in :mod:`attnscope.core.attention.fused_mlx`) follows one contract:

* inputs ``q (B, n_heads, L, D)``, ``k (B, n_kv_heads, S, D)``, ``v (B, n_kv_heads, S, Dv)``;
  ``n_heads`` a multiple of ``n_kv_heads`` (MHA, GQA, MQA). Query head ``h`` reads KV head
  ``h // group_size``; K/V are broadcast over the group, never copied (tiny-llm's GQA);
* ``mask``: anything :func:`attnscope.core.attention.masks.as_mask` accepts (None, ``"causal"`` bottom-right aligned,
  an int sliding window, a boolean or additive array, a :class:`attnscope.core.attention.masks.Mask` combining them);
* ``scale`` defaults to ``1/sqrt(D)`` (Vaswani et al. 2017 §3.2.1);
* scores, softmax and LSE in float32 or wider whatever the input dtype, so ``q·k`` beyond the
  float16 range does not overflow; a row with every key masked gives output 0 and LSE ``-inf``;
* returns :class:`AttentionResult` ``(out, lse, weights)``: ``out (B, n_heads, L, Dv)`` in q's
  dtype; ``lse (B, n_heads, L)`` float32 (natural log of ``Σ_j exp(s_ij)`` over the *scaled,
  masked* scores) and ``weights (B, n_heads, L, S)`` float32 only when asked for.

This module is the reference: plain numpy, computed in float64, written for clarity and used as
ground truth by the tests and by the worked examples (:mod:`attnscope.core.analysis.worked_examples`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from attnscope.core.attention.masks import as_mask, group_heads, to_4d


class AttentionResult(NamedTuple):
    """What every attention implementation returns (framework arrays of the implementation).

    Attributes:
        out: ``(B, n_heads, L, Dv)`` in q's dtype.
        lse: ``(B, n_heads, L)`` float32 log-sum-exp of each row's scaled, masked scores
            (``-inf`` for a fully masked row), or None when not requested.
        weights: ``(B, n_heads, L, S)`` float32 softmax weights (rows sum to 1, or are all 0
            when fully masked), or None when not requested.
    """

    out: Any
    lse: Any = None
    weights: Any = None


class Geometry(NamedTuple):
    """Sizes read off q, k, v by :func:`check_qkv`."""

    B: int
    n_heads: int
    n_kv_heads: int
    group_size: int
    L: int
    S: int
    D: int
    Dv: int


def check_qkv(q_shape, k_shape, v_shape) -> Geometry:
    """Validate q/k/v shapes against the contract and return the sizes.

    Raises:
        ValueError: wrong rank, mismatched batch / head_dim / key count, ``n_heads`` not a
            multiple of ``n_kv_heads``, or an empty query or key axis.
    """
    q_shape, k_shape, v_shape = tuple(q_shape), tuple(k_shape), tuple(v_shape)
    for name, shp in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        if len(shp) != 4:
            raise ValueError(f"{name} must be 4-d (B, heads, seq_len, head_dim), got shape {shp}")
    B, H, L, D = q_shape
    Bk, Hkv, S, Dk = k_shape
    Bv, Hv, Sv, Dv = v_shape
    if (Bk, Bv) != (B, B):
        raise ValueError(f"batch sizes differ: q {B}, k {Bk}, v {Bv}")
    if Dk != D:
        raise ValueError(f"q and k head_dim differ: {D} vs {Dk}")
    if (Hv, Sv) != (Hkv, S):
        raise ValueError(f"k {k_shape} and v {v_shape} differ in n_kv_heads or seq_len")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"n_heads={H} is not a multiple of n_kv_heads={Hkv}")
    if L == 0 or S == 0:
        raise ValueError(f"attention needs at least one query and one key (L={L}, S={S})")
    return Geometry(B, H, Hkv, H // Hkv, L, S, D, Dv)


def default_scale(head_dim: int) -> float:
    """``1 / sqrt(head_dim)`` (Vaswani et al. 2017 §3.2.1; ≈ 0.088 for d_k = 128: tests/core/test_attention_contract.py)."""
    return 1.0 / math.sqrt(head_dim)


def resolve_scale(scale: float | None, head_dim: int) -> float:
    """``scale`` as a float, defaulting to ``1/sqrt(head_dim)``.

    Raises:
        ValueError: a non-finite scale.
    """
    s = default_scale(head_dim) if scale is None else float(scale)
    if not math.isfinite(s):
        raise ValueError(f"scale must be finite, got {scale}")
    return s


def logsumexp(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``log Σ exp(x)`` along ``axis``, stable (max-shifted); ``-inf`` where every entry is ``-inf``."""
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(x - m_safe), axis=axis, keepdims=True)) + m_safe
    return np.squeeze(out, axis=axis)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Stable softmax along ``axis`` in float64; a slice that is all ``-inf`` gives zeros (not NaN).

    Handbook §3: ``softmax(15, 0, 0) = (0.99999969, 1.5e-7, 1.5e-7)``.
    """
    x = np.asarray(x, dtype=np.float64)
    lse = np.expand_dims(logsumexp(x, axis=axis), axis)
    lse_safe = np.where(np.isfinite(lse), lse, np.inf)  # exp(-inf - inf) = 0 for empty rows
    return np.exp(x - lse_safe)


def attention(
    q,
    k,
    v,
    *,
    scale: float | None = None,
    mask=None,
    return_lse: bool = False,
    return_weights: bool = False,
    softcap: float | None = None,
    sinks=None,
) -> AttentionResult:
    """Scaled dot-product attention, the reference: ``softmax(q kᵀ · scale + mask) v``.

    Args:
        q: ``(B, n_heads, L, D)`` array-like (numpy, or anything ``np.asarray`` takes).
        k: ``(B, n_kv_heads, S, D)``; v: ``(B, n_kv_heads, S, Dv)``.
        scale: multiplier of ``q·k``; default ``1/sqrt(D)``.
        mask: see :func:`attnscope.core.attention.masks.as_mask`.
        return_lse, return_weights: also return the per-row LSE / the weights.
        softcap: attention-logit soft-capping (Gemma 2): scores ``cap·tanh(s/cap)`` after the
            scale, before the mask.
        sinks: learned attention sinks (gpt-oss): ``(n_heads,)`` logits, one extra column of every
            row's scores that takes part in the softmax and is then dropped. The LSE includes it;
            the weights over the ``S`` keys sum to ``1 − exp(sink_h − lse)``.

    Returns:
        :class:`AttentionResult` of numpy arrays: out in q's dtype (float32 for non-float
        input), lse and weights float32 (float64 if q is float64).

    Raises:
        ValueError: shapes or mask that break the contract, a cap that is not positive, sinks that
            are not one per query head.

    Math: Vaswani et al. 2017 eq. 1; computed in float64 with the max-shifted softmax, rows
    with no allowed key set to zero (with sinks: all of such a row's mass is on the sink). Written
    as transformers' eager ``modeling_gemma2`` / ``modeling_gpt_oss`` compute it: the cap as
    divide-tanh-multiply; the sink as a concatenated column.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    g = check_qkv(q.shape, k.shape, v.shape)
    m = as_mask(mask)
    m.check_shape(g.B, g.n_heads, g.L, g.S)
    scale = resolve_scale(scale, g.D)

    qg = q.astype(np.float64).reshape(g.B, g.n_kv_heads, g.group_size, g.L, g.D)  # (B, Hkv, G, L, D)
    kg = k.astype(np.float64)[:, :, None]  # (B, Hkv, 1, S, D): broadcast over the group
    vg = v.astype(np.float64)[:, :, None]  # (B, Hkv, 1, S, Dv)
    s = np.matmul(qg, np.swapaxes(kg, -1, -2)) * scale  # (B, Hkv, G, L, S)
    if softcap is not None:
        cap = float(softcap)
        if not (math.isfinite(cap) and cap > 0):
            raise ValueError(f"softcap must be a positive finite number, got {softcap}")
        s = np.tanh(s / cap) * cap
    if not m.is_none:
        s = s + group_heads(to_4d(m.additive(g.L, g.S, np.float64)), g.n_kv_heads)
    if sinks is not None:
        sk = np.asarray(sinks, dtype=np.float64).reshape(-1)
        if sk.size != g.n_heads:
            raise ValueError(f"learned sinks must be one logit per query head ({g.n_heads}), got {sk.size}")
        col = np.broadcast_to(sk.reshape(1, g.n_kv_heads, g.group_size, 1, 1), (*s.shape[:-1], 1))
        s = np.concatenate([s, col], axis=-1)  # (B, Hkv, G, L, S + 1): the sink's column last
    lse = logsumexp(s, axis=-1)  # (B, Hkv, G, L)
    p = softmax(s, axis=-1)
    if sinks is not None:
        p = p[..., :-1]  # the sink's share is dropped: rows sum to less than 1
    out = np.matmul(p, vg).reshape(g.B, g.n_heads, g.L, g.Dv)

    out_dtype = q.dtype if np.issubdtype(q.dtype, np.floating) else np.float32
    stat_dtype = np.float64 if q.dtype == np.float64 else np.float32
    return AttentionResult(
        out.astype(out_dtype),
        lse.reshape(g.B, g.n_heads, g.L).astype(stat_dtype) if return_lse else None,
        p.reshape(g.B, g.n_heads, g.L, g.S).astype(stat_dtype) if return_weights else None,
    )
