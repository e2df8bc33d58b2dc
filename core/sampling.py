"""Next-token choice from logits: greedy, temperature, top-k, top-p (nucleus), seeded.

Top-p follows Holtzman et al. 2020 ("The Curious Case of Neural Text Degeneration", §3.1): keep
the smallest set of most likely tokens whose probability sums to at least ``top_p``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sampling:
    """Sampling settings. ``temperature == 0`` means greedy (argmax).

    ``temperature``: a finite number >= 0; ``top_k``: a whole number >= 0 (0 = off); ``top_p``: in
    (0, 1] (1 = off); ``seed``: a whole number (bools refused everywhere).

    Raises:
        WrongType (a TypeError and a ValueError): a value of the wrong type (``top_k=2.5``, a string).
        BadArgument (a ValueError): a value outside its range (``temperature=-1``, ``top_p=0``, NaN).
    """

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int = 0

    def __post_init__(self):
        from attnscope.core.checks import real, whole
        from attnscope.core.errors import BadArgument

        real("temperature", self.temperature, lo=0.0)
        if whole("top_k", self.top_k) < 0:
            raise BadArgument(f"top_k must be >= 0, got {self.top_k}")
        real("top_p", self.top_p, lo=0.0, hi=1.0, lo_open=True)
        whole("seed", self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Sampling()


def softmax(logits: np.ndarray) -> np.ndarray:
    """Float64 softmax of a 1-D logit vector (probabilities sum to 1)."""
    z = logits.astype(np.float64) - np.max(logits)
    e = np.exp(z)
    return e / e.sum()


def filtered_probs(logits: np.ndarray, s: Sampling) -> np.ndarray:
    """The distribution a token is drawn from after temperature, top-k and top-p, shape ``(vocab,)``
    (a top-k at or above the vocabulary's size keeps every token)."""
    if s.greedy:
        p = np.zeros(logits.shape[-1])
        p[int(np.argmax(logits))] = 1.0
        return p
    p = softmax(logits / s.temperature)
    if s.top_k and s.top_k < p.size:
        kth = np.partition(p, -s.top_k)[-s.top_k]
        p = np.where(p >= kth, p, 0.0)
    if s.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        csum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(csum, s.top_p * csum[-1]) + 1)]
        mask = np.zeros_like(p, dtype=bool)
        mask[keep] = True
        p = np.where(mask, p, 0.0)
    return p / p.sum()


def step_rng(seed: int, position: int) -> np.random.Generator:
    """The generator that draws the token at sequence ``position`` under ``seed``.

    Counter-based (numpy's SeedSequence over the pair ``(seed, position)``), so a draw depends only
    on the seed and the position, never on what was drawn before: stepping back and forward again,
    replaying a saved session, or continuing it in another process gives the same token.
    """
    return np.random.default_rng((int(seed), int(position)))


def choose(
    logits: np.ndarray, s: Sampling, rng: np.random.Generator | None = None, *, position: int = 0
) -> int:
    """Pick the next token id from ``logits`` ``(vocab,)``: argmax when greedy, else one draw from
    :func:`filtered_probs` with ``rng`` (default :func:`step_rng` of ``s.seed`` and ``position``)."""
    if s.greedy:
        return int(np.argmax(logits))
    p = filtered_probs(logits, s)
    rng = step_rng(s.seed, position) if rng is None else rng
    return int(rng.choice(p.shape[0], p=p))
