"""Scaled dot-product attention with per-row log-sum-exp (LSE), for torch.

This is the fast path every attention layer of a transformers model runs through when it is loaded
with ``attn_implementation="attnscope"`` (see :mod:`attnscope.core.backends.torch_backend`).

Shapes (docs/how-it-works.md): q ``(B, n_heads, L, head_dim)``; k, v ``(B, n_kv_heads, S, head_dim)``;
query head ``h`` reads KV head ``h // group_size`` with ``group_size = n_heads // n_kv_heads``.
GQA is done by *viewing* q as ``(B * n_kv_heads, group_size, L, D)`` and k, v as
``(B * n_kv_heads, 1, S, D)`` expanded with stride 0 along the group: K/V are never copied.

The math is softmax attention (Vaswani et al. 2017, eq. 1) computed by a fused FlashAttention
kernel (Dao et al. 2022, alg. 1) that also returns ``lse_i = log Σ_j exp(s_ij)`` for each row,
the quantity :mod:`attnscope.core.trace.torch_trace` needs to recompute any weight exactly:
``p_ij = exp(s_ij − lse_i)``.

:func:`attention` is the contract of :mod:`attnscope.core.attention.reference` (any mask, optional LSE and weights)
on torch tensors; :func:`sdpa_with_lse` is the per-layer call the torch backend makes.
Scores and softmax are float32 in every path (the CPU flash kernel and CUDA kernels accumulate
in float32), so float16 ``q·k`` beyond 65504 does not overflow; fully masked rows give 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from attnscope.core.attention import reference
from attnscope.core.attention.masks import Mask, as_mask, causal_allowed, group_heads, to_4d
from attnscope.core.attention.reference import AttentionResult, check_qkv, resolve_scale

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

    ``q_offset`` defaults to ``S - L`` (bottom-right aligned causal mask, see :mod:`attnscope.core.attention.masks`).
    """
    off = S - L if q_offset is None else q_offset
    return torch.from_numpy(causal_allowed(np.arange(off, off + L), np.arange(S), sliding_window)).to(device)


def _as_torch(a, device) -> torch.Tensor:
    """A numpy / torch / MLX mask array as a torch tensor on ``device`` (no copy when possible)."""
    if isinstance(a, torch.Tensor):
        return a.to(device)
    return torch.from_numpy(np.asarray(a)).to(device)


def mask_bias(
    L: int,
    S: int,
    n_kv_heads: int,
    *,
    causal: bool,
    sliding_window: int | None,
    array=None,
    dtype: torch.dtype = torch.float32,
    device="cpu",
) -> torch.Tensor | None:
    """The whole mask as one additive tensor in grouped layout, or None when nothing is masked.

    Args:
        L, S: query rows and keys; queries sit at positions ``S - L .. S - 1`` (bottom-right).
        n_kv_heads: to group a per-head array as ``(b, n_kv_heads, group, L, S)``.
        causal, sliding_window: the structural part (see :mod:`attnscope.core.attention.masks`).
        array: optional boolean (True = attend) or additive array broadcastable to
            ``(B, n_heads, L, S)`` (numpy, torch or MLX).
        dtype, device: of the result.

    Returns:
        ``(b, h1, g1, L', S')`` with ``b`` 1 or B, ``(h1, g1)`` either ``(1, 1)`` or
        ``(n_kv_heads, group_size)``, ``L'``/``S'`` as given or 1 where the array broadcasts:
        0 where allowed, ``-inf`` where masked, plus the array's own values if additive.
    """
    bias = None
    if causal:
        allowed = allowed_mask_torch(L, S, device, sliding_window)
        bias = torch.zeros((L, S), dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))
    if array is not None:
        a = to_4d(_as_torch(array, device))
        if a.dtype == torch.bool:
            a = torch.zeros(a.shape, dtype=dtype, device=device).masked_fill(~a, float("-inf"))
        else:
            a = a.to(dtype)
        bias = a if bias is None else a + bias
    if bias is None:
        return None
    return group_heads(to_4d(bias), n_kv_heads)


def _kernel_bias(bias5: torch.Tensor, B: int, Hkv: int, G: int) -> torch.Tensor:
    """Grouped bias ``(b, h1, g1, L, S)`` -> a mask the MHA kernel broadcasts over ``(B*Hkv, G, L, S)``."""
    b, h1, g1, L, S = bias5.shape
    if b == 1 and h1 == 1:
        return bias5[0]  # (1, g1, L, S)
    return bias5.expand(B, Hkv, g1, L, S).reshape(B * Hkv, g1, L, S)


def _empty_rows(bias5: torch.Tensor, B: int, Hkv: int, G: int, L: int) -> torch.Tensor | None:
    """``(B, n_heads, L)`` bool, True where every key of the row is masked; None if no such row."""
    empty = torch.isneginf(bias5).all(dim=-1)  # (b, h1, g1, L')
    if not bool(empty.any()):
        return None
    return empty.expand(B, Hkv, G, L).reshape(B, Hkv * G, L)


def sdpa_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
    sliding_window: int | None = None,
    mask=None,
    exact_half: bool = True,
    mask_cache: MaskCache | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output and per-row LSE through a fused kernel where one exists.

    Args:
        q: ``(B, n_heads, L, D)``, float32 / float16 / bfloat16.
        k, v: ``(B, n_kv_heads, S, D)``; ``n_heads`` a multiple of ``n_kv_heads``.
        scale: multiplier of ``q·k``; default ``D ** -0.5``.
        causal: bottom-right aligned causal mask (query ``i`` sees keys ``j <= i + S - L``).
        sliding_window: each query sees at most this many keys (itself included); needs causal.
        mask: optional extra array, boolean (True = attend) or additive, broadcastable to
            ``(B, n_heads, L, S)``, combined with the causal/window mask. Additive values are
            cast to q's dtype for the fused kernels.

    Returns:
        ``(out, lse)``: out ``(B, n_heads, L, Dv)`` in q's dtype; lse ``(B, n_heads, L)``
        **float64** in natural-log units of the *scaled* scores, exact enough that the weights
        ``exp(s − lse)`` carry under ~1e-6 relative error from it (:func:`exact_lse`). A fully
        masked row has ``lse = -inf`` and output 0. Scores and softmax are accumulated in
        float32 by every path. ``Dv != D`` (an MLA-style value head) takes the unfused path:
        the fused kernels need equal head sizes. ``exact_half=False`` keeps the kernel's LSE for
        float16/bfloat16 inputs (~5e-5 off on the CPU kernels) instead of an extra float32 scores
        pass over every row: the model path does this and lets the trace rebuild the LSE of the
        rows a view asks for (:meth:`attnscope.core.trace.torch_trace.TorchTrace.weights`), so prefill stays at the
        kernel's speed. Rows with ``|lse| > 16`` are always redone in float64.
        ``mask_cache``: a :class:`MaskCache` the caller owns (a Trace: every layer of a forward chunk
        has the same structural mask, built once then); None builds the mask on each call.
        ``softcap``: attention-logit soft-capping (Gemma 2): scores become ``cap·tanh(s/cap)``
        after scaling, before the mask (:func:`softcap_scores`). No fused CPU kernel applies a
        function to the scores, so these calls take the unfused float32 path
        (:func:`math_with_lse`, blocked over rows). Measured for a 512-token chunk, 8 heads,
        D = 64, warm, on a busy 2-core machine: 1.0–1.1 s, against 1.2–1.6 s for FlexAttention's
        ``score_mod`` (unfused without ``torch.compile``; compiled on the CPU it cannot return the
        LSE) and 0.12–0.18 s for the fused kernel without a cap.
        ``sinks``: learned attention sinks (gpt-oss), one logit per query head, ``(n_heads,)``:
        a no-op slot in every row's softmax denominator (:func:`add_learned_sinks`). The
        returned LSE then includes the sink, ``lse' = logaddexp(lse, sink_h)``, so the weights
        ``exp(s − lse')`` over real keys sum to ``1 − exp(sink_h − lse')``.

    Raises:
        ValueError: on incompatible shapes, a window without the causal mask, a bad mask array,
            a non-positive cap, or sinks that are not one logit per query head.
    """
    if softcap is not None or sinks is not None:
        return _capped_or_sunk(
            q, k, v, scale, causal, sliding_window, mask, exact_half, mask_cache, softcap, sinks
        )
    out, lse = _sdpa_kernel_lse(
        q, k, v, scale=scale, causal=causal, sliding_window=sliding_window, mask=mask, mask_cache=mask_cache
    )
    return out, exact_lse(
        q,
        k,
        lse,
        scale=scale,
        causal=causal,
        sliding_window=sliding_window,
        mask=mask,
        half_rows=exact_half,
        mask_cache=mask_cache,
    )


def check_softcap(softcap: float | None) -> float | None:
    """``softcap`` as a float (None stays None).

    Raises:
        ValueError: a cap that is not finite and positive.
    """
    if softcap is None:
        return None
    cap = float(softcap)
    if not (math.isfinite(cap) and cap > 0):
        raise ValueError(f"softcap must be a positive finite number, got {softcap}")
    return cap


def softcap_scores(s: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """Attention-logit soft-capping in place: ``s ← cap·tanh(s / cap)``; ``s`` unchanged for None.

    The scaled scores, before the mask (Gemma 2; transformers' ``modeling_gemma2.eager_attention_forward``
    divides, takes tanh, multiplies, in this order, which this follows operation for operation).
    Every recomputation of capped weights (the trace, its tiles and overviews) goes through here.
    """
    if softcap is None:
        return s
    return s.div_(softcap).tanh_().mul_(softcap)


def add_learned_sinks(
    out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Join a learned sink logit per query head to every row's softmax denominator.

    gpt-oss (transformers' ``modeling_gpt_oss.eager_attention_forward``) appends ``sink_h`` as an
    extra column of the scores, softmaxes, and drops that column. Equivalently, from the attention
    of the real keys (``out``, ``lse``)::

        lse' = logaddexp(lse, sink_h),     out' = exp(lse − lse') · out

    exact, and no pass over the scores. A fully masked row (``lse = -inf``) gets ``lse' = sink_h``
    and output 0: all of its mass sits on the sink.

    Args:
        out: ``(B, n_heads, L, Dv)``; lse: ``(B, n_heads, L)`` float64 (any float dtype).
        sinks: ``(n_heads,)`` sink logits (any float dtype, any device: moved to lse's).

    Returns:
        ``(out', lse')``: out' in out's dtype, lse' float64.

    Raises:
        ValueError: ``sinks`` is not one value per query head.
    """
    H = out.shape[1]
    sk = sinks.detach().reshape(-1).to(device=lse.device, dtype=torch.float64)
    if sk.numel() != H:
        raise ValueError(
            f"learned sinks must be one logit per query head ({H}), got shape {tuple(sinks.shape)}"
        )
    lse64 = lse.double()
    lse2 = torch.logaddexp(lse64, sk[None, :, None].expand_as(lse64))
    keep = torch.exp(lse64 - lse2)  # (B, H, L): the real keys' share of the row
    return (out.float() * keep.float()[..., None]).to(out.dtype), lse2


def _capped_or_sunk(q, k, v, scale, causal, sliding_window, mask, exact_half, mask_cache, softcap, sinks):
    """:func:`sdpa_with_lse` with a soft cap (the unfused float32 path) and/or learned sinks."""
    cap = check_softcap(softcap)
    if cap is None:
        out, lse = sdpa_with_lse(
            q,
            k,
            v,
            scale=scale,
            causal=causal,
            sliding_window=sliding_window,
            mask=mask,
            exact_half=exact_half,
            mask_cache=mask_cache,
        )
    else:
        if sliding_window is not None and not causal:
            raise ValueError("a sliding window without a causal mask is not supported")
        out, lse = _math_f32(
            q, k, v, scale=scale, causal=causal, sliding_window=sliding_window, mask=mask, softcap=cap
        )
        lse = exact_lse(
            q,
            k,
            lse,
            scale=scale,
            causal=causal,
            sliding_window=sliding_window,
            mask=mask,
            mask_cache=mask_cache,
            softcap=cap,
        )
    if sinks is not None:
        out, lse = add_learned_sinks(out, lse, sinks)
    return out, lse


def _sdpa_kernel_lse(q, k, v, *, scale, causal, sliding_window, mask, mask_cache=None):
    """:func:`sdpa_with_lse` with the kernel's own float32 LSE (before :func:`exact_lse`)."""
    g = check_qkv(q.shape, k.shape, v.shape)
    B, H, L, D = q.shape
    Hkv, S, G = g.n_kv_heads, g.S, g.group_size
    scale = resolve_scale(scale, D)
    if sliding_window is not None and not causal:
        raise ValueError("a sliding window without a causal mask is not supported")
    if sliding_window is not None and sliding_window <= 0:
        raise ValueError(f"sliding window must be positive, got {sliding_window}")
    if mask is not None:
        Mask(array=mask).check_shape(B, H, L, S)
    window = sliding_window if (sliding_window is not None and sliding_window < S) else None
    if v.shape[-1] != D:  # the fused kernels take one head size for q, k and v (tests/core/test_flash.py)
        return _math_f32(q, k, v, scale=scale, causal=causal, sliding_window=sliding_window, mask=mask)
    is_causal = False
    structural = causal
    if causal and window is None and mask is None and (L == 1 or L == S):
        # L == 1: a decode row sees every cached key; L == S: top-left == bottom-right.
        structural, is_causal = False, L == S and L > 1

    if q.device.type == "cpu":
        if structural and window is None and mask is None and L < S and q.dtype == torch.float32:
            split = _prefix_then_diagonal(q, k, v, scale)  # a prefill chunk after cached keys
            if split is not None:
                return split
        bias5, empty = _bias_and_empty(
            L, S, B, Hkv, G, structural, window, mask, q.dtype, q.device, mask_cache
        )
        qg, kg, vg = _gqa_views(q, k, v)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qg,
            kg,
            vg,
            0.0,
            is_causal,
            attn_mask=None if bias5 is None else _kernel_bias(bias5, B, Hkv, G),
            scale=scale,
        )
        out = out.reshape(B, H, L, v.shape[-1])
        lse = lse.reshape(B, H, L).float()
        return _zero_empty_rows(out, lse, empty)
    if q.device.type == "cuda":
        bias5, empty = _bias_and_empty(
            L, S, B, Hkv, G, structural, window, mask, q.dtype, q.device, mask_cache
        )
        fused = _cuda_fused(q, k, v, scale, is_causal, bias5)
        if fused is not None:
            out, lse = fused
            return _zero_empty_rows(out, lse, empty)
    return _math_f32(q, k, v, scale=scale, causal=causal, sliding_window=sliding_window, mask=mask)


# Above this |LSE| the merge of two partial softmaxes loses precision (fp32 LSE's ulp at 32 is
# 3.8e-6, which becomes the relative error of the merge weights): use the masked call instead.
SPLIT_MAX_LSE = 32.0


def _cpu_flash(q, k, v, scale, is_causal):
    """The CPU flash kernel without a mask: ``(out (B, H, L, D), lse (B, H, L) float32)``."""
    B, H, L, _ = q.shape
    qg, kg, vg = _gqa_views(q, k, v)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        qg, kg, vg, 0.0, is_causal, scale=scale
    )
    return out.reshape(B, H, L, v.shape[-1]), lse.reshape(B, H, L).float()


def _prefix_then_diagonal(q, k, v, scale):
    """Causal attention of ``1 < L < S`` float32 rows after ``P = S − L`` cached keys, or None.

    Every new row sees all ``P`` cached keys, and the last ``L`` keys form an ``L × L`` causal
    block (top-left aligned there). Two unmasked fused calls, merged by their LSEs
    (FlashAttention's combination of partial softmaxes, Dao et al. 2022, alg. 1 lines 10-12)::

        lse = logaddexp(lse_1, lse_2),   out = exp(lse_1 − lse)·out_1 + exp(lse_2 − lse)·out_2

    Equal to one call with an ``L × S`` additive mask, without the mask and without the kernel's
    work on the masked half of the last block. Returns None (caller takes the masked call) when
    any ``|lse| > SPLIT_MAX_LSE``, where the merge would lose precision.
    """
    P = k.shape[2] - q.shape[2]
    out1, lse1 = _cpu_flash(q, k[:, :, :P], v[:, :, :P], scale, False)  # (B, H, L, D), (B, H, L)
    out2, lse2 = _cpu_flash(q, k[:, :, P:], v[:, :, P:], scale, True)
    lse = torch.logaddexp(lse1, lse2)
    if float(torch.maximum(lse1.abs().max(), lse2.abs().max())) > SPLIT_MAX_LSE:
        return None
    out = out1.mul_(torch.exp(lse1 - lse)[..., None]).add_(out2.mul_(torch.exp(lse2 - lse)[..., None]))
    return out, lse


class MaskCache:
    """The structural masks (causal + window, no extra array) of the last forward, one slot per use.

    Every layer of one forward chunk has the same ``(L, S, window)``, so with a cache its mask is
    built once per chunk, not once per layer (saves ~3 % of a chunked 2048-token prefill on the
    CPU, and the per-layer allocations). Slots: ``"kernel"`` (the fused kernel's bias and empty
    rows, :func:`_bias_and_empty`) and ``"lse"`` (:func:`exact_lse`'s float32 bias). Owned by
    whoever runs the forwards (a :class:`attnscope.core.trace.torch_trace.TorchTrace` keeps one, used from
    the backend's thread) and passed explicitly: the attention path keeps no module-level state.
    """

    __slots__ = ("_slots",)

    def __init__(self) -> None:
        self._slots: dict[str, tuple] = {}

    def get(self, slot: str, key: tuple, build: Callable[[], object]):
        """The value kept in ``slot`` when it was built for ``key``, else ``build()`` (then kept there)."""
        kept = self._slots.get(slot)
        if kept is not None and kept[0] == key:
            return kept[1]
        value = build()
        self._slots[slot] = (key, value)
        return value

    def key(self, slot: str) -> tuple | None:
        """The key ``slot`` holds a mask for (None: empty)."""
        kept = self._slots.get(slot)
        return None if kept is None else kept[0]

    def clear(self) -> None:
        self._slots = {}


def _bias_and_empty(L, S, B, Hkv, G, causal, window, mask, dtype, device, cache: MaskCache | None = None):
    """``(bias5, empty)``: :func:`mask_bias` and :func:`_empty_rows` of one call (None, None if unmasked);
    kept in ``cache`` (slot ``"kernel"``) when there is no array mask."""

    def build():
        bias5 = mask_bias(
            L, S, Hkv, causal=causal, sliding_window=window, array=mask, dtype=dtype, device=device
        )
        return bias5, None if bias5 is None else _empty_rows(bias5, B, Hkv, G, L)

    if mask is not None or cache is None:
        return build()
    return cache.get("kernel", (L, S, B, Hkv, G, causal, window, dtype, str(device)), build)


def _zero_empty_rows(out, lse, empty):
    """Output 0 and LSE -inf on fully masked rows (``empty`` (B, H, L) bool or None)."""
    if empty is None:
        return out, lse
    out = out.masked_fill(empty[..., None], 0.0)
    lse = lse.masked_fill(empty, float("-inf"))
    return out, lse


def _cuda_fused(q, k, v, scale, is_causal, bias5):
    """FlashAttention-2 (fp16/bf16, no explicit mask) or memory-efficient attention on CUDA.

    Returns None when neither kernel takes these inputs, so the caller falls back to the
    unfused path. GQA is passed as a stride-0 expanded view, as on the CPU.
    """
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = H // Hkv
    qg, kg, vg = _gqa_views(q, k, v)
    try:
        if bias5 is None and q.dtype in (torch.float16, torch.bfloat16):
            res = torch.ops.aten._scaled_dot_product_flash_attention(
                qg, kg, vg, 0.0, is_causal, False, scale=scale
            )
            out, lse = res[0], res[1]
        else:
            bias = None
            if bias5 is not None:
                bias = bias5.expand(B, Hkv, G, L, S).reshape(B * Hkv, G, L, S)
            res = torch.ops.aten._scaled_dot_product_efficient_attention(
                qg, kg, vg, bias, True, 0.0, is_causal, scale=scale
            )
            out, lse = res[0], res[1][..., :L]
    except (RuntimeError, NotImplementedError):
        return None
    return out.reshape(B, H, L, v.shape[-1]), lse.reshape(B, H, L).float()


def _rows(bias5: torch.Tensor | None, r0: int, r1: int):
    """Rows ``r0:r1`` of a grouped bias (one broadcast row stays as it is)."""
    if bias5 is None or bias5.shape[-2] == 1:
        return bias5
    return bias5[..., r0:r1, :]


def math_with_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
    sliding_window: int | None = None,
    mask=None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unfused reference-quality attention in float32, blocked over query rows.

    Same contract as :func:`sdpa_with_lse` (LSE float64, :func:`exact_lse`; ``softcap`` and
    ``sinks`` as there). Memory: ``B × n_heads × ROW_BLOCK × S`` floats at a time, never the full
    ``L × S`` map for long inputs.
    """
    cap = check_softcap(softcap)
    out, lse = _math_f32(
        q, k, v, scale=scale, causal=causal, sliding_window=sliding_window, mask=mask, softcap=cap
    )
    lse = exact_lse(
        q, k, lse, scale=scale, causal=causal, sliding_window=sliding_window, mask=mask, softcap=cap
    )
    if sinks is not None:
        out, lse = add_learned_sinks(out, lse, sinks)
    return out, lse


def _math_f32(q, k, v, *, scale, causal, sliding_window, mask, softcap=None):
    """The unfused pass: output from float32 scores, LSE float64 as ``m + log ℓ`` of those scores."""
    g = check_qkv(q.shape, k.shape, v.shape)
    B, H, L, D = q.shape
    Hkv, S, G = g.n_kv_heads, g.S, g.group_size
    scale = resolve_scale(scale, D)
    bias5 = mask_bias(
        L,
        S,
        Hkv,
        causal=causal,
        sliding_window=sliding_window,
        array=mask,
        dtype=torch.float32,
        device=q.device,
    )
    qf = q.float().reshape(B, Hkv, G, L, D)  # (B, Hkv, G, L, D)
    kf = k.float()[:, :, None]  # (B, Hkv, 1, S, D): broadcast over the group
    vf = v.float()[:, :, None]
    outs, lses = [], []
    for r0 in range(0, L, ROW_BLOCK):
        r1 = min(L, r0 + ROW_BLOCK)
        s = torch.matmul(qf[..., r0:r1, :], kf.transpose(-1, -2)) * scale  # (B, Hkv, G, r, S)
        softcap_scores(s, softcap)  # Gemma 2: cap·tanh(s/cap) before the mask
        b = _rows(bias5, r0, r1)
        if b is not None:
            s = s + b
        p, m, total = _softmax_parts(s)  # (B, Hkv, G, r, S), (B, Hkv, G, r) twice
        outs.append(torch.matmul(p, vf))
        lses.append(_lse_from_parts(m, total))
    out = torch.cat(outs, dim=-2).reshape(B, H, L, v.shape[-1]).to(q.dtype)
    return out, torch.cat(lses, dim=-1).reshape(B, H, L)


# |LSE| up to which a float32 LSE is exact enough for the weights: exp(s − lse) inherits the LSE's
# absolute error as a relative one, and half a float32 ulp below 16 is 2⁻²⁴·16 ≈ 9.5e-7. Rows above
# it get their LSE (and their weights) from float64 scores (docs/exactness.md: at |lse| ≈ 3·10⁴ a float32
# ulp is 0.002, rows summed to 1.0006).
LSE_FP32_EXACT = 16.0


def _softmax_parts(s: torch.Tensor):
    """``(p, m, ℓ)`` of float32/float64 scores: weights, row max (0 for a fully masked row), row sum
    of ``exp(s − m)`` (0 for a fully masked row). FlashAttention's ``m`` and ``ℓ`` kept apart."""
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    total = e.sum(dim=-1, keepdim=True)
    denom = torch.where(total > 0, total, torch.ones_like(total))
    return e / denom, m.squeeze(-1), total.squeeze(-1)


def _lse_from_parts(m: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``m + log ℓ`` in float64 (``-inf`` where ``ℓ = 0``): no rounding of the sum to float32."""
    t = total.double()
    return torch.where(
        t > 0,
        m.double() + torch.log(torch.where(t > 0, t, torch.ones_like(t))),
        torch.full_like(t, float("-inf")),
    )


def _lse_rows(q, k, lse64, need, scale, bias5, dtype, softcap=None):
    """``lse64`` with the rows where ``need`` (B, H, L) recomputed from scores in ``dtype``.

    Scores ``q·kᵀ·scale + mask`` of the selected rows only, one (batch, KV head) at a time and at
    most ``ROW_BLOCK`` rows per product (whole row blocks when most rows are selected).
    """
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = H // Hkv
    if int(need.sum()) * 4 > need.numel():  # most rows: whole row blocks, no gathers
        return torch.where(need, _lse_all(q, k, scale, bias5, dtype, softcap), lse64)
    out = lse64.clone()
    outg = out.view(B, Hkv, G, L)
    needg = need.reshape(B, Hkv, G, L)
    qg = q.reshape(B, Hkv, G, L, D)  # (B, Hkv, G, L, D)
    full = None if bias5 is None else bias5.expand(B, Hkv, G, L, S)  # a view: no L × S copy
    for b in range(B):
        for h in range(Hkv):
            gi_all, li_all = needg[b, h].nonzero(as_tuple=True)
            if not gi_all.numel():
                continue
            kt = k[b, h].to(dtype).T  # (D, S)
            for c0 in range(0, gi_all.numel(), ROW_BLOCK):
                gi, li = gi_all[c0 : c0 + ROW_BLOCK], li_all[c0 : c0 + ROW_BLOCK]
                s = softcap_scores(torch.matmul(qg[b, h, gi, li].to(dtype), kt) * scale, softcap)  # (n, S)
                if full is not None:
                    s.add_(full[b, h, gi, li].to(dtype))
                outg[b, h, gi, li] = _lse_of_scores(s)
    return out


def _lse_of_scores(s: torch.Tensor) -> torch.Tensor:
    """``log Σ exp(s)`` over the last dim (max-shifted by torch; ``-inf`` for an all ``-inf`` row),
    as float64. From float32 scores the result carries float32 rounding, ≤ 9.5e-7 below
    :data:`LSE_FP32_EXACT`; larger rows are redone from float64 scores by :func:`exact_lse`."""
    return torch.logsumexp(s, dim=-1).double()


def _lse_all(q, k, scale, bias5, dtype, softcap=None):
    """``(B, n_heads, L)`` float64 LSE of every row from scores in ``dtype``, ``ROW_BLOCK`` rows at a time."""
    B, H, L, D = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    qg = q.reshape(B, Hkv, G, L, D)  # (B, Hkv, G, L, D)
    kt = k.to(dtype)[:, :, None].transpose(-1, -2)  # (B, Hkv, 1, D, S): broadcast over the group
    out = []
    for r0 in range(0, L, ROW_BLOCK):
        r1 = min(L, r0 + ROW_BLOCK)
        s = torch.matmul(qg[..., r0:r1, :].to(dtype), kt).mul_(scale)  # (B, Hkv, G, r, S)
        softcap_scores(s, softcap)
        bb = _rows(bias5, r0, r1)
        if bb is not None:
            s.add_(bb.to(dtype))  # broadcast in place
        out.append(_lse_of_scores(s))
    return torch.cat(out, dim=-1).reshape(B, H, L)


def exact_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    lse: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
    sliding_window: int | None = None,
    mask=None,
    half_rows: bool = True,
    mask_cache: MaskCache | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """A kernel's LSE made exact enough that ``exp(s − lse)`` is right to ~1e-6 relative.

    Args:
        q: ``(B, n_heads, L, D)``; k: ``(B, n_kv_heads, S, D)``; the inputs the kernel saw.
        lse: ``(B, n_heads, L)``: a kernel's float32 LSE, or the float64 ``m + log ℓ`` of
            the unfused path.
        scale, causal, sliding_window, mask: the mask and scale the LSE was computed with.

    Returns:
        ``(B, n_heads, L)`` float64. Rules (measured, docs/exactness.md):

        * float16 / bfloat16 inputs with a kernel's float32 LSE: every row is recomputed from
          float32 scores of the (exactly upcast) inputs, because the CPU kernel's LSE is ~3e-5
          off (uniform 8192-key rows summed to 1.00005);
        * any row with ``|lse| > LSE_FP32_EXACT`` (16) is recomputed from float64 scores,
          because a float32 LSE there is off by up to half an ulp (0.001 at 3·10⁴);
        * other rows keep their value; fully masked rows stay ``-inf``.

        ``half_rows=False`` skips the first rule (the kernel's LSE of float16/bfloat16 inputs is kept).

        ``mask_cache``: a :class:`MaskCache` that keeps the structural mask between calls with the
        same geometry (every layer of a forward; slot ``"lse"``); None builds it each call. An
        array ``mask`` is never cached. ``softcap``: the cap the LSE was computed with
        (:func:`softcap_scores`; recomputed rows apply it too). A learned sink is not part of
        this LSE: :func:`add_learned_sinks` joins it afterwards.
    """
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    scale = resolve_scale(scale, D)
    lse64 = lse.double()
    bias5: list = []

    def build():
        return mask_bias(
            L,
            S,
            Hkv,
            causal=causal,
            sliding_window=sliding_window,
            array=mask,
            dtype=torch.float32,
            device=q.device,
        )

    def bias():
        if not bias5:
            if mask is None and mask_cache is not None:  # every layer of a chunk: one mask
                bias5.append(mask_cache.get("lse", (L, S, Hkv, causal, sliding_window, str(q.device)), build))
            else:
                bias5.append(build())
        return bias5[0]

    if half_rows and lse.dtype != torch.float64 and q.dtype in (torch.float16, torch.bfloat16):
        lse64 = _lse_rows(q, k, lse64, torch.isfinite(lse64), scale, bias(), torch.float32, softcap)
    need = torch.isfinite(lse64) & (lse64.abs() > LSE_FP32_EXACT)
    if bool(need.any()):
        lse64 = _lse_rows(q, k, lse64, need, scale, bias(), torch.float64, softcap)
    return lse64


def _safe_lse(lse: torch.Tensor) -> torch.Tensor:
    """LSE with ``-inf`` (fully masked rows) replaced by ``+inf`` so that ``exp(s - lse)`` is 0."""
    return torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)


def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    lse: torch.Tensor,
    *,
    scale: float | None = None,
    mask=None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Exact softmax weights from q, k and the rows' LSE: ``exp(q·k·scale + mask − lse)``.

    (FlashAttention-2, Dao 2023, §3.1: the backward pass's ``P = exp(S − L)``.)

    Args:
        q: ``(B, n_heads, L, D)``; k: ``(B, n_kv_heads, S, D)``; lse: ``(B, n_heads, L)``,
            float64 from :func:`exact_lse` (a float32 LSE limits the weights to its rounding).
        mask: anything :func:`attnscope.core.attention.masks.as_mask` accepts (the mask the LSE was computed with).
        softcap: the scores are ``cap·tanh(q·k·scale / cap)`` (:func:`softcap_scores`). A learned
            sink needs nothing here: it lives in ``lse`` (:func:`add_learned_sinks`), and the rows
            then sum to less than 1.

    Returns:
        ``(B, n_heads, L, S)`` float32; fully masked rows are 0. Scores are formed in float32,
        or in float64 when a row's ``|lse|`` exceeds :data:`LSE_FP32_EXACT` (large scores).
    """
    B, H, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = H // Hkv
    m = as_mask(mask)
    scale = resolve_scale(scale, D)
    finite = torch.isfinite(lse)
    wide = lse.dtype == torch.float64 and bool((lse.abs() > LSE_FP32_EXACT).logical_and_(finite).any())
    dt = torch.float64 if wide else torch.float32
    s = torch.matmul(q.to(dt).reshape(B, Hkv, G, L, D), k.to(dt)[:, :, None].transpose(-1, -2)) * scale
    softcap_scores(s, check_softcap(softcap))
    bias5 = mask_bias(
        L, S, Hkv, causal=m.causal, sliding_window=m.window, array=m.array, dtype=dt, device=q.device
    )
    if bias5 is not None:
        s = s + bias5
    w = torch.exp(s - _safe_lse(lse.to(dt).reshape(B, Hkv, G, L))[..., None])
    return w.reshape(B, H, L, S).float()


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    mask=None,
    return_lse: bool = False,
    return_weights: bool = False,
    softcap: float | None = None,
    sinks=None,
) -> AttentionResult:
    """The attention contract (:mod:`attnscope.core.attention.reference`) on torch tensors, through the fused path.

    Args:
        q: ``(B, n_heads, L, D)``; k, v: ``(B, n_kv_heads, S, D)``; float32/float16/bfloat16.
        scale: default ``1/sqrt(D)``.
        mask: None (default: no mask), ``"causal"``, an int window, an array or a
            :class:`attnscope.core.attention.masks.Mask` (see :func:`attnscope.core.attention.masks.as_mask`).
        return_lse, return_weights: also return LSE ``(B, n_heads, L)`` float64
            (:func:`exact_lse`) / weights ``(B, n_heads, L, S)`` float32 (recomputed from it).
        softcap, sinks: soft-capping and learned sinks, as :func:`sdpa_with_lse` (``sinks`` a
            torch tensor or an array-like of ``n_heads`` logits).

    Returns:
        :class:`attnscope.core.attention.reference.AttentionResult` of torch tensors.

    Raises:
        ValueError: shapes or mask that break the contract.
    """
    m = as_mask(mask)
    sk = None if sinks is None else torch.as_tensor(sinks)
    out, lse = sdpa_with_lse(
        q,
        k,
        v,
        scale=scale,
        causal=m.causal,
        sliding_window=m.window,
        mask=m.array,
        softcap=softcap,
        sinks=sk,
    )
    weights = attention_weights(q, k, lse, scale=scale, mask=m, softcap=softcap) if return_weights else None
    return AttentionResult(out, lse if return_lse else None, weights)


default_scale = reference.default_scale  # 1/sqrt(head_dim): ≈ 0.088 for d_k = 128
