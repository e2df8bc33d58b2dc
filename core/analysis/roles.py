"""Head roles: automatic labels for every head, with the scores they come from.

Heads specialise in identifiable ways (Voita et al. 2019; Olsson et al. 2022, induction heads):
previous-token, induction, delimiter / attention sink, positional. Each score is a mean attention weight, in [0, 1], read
from the exact weights of the Trace (no ``T × T`` map is built: every score is a diagonal or a
few columns, ``O(layers × heads × T × head_dim)`` per diagonal).

For a head with weights ``w[i, j]`` (query row ``i``, key ``j``) over the session's sequence of
``T`` tokens:

``previous_token``
    ``mean_{i = 2 .. T−1} w[i, i − 1]``. Rows 0 and 1 are left out: row 0 has no previous token
    and row 1's previous token is token 0, the sink, which would credit sink heads.
``sink`` (sink / delimiter)
    ``mean_{i = 1 .. T−1} Σ_{j ∈ D, j <= i} w[i, j]`` with ``D = {0} ∪ delimiters``
    (:func:`attnscope.core.analysis.sinks.delimiter_positions`): the sink-set score of :mod:`attnscope.core.analysis.sinks`,
    plus, in a model with learned sinks (gpt-oss), each row's share on the learned softmax slot.
``local`` (positional / local)
    ``mean_{i = 1 .. T−1} Σ_{j ∈ [i − window + 1, i], j ∉ {0, i − 1}} w[i, j]``: mass on the
    ``window`` most recent keys (itself included) other than the previous token and token 0, so
    that it does not re-count the two roles above. A head that attends to itself or smears over
    its neighbours scores high.
``induction``
    Measured on its own probe, not the user's text (Olsson et al. 2022, "In-context Learning and
    Induction Heads", §2; the repeated-random-tokens test): ``n_probes`` sequences of ``R``
    uniformly random non-special tokens repeated twice, after a BOS token when the tokenizer has
    one (``off = 1``, else 0). Query ``i`` in the second copy (``i = off + R .. off + 2R − 1``)
    holds the same token as ``i − R``; an induction head attends to the token that followed that
    earlier occurrence, key ``i − R + 1``. Score: the mean of ``w[i, i − R + 1]`` over those rows
    and the probes. The probe runs in a separate KV cache (:func:`attnscope.core.analysis.experiments.separate_backend`);
    the user's session is untouched. Its result depends only on the model and is cached per model.

Label: among previous-token, induction and local, the role with the highest score ``>= threshold``;
if none reaches it, ``"sink"`` when the sink score does, else ``"mixed"``. The sink comes last
because it is where a head parks its mass when it has nothing to do (Xiao et al. 2023): an induction
head reading text without repeats sinks most of its attention, and is still an induction head.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core.analysis.remotable import remotable
from attnscope.core.arch import ArchConfig

if TYPE_CHECKING:
    from attnscope.core.session import Session

ROLES: tuple[str, ...] = ("previous_token", "induction", "sink", "local")
ROLE_TITLES: dict[str, str] = {
    "previous_token": "previous-token",
    "induction": "induction",
    "sink": "sink/delimiter",
    "local": "positional/local",
    "mixed": "mixed",
}
DEFAULT_THRESHOLD = 0.4
DEFAULT_WINDOW = 4
PROBE_LEN = 50  # R: random tokens per copy (the induction-head literature uses 50-300)
N_PROBES = 2


def diagonal_weights(trace, offset: int) -> np.ndarray:
    """Weight each row puts on the key ``offset`` positions before it, for every layer and head.

    Returns:
        ``(n_layers, n_heads, T)`` float32; ``out[l, h, i] = w[i, i − offset]``, 0 where
        ``i < offset`` or the key is outside the layer's sliding window.

    :meth:`attnscope.core.trace.base.TraceGeometry.diagonal`: cost ``O(layers × heads × T × head_dim)``
    on torch (one dot product per row, from q, the cached keys and the LSE); other traces go
    through ``trace.weights`` on row blocks.

    Raises:
        ValueError: negative offset.
    """
    return trace.diagonal(offset)


def _diagonal_blocked(trace, offset: int, block: int = 256) -> np.ndarray:
    """:func:`diagonal_weights` through ``trace.weights(layer, head, rows, cols)`` tiles, whatever the
    trace (the generic path every trace has; the test oracle for the torch one's batched product)."""
    from attnscope.core.trace.base import TraceGeometry

    return TraceGeometry._diagonal(trace, offset, block)


# -- scores on the user's sequence ------------------------------------------------------------------
def sequence_scores(
    trace, delimiters: Sequence[int] = (), window: int = DEFAULT_WINDOW
) -> dict[str, np.ndarray]:
    """``previous_token``, ``sink`` and ``local`` scores (module docstring), each ``(L, H)`` float32.

    Args:
        trace: a filled Trace of ``T`` rows.
        delimiters: delimiter positions (``>= 1``) for the sink/delimiter set.
        window: keys counted by ``local`` (``>= 2``).

    Scores that have no row to average (``T < 3`` for previous_token, ``T < 2`` else) are NaN.

    Raises:
        ValueError: window < 2.
    """
    from attnscope.core.analysis.sinks import weight_on_keys

    if window < 2:
        raise ValueError(f"window must be >= 2, got {window}")
    T = trace.seq_len
    shape = (trace.n_layers, trace.n_heads)
    nan = np.full(shape, np.nan, dtype=np.float32)
    prev = diagonal_weights(trace, 1)
    out = {"previous_token": prev[..., 2:].mean(-1) if T >= 3 else nan.copy()}
    if T < 2:
        out["sink"], out["local"] = nan.copy(), nan.copy()
        return out
    from attnscope.core.trace.softmax_variant import learned_sink_rows

    sink_rows = weight_on_keys(trace, [0, *delimiters])
    learned = learned_sink_rows(trace)  # gpt-oss: the learned softmax slot is a sink too
    if learned is not None:
        sink_rows = sink_rows + learned
    out["sink"] = sink_rows[..., 1:].mean(-1)
    local = np.zeros((trace.n_layers, trace.n_heads, T), dtype=np.float32)
    rows = np.arange(T)
    for d in range(window):
        if d == 1 or d >= T:
            continue
        w = diagonal_weights(trace, d)
        w[..., rows - d <= 0] = 0.0  # key 0 (and keys before it) not counted
        local += w
    out["local"] = local[..., 1:].mean(-1)
    return {k: v.astype(np.float32) for k, v in out.items()}


# -- induction probe ----------------------------------------------------------------------------------
def probe_ids(tokenizer, vocab_size: int, length: int = PROBE_LEN, seed: int = 0) -> tuple[list[int], int]:
    """A repeated random-token sequence: ``[bos] + r + r`` with ``r`` of ``length`` random ids.

    Ids are drawn uniformly (numpy ``default_rng(seed)``) from ``0 .. vocab_size − 1`` without the
    tokenizer's special ids. Returns ``(ids, off)``, ``off = 1`` when a BOS was prepended.

    Raises:
        ValueError: ``length < 2``.
    """
    if length < 2:
        raise ValueError(f"probe length must be >= 2, got {length}")
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    rng = np.random.default_rng(seed)
    r: list[int] = []
    while len(r) < length:
        t = int(rng.integers(0, vocab_size))
        if t not in special:
            r.append(t)
    bos = getattr(tokenizer, "bos_token_id", None)
    head = [int(bos)] if bos is not None else []
    return head + r + r, len(head)


def induction_scores_from_trace(trace, length: int, off: int) -> np.ndarray:
    """Induction score of every head from a Trace that ran a probe ``[bos]·off + r + r``.

    Returns ``(n_layers, n_heads)`` float32: mean over rows ``i = off + R .. off + 2R − 1`` of
    ``w[i, i − R + 1]`` (``R = length``).
    """
    d = diagonal_weights(trace, length - 1)  # (L, H, T)
    return d[..., off + length : off + 2 * length].mean(-1).astype(np.float32)


def induction_scores(
    session: Session,
    length: int = PROBE_LEN,
    n_probes: int = N_PROBES,
    seed: int = 0,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> np.ndarray:
    """Induction scores ``(n_layers, n_heads)`` float32 of the session's model (module docstring).

    Runs ``n_probes`` probes (seeds ``seed .. seed + n_probes − 1``) in a separate KV cache and
    averages. Cached per model and parameters (in ``session.backend.memo``). The session's sequence is untouched.

    Raises:
        ValueError: the probe does not fit in the model's context.
        Cancelled: ``cancelled()`` became true between probes.
    """
    from attnscope.core.analysis.experiments import separate_backend
    from attnscope.core.errors import Cancelled

    memo = getattr(session.backend, "memo", {})  # per model: the backend's (Backend.memo)
    key = ("induction", length, n_probes, seed)
    if key in memo:
        return memo[key]
    info = session.info
    vocab = min(info.vocab_size or len(session.tokenizer), len(session.tokenizer))
    acc = np.zeros((info.n_layers, info.n_heads), dtype=np.float64)
    for p in range(n_probes):
        if cancelled is not None and cancelled():
            raise Cancelled("induction probe cancelled")
        if progress is not None:
            progress(f"Induction probe {p + 1}/{n_probes}", p / n_probes)
        ids, off = probe_ids(session.tokenizer, vocab, length, seed + p)
        if info.max_context and len(ids) > info.max_context:
            raise ValueError(f"the probe of {len(ids)} tokens does not fit the context of {info.max_context}")
        with separate_backend(session) as b:
            b.forward(ids)
            acc += induction_scores_from_trace(b.trace, length, off)
    res = (acc / n_probes).astype(np.float32)
    memo[key] = res
    return res


# -- labels -----------------------------------------------------------------------------------------
NO_MAP = "no map"  # the label of every head of a hybrid model's layer with no softmax attention


def label_heads(
    scores: dict[str, np.ndarray], threshold: float = DEFAULT_THRESHOLD, no_map: Sequence[int] = ()
) -> np.ndarray:
    """Label per head (module docstring): the best specific role ``>= threshold``, else sink, else mixed;
    :data:`NO_MAP` for every head of the layers in ``no_map`` (a hybrid model's layers without softmax
    attention, whose scores are NaN: :mod:`attnscope.core.trace.base`, "Layers with no map").

    Args:
        scores: role name -> ``(L, H)`` scores (NaN = not measured, never chosen).

    Returns:
        ``(L, H)`` array of role names (``object`` dtype).
    """
    specific = [r for r in ROLES if r in scores and r != "sink"]
    shape = next(iter(scores.values())).shape
    labels = np.full(shape, "mixed", dtype=object)
    if "sink" in scores:
        labels[np.nan_to_num(scores["sink"], nan=-1.0) >= threshold] = "sink"
    if specific:
        stack = np.stack([np.nan_to_num(scores[r], nan=-1.0) for r in specific])  # (R, L, H)
        best = np.array(specific, dtype=object)[stack.argmax(0)]
        hit = stack.max(0) >= threshold
        labels[hit] = best[hit]
    for layer in no_map:
        labels[layer] = NO_MAP
    return labels


@dataclass(frozen=True)
class RoleTable:
    """Role scores and labels of every head.

    Attributes:
        scores: role -> ``(n_layers, n_heads)`` float32 (see the module docstring).
        labels: ``(n_layers, n_heads)`` role names, ``"mixed"``, or :data:`NO_MAP`.
        threshold, window, probe_len, n_probes: the parameters used.
        group_size: query heads per KV head (for the KV-head column).
        seq_len: tokens of the user's sequence the prompt-based scores come from.
        no_map: real indices of a hybrid model's layers with no softmax attention (NaN scores).
    """

    scores: dict
    labels: np.ndarray
    threshold: float
    window: int
    probe_len: int
    n_probes: int
    group_size: int
    seq_len: int
    no_map: tuple[int, ...] = ()

    @property
    def n_layers(self) -> int:
        return int(self.labels.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.labels.shape[1])

    def relabel(self, threshold: float) -> RoleTable:
        """The same scores labelled with another threshold."""
        from dataclasses import replace

        return replace(
            self, labels=label_heads(self.scores, threshold, self.no_map), threshold=float(threshold)
        )

    def rows(self) -> list[dict]:
        """One dict per head: layer, head, kv_head, label and every score (NaN -> None)."""
        out = []
        for layer in range(self.n_layers):
            for head in range(self.n_heads):
                d = {
                    "layer": layer,
                    "head": head,
                    "kv_head": self.kv_head(head),
                    "label": str(self.labels[layer, head]),
                }
                for r in ROLES:
                    v = float(self.scores[r][layer, head])
                    d[r] = None if np.isnan(v) else round(v, 6)
                out.append(d)
        return out

    def kv_head(self, head: int) -> int:
        """The KV head query head ``head`` reads (:meth:`attnscope.core.arch.ArchConfig.kv_head`)."""
        return ArchConfig(self.n_layers, self.n_heads, self.n_heads // self.group_size).kv_head(head)

    def heads_with(self, role: str) -> list[tuple[int, int]]:
        """``(layer, head)`` labelled ``role``, best score first."""
        idx = [(int(a), int(b)) for a, b in zip(*np.nonzero(self.labels == role), strict=True)]
        if role in self.scores:
            idx.sort(key=lambda p: -float(self.scores[role][p]))
        return idx

    def to_json(self) -> dict:
        return {
            "definitions": {
                "previous_token": "mean over query rows i = 2..T-1 of the weight on key i-1",
                "induction": "repeated random tokens [bos] r r (|r| = probe_len): mean over rows i of the second "
                "copy of the weight on key i-probe_len+1 (Olsson et al. 2022)",
                "sink": "mean over rows i >= 1 of the weight on key 0 and the delimiter tokens",
                "local": "mean over rows i >= 1 of the weight on the `window` most recent keys, "
                "without key i-1 and key 0",
                "label": "highest of previous_token/induction/local >= threshold, else sink if >= threshold, "
                "else mixed",
            },
            "threshold": self.threshold,
            "window": self.window,
            "probe_len": self.probe_len,
            "n_probes": self.n_probes,
            "seq_len": self.seq_len,
            "heads": self.rows(),
        }


@remotable
def role_table(
    session: Session,
    threshold: float = DEFAULT_THRESHOLD,
    window: int = DEFAULT_WINDOW,
    probe_len: int = PROBE_LEN,
    n_probes: int = N_PROBES,
    induction: bool = True,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> RoleTable:
    """All role scores and labels for the session's model and current sequence.

    Args:
        session: a :class:`attnscope.core.session.Session` after a prompt, or a
            :class:`attnscope.core.remote.client.RemoteSession`: then the table is computed on the
            engine, from its model (``@remotable``), and arrives identical (labels as strings).
        induction: run the induction probe (else the induction scores are NaN).

    Raises:
        SessionError: nothing has run yet. ValueError: bad threshold or window.
    """
    from attnscope.core.analysis.sinks import delimiter_positions

    session._require_run()
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    special = getattr(session.tokenizer, "all_special_ids", ()) or ()
    scores = sequence_scores(session.trace, delimiter_positions(session.tokens, special), window)
    if induction:
        scores["induction"] = induction_scores(
            session, probe_len, n_probes, cancelled=cancelled, progress=progress
        )
    else:
        scores["induction"] = np.full(scores["sink"].shape, np.nan, dtype=np.float32)
    arch = session.info.arch
    no_map = tuple(i for i in range(arch.n_layers) if not arch.has_map(i))
    return RoleTable(
        scores=scores,
        labels=label_heads(scores, threshold, no_map),
        no_map=no_map,
        threshold=float(threshold),
        window=window,
        probe_len=probe_len,
        n_probes=n_probes,
        group_size=session.info.group_size,
        seq_len=session.seq_len,
    )
