"""The mask, the scores and the softmax of one head at one forward step (the Mask panel's data).

A *step* is one forward call: step 0 is prefill (``L = n_prompt`` new queries over
``S = n_prompt`` keys); step ``t >= 1`` is decode step ``t`` (``L = 1`` new query, position
``n_prompt + t − 1``, over ``S = n_prompt + t`` cached keys).

The applied mask is the bottom-right aligned causal mask (docs/how-it-works.md, :mod:`attnscope.core.attention.masks`)::

    allowed[i, j] = j <= i + (S − L)          i.e. tril(ones(L, S), k = S − L)

so in decode (``L = 1``) the single query sees every cached key; the classic bug is
``tril(k = 0)``, which would let it see key 0 only (the is_causal-with-cache pitfall; tests/core/test_masks.py). A sliding window of ``W`` keys
additionally needs ``j > i + (S − L) − W``. A single-sequence session has no padding, so there
is no padding mask (batch = 1, every position is a real token).

Scaled scores before softmax are ``q · kᵀ · scale`` with ``-inf`` where masked; in a soft-capped
layer (Gemma 2) the softmax sees ``cap·tanh(q · kᵀ · scale / cap)``, and the report keeps both the
raw and the capped scores. The weights after softmax come from the stored LSE (exact). Row entropy, in nats::

    H_i = − Σ_j w_ij · ln w_ij        (0 · ln 0 = 0),   0 <= H_i <= ln(number of allowed keys)

Prefill of a long prompt runs in chunks (the torch backend: 512 tokens), each chunk with its own
``L`` and ``S``; chunk ``c`` applied exactly the rows of the full prefill mask it computed, so the
mask shown for step 0 is the union of what the chunks applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core.analysis.remotable import remotable
from attnscope.core.attention.masks import causal_mask

if TYPE_CHECKING:
    from attnscope.core.session import Session

MAX_ROWS = 512  # prefill rows drawn at most (the last ones: they see the most keys)


@dataclass(frozen=True)
class MaskReport:
    """One head at one step. Arrays cover query rows ``row_start .. row_stop-1`` (absolute
    positions) and every key ``0 .. S-1``.

    Attributes:
        layer, head, step: the selection; kind: ``"prefill"`` or ``"decode"``.
        L, S: queries and keys of the forward call; offset: ``S − L`` (the ``k`` of ``tril``).
        row_start, row_stop: absolute positions of the rows shown (all ``L`` rows unless more
            than :data:`MAX_ROWS`, then the last ones).
        sliding_window: the layer's window in keys, or None.
        allowed: ``(n_rows, S)`` bool, the mask that was applied (True = attend).
        scores: ``(n_rows, S)`` float32 scaled scores before softmax, ``-inf`` where masked.
        weights: ``(n_rows, S)`` float32 weights after softmax (rows sum to 1).
        entropy: ``(n_rows,)`` float32 row entropy, nats; max_entropy: ``ln(allowed keys)``.
        scale: the softmax scale used (``1/sqrt(head_dim)`` unless the model says otherwise).
        layer_windows: every layer's window as captured (None = global), to say how this layer
            relates to the others (:attr:`window_note`); empty when unknown.
        softcap: the layer's attention-logit cap (Gemma 2), or None; ``scores`` are then the capped
            scores the softmax saw and ``raw_scores`` the ``q·kᵀ·scale`` before the cap.
        raw_scores: ``(n_rows, S)`` float32 scores before the cap, ``-inf`` where masked; None
            without a cap.
        learned_sink: this head's learned sink logit (gpt-oss), or None; the weights of a row then
            sum to ``1 −`` :attr:`learned_share` of it.
        learned_share: ``(n_rows,)`` float32 share of each row on the learned sink, or None.
    """

    layer: int
    head: int
    step: int
    kind: str
    L: int
    S: int
    offset: int
    row_start: int
    row_stop: int
    sliding_window: int | None
    allowed: np.ndarray
    scores: np.ndarray
    weights: np.ndarray
    entropy: np.ndarray
    max_entropy: np.ndarray
    scale: float
    layer_windows: tuple[int | None, ...] = ()
    softcap: float | None = None
    raw_scores: np.ndarray | None = None
    learned_sink: float | None = None
    learned_share: np.ndarray | None = None

    @property
    def window_note(self) -> str:
        """One sentence on the window: this layer's, or that this layer is global while others slide.

        E.g. ``"This layer is global (full causal mask); layers 0–4, 6–10, 12–16 use a 512-key
        window."`` (Gemma 3 layer 5), ``"No sliding window in this model."``.
        """
        from attnscope.core.kv_formula import format_ranges

        by_w: dict[int, list[int]] = {}
        for i, w in enumerate(self.layer_windows):
            if w is not None:
                by_w.setdefault(w, []).append(i)
        others = "; ".join(
            f"layer{'s' if len(ls) > 1 else ''} {format_ranges(ls)} use a {w:,}-key window"
            for w, ls in sorted(by_w.items())
        )
        if self.sliding_window is not None:
            text = (
                f"Sliding window: {self.sliding_window:,} keys (j > i + S − L − W): a query sees itself and "
                f"the {self.sliding_window - 1:,} keys before it."
            )
            glob = [i for i, w in enumerate(self.layer_windows) if w is None]
            if glob:
                text += f" Layer{'s' if len(glob) > 1 else ''} {format_ranges(glob)} {'are' if len(glob) > 1 else 'is'} global."
            return text
        if others:
            return f"This layer is global (full causal mask); {others}."
        return "No sliding window in this model."

    @property
    def formula(self) -> str:
        """The mask rule with this step's numbers, e.g. ``tril(ones(1, 43), k = 43 − 1 = 42)``."""
        rule = f"allowed[i, j] = j ≤ i + (S − L) = j ≤ i + {self.offset}"
        if self.sliding_window is not None:
            rule += f"  and  j > i + {self.offset} − {self.sliding_window}"
        return (
            f"tril(ones(L, S), k = S − L) = tril(ones({self.L}, {self.S}), k = {self.S} − {self.L} = {self.offset});  "
            + rule
        )


def entropy_nats(w: np.ndarray) -> np.ndarray:
    """Row entropy ``−Σ w ln w`` in nats (``0 · ln 0 = 0``), float32 ``(n_rows,)``."""
    w = np.asarray(w, dtype=np.float64)
    lw = np.zeros_like(w)
    np.log(w, out=lw, where=w > 0)
    return (-(w * lw).sum(axis=-1)).astype(np.float32)


def step_geometry(n_prompt: int, n_generated: int, step: int) -> tuple[str, int, int]:
    """``(kind, L, S)`` of forward step ``step`` (0 = prefill, ``t`` = decode step ``t``).

    Raises:
        IndexError: step outside ``0 .. n_generated``.
    """
    if not 0 <= step <= n_generated:
        raise IndexError(f"step {step} out of range 0..{n_generated}")
    if step == 0:
        return "prefill", n_prompt, n_prompt
    return "decode", 1, n_prompt + step


@remotable
def mask_report(
    session: Session, layer: int, head: int, step: int | None = None, max_rows: int = MAX_ROWS
) -> MaskReport:
    """Build the :class:`MaskReport` of ``(layer, head)`` at ``step`` (None = the latest step).

    ``session`` may be a :class:`attnscope.core.remote.client.RemoteSession`: the report is then
    built on the engine from its trace (``@remotable``) and arrives identical.

    Raises:
        IndexError: layer, head or step out of range. SessionError: nothing run yet.
    """
    step = session.n_generated if step is None else step
    kind, L, S = step_geometry(session.n_prompt, session.n_generated, step)
    trace = session.trace
    row_stop = S
    row_start = max(S - L, row_stop - max_rows)
    rows, cols = slice(row_start, row_stop), slice(0, S)
    w = session.weights(layer, head, rows, cols)  # validates layer/head
    allowed = trace.allowed(layer, rows, cols)
    scores = trace.scores(layer, head, rows, cols)
    rec = trace.layers[layer]
    window = rec.sliding_window
    # the trace's mask must be the tril(k = S − L) rows of this forward call
    expect = causal_mask(L, S, window)[row_start - (S - L) :]
    if not np.array_equal(allowed, expect):  # pragma: no cover - would be an engine bug
        raise RuntimeError("the trace's mask disagrees with tril(k=S-L): engine bug")
    cap = getattr(rec, "softcap", None)
    raw = trace.scores(layer, head, rows, cols, raw=True).astype(np.float32) if cap is not None else None
    sinks = getattr(rec, "sinks", None)
    learned = share = None
    if sinks is not None:
        learned = float(sinks[head])
        share = trace.learned_sink_share(layer)[head, rows].astype(np.float32)
    n_allowed = allowed.sum(axis=1)
    with np.errstate(divide="ignore"):
        max_h = np.log(np.maximum(n_allowed, 1)).astype(np.float32)
    return MaskReport(
        layer,
        head,
        step,
        kind,
        L,
        S,
        S - L,
        row_start,
        row_stop,
        window,
        allowed,
        scores.astype(np.float32),
        w.astype(np.float32),
        entropy_nats(w),
        max_h,
        float(rec.scale),
        tuple(getattr(x, "sliding_window", None) for x in trace.layers),
        None if cap is None else float(cap),
        raw,
        learned,
        share,
    )
