"""Tiled online-softmax attention in torch: FlashAttention-2's forward pass, written out.

A reference for the tests (tests/core/test_flash.py, tests/core/test_attention_contract.py,
tests/core/test_precision_lse.py): no product path runs it; the fused path
(attnscope.core.attention.fused) must agree with it and with the numpy reference.
It follows Algorithm 1 of FlashAttention-2 (Dao 2023) block by block; the ``T × T`` score matrix
is never materialised, only one ``block_q × block_k`` tile of it at a time:

for each block ``Q_i`` of ``block_q`` query rows::

    m_i = -inf, l_i = 0, O_i = 0                         running max, running sum, accumulator
    for each block K_j, V_j of block_k keys:
        S_ij   = Q_i K_jᵀ · scale + mask_ij             one tile of scores (float32)
        m_new  = max(m_i, rowmax(S_ij))
        P_ij   = exp(S_ij − m_new)
        l_i    = exp(m_i − m_new) · l_i + rowsum(P_ij)  rescale the old sum, add the new one
        O_i    = exp(m_i − m_new) · O_i + P_ij V_j      rescale the accumulator likewise
        m_i    = m_new
    O_i = O_i / l_i ;  LSE_i = m_i + log(l_i)           one division at the very end (FA-2)

Fully masked tiles: while a row has seen no allowed key its running max is ``-inf``; the
exponentials are taken against 0 instead (``exp(-inf) = 0``), so the row's sum and accumulator
stay 0 and ``exp(m_i − m_new)`` never evaluates ``-inf − (-inf)``. A row that never sees an
allowed key ends with ``l_i = 0``: output 0, LSE ``-inf``, as the contract says.
Tiles the causal / window mask forbids entirely are skipped without computing them
(``skip_masked_blocks``), as FA-2 does above the diagonal.

Same contract as :func:`attnscope.core.attention.reference.attention` (masks, GQA by broadcasting, float32 softmax).
"""

from __future__ import annotations

import numpy as np
import torch
from attnscope.core.attention.fused import attention_weights, mask_bias
from attnscope.core.attention.masks import as_mask
from attnscope.core.attention.reference import AttentionResult, check_qkv, resolve_scale


def _tile(bias5: torch.Tensor | None, r0: int, r1: int, c0: int, c1: int):
    """Tile ``[r0:r1, c0:c1]`` of a grouped bias whose last two dims may broadcast (size 1)."""
    if bias5 is None:
        return None
    rs = slice(None) if bias5.shape[-2] == 1 else slice(r0, r1)
    cs = slice(None) if bias5.shape[-1] == 1 else slice(c0, c1)
    return bias5[..., rs, cs]


def _tile_allowed(
    L: int, S: int, window: int | None, r0: int, r1: int, c0: int, c1: int, device
) -> torch.Tensor:
    """Causal / window ``(r, c)`` boolean tile: query row ``i`` (position ``i + S − L``) sees key ``j``
    iff ``j <= pos`` and, with a window ``W``, ``j > pos − W`` (:mod:`attnscope.core.attention.masks`)."""
    pos = torch.arange(r0, r1, device=device)[:, None] + (S - L)
    j = torch.arange(c0, c1, device=device)[None, :]
    allowed = j <= pos
    if window is not None:
        allowed &= j > pos - window
    return allowed


def _block_is_masked(
    L: int, S: int, causal: bool, window: int | None, r0: int, r1: int, c0: int, c1: int
) -> bool:
    """True when the causal / window mask forbids every (query, key) pair of the tile.

    Query row ``i`` sits at position ``p = i + S − L`` and sees keys ``p − W < j <= p``.
    """
    if not causal:
        return False
    first_pos, last_pos = r0 + S - L, r1 - 1 + S - L
    if c0 > last_pos:  # every key of the tile lies after the last query: above the diagonal
        return True
    return window is not None and c1 - 1 <= first_pos - window  # all keys left of the window


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    mask=None,
    block_q: int = 64,
    block_k: int = 64,
    skip_masked_blocks: bool = True,
    return_lse: bool = False,
    return_weights: bool = False,
) -> AttentionResult:
    """Attention by tiles with an online softmax (FlashAttention-2, Dao 2023, Algorithm 1).

    Args:
        q: ``(B, n_heads, L, D)``; k, v: ``(B, n_kv_heads, S, D)``; float32/float16/bfloat16.
            GQA: each tile of q is viewed as ``(B, n_kv_heads, group, block_q, D)`` against
            K/V tiles ``(B, n_kv_heads, 1, block_k, D)`` (broadcast, never copied).
        scale: default ``1/sqrt(D)``.
        mask: anything :func:`attnscope.core.attention.masks.as_mask` accepts (default: no mask).
        block_q, block_k: tile sizes (FA-2's ``B_r``, ``B_c``), positive ints.
        skip_masked_blocks: skip tiles the causal / window mask forbids entirely.
        return_lse: also return the LSE ``m + log l`` the algorithm ends with (float64: ``m``
            and ``l`` are float32, combined without rounding the sum back to float32).
        return_weights: also return the weights, recomputed tile-free as ``exp(S − LSE)``
            (the materialised ``L × S`` float32 matrix flash avoids: for small inputs only).

    Returns:
        :class:`attnscope.core.attention.reference.AttentionResult`: out in q's dtype, lse ``(B, n_heads, L)``
        float64, weights ``(B, n_heads, L, S)`` float32 (when requested).

    Raises:
        ValueError: shapes or mask that break the contract, non-positive block sizes.
    """
    g = check_qkv(q.shape, k.shape, v.shape)
    if int(block_q) <= 0 or int(block_k) <= 0:
        raise ValueError(f"block sizes must be positive, got block_q={block_q}, block_k={block_k}")
    m = as_mask(mask)
    m.check_shape(g.B, g.n_heads, g.L, g.S)
    scale = resolve_scale(scale, g.D)
    B, Hkv, G, L, S, D, Dv = g.B, g.n_kv_heads, g.group_size, g.L, g.S, g.D, g.Dv
    # An array mask is the caller's (b, h, L, S) already; the causal / window part is built per
    # tile from positions, so no L × S tensor is made for it.
    bias5 = mask_bias(
        L, S, Hkv, causal=False, sliding_window=None, array=m.array, dtype=torch.float32, device=q.device
    )

    qg = q.reshape(B, Hkv, G, L, D)  # (B, Hkv, G, L, D)
    kg = k[:, :, None]  # (B, Hkv, 1, S, D)
    vg = v[:, :, None]  # (B, Hkv, 1, S, Dv)
    out = torch.empty((B, Hkv, G, L, Dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hkv, G, L), dtype=torch.float64, device=q.device)  # m + log ℓ, see below
    neg_inf = float("-inf")

    for r0 in range(0, L, block_q):
        r1 = min(L, r0 + block_q)
        q_i = qg[..., r0:r1, :].float()  # (B, Hkv, G, r, D)
        m_i = torch.full((B, Hkv, G, r1 - r0), neg_inf, device=q.device)  # running max
        l_i = torch.zeros((B, Hkv, G, r1 - r0), device=q.device)  # running sum
        o_i = torch.zeros((B, Hkv, G, r1 - r0, Dv), device=q.device)  # unnormalised accumulator
        for c0 in range(0, S, block_k):
            c1 = min(S, c0 + block_k)
            if skip_masked_blocks and _block_is_masked(L, S, m.causal, m.window, r0, r1, c0, c1):
                continue
            s_ij = torch.matmul(q_i, kg[..., c0:c1, :].float().transpose(-1, -2)) * scale  # (B,Hkv,G,r,c)
            b = _tile(bias5, r0, r1, c0, c1)
            if b is not None:
                s_ij = s_ij + b
            if m.causal:
                s_ij = s_ij.masked_fill(
                    ~_tile_allowed(L, S, m.window, r0, r1, c0, c1, q.device), float("-inf")
                )
            m_new = torch.maximum(m_i, s_ij.amax(dim=-1))
            m_ref = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)  # no -inf - -inf
            p_ij = torch.exp(s_ij - m_ref[..., None])
            alpha = torch.exp(m_i - m_ref)  # rescales what was accumulated against the old max
            l_i = alpha * l_i + p_ij.sum(dim=-1)
            o_i = alpha[..., None] * o_i + torch.matmul(p_ij, vg[..., c0:c1, :].float())
            m_i = m_new
        seen = l_i > 0
        out[..., r0:r1, :] = torch.where(
            seen[..., None], o_i / torch.where(seen, l_i, torch.ones_like(l_i))[..., None], 0.0
        ).to(q.dtype)
        # m and ℓ are kept apart to the end and combined in float64: a float32 m + log ℓ loses
        # half an ulp of m (0.001 at |m| ≈ 3·10⁴), which every weight exp(s − lse) would inherit.
        l64 = l_i.double()
        lse[..., r0:r1] = torch.where(
            seen, m_i.double() + torch.log(torch.where(seen, l64, torch.ones_like(l64))), neg_inf
        )

    out = out.reshape(B, g.n_heads, L, Dv)
    lse = lse.reshape(B, g.n_heads, L)
    weights = attention_weights(q, k, lse, scale=scale, mask=m) if return_weights else None
    return AttentionResult(out, lse if return_lse else None, weights)


def online_softmax_trace(scores, block: int) -> list[dict]:
    """The online softmax of one row of scores, block by block (Milakov and Gimelshein 2018), for teaching views.

    Args:
        scores: 1-d array of (scaled, masked) scores; ``-inf`` entries are masked keys.
        block: keys per block.

    Returns:
        One dict per block: ``start``, ``stop``, ``block_max``, ``m`` (running max after the
        block), ``l`` (running sum, relative to ``m``), ``alpha`` (the factor the previous sum
        was rescaled by) and ``weights`` (the row's softmax as known so far, length ``len(scores)``;
        exact after the last block).

    Raises:
        ValueError: a non-positive block.
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    if block <= 0:
        raise ValueError(f"block must be positive, got {block}")
    m, total, steps = -np.inf, 0.0, []
    for c0 in range(0, len(s), block):
        c1 = min(len(s), c0 + block)
        bmax = float(np.max(s[c0:c1]))
        m_new = max(m, bmax)
        m_ref = m_new if np.isfinite(m_new) else 0.0
        alpha = float(np.exp(m - m_ref))
        total = alpha * total + float(np.sum(np.exp(s[c0:c1] - m_ref)))
        m = m_new
        w = np.zeros_like(s)
        if total > 0:
            w[:c1] = np.exp(s[:c1] - m_ref) / total
        steps.append(
            {"start": c0, "stop": c1, "block_max": bmax, "m": m, "l": total, "alpha": alpha, "weights": w}
        )
    return steps
