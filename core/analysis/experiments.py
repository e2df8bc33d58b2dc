"""Live experiments: change one thing in every attention layer and measure what it does.

Each experiment re-runs the session's current sequence (prompt + generated tokens) on the same
model, in a **separate** KV cache and Trace (:func:`separate_backend`: the user's session is left
as it was), once unmodified (the baseline) and once modified, and compares:

* the next-token distribution after the sequence: ``KL(base ‖ exp) = Σ_v p_base(v) (log p_base(v)
  − log p_exp(v))`` in nats (:func:`kl_divergence`) and whether the top-1 token changes;
* the prompt's perplexity ``exp(−1/(P−1) Σ_{i=1}^{P−1} log p(x_i | x_<i))`` (:func:`perplexity`),
  from the logits at positions ``0 .. P−2``.

How a run feeds the sequence: positions ``< decode_from`` in one prefill forward, then the rest
one token at a time through the KV cache (decode), teacher-forced with the sequence's tokens.
Default ``decode_from = min(n_prompt, seq_len − 1)``: the last token is always a decode step, so
the next-token distribution comes from a decode row, as when the user pressed Step.

The experiments (:data:`KINDS`):

``evict_first`` (``k``)
    Evict the first ``k`` tokens from the KV cache: the row at position ``i >= k`` sees keys
    ``k .. i`` only (rows ``i < k`` ran before the eviction and see ``0 .. i``).
``sinks_window`` (``k``, ``window``)
    StreamingLLM's cache (Xiao et al. 2023, fig. 1d): ``k`` attention-sink tokens plus a rolling
    window; the row at ``i`` sees keys ``j < k`` and ``i − window < j <= i``. ``k = 0`` is plain
    window attention (their fig. 1b), which the paper shows collapses.
``no_causal_prefill``
    Drop the causal mask in prefill forwards (``L > 1``): every prompt row sees the whole prompt,
    future included, so the prompt's perplexity collapses (the model reads the answer).
``decode_top_left``
    The classic decode bug (docs/tabs/experiments.md, ``is_causal=True`` with a cache): a top-left
    aligned causal mask ``tril(ones(L, S))`` (:func:`attnscope.core.attention.masks.top_left_causal_mask`) in every
    forward. Prefill (``L = S``) is unchanged; a decode row (``L = 1``) sees key 0 only.
``no_scale``
    Scores ``q · k`` without the ``1/√head_dim`` factor (Vaswani et al. 2017 §3.2.1, why 1/√d_k): softmax
    saturates towards one-hot.

The cache policies apply per query row as a mask, which is exactly streaming decode with that
cache: the K/V of position ``j`` come from a row that saw only what the cache held when ``j``
arrived. Cached keys keep their original RoPE positions (the cache holds rotated keys);
StreamingLLM additionally re-indexes positions inside the cache (§3.2), which is not done here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core.analysis.remotable import remotable
from attnscope.core.attention.masks import causal_allowed
from attnscope.core.errors import Cancelled, SessionError, UnsupportedModelError

if TYPE_CHECKING:
    from attnscope.core.session import Session

KINDS: dict[str, str] = {
    "evict_first": "Evict the first k tokens from the KV cache",
    "sinks_window": "Keep k sink tokens + a window (StreamingLLM)",
    "no_causal_prefill": "Drop the causal mask during prefill",
    "decode_top_left": "Decode bug: top-left-aligned causal mask with a KV cache",
    "no_scale": "No 1/√d scaling",
}


# -- maths -----------------------------------------------------------------------------------------
def log_softmax(logits: np.ndarray) -> np.ndarray:
    """``log softmax`` over the last axis in float64 (stable: max subtracted first)."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def kl_divergence(logits_p: np.ndarray, logits_q: np.ndarray) -> np.ndarray | float:
    """``KL(p ‖ q) = Σ_v p(v) (log p(v) − log q(v))`` in nats, ``p = softmax(logits_p)``.

    Args:
        logits_p, logits_q: ``(..., vocab)`` logits of the same shape.

    Returns:
        ``(...)`` float64 (a float for 1-D input); ``inf`` where ``q`` is 0 and ``p`` is not.

    Raises:
        ValueError: shapes differ.
    """
    if np.shape(logits_p) != np.shape(logits_q):
        raise ValueError(f"logits shapes differ: {np.shape(logits_p)} vs {np.shape(logits_q)}")
    lp, lq = log_softmax(logits_p), log_softmax(logits_q)
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (lp - lq), 0.0)
    out = terms.sum(axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def token_logprobs(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """``log p(targets[i] | logits[i])`` for each row: ``(n,)`` float64 from ``(n, vocab)`` logits."""
    lp = log_softmax(logits)
    return lp[np.arange(len(targets)), np.asarray(targets, dtype=np.int64)]


def perplexity(logits: np.ndarray, ids: list[int] | np.ndarray) -> float:
    """Perplexity of ``ids`` under next-token ``logits``: ``exp(mean_i −log p(ids[i] | logits[i−1]))``.

    Args:
        logits: ``(n, vocab)``, row ``i`` predicting ``ids[i + 1]`` (at least ``len(ids) − 1`` rows).
        ids: the token ids, ``n >= 2``.

    Raises:
        ValueError: fewer than 2 ids or too few logit rows.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) < 2:
        raise ValueError("perplexity needs at least 2 tokens")
    if len(logits) < len(ids) - 1:
        raise ValueError(f"{len(logits)} logit rows cannot predict {len(ids) - 1} tokens")
    nll = -token_logprobs(np.asarray(logits)[: len(ids) - 1], ids[1:])
    return float(math.exp(nll.mean()))


# -- the experiment and its attention hook ---------------------------------------------------------
@dataclass(frozen=True)
class Experiment:
    """One experiment and its parameters.

    Attributes:
        kind: a key of :data:`KINDS`.
        k: ``evict_first``: tokens evicted; ``sinks_window``: sink tokens kept.
        window: ``sinks_window``: most recent tokens kept (the row's own token included).
        decode_from: positions ``>= decode_from`` are fed one token at a time (None: default,
            ``min(n_prompt, seq_len − 1)``).
    """

    kind: str
    k: int = 4
    window: int = 16
    decode_from: int | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown experiment {self.kind!r}; choose one of {', '.join(KINDS)}")
        if self.k < 0:
            raise ValueError(f"k must be >= 0, got {self.k}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.decode_from is not None and self.decode_from < 1:
            raise ValueError(f"decode_from must be >= 1, got {self.decode_from}")

    @property
    def title(self) -> str:
        return KINDS[self.kind]

    @property
    def params(self) -> str:
        """Short parameter text, e.g. ``"k=4, window=16"``."""
        if self.kind == "evict_first":
            return f"k={self.k}"
        if self.kind == "sinks_window":
            return f"sinks={self.k}, window={self.window}"
        return ""

    def allowed(self, q_pos: np.ndarray, k_pos: np.ndarray, sliding_window: int | None = None) -> np.ndarray:
        """The cache policy's boolean ``(len(q_pos), len(k_pos))`` mask at absolute positions.

        For ``evict_first`` and ``sinks_window`` (combined with causal + the layer's window);
        other kinds return the plain causal mask.
        """
        a = causal_allowed(q_pos, k_pos, sliding_window)
        qp, kp = np.asarray(q_pos)[:, None], np.asarray(k_pos)[None, :]
        if self.kind == "evict_first":
            a &= (kp >= self.k) | (qp < self.k)
        elif self.kind == "sinks_window":
            a &= (kp < self.k) | (kp > qp - self.window)
        return a


class Overrides:
    """The hook the torch attention function calls (``trace.overrides.attend``) for an experiment.

    ``attend(module, query, key, value, scaling, window, softcap=None, sinks=None) -> (out, lse)``
    with query ``(B, H, L, D)`` at positions ``S − L .. S − 1`` and key/value ``(B, H_kv, S, D)``
    (the whole cache); ``softcap`` and ``sinks`` are the layer's soft cap and learned sink logits,
    kept in every experiment (:func:`attnscope.core.attention.fused.sdpa_with_lse`).
    """

    def __init__(self, experiment: Experiment):
        self.experiment = experiment
        self.calls = 0

    def attend(self, module, query, key, value, scaling, window, softcap=None, sinks=None):
        import functools

        import torch
        from attnscope.core.attention.fused import sdpa_with_lse as _sdpa
        from attnscope.core.attention.masks import top_left_causal_mask

        self.calls += 1
        ex = self.experiment
        sdpa_with_lse = functools.partial(_sdpa, softcap=softcap, sinks=sinks)
        L, S, D = query.shape[2], key.shape[2], query.shape[-1]
        scale = scaling if scaling is not None else D**-0.5
        if ex.kind == "no_scale":
            return sdpa_with_lse(query, key, value, scale=1.0, causal=True, sliding_window=window)
        if ex.kind == "no_causal_prefill":
            if L > 1:
                return sdpa_with_lse(query, key, value, scale=scale, causal=False)
            return sdpa_with_lse(query, key, value, scale=scale, causal=True, sliding_window=window)
        if ex.kind == "decode_top_left":
            allowed = top_left_causal_mask(L, S)
            if window is not None:  # the window counted from the (wrong) top-left positions
                allowed &= causal_allowed(np.arange(L), np.arange(S), window)
        else:
            allowed = ex.allowed(np.arange(S - L, S), np.arange(S), window)
        mask = torch.from_numpy(allowed).to(query.device)
        return sdpa_with_lse(query, key, value, scale=scale, causal=False, mask=mask)


# -- separate runs on the same model ------------------------------------------------------------------
@contextmanager
def separate_backend(session: Session, overrides=None, capture: bool = True) -> Iterator:
    """A backend on the session's model with its own empty KV cache and Trace
    (:meth:`attnscope.core.backends.base.Backend.fork`).

    The user's cache and Trace are not touched; ``overrides`` is set on the new Trace (the
    experiment hook), for backends whose ``supports_overrides`` is true.

    Args:
        session: a :class:`attnscope.core.session.Session`.
        overrides: an object with ``attend(...)`` (:class:`Overrides`) or None.
        capture: record queries/LSE in the new Trace (roles need it; experiments do not).

    Raises:
        UnsupportedModelError: ``overrides`` with a backend that does not support them (MLX).
    """
    with session.backend.fork(overrides, capture) as scratch:
        yield scratch


@dataclass(frozen=True)
class RunLogits:
    """What one run of the sequence leaves for the comparison (small: no ``T × vocab`` array).

    Attributes:
        last: ``(vocab,)`` float32 logits after the last token (the next-token distribution).
        target_logprob: ``(T − 1,)`` float64, ``log p(x_{i+1} | x_≤i)`` for ``i = 0 .. T−2``.
        argmax: ``(T,)`` int64, the top-1 token predicted after each position.
    """

    last: np.ndarray
    target_logprob: np.ndarray
    argmax: np.ndarray


def run_sequence(
    session: Session,
    ids: list[int],
    decode_from: int,
    overrides=None,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RunLogits:
    """Feed ``ids`` (prefill ``ids[:decode_from]``, then decode one at a time) in a separate cache.

    Raises:
        Cancelled: ``cancelled()`` became true between forwards.
        ValueError: ``decode_from`` outside ``1 .. len(ids)``.
    """
    T = len(ids)
    if not 1 <= decode_from <= T:
        raise ValueError(f"decode_from must be in 1..{T}, got {decode_from}")
    from attnscope.core.backends.base import PREFILL_CHUNK

    tgt = np.asarray(ids[1:] + [0], dtype=np.int64)
    logp = np.zeros(T, dtype=np.float64)
    argmax = np.zeros(T, dtype=np.int64)
    last = None
    with separate_backend(session, overrides, capture=False) as b:
        pos = 0
        while pos < T:
            if cancelled is not None and cancelled():
                raise Cancelled("experiment cancelled")
            n = min(PREFILL_CHUNK, decode_from - pos) if pos < decode_from else 1
            lg = b.forward(ids[pos : pos + n], all_logits=True)  # (n, vocab)
            lg = lg.reshape(n, -1)
            logp[pos : pos + n] = token_logprobs(lg, tgt[pos : pos + n])
            argmax[pos : pos + n] = lg.argmax(-1)
            last = lg[-1]
            pos += n
            if progress is not None:
                progress(pos, T)
    return RunLogits(last=np.asarray(last, dtype=np.float32), target_logprob=logp[: T - 1], argmax=argmax)


@dataclass(frozen=True)
class ExperimentResult:
    """An experiment against the unmodified run of the same sequence.

    Attributes:
        experiment: what ran (``decode_from`` filled in).
        seq_len, n_prompt: the sequence.
        kl_next: ``KL(base ‖ exp)`` of the next-token distributions, nats.
        top1_base, top1_exp: ``(id, text, prob)`` top-1 next token of each run (prob in its run).
        p_exp_of_base_top1: probability the modified run gives the baseline's top-1 token.
        ppl_base, ppl_exp: the prompt's perplexity (NaN with fewer than 2 prompt tokens).
        nll_base, nll_exp: ``(T − 1,)`` per-position negative log-likelihood of the next token.
        top1_agreement: fraction of positions whose top-1 prediction is the same in both runs.
    """

    experiment: Experiment
    seq_len: int
    n_prompt: int
    kl_next: float
    top1_base: tuple[int, str, float]
    top1_exp: tuple[int, str, float]
    p_exp_of_base_top1: float
    ppl_base: float
    ppl_exp: float
    nll_base: np.ndarray = field(repr=False)
    nll_exp: np.ndarray = field(repr=False)
    top1_agreement: float = 1.0

    @property
    def top1_changed(self) -> bool:
        return self.top1_base[0] != self.top1_exp[0]

    def to_json(self) -> dict:
        ex = self.experiment
        return {
            "experiment": ex.kind,
            "title": ex.title,
            "k": ex.k,
            "window": ex.window,
            "decode_from": ex.decode_from,
            "seq_len": self.seq_len,
            "n_prompt": self.n_prompt,
            "kl_next": self.kl_next,
            "top1_base": list(self.top1_base),
            "top1_exp": list(self.top1_exp),
            "top1_changed": self.top1_changed,
            "p_exp_of_base_top1": self.p_exp_of_base_top1,
            "ppl_base": self.ppl_base,
            "ppl_exp": self.ppl_exp,
            "top1_agreement": self.top1_agreement,
        }


def _ppl(logprob: np.ndarray, n_prompt: int) -> float:
    if n_prompt < 2:
        return float("nan")
    return float(math.exp(-logprob[: n_prompt - 1].mean()))


def _top1(session: Session, logits: np.ndarray) -> tuple[int, str, float]:
    from attnscope.core.tokens import token_text

    p = np.exp(log_softmax(logits))
    i = int(np.argmax(p))
    return i, token_text(session.tokenizer, i)[1], float(p[i])


# Experiments that evict tokens from the KV cache: on a hybrid model (docs/how-it-works.md "Hybrid models") the
# linear-attention / Mamba / convolution layers fold every token into their state, so masking keys in the
# attention layers would not evict anything from the model; the others change only what every attention
# layer computes, which is as well-defined on a hybrid model (its other layers run unchanged).
CACHE_POLICY_KINDS = ("evict_first", "sinks_window")


def hybrid_refusal(arch, kind: str) -> str:
    """Why experiment ``kind`` cannot run on a model of geometry ``arch`` (one line), ``""`` when it can."""
    if kind not in CACHE_POLICY_KINDS or not arch.is_hybrid:
        return ""
    others = [i for i in range(arch.n_layers) if not arch.has_map(i) or arch.has_state(i)]
    if not others:
        return ""
    from attnscope.core.arch import kind_label

    first = others[0]
    return (
        f"{KINDS[kind]}: layer {first} is {kind_label(arch.layer_kind(first))}, whose state holds every token, "
        "so evicting tokens from the attention layers' KV cache does not evict them from this hybrid model"
    )


@remotable
def run_experiments(
    session: Session,
    experiments: list[Experiment],
    progress: Callable[[str, float], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> list[ExperimentResult]:
    """Run each experiment and the baseline on the session's current sequence.

    The baseline is run once per distinct ``decode_from``. The session's own KV cache, Trace and
    logits are unchanged afterwards.

    Args:
        session: a torch :class:`attnscope.core.session.Session` after a prompt (+ steps), or a
            :class:`attnscope.core.remote.client.RemoteSession`: then they run on the engine, on
            its model and sequence (``@remotable``), and the results arrive identical.
        experiments: what to run.
        progress: ``progress(message, fraction)``.
        cancelled: checked between forwards.

    Raises:
        SessionError: nothing has run yet, or a sequence of one token.
        UnsupportedModelError: not the torch backend; a cache-eviction experiment on a hybrid model
            (:func:`hybrid_refusal`).
        Cancelled: cancelled between forwards.
    """
    session._require_run()
    if not getattr(session.backend, "supports_overrides", False):  # undeclared: not supported
        raise UnsupportedModelError(
            f"experiments need the torch backend (this session runs on {session.backend.name})"
        )
    for e in experiments:
        why = hybrid_refusal(session.info.arch, e.kind)
        if why:
            raise UnsupportedModelError(why)
    ids = session.ids
    T, P = len(ids), session.n_prompt
    if T < 2:
        raise SessionError("experiments need at least 2 tokens in the sequence")
    default_from = max(1, min(P, T - 1))
    exps = [e if e.decode_from is not None else replace(e, decode_from=default_from) for e in experiments]
    # each exps[i].decode_from, as an int
    starts = [default_from if e.decode_from is None else e.decode_from for e in experiments]
    for f in starts:
        if f > T:
            raise ValueError(f"decode_from={f} is past the sequence of {T} tokens")
    froms = sorted(set(starts))
    n_runs = len(froms) + len(exps)
    done = [0]

    def prog(label):
        def f(pos, total):
            if progress is not None:
                progress(f"{label}: {pos}/{total} tokens", (done[0] + pos / total) / n_runs)

        return f

    base = {}
    for f in froms:
        base[f] = run_sequence(session, ids, f, None, cancelled, prog("Baseline"))
        done[0] += 1
    out = []
    for e, start in zip(exps, starts, strict=True):
        r = run_sequence(session, ids, start, Overrides(e), cancelled, prog(e.title))
        done[0] += 1
        b = base[start]
        pb = np.exp(log_softmax(r.last))
        top_b = _top1(session, b.last)
        out.append(
            ExperimentResult(
                experiment=e,
                seq_len=T,
                n_prompt=P,
                kl_next=float(kl_divergence(b.last, r.last)),
                top1_base=top_b,
                top1_exp=_top1(session, r.last),
                p_exp_of_base_top1=float(pb[top_b[0]]),
                ppl_base=_ppl(b.target_logprob, P),
                ppl_exp=_ppl(r.target_logprob, P),
                nll_base=(-b.target_logprob).astype(np.float32),
                nll_exp=(-r.target_logprob).astype(np.float32),
                top1_agreement=float(np.mean(b.argmax == r.argmax)),
            )
        )
    if progress is not None:
        progress("Experiments done", 1.0)
    return out


def default_params(seq_len: int) -> tuple[int, int]:
    """The ``(k, window)`` that fit a sequence of ``seq_len`` tokens: ``k = min(4, max(1, seq_len // 4))``
    (tokens evicted by ``evict_first``, sink tokens kept by ``sinks_window``: at most a quarter of the
    sequence) and ``window = max(1, min(16, seq_len // 2))`` (half of it at most, so that the window
    drops keys). On 14 tokens: ``(3, 7)``; from 32 tokens on: ``(4, 16)``."""
    return min(4, max(1, seq_len // 4)), max(1, min(16, seq_len // 2))


def param_fits(value: int, seq_len: int) -> bool:
    """True when a ``k`` or ``window`` of ``value`` still changes something on ``seq_len`` tokens:
    ``value < seq_len`` (evicting or keeping every token, or a window as long as the sequence, is the
    unmodified run)."""
    return value < seq_len


def default_experiments(
    seq_len: int, arch=None, k: int | None = None, window: int | None = None, decode_from: int | None = None
) -> list[Experiment]:
    """One experiment of each kind on a sequence of ``seq_len`` tokens: ``k`` and ``window`` (None:
    :func:`default_params`) for the two cache policies, ``decode_from`` for all (None: the default of
    :func:`run_experiments`); with ``arch`` (:class:`attnscope.core.arch.ArchConfig`) those a hybrid
    model refuses (:func:`hybrid_refusal`) are left out.

    Raises:
        ValueError: ``k < 0``, ``window < 1`` or ``decode_from < 1`` (:class:`Experiment`)."""
    fit_k, fit_w = default_params(seq_len)
    k = fit_k if k is None else k
    w = fit_w if window is None else window
    exps = [
        Experiment("evict_first", k=k, decode_from=decode_from),
        Experiment("sinks_window", k=k, window=w, decode_from=decode_from),
        Experiment("no_causal_prefill", decode_from=decode_from),
        Experiment("decode_top_left", decode_from=decode_from),
        Experiment("no_scale", decode_from=decode_from),
    ]
    return [e for e in exps if arch is None or not hybrid_refusal(arch, e.kind)]
