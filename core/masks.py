"""Attention masks as boolean "allowed" arrays, shared by every backend and view.

Conventions (DESIGN.md, seed 000 §3 "causal_mask(L, S)"):

* Query row ``i`` of ``L`` new rows attends key ``j`` of ``S`` keys iff ``j <= i + (S - L)``:
  the causal mask is aligned to the bottom-right corner (``tril(k=S-L)``), so a decode step
  with ``L = 1`` sees every cached key.
* A sliding window of ``W`` keys additionally requires ``j > i + (S - L) - W``: each query sees
  itself and the ``W - 1`` keys before it (the Mistral / Qwen2 convention).
* Positions can be given explicitly (``q_pos``, ``k_pos``) so that a tile of a long map, or a
  KV cache whose first entry is not position 0, gets the same mask as the full matrix.
"""

from __future__ import annotations

import numpy as np


def causal_allowed(
    q_pos: np.ndarray, k_pos: np.ndarray, sliding_window: int | None = None
) -> np.ndarray:
    """Boolean ``(len(q_pos), len(k_pos))`` array, True where query may attend key.

    Args:
        q_pos: int array of absolute query positions, shape ``(L,)``.
        k_pos: int array of absolute key positions, shape ``(S,)``.
        sliding_window: keep only the last ``W`` keys (including the query's own position).

    Raises:
        ValueError: if ``sliding_window`` is not positive.
    """
    q_pos = np.asarray(q_pos)[:, None]
    k_pos = np.asarray(k_pos)[None, :]
    allowed = k_pos <= q_pos
    if sliding_window is not None:
        if sliding_window <= 0:
            raise ValueError(f"sliding_window must be positive, got {sliding_window}")
        allowed &= k_pos > q_pos - sliding_window
    return allowed


def causal_mask(L: int, S: int, sliding_window: int | None = None) -> np.ndarray:
    """Bottom-right aligned causal mask for ``L`` new queries over ``S`` keys, shape ``(L, S)`` bool.

    Equals ``tril(ones(L, S), k=S-L)`` (seed 000, ``causal_mask``); with ``L = 1`` every key
    is allowed.
    """
    if L > S:
        raise ValueError(f"more queries than keys (L={L} > S={S}) cannot be causal")
    return causal_allowed(np.arange(S - L, S), np.arange(S), sliding_window)


def top_left_causal_mask(L: int, S: int) -> np.ndarray:
    """The classic decode bug (handbook §9 pitfall): ``tril(ones(L, S), k=0)``.

    With a KV cache (``L < S``) query ``i`` is wrongly kept from keys ``i+1 .. S-1``; a single
    decode query sees only key 0.
    """
    return np.tril(np.ones((L, S), dtype=bool))


def additive(allowed: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Turn a boolean mask into an additive one: 0 where allowed, ``-inf`` elsewhere."""
    return np.where(allowed, 0.0, -np.inf).astype(dtype)
