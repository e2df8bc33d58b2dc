"""Scaled dot-product attention with per-row log-sum-exp (LSE), for torch.

This is the fast path every attention layer of a transformers model runs through when it is loaded
with ``attn_implementation="attnscope"`` (see :mod:`core.backends.torch_backend`).

Shapes (DESIGN.md): q ``(B, n_heads, L, head_dim)``; k, v ``(B, n_kv_heads, S, head_dim)``;
query head ``h`` reads KV head ``h // group_size`` with ``group_size = n_heads // n_kv_heads``.
GQA is done by *viewing* q as ``(B * n_kv_heads, group_size, L, D)`` and k, v as
``(B * n_kv_heads, 1, S, D)`` expanded with stride 0 along the group: K/V are never copied.

The math is softmax attention (Vaswani et al. 2017, eq. 1) computed by a fused FlashAttention
kernel (Dao et al. 2022, alg. 1) that also returns ``lse_i = log Σ_j exp(s_ij)`` for each row,
the quantity :mod:`core.capture` needs to recompute any weight exactly:
``p_ij = exp(s_ij − lse_i)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from core.masks import causal_allowed

# Rows per block in the unfused fallback: bounds its scores buffer to H × ROW_BLOCK × S floats.
ROW_BLOCK = 1024


def _gqa_views(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Views that run GQA on an MHA kernel without copying K/V.

    Returns q ``(B*Hkv, G, L, D)``, k and v ``(B*Hkv, G, S, D)`` (stride 0 along G).
    """
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if H % Hkv:
        raise ValueError(f"n_heads={H} is not a multiple of n_kv_heads={Hkv}")
    G = H // Hkv
    qg = q.reshape(B * Hkv, G, L, D)  # (B*Hkv, G, L, D): heads are kv-major, h = kv*G + g
    kg = k.reshape(B * Hkv, 1, S, D).expand(B * Hkv, G, S, D)  # stride 0 along G
    vg = v.reshape(B * Hkv, 1, S, v.shape[-1]).expand(B * Hkv, G, S, v.shape[-1])
    return qg, kg, vg


def allowed_mask_torch(
    L: int, S: int, device, sliding_window: int | None = None, q_offset: int | None = None
) -> torch.Tensor:
    """Boolean ``(L, S)`` allowed-mask on ``device``; query ``i`` sits at position ``q_offset + i``.

    ``q_offset`` defaults to ``S - L`` (bottom-right aligned causal mask, see :mod:`core.masks`).
    """
    off = S - L if q_offset is None else q_offset
    return torch.from_numpy(causal_allowed(np.arange(off, off + L), np.arange(S), sliding_window)).to(device)


def sdpa_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
    sliding_window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output and per-row LSE through a fused kernel where one exists.

    Args:
        q: ``(B, n_heads, L, D)``, float32 / float16 / bfloat16.
        k, v: ``(B, n_kv_heads, S, D)``; ``n_heads`` a multiple of ``n_kv_heads``.
        scale: multiplier of ``q·k``; default ``D ** -0.5``.
        causal: bottom-right aligned causal mask (query ``i`` sees keys ``j <= i + S - L``).
        sliding_window: each query sees at most this many keys (itself included).

    Returns:
        ``(out, lse)``: out ``(B, n_heads, L, D)`` in q's dtype; lse ``(B, n_heads, L)`` float32
        in natural-log units of the *scaled* scores. A fully masked row has ``lse = -inf``
        and output 0.

    Raises:
        ValueError: on incompatible head counts.
    """
    B, H, L, D = q.shape
    S = k.shape[2]
    scale = D**-0.5 if scale is None else float(scale)
    window = sliding_window if (sliding_window is not None and sliding_window < S) else None
    if not causal and window is None:
        mask = None
        is_causal = False
    elif causal and window is None and (L == 1 or L == S):
        # L == 1: a decode row sees every cached key; L == S: top-left == bottom-right.
        mask, is_causal = None, L == S and L > 1
    else:
        mask = allowed_mask_torch(L, S, q.device, window if causal else None) if causal else None
        if not causal and window is not None:
            raise ValueError("a sliding window without a causal mask is not supported")
        is_causal = False

    if q.device.type == "cpu":
        qg, kg, vg = _gqa_views(q, k, v)
        # the CPU flash kernel takes only an additive mask of q's dtype (not a boolean one)
        bias = None if mask is None else torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qg, kg, vg, 0.0, is_causal, attn_mask=bias, scale=scale
        )
        out = out.reshape(B, H, L, v.shape[-1])
        lse = lse.reshape(B, H, L).float()
        if mask is not None and not bool(mask.any(dim=-1).all()):
            out, lse = _zero_empty_rows(out, lse, mask)
        return out, lse
    if q.device.type == "cuda":
        fused = _cuda_fused(q, k, v, scale, is_causal, mask)
        if fused is not None:
            return fused
    return math_with_lse(q, k, v, scale=scale, causal=causal, sliding_window=sliding_window)


def _zero_empty_rows(out, lse, mask):
    empty = ~mask.any(dim=-1)  # (L,)
    out = out.masked_fill(empty[None, None, :, None], 0.0)
    lse = lse.masked_fill(empty[None, None, :], float("-inf"))
    return out, lse


def _cuda_fused(q, k, v, scale, is_causal, mask):
    """FlashAttention-2 (fp16/bf16, no explicit mask) or memory-efficient attention on CUDA.

    Returns None when neither kernel takes these inputs, so the caller falls back to the
    unfused path. GQA is passed as a stride-0 expanded view, as on the CPU.
    """
    B, H, L, D = q.shape
    qg, kg, vg = _gqa_views(q, k, v)
    try:
        if mask is None and q.dtype in (torch.float16, torch.bfloat16):
            res = torch.ops.aten._scaled_dot_product_flash_attention(
                qg, kg, vg, 0.0, is_causal, False, scale=scale
            )
            out, lse = res[0], res[1]
        else:
            bias = None
            if mask is not None:
                bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
                bias = bias.expand(qg.shape[0], qg.shape[1], L, k.shape[2])
            res = torch.ops.aten._scaled_dot_product_efficient_attention(
                qg, kg, vg, bias, True, 0.0, is_causal, scale=scale
            )
            out, lse = res[0], res[1][..., :L]
    except (RuntimeError, NotImplementedError):
        return None
    return out.reshape(B, H, L, v.shape[-1]), lse.reshape(B, H, L).float()


def math_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
    sliding_window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unfused reference-quality attention in float32, blocked over query rows.

    Same contract as :func:`sdpa_with_lse`. Memory: ``B × n_heads × ROW_BLOCK × S`` floats at
    a time, never the full ``L × S`` map for long inputs.
    """
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = H // Hkv
    scale = D**-0.5 if scale is None else float(scale)
    qf = q.float().reshape(B, Hkv, G, L, D)  # (B, Hkv, G, L, D)
    kf = k.float()[:, :, None]  # (B, Hkv, 1, S, D): broadcast over the group
    vf = v.float()[:, :, None]
    outs, lses = [], []
    for r0 in range(0, L, ROW_BLOCK):
        r1 = min(L, r0 + ROW_BLOCK)
        s = torch.matmul(qf[..., r0:r1, :], kf.transpose(-1, -2)) * scale  # (B, Hkv, G, r, S)
        if causal:
            allowed = allowed_mask_torch(r1 - r0, S, q.device, sliding_window, q_offset=S - L + r0)
            s = s.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # (B, Hkv, G, r)
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        outs.append(torch.matmul(p, vf))
        lses.append(lse)
    out = torch.cat(outs, dim=-2).reshape(B, H, L, v.shape[-1]).to(q.dtype)
    return out, torch.cat(lses, dim=-1).reshape(B, H, L)


def default_scale(head_dim: int) -> float:
    """``1 / sqrt(head_dim)`` (Vaswani et al. 2017 §3.2.1; seed 002: ≈ 0.088 for d_k = 128)."""
    return 1.0 / math.sqrt(head_dim)
