"""Replaying a decode run: what the maps and the next-token distribution were at any step.

A session after prefill of ``n_prompt`` tokens and ``n_generated`` decode steps holds one query
row per position. *Step* ``t`` (``0 .. n_generated``) is the state after ``t`` decode steps: the
sequence was ``n_prompt + t`` tokens long.

Why cropping is exact (no recompute, no stored history): with a causal mask query row ``i`` only
sees keys ``j <= i``, and the KV cache is append-only, so neither the keys nor the LSE of row
``i`` change when later tokens arrive. The map at step ``t`` is therefore exactly the top-left
``(n_prompt + t) × (n_prompt + t)`` block of the map now (bottom-right aligned
``tril(k=S−L)``; a decode step adds one row and one column and touches nothing else). A sliding
window only removes keys from a row, so the argument holds with one too.

The next-token distribution of step ``t`` is the softmax of the logits the session kept for that
step (:meth:`attnscope.core.session.Session.logits_at`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core.analysis.remotable import remotable
from attnscope.core.sampling import GREEDY, Sampling, filtered_probs, softmax
from attnscope.core.tokens import token_text

if TYPE_CHECKING:
    from attnscope.core.session import Session


def visible_len(n_prompt: int, n_generated: int, step: int | None) -> int:
    """Sequence length at decode step ``step`` (None = the latest step): ``n_prompt + step``.

    Raises:
        IndexError: ``step`` outside ``0 .. n_generated``.
    """
    if step is None:
        return n_prompt + n_generated
    if not 0 <= step <= n_generated:
        raise IndexError(f"step {step} out of range 0..{n_generated}")
    return n_prompt + step


@dataclass(frozen=True)
class NextTokenRow:
    """One candidate next token.

    Attributes:
        id: vocabulary id; text: display label; raw: the tokenizer's own string.
        p_model: the model's probability (softmax of the logits, temperature 1).
        p_sampled: probability under the sampling settings (temperature, top-k, top-p), i.e. the
            distribution the sampler draws from; 1.0 / 0.0 under greedy.
    """

    id: int
    text: str
    raw: str
    p_model: float
    p_sampled: float


@dataclass(frozen=True)
class NextTokenTable:
    """Top-``k`` next tokens at one step.

    Attributes:
        step: decode step (0 = after prefill).
        position: position the next token takes (``n_prompt + step``).
        rows: candidates, most likely first.
        chosen_id: the id that was actually generated at this step (None at the latest step).
        sampling: the settings ``p_sampled`` was computed with.
        entropy: entropy of the model's full distribution, nats.
    """

    step: int
    position: int
    rows: tuple[NextTokenRow, ...]
    chosen_id: int | None
    sampling: Sampling
    entropy: float


@remotable
def next_tokens(
    session: Session, step: int | None = None, k: int = 10, sampling: Sampling | None = None
) -> NextTokenTable:
    """Top-``k`` next-token probabilities at decode step ``step`` (None = the latest).

    Raises:
        SessionError: nothing run yet. IndexError: step out of range. ValueError: ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    step = session.n_generated if step is None else step
    logits = np.asarray(session.logits_at(step), dtype=np.float64)
    sampling = session.sampling if sampling is None else sampling
    p = softmax(logits)
    ps = filtered_probs(logits, sampling or GREEDY)
    top = np.argsort(-p, kind="stable")[:k]
    rows = []
    for i in top:
        raw, label = token_text(session.tokenizer, int(i))
        rows.append(NextTokenRow(int(i), label, raw, float(p[i]), float(ps[i])))
    pos = session.n_prompt + step
    chosen = session.ids[pos] if step < session.n_generated else None
    nz = p[p > 0]
    return NextTokenTable(step, pos, tuple(rows), chosen, sampling, float(-(nz * np.log(nz)).sum()))
