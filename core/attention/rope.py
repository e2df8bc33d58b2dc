"""Rotary position embedding (RoPE), numpy reference for worked examples and views.

RoPE (Su et al. 2021, RoFormer eq. 13-15) rotates each pair of a query or key's coordinates by an
angle proportional to its position: pair ``i`` at position ``m`` turns by ``m·θ_i`` with
``θ_i = base^(−2i/d)``. Because rotations compose, ``⟨R_m q, R_n k⟩ = ⟨q, R_{n−m} k⟩``: the score
depends on the positions only through their offset ``n − m`` (Su et al. 2021, RoFormer §3.4).

Two pairings are in use, with the same maths and different coordinate order:

* ``interleaved=True``: pairs ``(x[2i], x[2i+1])`` — RoFormer, Meta's Llama reference code,
  GPT-J, MLX's ``traditional=True``; the handbook's exercise 3 uses it.
* ``interleaved=False``: pairs ``(x[i], x[i + d/2])`` — Hugging Face transformers'
  ``rotate_half`` (Llama, Mistral, Qwen) and MLX's ``traditional=False``.
"""

from __future__ import annotations

import numpy as np


def rope_frequencies(head_dim: int, base: float = 10000.0) -> np.ndarray:
    """``θ_i = base^(−2i/head_dim)`` for ``i = 0 .. head_dim/2 − 1``, float64 ``(head_dim/2,)``.

    Raises:
        ValueError: an odd or non-positive ``head_dim``, a non-positive ``base``.
    """
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"RoPE needs a positive even head_dim, got {head_dim}")
    if base <= 0:
        raise ValueError(f"RoPE base must be positive, got {base}")
    return base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def _theta(theta, head_dim: int) -> np.ndarray:
    theta = np.asarray(theta, dtype=np.float64).ravel()
    if head_dim % 2 or theta.shape[0] != head_dim // 2:
        raise ValueError(
            f"need head_dim/2 = {head_dim // 2} angles for head_dim {head_dim}, got {theta.shape[0]}"
        )
    return theta


def apply_rope(x, positions, theta, *, interleaved: bool = True) -> np.ndarray:
    """Rotate vectors by their positions.

    Args:
        x: ``(..., T, D)`` (or ``(D,)`` with a scalar position), D even.
        positions: ``(T,)`` positions (ints or floats), or a scalar.
        theta: ``(D/2,)`` angles per unit position (e.g. :func:`rope_frequencies`).
        interleaved: pairing of coordinates (module notes).

    Returns:
        float64 array of x's shape.

    Raises:
        ValueError: odd D, or ``theta`` of the wrong length.
    """
    x = np.asarray(x, dtype=np.float64)
    D = x.shape[-1]
    theta = _theta(theta, D)
    ang = np.multiply.outer(np.asarray(positions, dtype=np.float64), theta)  # (T, D/2) or (D/2,)
    cos, sin = np.cos(ang), np.sin(ang)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., : D // 2], x[..., D // 2 :]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = np.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., : D // 2], out[..., D // 2 :] = ra, rb
    return out


def rotation_matrix(position: float, theta, *, interleaved: bool = True) -> np.ndarray:
    """The ``(D, D)`` orthogonal matrix ``R_m`` with ``apply_rope(x, m) = R_m @ x``."""
    theta = np.asarray(theta, dtype=np.float64).ravel()
    D = 2 * theta.shape[0]
    return apply_rope(np.eye(D), position, theta, interleaved=interleaved).T


def rope_score(q, k, m: float, n: float, theta, *, interleaved: bool = True) -> float:
    """``⟨R_m q, R_n k⟩``: the (unscaled) score of a query at position ``m`` and a key at ``n``.

    Handbook exercise 3: θ = (1.0, 0.1), q = k = (1, 0, 1, 0): positions (3, 7) and (0, 4) both
    give 0.2674 (= cos 4 + cos 0.4), because only ``n − m`` matters.
    """
    return float(
        apply_rope(q, m, theta, interleaved=interleaved) @ apply_rope(k, n, theta, interleaved=interleaved)
    )
