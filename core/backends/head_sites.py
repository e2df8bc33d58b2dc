"""What the head analyses (ablation, activation patching, direct logit attribution, the logit lens:
:mod:`attnscope.core.analysis.head_effects`) need from a model where torch module hooks cannot reach its
layers: numpy arrays in and out, no framework types.

:class:`HeadSites` gives the clean values of a model's sites and the weights direct logit attribution
projects through; :class:`HeadRunner` the logits at a read-out position with units replaced, one unit per
batch row; :class:`RowEdit` says what a row replaces. :mod:`attnscope.core.backends.mlx_interventions`
implements them for the MLX backend's own models; :mod:`attnscope.core.analysis.mlx_heads` computes the
analyses on them.

Sites (``(L, width)`` per layer): ``"z"`` the output projection's input (head ``h``'s ``Σ_j α_ij v_j`` at
``[h·D, (h+1)·D)``), ``"q"``/``"k"``/``"v"`` the query/key/value projections' outputs (before QK-norm and
RoPE), ``"input"``/``"resid"`` a layer's input/output hidden states, ``"mlp"`` its MLP's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class RowEdit:
    """One replacement in one batch row: site ``key`` (``"z"``, ``"q"``, ``"k"`` or ``"v"``), the
    ``head_dim``-wide column blocks of ``heads`` (query heads for ``z``/``q``, KV heads for ``k``/``v``), by
    ``value``: None (zeros) or ``(rows, width)`` float32 (the site's full width; one row is used at every
    position, more rows are the run's positions, the last ones used)."""

    key: str
    heads: tuple[int, ...]
    value: np.ndarray | None = None


class HeadRunner(Protocol):
    """Logits at the read-out position ``p`` (the last of the ids it was made for) with units replaced in
    one layer, the layers below it reused.

    Attributes:
        clean: ``(vocab,)`` float32: the logits at ``p`` with nothing replaced.
        max_rows: the most rows one :meth:`batch` should get.
    """

    clean: np.ndarray
    max_rows: int

    def batch(self, layer: int, rows: Sequence[Sequence[RowEdit]]) -> np.ndarray:
        """``(len(rows), vocab)`` float32 logits at ``p``, row ``b`` with ``rows[b]`` replaced in ``layer``
        (``readout`` scope: at ``p`` only; ``everywhere``: at every position)."""
        ...


class HeadSites(Protocol):
    """A model's sites and weights for the head analyses (module docstring)."""

    def capture(self, ids: Sequence[int], keys: Sequence[str], last: bool = False) -> tuple[np.ndarray, dict]:
        """One forward of ``ids``: ``(logits (vocab,) float32 at the last position, {(key, layer): (L, width)
        float32})`` (``last``: the last row only)."""
        ...

    def runner(self, ids: Sequence[int], scope: str) -> HeadRunner:
        """A :class:`HeadRunner` on ``ids`` (``scope``: ``"readout"`` or ``"everywhere"``)."""
        ...

    def gradients(self, ids: Sequence[int], keys: Sequence[str], target: Any) -> tuple[float, dict]:
        """The target (a :class:`attnscope.core.analysis.head_effects.Target`: ``logit_diff`` or the
        log-probability of ``token``) on the last position's logits, and its gradient with respect to every
        site in ``keys`` of every layer: ``(value, {(key, layer): (L, width) float32})``."""
        ...

    def lens(self, ids: Sequence[int], positions: Sequence[int]) -> tuple[np.ndarray, list]:
        """The logits at ``positions`` ``(P, vocab)`` float32 and each layer's output hidden states there
        (opaque per layer, for :meth:`unembed_probs`)."""
        ...

    def unembed_probs(self, h: Any) -> np.ndarray:
        """A layer's hidden states from :meth:`lens` through the final norm, the unembedding and a softmax:
        ``(P, vocab)`` float64."""
        ...

    def out_proj(self, layer: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The output projection's weight ``(hidden, n_heads·D)`` and bias (or None), float64."""
        ...

    def final_norm(self) -> tuple[np.ndarray, float]:
        """The final RMSNorm's weight ``(hidden,)`` float64 and epsilon."""
        ...

    def unembedding(self, tokens: Sequence[int]) -> np.ndarray:
        """The unembedding rows of ``tokens``: ``(len(tokens), hidden)`` float64."""
        ...
