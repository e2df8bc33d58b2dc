"""The recurrent and convolution states of a hybrid model's layers, and how step back restores them.

A hybrid decoder (docs/how-it-works.md "Hybrid models": Qwen3-Next, Qwen3.5, Granite 4, Falcon-H1, LFM2) mixes
softmax-attention layers, whose KV cache grows by one row per token and is cut back by slicing,
with layers that fold the whole past into a fixed-size state: a Gated DeltaNet's ``(heads, d_k, d_v)``
matrix and a short convolution's last ``kernel − 1`` inputs (linear attention), a Mamba-2 mixer's SSM
state and convolution window, LFM2's convolution window. transformers keeps those in the cache's
``LinearAttentionLayer`` objects (``conv_states`` / ``recurrent_states``, updated in place, next to the
layer's own token count and flags). Such a state cannot be truncated: the state after ``n`` tokens is not a
slice of the state after ``n + 1``.

So the torch backend keeps a copy of every such layer's state (all its attributes but the K/V tensors)
after each forward (:class:`StateSnapshots`,
one per sequence length reached: the end of a prefill, each decode step), and step back to a length it
holds restores that copy: the same tensors the model had, so the steps that follow give the same
logits and weights bit for bit. Copies are kept within :data:`SNAPSHOT_BUDGET_BYTES`, the oldest
dropped first (the latest is always kept); step back to a length with no copy restores the nearest
earlier one and re-runs the tokens between (:class:`StateRecompute`, said in the status bar).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

# Bytes of state copies kept for step back (Qwen3.5-9B, float32 states: ~50 MB per copy, so ~5 steps;
# the tiny test models: thousands)
SNAPSHOT_BUDGET_BYTES = 256 << 20

_STATE_FIELDS = ("conv_states", "recurrent_states")
# A hybrid attention + state layer's K/V tensors: cut back by slicing (TorchBackend._crop), never copied
_KV_FIELDS = frozenset({"keys", "values"})


def is_state_layer(layer: Any) -> bool:
    """Whether a transformers cache layer holds recurrent / convolution states (``LinearAttentionLayer``
    and the hybrid attention + state layers)."""
    return hasattr(layer, "conv_states") and hasattr(layer, "recurrent_states")


def state_bytes(layer: Any) -> int:
    """Bytes the conv and recurrent state tensors of one cache layer hold now (0 for a KV-only layer)."""
    if not is_state_layer(layer):
        return 0
    total = 0
    for field in _STATE_FIELDS:
        for t in getattr(layer, field).values():
            if t is not None:
                total += t.numel() * t.element_size()
    return total


def state_layer_bytes(cache: Any, n_layers: int) -> np.ndarray:
    """``(n_layers,)`` int64: bytes of each layer's recurrent / convolution states in ``cache``."""
    out = np.zeros(n_layers, dtype=np.int64)
    for i, layer in enumerate(list(getattr(cache, "layers", ()))[:n_layers]):
        out[i] = state_bytes(layer)
    return out


def _dup(value: Any) -> Any:
    """``value`` with every tensor in it cloned (through dicts, lists and tuples); other values as they are."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _dup(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_dup(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_dup(v) for v in value)
    return value


def _copy(layer: Any) -> dict:
    # Every attribute of the layer but its K/V tensors, not a list of known names: besides the conv and
    # recurrent states, transformers keeps the layer's own token count (``cumulative_length_linear``, a
    # tensor added in place by each forward, which the cache's ``get_seq_length`` and so the model's
    # positions read since 5.25), the init flags, the kernel sizes and a recurrent-state history; a
    # field missed here leaves the step back inexact (tests/core/test_hybrid.py).
    return {name: _dup(v) for name, v in vars(layer).items() if name not in _KV_FIELDS}


def _put(layer: Any, snap: dict) -> None:
    # clones again: the model updates these tensors in place (causal_conv1d_update, copy_, add_), and the
    # copy must stay as it was for a later step back to the same length
    for name, v in snap.items():
        setattr(layer, name, _dup(v))


@dataclass(frozen=True)
class StateRecompute:
    """A step back to a length with no state copy: the states were restored at ``restored`` tokens and
    tokens ``restored .. length − 1`` re-run (their rows of the trace recomputed in one chunk)."""

    restored: int
    length: int

    def __str__(self) -> str:
        start = "from the start" if self.restored == 0 else f"from the copy at {self.restored}"
        return (
            f"step back to {self.length} tokens: the recurrent/conv states had no copy there, so tokens "
            f"{self.restored}..{self.length - 1} were re-run {start}"
        )


class StateSnapshots:
    """Copies of the state layers of a cache, by the sequence length they were taken at.

    Args:
        budget: bytes of copies to keep (:data:`SNAPSHOT_BUDGET_BYTES`); the newest is kept whatever its size.
    """

    def __init__(self, budget: int = SNAPSHOT_BUDGET_BYTES):
        self.budget = int(budget)
        self._snaps: dict[int, tuple[int, list[tuple[int, dict]]]] = {}  # length -> (bytes, [(layer, copy)])

    def clear(self) -> None:
        self._snaps = {}

    @property
    def lengths(self) -> list[int]:
        """The sequence lengths a copy is held for, ascending."""
        return sorted(self._snaps)

    @property
    def nbytes(self) -> int:
        """Bytes the held copies take."""
        return sum(b for b, _ in self._snaps.values())

    def take(self, length: int, cache: Any) -> None:
        """Copy every state layer of ``cache`` as the state after ``length`` tokens; drop the oldest copies
        past the budget."""
        copies = [(i, _copy(layer)) for i, layer in enumerate(cache.layers) if is_state_layer(layer)]
        size = sum(state_bytes(cache.layers[i]) for i, _ in copies)
        self._snaps[int(length)] = (size, copies)
        while len(self._snaps) > 1 and self.nbytes > self.budget:
            del self._snaps[min(self._snaps)]

    def nearest(self, length: int) -> int | None:
        """The longest held length ``<= length``, or None."""
        held = [n for n in self._snaps if n <= length]
        return max(held) if held else None

    def restore(self, length: int, cache: Any) -> None:
        """Put the copy taken at ``length`` back into ``cache``'s state layers and forget every later copy.

        Raises:
            KeyError: no copy at ``length``.
        """
        _, copies = self._snaps[length]
        for i, snap in copies:
            _put(cache.layers[i], snap)
        for n in [n for n in self._snaps if n > length]:
            del self._snaps[n]
