"""Attention sinks: how much attention every head dumps on the first token and on delimiters.

Attention sinks (Xiao et al. 2023; README "Sinks"): softmax must sum to 1, so a head with nothing
to attend to puts its mass on a token every position can see: token 0 (often BOS or
``<|im_start|>``), or a period / newline (a delimiter head dumps weight on token 0 or a period).
Xiao et al. 2023 (StreamingLLM) show that evicting those tokens from the KV
cache breaks the model (see :mod:`attnscope.core.analysis.experiments`).

Scores, for one head and a sequence of ``T`` tokens with weights ``w[i, j]``:

* **sink score** (the basic one; docs/window.md, Sinks): the mean over query rows ``i >= 1``
  of ``w[i, 0]``. Row 0 can only attend to itself, so it is left out. Computed for every layer
  and head from ``q_i``, ``k_0`` and the LSE rows alone: ``w[i, 0] = exp(q_i · k_0 · scale −
  lse_i)`` (FlashAttention-2 §3.1), cost ``O(layers × heads × T × head_dim)``, linear in ``T``.
* **sink-set score**: the mean over rows ``i >= 1`` of ``Σ_{j ∈ D, j <= i} w[i, j]`` where
  ``D = {0} ∪ delimiters`` (:func:`delimiter_positions`: special tokens such as BOS or
  ``<|im_start|>``, and tokens whose text is only punctuation or whitespace/newline). Cost
  ``O(layers × heads × T × |D| × head_dim)``.

* **learned sink** (gpt-oss: one logit per query head joins every row's softmax denominator, the
  "learnable no-op slot" alternative to a token-0 sink; Xiao et al. 2023 §3.3): the mean over rows
  ``i >= 1`` of the slot's share ``exp(sink_h − lse_i) = 1 − Σ_j w[i, j]``, shown beside token 0.
  Sink heads then count it: a head is a sink head when its mass on token 0 and on the learned
  sink together reaches the threshold (:attr:`SinkReport.sink_total`).

Tracking across decode steps: decode never changes earlier rows (causal mask), so the table the
session had after ``t`` tokens is the same mean over rows ``1 .. t − 1`` only: the per-row
weights give every step's table at once (:attr:`SinkReport.running`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core.analysis.remotable import remotable

if TYPE_CHECKING:
    from attnscope.core.session import Session

DEFAULT_THRESHOLD = 0.5  # a head with sink score >= this is flagged as a sink head


def is_delimiter_text(text: str) -> bool:
    """True for a token text made only of punctuation and/or whitespace (incl. ``↵``, ``⇥``).

    Unicode categories ``P*`` (punctuation) and ``Z*`` / control characters count; the display
    arrows of :func:`attnscope.core.tokens.display_label` count as whitespace. An empty string is False.

    >>> is_delimiter_text("."), is_delimiter_text(" ,"), is_delimiter_text("↵"), is_delimiter_text(" the")
    (True, True, True, False)
    """
    text = text.replace("↵", "\n").replace("⇥", "\t").replace("␍", "\r")
    if not text:
        return False
    return all(ch.isspace() or unicodedata.category(ch)[0] in "PZC" for ch in text)


def delimiter_positions(tokens: Sequence, special_ids: Sequence[int] = ()) -> list[int]:
    """Positions ``p >= 1`` of delimiter tokens: special tokens, punctuation, whitespace.

    Args:
        tokens: :class:`attnscope.core.tokens.Token` objects (``id``, ``raw``, ``text``).
        special_ids: the tokenizer's special token ids (``tokenizer.all_special_ids``); tokens
            whose raw string looks like ``<|...|>`` or ``<s>``-style markup count too.

    Returns:
        Sorted positions, never 0 (position 0 is the sink itself and is always in the set).
    """
    special = {int(i) for i in special_ids}
    out = []
    for t in tokens:
        if t.position == 0:
            continue
        raw = str(t.raw)
        markup = raw.startswith("<") and raw.endswith(">") and len(raw) > 2 and not raw.startswith("<0x")
        if t.id in special or markup or is_delimiter_text(t.text):
            out.append(int(t.position))
    return out


def weight_on_keys(trace, positions: Sequence[int]) -> np.ndarray:
    """Total weight every row of every head puts on the keys at ``positions``.

    Args:
        trace: a :class:`attnscope.core.trace.base.Trace`, or any object with ``weight_on_key(key)``,
            ``n_layers``, ``n_heads`` and ``seq_len`` (summed key by key).
        positions: key positions (duplicates are counted once).

    Returns:
        ``(n_layers, n_heads, T)`` float32 (:meth:`attnscope.core.trace.base.TraceGeometry.row_mass`); row
        ``i`` sums ``w[i, j]`` over ``j`` in ``positions`` that it may see (``j <= i``, inside a
        sliding window).

    Raises:
        IndexError: a position outside ``0 .. T - 1``.
    """
    if hasattr(trace, "row_mass"):
        return trace.row_mass(positions)
    from attnscope.core.trace.base import key_positions, summed_weight_on_keys

    return summed_weight_on_keys(trace, key_positions(trace, positions))


def uniform_causal_baseline(n: int) -> float:
    """The sink score a head would get from plain causal averaging: a uniform causal head puts
    ``1 / (i + 1)`` on token 0 in row ``i``, so over rows ``1 .. n − 1`` the mean is
    ``(H_n − 1) / (n − 1)`` with ``H_n`` the n-th harmonic number (e.g. 0.5 at n = 2, 0.3611 at
    n = 4). A head's score divided by this tells a sink (many times it) from averaging (about 1).

    Raises:
        ValueError: ``n < 2`` (no row ``i >= 1``).
    """
    if n < 2:
        raise ValueError(f"the baseline needs at least 2 tokens, got {n}")
    return float(np.mean(1.0 / np.arange(2, n + 1, dtype=np.float64)))


def running_mean_from_row1(per_row: np.ndarray) -> np.ndarray:
    """``r[..., t]`` = mean of ``per_row[..., 1 : t + 1]``: the score after ``t + 1`` tokens.

    ``r[..., 0]`` is NaN (no row ``i >= 1`` yet). Shape and dtype as ``per_row`` (float32).
    """
    T = per_row.shape[-1]
    out = np.full(per_row.shape, np.nan, dtype=np.float32)
    if T > 1:
        c = np.cumsum(per_row[..., 1:].astype(np.float64), axis=-1)
        out[..., 1:] = c / np.arange(1, T)
    return out


@dataclass(frozen=True)
class SinkReport:
    """Sink scores of every head after a sequence, and how they evolved token by token.

    Attributes:
        sink: ``(n_layers, n_heads)`` float32, the basic sink score (mean over rows ``i >= 1``
            of the weight on key 0).
        sink_set: ``(n_layers, n_heads)`` float32, the same for the mass on ``{0} ∪ delimiters``.
        per_row: ``(n_layers, n_heads, T)`` weight each query row puts on key 0.
        per_row_set: ``(n_layers, n_heads, T)`` weight each row puts on the sink set.
        running: ``(n_layers, n_heads, T)``: ``running[..., t]`` is the sink score the session
            had when it held ``t + 1`` tokens (NaN at ``t = 0``).
        running_set: the same for the sink-set score.
        delimiters: positions (``>= 1``) of the delimiter tokens in the sink set.
        n_prompt: tokens of the prompt (rows ``>= n_prompt`` were decode steps).
        threshold: heads with ``sink >= threshold`` are sink heads.
    """

    sink: np.ndarray
    sink_set: np.ndarray
    per_row: np.ndarray
    per_row_set: np.ndarray
    running: np.ndarray
    running_set: np.ndarray
    delimiters: tuple[int, ...]
    n_prompt: int
    threshold: float = DEFAULT_THRESHOLD
    token_texts: tuple[str, ...] = field(default=())
    # learned sinks (gpt-oss), None for a model without: (n_layers, n_heads) mean share over rows
    # i >= 1, the (n_layers, n_heads, T) share of each row and its running mean
    learned: np.ndarray | None = None
    per_row_learned: np.ndarray | None = None
    running_learned: np.ndarray | None = None

    @property
    def has_learned_sinks(self) -> bool:
        return self.learned is not None

    @property
    def sink_total(self) -> np.ndarray:
        """``(n_layers, n_heads)``: mass on token 0 plus the learned sink's share (= :attr:`sink`
        without learned sinks): what sink detection (:meth:`sink_heads`) compares to the threshold."""
        return self.sink if self.learned is None else (self.sink + self.learned).astype(np.float32)

    @property
    def running_total(self) -> np.ndarray:
        """:attr:`running` plus :attr:`running_learned` (``(n_layers, n_heads, T)``)."""
        if self.running_learned is None:
            return self.running
        return (self.running + self.running_learned).astype(np.float32)

    @property
    def seq_len(self) -> int:
        return int(self.per_row.shape[-1])

    @property
    def n_layers(self) -> int:
        return int(self.sink.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.sink.shape[1])

    def sink_heads(self, threshold: float | None = None) -> list[tuple[int, int]]:
        """``(layer, head)`` pairs whose sink score is ``>= threshold`` (default: the report's); with
        learned sinks, the score is the mass on token 0 plus the learned sink's (:attr:`sink_total`)."""
        th = self.threshold if threshold is None else threshold
        return [(int(a), int(b)) for a, b in zip(*np.nonzero(self.sink_total >= th), strict=True)]

    def at_seq_len(self, n: int) -> np.ndarray:
        """The ``(n_layers, n_heads)`` sink table the session had with ``n`` tokens (``2 <= n <= T``)."""
        if not 2 <= n <= self.seq_len:
            raise ValueError(f"seq_len must be in 2..{self.seq_len}, got {n}")
        return self.running[..., n - 1]

    def by_step(self) -> list[tuple[int, np.ndarray]]:
        """``(seq_len, table)`` after prefill and after each decode step."""
        start = max(2, self.n_prompt)
        return [(n, self.at_seq_len(n)) for n in range(start, self.seq_len + 1)]

    def to_json(self) -> dict:
        """A JSON-ready dict (lists of floats, layers × heads)."""

        def r(a):  # NaN (a hybrid model's layer with no map) -> None: JSON has no NaN
            x = np.round(np.asarray(a, dtype=np.float64), 6)
            y = x.astype(object)
            y[np.isnan(x)] = None
            return y.tolist()

        out = {
            "definition": "sink score = mean over query rows i >= 1 of the attention weight on key 0 "
            "(row 0 can only attend to itself); sink_set = the same for the total weight on key 0 and "
            "the delimiter positions (special tokens, punctuation, whitespace/newline)",
            "seq_len": self.seq_len,
            "n_prompt": self.n_prompt,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "threshold": self.threshold,
            "sink": r(self.sink),
            "sink_set": r(self.sink_set),
            "delimiter_positions": list(self.delimiters),
            "tokens": list(self.token_texts),
            "sink_heads": [list(p) for p in self.sink_heads()],
            "by_step": [
                {"seq_len": n, "sink": r(t), "sink_set": r(self.running_set[..., n - 1])}
                for n, t in self.by_step()
            ],
        }
        if self.learned is not None and self.running_learned is not None:
            out["learned_sink"] = r(self.learned)
            out["sink_total"] = r(self.sink_total)
            out["learned_sink_definition"] = (
                "learned_sink = mean over query rows i >= 1 of the learned sink's share of the row, "
                "exp(sink_h - lse_i) = 1 - sum_j w_ij; sink heads compare sink + learned_sink to the threshold"
            )
            for entry in out["by_step"]:
                entry["learned_sink"] = r(self.running_learned[..., entry["seq_len"] - 1])
        return out


def sink_report(
    trace,
    tokens: Sequence,
    special_ids: Sequence[int] = (),
    n_prompt: int | None = None,
    threshold: float = DEFAULT_THRESHOLD,
) -> SinkReport:
    """Compute the :class:`SinkReport` of a filled trace.

    Args:
        trace: the session's Trace (torch or MLX) holding ``T = len(tokens)`` rows.
        tokens: the sequence's :class:`attnscope.core.tokens.Token` objects.
        special_ids: the tokenizer's special ids (for :func:`delimiter_positions`).
        n_prompt: prompt length (default: all tokens).
        threshold: sink-head threshold in [0, 1].

    Raises:
        ValueError: threshold outside [0, 1], or tokens that do not match the trace.
    """
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    T = trace.seq_len
    if len(tokens) != T:
        raise ValueError(f"{len(tokens)} tokens but the trace holds {T} rows")
    per_row = trace.weight_on_key(0).astype(np.float32)  # (L, H, T)
    delims = delimiter_positions(tokens, special_ids)
    per_row_set = per_row + weight_on_keys(trace, delims) if delims else per_row.copy()
    running = running_mean_from_row1(per_row)
    if T > 1:
        sink = per_row[..., 1:].mean(-1)
        sink_set = per_row_set[..., 1:].mean(-1)
    else:
        sink = np.zeros(per_row.shape[:2], np.float32)
        sink_set = sink.copy()
    from attnscope.core.trace.softmax_variant import learned_sink_rows

    per_row_learned = learned_sink_rows(trace)  # (L, H, T) or None
    learned = running_learned = None
    if per_row_learned is not None:
        running_learned = running_mean_from_row1(per_row_learned)
        learned = (per_row_learned[..., 1:].mean(-1) if T > 1 else np.zeros_like(sink)).astype(np.float32)
    return SinkReport(
        sink=sink.astype(np.float32),
        sink_set=sink_set.astype(np.float32),
        per_row=per_row,
        per_row_set=per_row_set.astype(np.float32),
        running=running,
        running_set=running_mean_from_row1(per_row_set),
        delimiters=tuple(delims),
        n_prompt=len(tokens) if n_prompt is None else int(n_prompt),
        threshold=float(threshold),
        token_texts=tuple(t.text for t in tokens),
        learned=learned,
        per_row_learned=per_row_learned,
        running_learned=running_learned,
    )


@remotable
def session_sink_report(session: Session, threshold: float = DEFAULT_THRESHOLD) -> SinkReport:
    """:func:`sink_report` for a :class:`attnscope.core.session.Session` after a prompt (+ steps).

    Raises:
        SessionError: nothing has run yet.
    """
    session._require_run()
    special = getattr(session.tokenizer, "all_special_ids", ()) or ()
    return sink_report(session.trace, session.tokens, special, session.n_prompt, threshold)
