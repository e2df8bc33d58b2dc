"""Attention masks as boolean "allowed" arrays, shared by every backend and view.

Conventions (tiny-llm's ``causal_mask(L, S)``, docs/how-it-works.md):

* Query row ``i`` of ``L`` new rows attends key ``j`` of ``S`` keys iff ``j <= i + (S - L)``:
  the causal mask is aligned to the bottom-right corner (``tril(k=S-L)``), so a decode step
  with ``L = 1`` sees every cached key.
* A sliding window of ``W`` keys additionally requires ``j > i + (S - L) - W``: each query sees
  itself and the ``W - 1`` keys before it (the Mistral / Qwen2 convention).
* Positions can be given explicitly (``q_pos``, ``k_pos``) so that a tile of a long map, or a
  KV cache whose first entry is not position 0, gets the same mask as the full matrix.

The ``mask=`` argument of every attention implementation (numpy reference, torch fused, torch
tiled online softmax, MLX) is normalised by :func:`as_mask` into one :class:`Mask`: ``None``,
``"causal"``, an int sliding window, a boolean (True = attend) or additive array, or a
combination of these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


def causal_allowed(q_pos: np.ndarray, k_pos: np.ndarray, sliding_window: int | None = None) -> np.ndarray:
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

    Equals ``tril(ones(L, S), k=S-L)`` (tiny-llm's ``causal_mask``); with ``L = 1`` every key
    is allowed.
    """
    if L > S:
        raise ValueError(f"more queries than keys (L={L} > S={S}) cannot be causal")
    return causal_allowed(np.arange(S - L, S), np.arange(S), sliding_window)


def hidden_cells(q_pos, k_pos, sliding_window: int | None = None) -> np.ndarray:
    """``(len(q_pos), len(k_pos))`` bool, True where the mask hides key ``k`` from query ``q``: a
    later key (``k > q``) or, with a sliding window of ``W`` keys, one ``W`` or more positions back
    (``k <= q - W``). The negation of :func:`causal_allowed`; a window of None or 0 means causal only.

    The one rule the heatmap, the figure renderer (attnscope.core.io.render), the head grid and the
    exports draw masked cells with (tests/core/test_masks.py).
    """
    q = np.asarray(q_pos, dtype=np.int64)[:, None]
    k = np.asarray(k_pos, dtype=np.int64)[None, :]
    out = k > q
    if sliding_window:
        out = out | (k <= q - int(sliding_window))
    return out


def hidden_blocks(row_edges, col_edges, sliding_window: int | None = None) -> np.ndarray:
    """``(R, C)`` bool: the blocks of a pooled map (query rows ``[row_edges[a], row_edges[a+1])``,
    keys ``[col_edges[c], col_edges[c+1])``, int edges, ``R + 1`` and ``C + 1`` of them) holding only
    cells :func:`hidden_cells` hides. A block has a visible cell iff its first key is at most its
    last query and, with a window ``W``, its last key is less than ``W`` before its first query.
    """
    re_, ce = np.asarray(row_edges, dtype=np.int64), np.asarray(col_edges, dtype=np.int64)
    a, b = re_[:-1, None], re_[1:, None]
    c, d = ce[None, :-1], ce[None, 1:]
    out = c > b - 1  # every key after every query of the block
    if sliding_window:
        out = out | (d - 1 <= a - int(sliding_window))
    return out


def aggregate_window(windows, layer: int, mode: str) -> int | None:
    """The sliding window a map was masked with, from each layer's window ``windows`` (a sequence
    of int or None, one per layer, as ``Snapshot.layer_windows``): its layer's for a map of one
    layer (one head, a KV group, a layer mean); for the mean of all layers (``mode == "all"``) a
    cell is hidden only where every layer hides it, so the largest window, or None (causal only)
    when some layer is global. None too without windows or for a layer outside them."""
    if not windows:
        return None
    if mode == "all":
        return None if any(w is None for w in windows) else max(windows)
    return windows[layer] if 0 <= layer < len(windows) else None


def top_left_causal_mask(L: int, S: int) -> np.ndarray:
    """The classic decode bug (docs/tabs/experiments.md, "the top-left-mask decode bug"): ``tril(ones(L, S), k=0)``.

    With a KV cache (``L < S``) query ``i`` is wrongly kept from keys ``i+1 .. S-1``; a single
    decode query sees only key 0.
    """
    return np.tril(np.ones((L, S), dtype=bool))


def additive(allowed: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Turn a boolean mask into an additive one: 0 where allowed, ``-inf`` elsewhere."""
    return np.where(allowed, 0.0, -np.inf).astype(dtype)


# ---------------------------------------------------------------------------------------------
# The mask vocabulary of the attention contract (attnscope.core.attention.reference, attnscope.core.attention.fused, tests/flash_reference.py,
# attnscope.core.attention.fused_mlx all normalise their ``mask=`` argument with :func:`as_mask`).
# ---------------------------------------------------------------------------------------------

_BOOL_DTYPES = {"bool", "torch.bool", "mlx.core.bool"}


def is_bool_dtype(dtype) -> bool:
    """True for numpy, torch and MLX boolean dtypes (compared by name: no framework import)."""
    return str(dtype) in _BOOL_DTYPES


def is_float_dtype(dtype) -> bool:
    """True for floating dtypes of numpy, torch and MLX (float16/32/64, bfloat16)."""
    return "float" in str(dtype)


@dataclass(frozen=True, eq=False, repr=False)
class Mask:
    """One attention mask: structural parts (causal, sliding window) and an optional array.

    Attributes:
        causal: bottom-right aligned causal mask: query row ``i`` of ``L`` sees key ``j`` of ``S``
            iff ``j <= i + (S - L)`` (``tril(k=S-L)``, as tiny-llm's ``causal_mask``). With ``L > S`` the first
            ``L - S`` rows see no key at all (their output is zero).
        window: sliding window of ``W`` keys: additionally ``j > i + (S - L) - W`` (the query
            itself and the ``W - 1`` keys before it). Needs ``causal=True``.
        array: numpy / torch / MLX array of 2 to 4 dims, broadcastable to
            ``(B, n_heads, L, S)``: boolean (True = attend) or floating and *additive* (added to
            the scaled scores; ``-inf`` masks a key). Combined with the structural parts by AND
            (boolean) or by adding ``-inf`` where they forbid (additive).

    A row whose every key is masked yields output 0 and LSE ``-inf`` in every implementation.

    Raises:
        ValueError: a non-positive window, a window without ``causal``, an array of the wrong
            rank or of an integer dtype.
    """

    causal: bool = False
    window: int | None = None
    array: Any = None

    def __post_init__(self):
        if self.window is not None:
            if isinstance(self.window, bool) or not isinstance(self.window, (int, np.integer)):
                raise ValueError(f"sliding window must be an int, got {self.window!r}")
            if self.window <= 0:
                raise ValueError(f"sliding window must be positive, got {self.window}")
            if not self.causal:
                raise ValueError("a sliding window needs the causal mask: use Mask(causal=True, window=W)")
        a = self.array
        if a is not None:
            if not hasattr(a, "shape") or not hasattr(a, "dtype"):
                raise ValueError(f"mask array must be a numpy/torch/MLX array, got {type(a).__name__}")
            if not 2 <= len(a.shape) <= 4:
                raise ValueError(f"mask array must have 2 to 4 dims (…, L, S), got shape {tuple(a.shape)}")
            if not (is_bool_dtype(a.dtype) or is_float_dtype(a.dtype)):
                raise ValueError(
                    f"mask array must be boolean (True = attend) or additive float, got {a.dtype}"
                )

    @property
    def is_none(self) -> bool:
        """True when nothing is masked."""
        return not self.causal and self.array is None

    @property
    def array_is_bool(self) -> bool:
        return self.array is not None and is_bool_dtype(self.array.dtype)

    def structural(self, L: int, S: int) -> np.ndarray | None:
        """Boolean ``(L, S)`` allowed-array of the causal/window part, None when there is none."""
        if not self.causal:
            return None
        return causal_allowed(np.arange(S - L, S), np.arange(S), self.window)

    def check_shape(self, B: int, n_heads: int, L: int, S: int) -> None:
        """Raise ValueError if ``array`` does not broadcast to ``(B, n_heads, L, S)``."""
        if self.array is None:
            return
        shape = (1,) * (4 - len(self.array.shape)) + tuple(self.array.shape)
        for got, want, name in zip(shape, (B, n_heads, L, S), ("batch", "n_heads", "L", "S"), strict=True):
            if got not in (1, want):
                raise ValueError(
                    f"mask array shape {tuple(self.array.shape)} does not broadcast to "
                    f"(B, n_heads, L, S) = {(B, n_heads, L, S)} ({name})"
                )

    def additive(self, L: int, S: int, dtype=np.float32) -> np.ndarray:
        """The whole mask as one additive numpy array: 0 / ``-inf`` (and the array's own values).

        Shape ``(L, S)`` or, with an array, the array's 4-d broadcast shape ``(b, h, L, S)``
        (``b``, ``h`` each 1 or full). numpy only: torch and MLX build their own.
        """
        bias = np.zeros((L, S), dtype=dtype)
        st = self.structural(L, S)
        if st is not None:
            bias = np.where(st, 0.0, -np.inf).astype(dtype)
        if self.array is not None:
            a = to_4d(np.asarray(self.array))
            a = np.where(a, 0.0, -np.inf) if a.dtype == np.bool_ else a
            bias = bias + a.astype(dtype)
        return bias

    def describe(self) -> str:
        """Short label for views and logs, e.g. ``"causal, window 4096, + bool (1, 1, 7, 7)"``."""
        parts = []
        if self.causal:
            parts.append("causal")
        if self.window is not None:
            parts.append(f"window {self.window}")
        if self.array is not None:
            kind = "bool" if self.array_is_bool else "additive"
            parts.append(f"+ {kind} {tuple(self.array.shape)}")
        return ", ".join(parts) if parts else "none"

    def __repr__(self) -> str:
        return f"Mask({self.describe()})"


NO_MASK = Mask()
CAUSAL = Mask(causal=True)


def as_mask(spec) -> Mask:
    """Normalise the ``mask=`` argument of every attention implementation into a :class:`Mask`.

    Accepts (mlx-lm's vocabulary, extended): ``None`` or ``"none"`` (no mask); ``"causal"``
    (bottom-right aligned); an ``int`` ``W`` (causal sliding window of ``W`` keys);
    a boolean array (True = attend) or an additive float array broadcastable to
    ``(B, n_heads, L, S)``; or a :class:`Mask` combining these.

    Raises:
        ValueError: anything else (one line naming what was given).
    """
    if spec is None:
        return NO_MASK
    if isinstance(spec, Mask):
        return spec
    if isinstance(spec, str):
        s = spec.strip().lower()
        if s == "none":
            return NO_MASK
        if s == "causal":
            return CAUSAL
        raise ValueError(f"unknown mask {spec!r}: use None, 'causal', an int window, an array or a Mask")
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return Mask(causal=True, window=int(spec))
    if hasattr(spec, "shape") and hasattr(spec, "dtype"):
        return Mask(array=spec)
    raise ValueError(
        f"unsupported mask of type {type(spec).__name__}: use None, 'causal', an int window, an array or a Mask"
    )


def to_4d(a):
    """Prepend unit dims so that a 2- to 4-d mask array reads ``(b, h, L, S)`` (numpy/torch/MLX)."""
    nd = len(a.shape)
    return a.reshape((1,) * (4 - nd) + tuple(a.shape)) if nd < 4 else a


def group_heads(a4, n_kv_heads: int):
    """View a ``(b, h, L, S)`` mask as ``(b, n_kv_heads|1, group|1, L, S)`` for grouped attention.

    Query head ``h`` belongs to KV head ``h // group_size`` (:meth:`attnscope.core.arch.ArchConfig.kv_head`), so a per-head mask
    reshapes without copying; a mask shared by all heads (``h == 1``) gets two unit dims.
    Works on numpy, torch and MLX arrays.
    """
    b, h, L, S = a4.shape
    if h == 1:
        return a4.reshape(b, 1, 1, L, S)
    return a4.reshape(b, n_kv_heads, h // n_kv_heads, L, S)
