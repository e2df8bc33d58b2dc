"""The attention contract (:mod:`attnscope.core.attention.reference`) on MLX arrays.

Two functions:

* :func:`attention` — the MLX reference: scores, softmax and LSE in float32 by broadcasting
  (tiny-llm's GQA: q viewed as ``(B, n_kv_heads, group, L, D)``, k and v as
  ``(B, n_kv_heads, 1, S, D)``; K/V are never tiled), optional LSE and weights.
* :func:`sdpa_with_lse_mlx` — what the MLX backend calls in every layer: the output from
  ``mx.fast.scaled_dot_product_attention`` (fused on Apple silicon) and the per-row LSE computed
  alongside in float32, row block by row block. Same shapes and meaning as
  :func:`attnscope.core.attention.fused.sdpa_with_lse`.

``mx.fast`` alone does not meet the contract in three places, all handled here:

* a row whose every key is masked comes back as NaN (additive ``-inf`` mask) or as a uniform
  average (boolean mask): rows with LSE ``-inf`` are set to 0;
* on the CPU with float16 inputs it forms the scores in float16, so ``q·k·scale`` beyond the
  float16 range gives NaN: when the float32 scores of the LSE pass show that risk, the output
  is taken from the float32 path instead (the Metal kernels accumulate scores in float32; not
  verified here, no Apple GPU);
* on the CPU (mlx 0.32, Linux) it rounds the scores to the input dtype before its float32
  softmax: measured here, bfloat16 outputs off by up to 3.5e-2 (relative) at ``|s| ≈ 86``, an
  error of about ``2⁻⁸·|s|`` (0.48 absolute on a small test, tests/core/test_mlx_backend.py). On the CPU the wrapper
  therefore computes the output from its own float32 scores (which the LSE needs anyway);
  ``mx.fast`` is used on the GPU (Metal), where it is fused. ``fused=`` overrides the choice,
  but for bfloat16 / float16 inputs ``mx.fast`` is used only on a device where a probe
  (:func:`fast_keeps_float32_scores`, once per device and dtype) showed that it does not round
  the scores to the input dtype; elsewhere the float32 pass gives the output;
* a value head size different from the query's (``Dv != D``) always takes the float32 pass.

The LSE is kept as its two FlashAttention parts, the row max ``m`` and ``ℓ = log Σ exp(s − m)``
(``parts=True``), so that the Trace's weights ``exp((s − m) − ℓ)`` do not inherit the float32
rounding of ``m + ℓ`` (0.001 at ``|lse| ≈ 3·10⁴``, docs/exactness.md; Metal has no float64).

mlx is an optional dependency (``pip install attnscope[mlx]``): import this module only where
``import mlx.core`` works.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from attnscope.core.attention.masks import Mask, as_mask, causal_allowed, group_heads, to_4d
from attnscope.core.attention.reference import AttentionResult, check_qkv, resolve_scale

# Query rows per block of the LSE pass: bounds its float32 scores to B × n_heads × ROW_BLOCK × S.
ROW_BLOCK = 1024
# Largest |scaled score| we let mx.fast handle in float16 (float16 max is 65504).
FP16_SAFE_SCORE = 3.0e4


def _as_mx(a) -> mx.array:
    """A numpy / torch / MLX mask array as an MLX array."""
    if isinstance(a, mx.array):
        return a
    return mx.array(np.asarray(a))


def mask_bias_mlx(m: Mask, L: int, S: int, n_kv_heads: int, dtype=mx.float32) -> mx.array | None:
    """The whole mask as one additive MLX array in grouped layout ``(b, h1, g1, L', S')``, or None.

    0 where allowed, ``-inf`` where masked, plus an additive array's own values (see
    :func:`attnscope.core.attention.fused.mask_bias`, the torch twin).
    """
    bias = None
    if m.causal and not (L == 1 and (m.window is None or m.window >= S)):  # a decode row sees all
        # Built with MLX ops on the device (no numpy L × S round trip per layer); same rule as
        # attnscope.core.attention.masks.causal_allowed: key j <= query position i + S - L, and j > that - window.
        q_pos = mx.arange(S - L, S)[:, None]
        k_pos = mx.arange(S)[None, :]
        allowed = k_pos <= q_pos
        if m.window is not None:
            allowed = mx.logical_and(allowed, k_pos > q_pos - m.window)
        bias = mx.where(allowed, mx.array(0.0, dtype=dtype), mx.array(-np.inf, dtype=dtype))
    if m.array is not None:
        a = to_4d(_as_mx(m.array))
        if a.dtype == mx.bool_:
            a = mx.where(a, mx.array(0.0, dtype=dtype), mx.array(-np.inf, dtype=dtype))
        else:
            a = a.astype(dtype)
        bias = a if bias is None else a + bias
    if bias is None:
        return None
    return group_heads(to_4d(bias), n_kv_heads)


def _lse_parts(s: mx.array) -> tuple[mx.array, mx.array]:
    """FlashAttention's ``m`` (row max, 0 on a fully masked row) and ``ℓ = log Σ exp(s − m)``
    (``-inf`` on a fully masked row) of float32 scores, each ``s.shape[:-1]`` float32."""
    mrow = mx.max(s, axis=-1, keepdims=True)
    mrow = mx.where(mx.isinf(mrow), mx.array(0.0), mrow)
    total = mx.sum(mx.exp(s - mrow), axis=-1)
    ell = mx.where(total > 0, mx.log(mx.where(total > 0, total, mx.array(1.0))), mx.array(-np.inf))
    return mx.squeeze(mrow, -1), ell


# (device, dtype) -> whether mx.fast.scaled_dot_product_attention keeps float32 scores there.
_FAST_VERIFIED: dict[tuple[str, str], bool] = {}


def fast_keeps_float32_scores(dtype) -> bool:
    """Whether ``mx.fast.scaled_dot_product_attention`` on the default device forms the scores of
    ``dtype`` inputs in float32 (probed once per device and dtype; float32 inputs: True).

    The probe: one query ``[2048, 1]`` over keys ``[1, 0]`` and ``[1, 1.5]`` (scale 1): float32
    scores 2048 and 2049.5 give the second value weight ``σ(1.5) = 0.8176``; scores rounded to
    bfloat16 (spacing 16 there) or float16 (spacing 2) give 0.5 or 0.8808. All inputs are exact in
    both dtypes, so only the rounding of the scores can move the output.
    """
    if dtype == mx.float32:
        return True
    key = (str(mx.default_device()), str(dtype))
    if key not in _FAST_VERIFIED:
        q = mx.array([[[[2048.0, 1.0]]]]).astype(dtype)
        k = mx.array([[[[1.0, 0.0], [1.0, 1.5]]]]).astype(dtype)
        v = mx.array([[[[0.0, 0.0], [1.0, 1.0]]]]).astype(dtype)
        try:
            out = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0).astype(mx.float32)
            got = float(np.array(out)[0, 0, 0, 0])
        except Exception:  # noqa: BLE001 - a kernel that refuses the probe is not verified
            got = float("nan")
        _FAST_VERIFIED[key] = bool(abs(got - 0.8175745) < 4e-3)
    return _FAST_VERIFIED[key]


def _softmax_lse(s: mx.array) -> tuple[mx.array, mx.array]:
    """Row softmax and LSE of float32 scores; fully masked rows give weights 0 and LSE ``-inf``.

    Normalised as ``exp(s − max) / Σ`` rather than ``exp(s − lse)``: exact to float32 rounding
    even when the scores are large (``lse`` itself then carries an absolute error of ~1 ulp).
    """
    mrow = mx.max(s, axis=-1, keepdims=True)
    mrow = mx.where(mx.isinf(mrow), mx.array(0.0), mrow)
    e = mx.exp(s - mrow)
    total = mx.sum(e, axis=-1, keepdims=True)
    seen = total > 0
    p = e / mx.where(seen, total, mx.array(1.0))
    lse = mx.where(seen, mrow + mx.log(mx.where(seen, total, mx.array(1.0))), mx.array(-np.inf))
    return p, mx.squeeze(lse, -1)


def _scores(qg: mx.array, kg: mx.array, scale: float, bias5: mx.array | None, r0: int, r1: int) -> mx.array:
    """float32 scaled, masked scores of query rows ``r0:r1``: ``(B, Hkv, G, r, S)``."""
    s = mx.matmul(qg[..., r0:r1, :].astype(mx.float32), kg.astype(mx.float32).swapaxes(-1, -2)) * scale
    if bias5 is not None:
        s = s + (bias5 if bias5.shape[-2] == 1 else bias5[..., r0:r1, :])
    return s


def attention(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    *,
    scale: float | None = None,
    mask=None,
    return_lse: bool = False,
    return_weights: bool = False,
) -> AttentionResult:
    """The MLX reference attention: ``softmax(q kᵀ · scale + mask) v`` in float32.

    Args:
        q: ``(B, n_heads, L, D)``; k, v: ``(B, n_kv_heads, S, D)``; float32/float16/bfloat16.
        scale: default ``1/sqrt(D)``.
        mask: anything :func:`attnscope.core.attention.masks.as_mask` accepts (default: no mask).
        return_lse, return_weights: also return LSE ``(B, n_heads, L)`` / weights
            ``(B, n_heads, L, S)``, float32.

    Returns:
        :class:`attnscope.core.attention.reference.AttentionResult` of MLX arrays (out in q's dtype).

    Raises:
        ValueError: shapes or mask that break the contract.
    """
    g = check_qkv(q.shape, k.shape, v.shape)
    m = as_mask(mask)
    m.check_shape(g.B, g.n_heads, g.L, g.S)
    scale = resolve_scale(scale, g.D)
    qg = q.reshape(g.B, g.n_kv_heads, g.group_size, g.L, g.D)  # (B, Hkv, G, L, D)
    kg = mx.expand_dims(k, 2)  # (B, Hkv, 1, S, D): broadcast over the group
    vg = mx.expand_dims(v, 2).astype(mx.float32)
    bias5 = mask_bias_mlx(m, g.L, g.S, g.n_kv_heads)
    s = _scores(qg, kg, scale, bias5, 0, g.L)  # (B, Hkv, G, L, S)
    p, lse = _softmax_lse(s)  # (B, Hkv, G, L, S), (B, Hkv, G, L); -inf on fully masked rows
    out = mx.matmul(p, vg).astype(q.dtype).reshape(g.B, g.n_heads, g.L, g.Dv)
    return AttentionResult(
        out,
        lse.reshape(g.B, g.n_heads, g.L) if return_lse else None,
        p.reshape(g.B, g.n_heads, g.L, g.S) if return_weights else None,
    )


def _fast_mask(m: Mask, L: int, S: int, B: int, n_kv_heads: int, dtype):
    """The mask argument for ``mx.fast.scaled_dot_product_attention``: None, "causal" or an array."""
    if m.is_none:
        return None
    if m.causal and m.window is None and m.array is None and L <= S:
        return "causal"  # mx.fast's causal is lower-right aligned, like ours
    if m.array is None or m.array_is_bool:
        allowed = None
        if m.causal:
            allowed = mx.array(causal_allowed(np.arange(S - L, S), np.arange(S), m.window))
        if m.array is not None:
            a = to_4d(_as_mx(m.array))
            allowed = a if allowed is None else mx.logical_and(a, allowed)
        assert allowed is not None, "a mask that is not none is causal or has an array"
        return to_4d(allowed)
    b5 = mask_bias_mlx(m, L, S, n_kv_heads, dtype=dtype)
    assert b5 is not None, "an additive mask array gives a bias"
    b, h1, g1, Lb, Sb = b5.shape
    return b5.reshape(b, h1 * g1, Lb, Sb)


def sdpa_with_lse_mlx(
    q: mx.array,
    k: mx.array,
    v: mx.array,
    scale: float | None = None,
    mask="causal",
    *,
    fused: bool | None = None,
    parts: bool = False,
):
    """Attention output and per-row LSE on MLX: the MLX backend's per-layer call.

    Args:
        q: ``(B, n_heads, L, D)``; k: ``(B, n_kv_heads, S, D)``, v: ``(B, n_kv_heads, S, Dv)``
            (not tiled for GQA); float32 / float16 / bfloat16.
        scale: multiplier of ``q·k``; default ``D ** -0.5``.
        mask: default ``"causal"`` (bottom-right aligned: a decode row with ``L = 1`` sees every
            cached key); None for no mask; an int sliding window; a boolean / additive array;
            a :class:`attnscope.core.attention.masks.Mask` (e.g. ``Mask(causal=True, window=4096)``).
        fused: True takes the output from ``mx.fast.scaled_dot_product_attention``; False
            computes it from the same float32 scores as the LSE (one pass); None (default)
            picks ``mx.fast`` on the GPU and the float32 pass on the CPU (see module notes).
            Either way bfloat16 / float16 inputs use ``mx.fast`` only where
            :func:`fast_keeps_float32_scores` verified it, and ``Dv != D`` never does.
        parts: return the LSE as its parts ``(m, ℓ)`` (each ``(B, n_heads, L)`` float32,
            ``lse = m + ℓ``) instead of one float32 array.

    Returns:
        ``(out, lse)``: out ``(B, n_heads, L, Dv)`` in q's dtype; lse ``(B, n_heads, L)``
        float32, natural log of ``Σ_j exp(s_ij)`` over the scaled, masked scores (or ``(m, ℓ)``
        with ``parts``); a fully masked row has output 0 and LSE ``-inf`` (``ℓ = -inf``).

    Raises:
        ValueError: shapes or mask that break the contract.
    """
    g = check_qkv(q.shape, k.shape, v.shape)
    m = as_mask(mask)
    m.check_shape(g.B, g.n_heads, g.L, g.S)
    scale = resolve_scale(scale, g.D)
    on_gpu = mx.default_device().type == mx.DeviceType.gpu
    if fused is None:
        fused = on_gpu
    if fused and (g.Dv != g.D or not fast_keeps_float32_scores(q.dtype)):
        fused = False  # tests/core/test_mlx_backend.py: a kernel call that would crash or round the scores
    B, H, Hkv, G, L, S = g.B, g.n_heads, g.n_kv_heads, g.group_size, g.L, g.S
    qg = q.reshape(B, Hkv, G, L, g.D)
    kg = mx.expand_dims(k, 2)
    bias5 = mask_bias_mlx(m, L, S, Hkv)
    ms, ells, outs, smax = [], [], [], []
    for r0 in range(0, L, ROW_BLOCK):
        r1 = min(L, r0 + ROW_BLOCK)
        s = _scores(qg, kg, scale, bias5, r0, r1)  # (B, Hkv, G, r, S) float32
        mrow, ell = _lse_parts(s)  # (B, Hkv, G, r) each
        ms.append(mrow)
        ells.append(ell)
        if fused:
            if q.dtype == mx.float16 and not on_gpu:
                smax.append(mx.max(mx.where(mx.isinf(s), mx.array(0.0), mx.abs(s))))
        else:
            p, _ = _softmax_lse(s)  # exp(s − m) / Σ: exact to float32 rounding, 0 on masked rows
            outs.append(mx.matmul(p, mx.expand_dims(v, 2).astype(mx.float32)))
    mrow = mx.concatenate(ms, axis=-1) if len(ms) > 1 else ms[0]  # (B, Hkv, G, L)
    ell = mx.concatenate(ells, axis=-1) if len(ells) > 1 else ells[0]
    lse = mrow + ell
    if smax and float(mx.max(mx.stack(smax))) * max(1.0, 1.0 / max(abs(scale), 1e-30)) > FP16_SAFE_SCORE:
        return sdpa_with_lse_mlx(q, k, v, scale, m, fused=False, parts=parts)  # float16 scores would overflow
    if fused:
        out = mx.fast.scaled_dot_product_attention(
            q, k, v, scale=scale, mask=_fast_mask(m, L, S, B, Hkv, q.dtype)
        )
        out = out.reshape(B, Hkv, G, L, g.Dv)
        # Only an array mask, or more queries than keys under the causal mask, can leave a row
        # with no key. Otherwise the output does not depend on the LSE, which then stays lazy:
        # MLX computes it only if a caller (the Trace) evaluates it.
        if m.array is not None or (m.causal and L > S):
            out = mx.where(mx.expand_dims(mx.isneginf(lse), -1), mx.array(0.0, dtype=out.dtype), out)
    else:
        out = mx.concatenate(outs, axis=-2) if len(outs) > 1 else outs[0]
    out = out.astype(q.dtype).reshape(B, H, L, g.Dv)
    if parts:
        return out, (mrow.reshape(B, H, L), ell.reshape(B, H, L))
    return out, lse.reshape(B, H, L)
