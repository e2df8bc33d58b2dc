"""Which heads matter: head ablation, activation patching, direct logit attribution and the logit lens.

Every number here is exact for the forward that runs (no gradient estimate): an effect is the change in
a :class:`Target` when a head's output — its slice of the attention output projection's input,
``z_i^h = Σ_j α_ij^h v_j`` (``(n_heads·head_dim,)`` per position, head ``h`` at ``[h·D, (h+1)·D)``) —
is replaced, as a plain transformers forward with a hook on ``o_proj``'s input would compute it
(tests/test_head_effects.py checks this against exactly such hooks). GQA-aware: a KV head's effect
replaces the outputs of the whole group of query heads that read it at once
(:meth:`attnscope.core.arch.ArchConfig.group`).

Scopes (Wang et al. 2022, "Interpretability in the Wild" for the IOI task; Heimersheim & Nanda 2024,
"How to use and interpret activation patching"):

* ``"readout"``: the head's output is replaced only at the read-out position ``p``. Positions before
  ``p`` are unchanged in every layer, so the clean KV cache of ``ids[:p]`` is kept and each head costs
  one decode step over it.
* ``"everywhere"``: replaced at every position ``0..p``; one forward of ``ids[:p + 1]`` per head.

Direct logit attribution (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"):
the residual stream entering the final norm at ``p`` is the sum of the embedding, every head's output
through its slice of ``W_O``, every output-projection bias and every MLP output. With the final norm's
scale frozen at its value for that residual (RMSNorm ``w ⊙ x / rms(x)``, LayerNorm likewise after
centring), the norm is linear, so the target logit splits exactly into those parts (plus the norm's
and unembedding's biases). A family whose residual stream is not that sum (post-norm sublayers) is
refused in one line.

Logit lens (nostalgebraist 2020): the residual after each layer, through the final norm and the
unembedding, for the positions asked for only.

Torch backend only: the MLX backend's layers are not hookable this way (refused in one line).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from attnscope.core.analysis.remotable import remotable
from attnscope.core.checks import index
from attnscope.core.errors import BadArgument, Cancelled, OutOfRange, SessionError, UnsupportedModelError

TARGET_KINDS = ("logprob", "logit_diff", "kl")
METHODS = ("zero", "mean", "resample")
SCOPES = ("readout", "everywhere")


# -- targets ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """What an effect is measured on, read from the logits at ``position`` (which predict the token at
    ``position + 1``).

    Attributes:
        kind: ``"logprob"`` (log-probability of ``token``), ``"logit_diff"`` (logit of ``token`` minus
            that of ``other``) or ``"kl"`` (KL(clean ‖ changed) of the whole next-token distribution,
            in nats).
        position: the read-out position, ``0 .. seq_len - 1``.
        token, other: vocabulary ids (``other`` only for ``logit_diff``; ``token`` unused for ``kl``).
    """

    kind: str
    position: int
    token: int = -1
    other: int = -1

    def value(self, logits: np.ndarray, clean: np.ndarray | None = None) -> float:
        """The target on ``logits`` (``(vocab,)`` float); ``kl`` needs the clean logits too."""
        x = np.asarray(logits, dtype=np.float64)
        if self.kind == "logit_diff":
            return float(x[self.token] - x[self.other])
        logp = x - _logsumexp(x)
        if self.kind == "logprob":
            return float(logp[self.token])
        if clean is None:
            return 0.0
        c = np.asarray(clean, dtype=np.float64)
        logq = c - _logsumexp(c)
        return float(np.sum(np.exp(logq) * (logq - logp)))

    def to_json(self) -> dict:
        return {"kind": self.kind, "position": self.position, "token": self.token, "other": self.other}


def _logsumexp(x: np.ndarray) -> float:
    m = float(np.max(x))
    return m + math.log(float(np.sum(np.exp(x - m))))


def token_id(session, token: int | str, what: str = "token") -> int:
    """One vocabulary id from an id or a text that is exactly one token.

    Raises:
        BadArgument: a text that is not one token (the message lists its tokens), an id outside
            the vocabulary, or an empty text.
    """
    vocab = session.info.vocab_size
    if isinstance(token, bool):
        raise BadArgument(f"{what} must be a token id or text, got {token!r}")
    if isinstance(token, int | np.integer):
        if not 0 <= int(token) < vocab:
            raise BadArgument(f"{what} id {int(token)} is outside the vocabulary 0..{vocab - 1}")
        return int(token)
    if not isinstance(token, str) or not token:
        raise BadArgument(f"{what} must be a token id or a non-empty text, got {token!r}")
    if token.strip().lstrip("-").isdigit() and token.strip() == token:
        return token_id(session, int(token), what)
    ids = list(session.tokenizer.encode(token, add_special_tokens=False))
    if len(ids) != 1:
        pieces = [session.tokenizer.decode([i]) for i in ids]
        raise BadArgument(
            f"{what} {token!r} is {len(ids)} tokens ({' | '.join(repr(p) for p in pieces)}), not one: "
            "give a text that is one token, or its id"
        )
    return int(ids[0])


@remotable
def make_target(
    session,
    kind: str = "logprob",
    position: int | None = None,
    token: int | str | None = None,
    other: int | str | None = None,
) -> Target:
    """A checked :class:`Target` for ``session``'s sequence.

    ``position`` defaults to the last one (negative counts from the end); ``token`` defaults to the
    token the sequence holds at ``position + 1``, or the model's top token after the last position.

    Raises:
        SessionError: nothing run yet. BadArgument: an unknown kind, ``logit_diff`` without ``other``, a
            token that is not one token. OutOfRange: a position outside the sequence.
    """
    if kind not in TARGET_KINDS:
        raise BadArgument(f"target kind must be one of {', '.join(TARGET_KINDS)}, got {kind!r}")
    T = session.seq_len
    if not T:
        raise SessionError("run a prompt first: there is no sequence to measure on")
    if position is None:
        position = T - 1
    if isinstance(position, int | np.integer) and not isinstance(position, bool) and position < 0:
        position = int(position) + T
    position = index("position", position, T)
    if token is None:
        ids = session.ids
        tid = ids[position + 1] if position + 1 < T else int(np.argmax(_clean_logits(session, position)))
    else:
        tid = token_id(session, token, "target token")
    oid = -1
    if kind == "logit_diff":
        if other is None:
            raise BadArgument("a logit-difference target needs a second token (other)")
        oid = token_id(session, other, "other token")
        if oid == tid:
            raise BadArgument("the two tokens of a logit difference are the same token")
    return Target(kind, int(position), int(tid), int(oid))


# -- the model's parts ----------------------------------------------------------------------------------
@dataclass
class _Parts:
    layers: list  # decoder layer modules
    out_proj: list  # each layer's attention output projection (input: (B, L, n_heads·D))
    mlp: list  # each layer's MLP module (None where the layer has none)
    norm: Any  # final norm module
    lm_head: Any
    final_softcap: float | None
    pre_norm: bool


def _parts(session) -> _Parts:
    be = session.backend
    model = getattr(be, "model", None)
    import torch

    if not isinstance(model, torch.nn.Module):  # the MLX backend's model: no module hooks
        raise UnsupportedModelError(
            "head ablation, patching, direct logit attribution and the logit lens need the torch backend "
            "(the MLX backend's layers cannot be hooked): use --backend torch"
        )
    m: Any = model  # a transformers PreTrainedModel
    dec: Any = m.get_decoder() if hasattr(m, "get_decoder") else m
    if not (hasattr(dec, "layers") or hasattr(dec, "h")):
        dec = getattr(model, "transformer", dec)  # GPT-2
    layers = getattr(dec, "layers", None) or getattr(dec, "h", None)
    norm = next((getattr(dec, n) for n in ("norm", "ln_f", "final_layernorm") if hasattr(dec, n)), None)
    head: Any = m.get_output_embeddings() if hasattr(m, "get_output_embeddings") else None
    if layers is None or norm is None or head is None:
        raise UnsupportedModelError(
            f"{session.info.architecture}: its decoder layers, final norm or unembedding cannot be found"
        )
    outs, mlps = [], []
    arch = session.info.arch
    for i, layer in enumerate(layers):
        attn = next(
            (getattr(layer, n) for n in ("self_attn", "attn", "attention") if hasattr(layer, n)), None
        )
        proj = None
        if attn is not None:
            proj = next(
                (getattr(attn, n) for n in ("o_proj", "c_proj", "out_proj", "dense") if hasattr(attn, n)),
                None,
            )
        if proj is None and arch.has_map(i):
            raise UnsupportedModelError(
                f"{session.info.architecture}: a layer has no attention output projection to hook (o_proj/c_proj)"
            )
        outs.append(proj)
        mlps.append(
            next(
                (getattr(layer, n) for n in ("mlp", "feed_forward", "block_sparse_moe") if hasattr(layer, n)),
                None,
            )
        )
    cfg: Any = getattr(model, "config", None)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    post = any(hasattr(layers[0], n) for n in ("post_feedforward_layernorm", "post_mlp_layernorm"))
    return _Parts(
        list(layers), outs, mlps, norm, head, getattr(cfg, "final_logit_softcapping", None), not post
    )


def _clean_logits(session, position: int) -> np.ndarray:
    """The session's own logits at ``position`` (the logits after it was fed)."""
    n = session.n_prompt
    if position >= n - 1:
        return session.logits_at(position - (n - 1))
    with _scratch(session) as be:
        return be.forward(session.ids[: position + 1])


@contextlib.contextmanager
def _scratch(session) -> Iterator[Any]:
    """A backend on the session's model with its own cache, recording nothing."""
    with session.backend.fork(capture=False) as be:
        yield be


@contextlib.contextmanager
def _hooks(pairs: Sequence[tuple[Any, Callable]], kind: str = "pre") -> Iterator[None]:
    handles = []
    try:
        for mod, fn in pairs:
            handles.append(
                mod.register_forward_pre_hook(fn) if kind == "pre" else mod.register_forward_hook(fn)
            )
        yield
    finally:
        for h in handles:
            h.remove()


def _replace_heads(heads: Sequence[int], D: int, value, positions: slice) -> Callable:
    """A forward pre-hook putting ``value`` (None = zeros; else ``(L?, n_heads·D)`` rows, broadcast) into
    the slices of ``heads`` at ``positions`` of the output projection's input."""

    def hook(_mod, args):
        (x, *rest) = args
        x = x.clone()
        for h in heads:
            sl = slice(h * D, (h + 1) * D)
            if value is None:
                x[:, positions, sl] = 0
            else:
                v = value[..., sl].to(x.dtype)
                x[:, positions, sl] = v[-x[:, positions].shape[1] :] if v.dim() > 1 and v.shape[0] > 1 else v
        return (x, *rest)

    return hook


def _check(cancelled: Callable[[], bool] | None, done: int, total: int) -> None:
    if cancelled is not None and cancelled():
        raise Cancelled(f"stopped after {done} of {total} heads")


# -- captures -------------------------------------------------------------------------------------------
def _capture_inputs(be, parts: _Parts, ids: list[int]) -> list:
    """Every layer's output-projection input for ``ids`` from an empty cache: ``(L, n_heads·D)`` float32 each."""
    import torch

    got: list = [None] * len(parts.out_proj)

    def keep(i):
        def hook(_m, args):
            got[i] = args[0][0].detach().float()

        return hook

    be.reset()
    with (
        torch.inference_mode(),
        _hooks([(p, keep(i)) for i, p in enumerate(parts.out_proj) if p is not None]),
    ):
        be.forward(list(ids))
    be.reset()
    return got


# -- ablation -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadEffects:
    """Change in the target when each head's output is replaced.

    Attributes:
        query: ``(n_layers, n_heads)`` float64: target(changed) − target(clean) (for ``kl``: the KL itself).
        kv: ``(n_layers, n_kv_heads)`` float64: the same with the whole GQA group of query heads that
            read the KV head replaced at once.
        clean: the target on the clean run.
        target, method, scope: what was measured and how.
        layers: the real indices of the layers measured (layers with an attention map).
    """

    query: np.ndarray
    kv: np.ndarray
    clean: float
    target: Target
    method: str
    scope: str
    layers: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def top(self, k: int = 10) -> list[tuple[int, int, float]]:
        """The ``k`` query heads of largest |effect|: ``(layer, head, effect)``, largest first."""
        flat = np.argsort(-np.abs(np.nan_to_num(self.query)), axis=None)[:k]
        H = self.query.shape[1]
        return [(int(i // H), int(i % H), float(self.query.flat[i])) for i in flat]

    def to_json(self) -> dict:
        return {
            "target": self.target.to_json(),
            "method": self.method,
            "scope": self.scope,
            "clean": self.clean,
            "query_heads": np.round(self.query, 7).tolist(),
            "kv_heads": np.round(self.kv, 7).tolist(),
            "layers": list(self.layers),
        }


def _groups(session) -> list[list[int]]:
    arch = session.info.arch
    return [list(arch.group(k)) for k in range(arch.n_kv_heads)]


@remotable
def head_effects(
    session,
    target: Target | None = None,
    method: str = "zero",
    scope: str = "readout",
    source: str | Sequence[int] | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> HeadEffects:
    """Ablate every query head and every KV head's group, one at a time, and measure ``target``.

    Args:
        target: default :func:`make_target` (log-prob of the next token at the last position).
        method: ``"zero"``; ``"mean"`` (the head's output averaged over this sequence's positions
            ``0..p``); ``"resample"`` (the head's output from ``source``, a second prompt of token ids or
            text, at the same positions: it must be at least ``p + 1`` tokens long).
        scope: ``"readout"`` (only at the read-out position, KV cache of the prefix reused) or
            ``"everywhere"`` (every position ``0..p``).
        progress: ``progress(done, total)`` after each head; ``cancelled()`` is checked before each.

    Cost: one forward of ``ids[:p]``, then one decode step per head (readout) or one forward of
    ``ids[:p + 1]`` per head (everywhere). Memory: one extra KV cache of the prefix.

    Raises:
        BadArgument: unknown method/scope, resample without a source or with one too short.
        UnsupportedModelError: not the torch backend. Cancelled: ``cancelled()`` became true.
    """
    import torch

    if method not in METHODS:
        raise BadArgument(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if scope not in SCOPES:
        raise BadArgument(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    target = make_target(session) if target is None else target
    parts = _parts(session)
    info = session.info
    D, H = info.head_dim, info.n_heads
    p = target.position
    ids = session.ids[: p + 1]
    layers = info.arch.attention_layers
    groups = _groups(session)
    units = [(layer, [h]) for layer in layers for h in range(H)] + [
        (layer, g) for layer in layers for g in groups
    ]
    total = len(units)
    query = np.full((info.n_layers, H), np.nan)
    kv = np.full((info.n_layers, info.n_kv_heads), np.nan)
    with _scratch(session) as be, torch.inference_mode():
        replacement: list = [None] * len(parts.out_proj)
        if method != "zero":
            if method == "mean":
                rows = _capture_inputs(be, parts, ids)
                replacement = [None if r is None else r.mean(dim=0, keepdim=True) for r in rows]
            else:
                src = _source_ids(session, source, p + 1)
                rows = _capture_inputs(be, parts, src[: p + 1])
                replacement = rows
        be.reset()
        if scope == "readout":
            if p:
                be.forward(ids[:p])
            clean_logits = be.forward([ids[p]])
            be.truncate(p)
        else:
            clean_logits = be.forward(ids)
            be.reset()
        clean = target.value(clean_logits, clean_logits)
        for done, (layer, heads) in enumerate(units):
            _check(cancelled, done, total)
            value = replacement[layer]
            if scope == "readout":
                pos = slice(-1, None)
                value = value if value is None else value[-1:] if method == "resample" else value
                with _hooks([(parts.out_proj[layer], _replace_heads(heads, D, value, pos))]):
                    logits = be.forward([ids[p]])
                be.truncate(p)
            else:
                with _hooks([(parts.out_proj[layer], _replace_heads(heads, D, value, slice(None)))]):
                    logits = be.forward(ids)
                be.reset()
            effect = target.value(logits, clean_logits)
            effect = effect if target.kind == "kl" else effect - clean
            if done < len(layers) * H:
                query[layer, heads[0]] = effect
            else:
                kv[layer, groups.index(heads)] = effect
            if progress is not None:
                progress(done + 1, total)
    return HeadEffects(query, kv, clean, target, method, scope, layers)


def _source_ids(session, source, need: int) -> list[int]:
    if source is None:
        raise BadArgument("resample ablation needs a second prompt (source)")
    ids = (
        session.encode(source, session.chat_template) if isinstance(source, str) else [int(i) for i in source]
    )
    if len(ids) < need:
        raise BadArgument(
            f"the resample prompt has {len(ids)} tokens; it needs at least {need} (up to the read-out position)"
        )
    return ids


# -- activation patching ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PatchResult:
    """Fraction of the clean − corrupted target difference each head's patch accounts for.

    Attributes:
        denoise: ``(n_layers, n_heads)``: corrupted run with the head's output taken from the clean run:
            (t_patched − t_corrupt) / (t_clean − t_corrupt) (1 = the head alone restores the behaviour).
        noise: ``(n_layers, n_heads)``: clean run with the head's output from the corrupted run:
            (t_clean − t_patched) / (t_clean − t_corrupt) (1 = the head alone breaks it).
        denoise_kv, noise_kv: ``(n_layers, n_kv_heads)``: the same for whole GQA groups.
        clean, corrupt: the target on each run.
    """

    denoise: np.ndarray
    noise: np.ndarray
    denoise_kv: np.ndarray
    noise_kv: np.ndarray
    clean: float
    corrupt: float
    target: Target
    scope: str
    layers: tuple[int, ...] = ()

    def to_json(self) -> dict:
        r = lambda a: np.round(a, 7).tolist()  # noqa: E731
        return {
            "target": self.target.to_json(),
            "scope": self.scope,
            "clean": self.clean,
            "corrupt": self.corrupt,
            "denoise": r(self.denoise),
            "noise": r(self.noise),
            "denoise_kv": r(self.denoise_kv),
            "noise_kv": r(self.noise_kv),
            "layers": list(self.layers),
        }


@remotable
def patch_heads(
    session,
    corrupt: str | Sequence[int],
    target: Target | None = None,
    scope: str = "everywhere",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> PatchResult:
    """Activation patching of every head's output between the session's sequence (clean) and
    ``corrupt`` (text, encoded as the session's prompt was, or token ids), which must be as long up to the
    read-out position (the IOI-style swap of two names keeps the length).

    Raises:
        BadArgument: prompts of different lengths; a target that is not a logit difference or log-prob.
        UnsupportedModelError: not the torch backend. Cancelled: as :func:`head_effects`.
    """
    import torch

    if scope not in SCOPES:
        raise BadArgument(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    target = make_target(session) if target is None else target
    if target.kind == "kl":
        raise BadArgument("patching measures a log-prob or a logit difference, not a KL divergence")
    parts = _parts(session)
    info = session.info
    D, H = info.head_dim, info.n_heads
    p = target.position
    clean_ids = session.ids[: p + 1]
    bad = (
        session.encode(corrupt, session.chat_template)
        if isinstance(corrupt, str)
        else [int(i) for i in corrupt]
    )
    if len(bad) != session.n_prompt:
        raise BadArgument(
            f"the corrupted prompt has {len(bad)} tokens and the clean one {session.n_prompt}: patching needs "
            "prompts of the same length (swap words that are one token each)"
        )
    if p >= len(bad):
        raise OutOfRange(f"the read-out position {p} is past the corrupted prompt's {len(bad)} tokens")
    bad = bad[: p + 1]
    layers = info.arch.attention_layers
    groups = _groups(session)
    units = [(layer, [h]) for layer in layers for h in range(H)] + [
        (layer, g) for layer in layers for g in groups
    ]
    total = 2 * len(units)
    out = {
        k: np.full((info.n_layers, n), np.nan)
        for k, n in (("dn", H), ("ns", H), ("dkv", info.n_kv_heads), ("nkv", info.n_kv_heads))
    }
    with _scratch(session) as be, torch.inference_mode():
        rows = {"clean": _capture_inputs(be, parts, clean_ids), "corrupt": _capture_inputs(be, parts, bad)}
        t = {}
        for name, run in (("clean", clean_ids), ("corrupt", bad)):
            t[name] = target.value(be.forward(run))
            be.reset()
        diff = t["clean"] - t["corrupt"]
        done = 0
        for into, src, key in (("corrupt", "clean", "d"), ("clean", "corrupt", "n")):
            run = bad if into == "corrupt" else clean_ids
            if scope == "readout" and p:
                be.forward(run[:p])
            for u, (layer, heads) in enumerate(units):
                _check(cancelled, done, total)
                value = rows[src][layer]
                pos = slice(-1, None) if scope == "readout" else slice(None)
                v = value[-1:] if scope == "readout" else value
                with _hooks([(parts.out_proj[layer], _replace_heads(heads, D, v, pos))]):
                    logits = be.forward([run[p]] if scope == "readout" else run)
                if scope == "readout":
                    be.truncate(p)
                else:
                    be.reset()
                tv = target.value(logits)
                frac = ((tv - t["corrupt"]) if key == "d" else (t["clean"] - tv)) / diff if diff else np.nan
                if u < len(layers) * H:
                    out["dn" if key == "d" else "ns"][layer, heads[0]] = frac
                else:
                    out["dkv" if key == "d" else "nkv"][layer, groups.index(heads)] = frac
                done += 1
                if progress is not None:
                    progress(done, total)
            be.reset()
    return PatchResult(
        out["dn"], out["ns"], out["dkv"], out["nkv"], t["clean"], t["corrupt"], target, scope, layers
    )


# -- direct logit attribution ------------------------------------------------------------------------------
@dataclass(frozen=True)
class LogitAttribution:
    """The target logit at a position split into the residual stream's parts (final norm's scale frozen).

    Attributes:
        heads: ``(n_layers, n_heads)`` float64: each head's output through its ``W_O`` slice.
        attn_bias: ``(n_layers,)``: each output projection's bias (0 without one).
        mlp: ``(n_layers,)``: each MLP output.
        embedding: the token (and position) embedding entering layer 0.
        constant: the final norm's bias and the unembedding's bias, projected.
        logit: the model's logit for the token (for ``logit_diff``: the difference).
        residual_error: ``|Σ parts − residual|`` over ``|residual|``, the check that the parts are the
            whole residual stream (float32 round-off, ~1e-6).
    """

    heads: np.ndarray
    attn_bias: np.ndarray
    mlp: np.ndarray
    embedding: float
    constant: float
    logit: float
    target: Target
    residual_error: float

    @property
    def total(self) -> float:
        """The sum of every part (equals :attr:`logit`)."""
        return float(
            np.nansum(self.heads) + self.attn_bias.sum() + self.mlp.sum() + self.embedding + self.constant
        )

    def to_json(self) -> dict:
        return {
            "target": self.target.to_json(),
            "logit": self.logit,
            "total": self.total,
            "heads": np.round(self.heads, 7).tolist(),
            "attn_bias": np.round(self.attn_bias, 7).tolist(),
            "mlp": np.round(self.mlp, 7).tolist(),
            "embedding": self.embedding,
            "constant": self.constant,
        }


def _frozen_linear(norm, h):
    """``f(c)``: the final norm with its scale frozen at residual ``h`` (``(hidden,)``), linear in ``c``,
    and the norm's constant (its bias) so that ``f(h) + bias == norm(h)``."""
    import torch

    eps = next(
        (float(getattr(norm, n)) for n in ("variance_epsilon", "eps", "epsilon") if hasattr(norm, n)), 1e-6
    )
    bias = getattr(norm, "bias", None)
    layer_norm = isinstance(norm, torch.nn.LayerNorm) or bias is not None
    h = h.double()

    def scale(x):
        if layer_norm:
            return torch.sqrt(((x - x.mean()) ** 2).mean() + eps)
        return torch.sqrt((x * x).mean() + eps)

    s_h = scale(h)
    b = bias.detach().double() if bias is not None else torch.zeros_like(h)

    def f(c):
        c = c.double()
        if not torch.any(c):
            return torch.zeros_like(c)
        y = norm(c.to(next(norm.parameters()).dtype)[None]).double()[0] - b
        return y * scale(c) / s_h

    return f, b


@remotable
def logit_attribution(session, target: Target | None = None) -> LogitAttribution:
    """Direct logit attribution of ``target`` (``logprob`` and ``kl`` targets are attributed as the raw
    logit of the token; ``logit_diff`` as the difference) at its position.

    Raises:
        UnsupportedModelError: not the torch backend; a post-norm family, or one whose residual stream is
            not the sum of its parts (checked: :attr:`LogitAttribution.residual_error` above 1e-3).
    """
    import torch

    target = make_target(session) if target is None else target
    parts = _parts(session)
    if not parts.pre_norm:
        raise UnsupportedModelError(
            f"{session.info.architecture} normalises each sublayer's output (post-norm): its residual stream "
            "is not a sum of head outputs, so direct logit attribution is not defined for it"
        )
    info = session.info
    D, H, L = info.head_dim, info.n_heads, info.n_layers
    p = target.position
    ids = session.ids[: p + 1]
    z: list = [None] * L
    attn_out: list = [None] * L
    mlp_out: list = [None] * L
    got: dict = {}

    def keep_z(i):
        def hook(_m, args):
            z[i] = args[0][0, -1].detach()

        return hook

    def keep_out(store, i):
        def hook(_m, _args, out):
            o = out[0] if isinstance(out, tuple) else out
            store[i] = o[0, -1].detach().double()

        return hook

    def keep_first(_m, args, kwargs=None):
        x = args[0] if args else kwargs["hidden_states"]
        got["embedding"] = x[0, -1].detach().double()

    def keep_final(_m, args):
        got["residual"] = args[0][0, -1].detach().double()

    projs = [(i, m) for i, m in enumerate(parts.out_proj) if m is not None]
    pre = [(m, keep_z(i)) for i, m in projs] + [(parts.norm, keep_final)]
    post = [(m, keep_out(attn_out, i)) for i, m in projs]
    post += [(m, keep_out(mlp_out, i)) for i, m in enumerate(parts.mlp) if m is not None]
    first = parts.layers[0].register_forward_pre_hook(keep_first, with_kwargs=True)
    try:
        with _scratch(session) as be, torch.inference_mode(), _hooks(pre), _hooks(post, "post"):
            logits = be.forward(ids)
    finally:
        first.remove()
    resid = got["residual"]
    f, norm_bias = _frozen_linear(parts.norm, resid)
    W = parts.lm_head.weight.detach()
    u = W[target.token].double()
    if target.kind == "logit_diff":
        u = u - W[target.other].double()
    head_bias = getattr(parts.lm_head, "bias", None)
    const = float(norm_bias @ u)
    if head_bias is not None:
        hb = head_bias.detach().double()
        const += float(hb[target.token] - (hb[target.other] if target.kind == "logit_diff" else 0.0))
    heads = np.zeros((L, H))
    attn_bias = np.zeros(L)
    mlp = np.zeros(L)
    total = got["embedding"].clone()
    with torch.inference_mode():
        for i in range(L):
            proj = parts.out_proj[i]
            zi = z[i]
            if proj is None or zi is None:
                continue
            # head h alone through the projection: a block-diagonal batch of n_heads rows
            batch = torch.zeros((H, H * D), dtype=zi.dtype, device=zi.device)
            for h in range(H):
                batch[h, h * D : (h + 1) * D] = zi[h * D : (h + 1) * D]
            zero = proj(torch.zeros((1, H * D), dtype=zi.dtype, device=zi.device)).double()[0]
            per_head = proj(batch).double() - zero
            for h in range(H):
                heads[i, h] = float(f(per_head[h]) @ u)
            attn_bias[i] = float(f(zero) @ u)
            total = total + per_head.sum(0) + zero
            if mlp_out[i] is not None:
                mlp[i] = float(f(mlp_out[i]) @ u)
                total = total + mlp_out[i]
        embedding = float(f(got["embedding"]) @ u)
    err = float(torch.linalg.vector_norm(total - resid) / torch.linalg.vector_norm(resid).clamp_min(1e-30))
    if err > 1e-3:
        raise UnsupportedModelError(
            f"{info.architecture}: the residual stream is not the sum of embedding, head and MLP outputs "
            f"(relative difference {err:.1e}), so direct logit attribution is not defined for it"
        )
    x = np.asarray(logits, dtype=np.float64)
    logit = float(x[target.token] - (x[target.other] if target.kind == "logit_diff" else 0.0))
    result = LogitAttribution(heads, attn_bias, mlp, embedding, const, logit, target, err)
    if abs(result.total - logit) > 1e-3 * max(
        1.0, abs(logit)
    ):  # e.g. a logit scale or soft-cap after lm_head
        raise UnsupportedModelError(
            f"{info.architecture}: its logits are not the unembedding of the final norm's output "
            f"(parts sum to {result.total:.4f}, the logit is {logit:.4f}): direct logit attribution is not defined for it"
        )
    return result


# -- logit lens ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LogitLens:
    """Each layer's residual stream read through the final norm and the unembedding.

    Attributes:
        positions: ``(P,)`` the positions read.
        top_ids, top_probs: ``(n_layers, P, k)``: the top tokens after each layer and their probabilities.
        final_rank: ``(n_layers, P)`` int: the rank (0 = top) of the model's final prediction at each
            position after each layer; ``final_prob`` its probability; ``final_ids`` ``(P,)`` that token.
    """

    positions: np.ndarray
    top_ids: np.ndarray
    top_probs: np.ndarray
    final_ids: np.ndarray
    final_rank: np.ndarray
    final_prob: np.ndarray

    def to_json(self) -> dict:
        return {
            "positions": self.positions.tolist(),
            "top_ids": self.top_ids.tolist(),
            "top_probs": np.round(self.top_probs, 7).tolist(),
            "final_ids": self.final_ids.tolist(),
            "final_rank": self.final_rank.tolist(),
            "final_prob": np.round(self.final_prob, 7).tolist(),
        }


@remotable
def logit_lens(session, positions: Sequence[int] | None = None, k: int = 5) -> LogitLens:
    """The logit lens at ``positions`` (default: the last 16), ``k`` top tokens per layer and position.

    Cost: one forward of ``ids[:max(positions) + 1]`` and ``n_layers × P`` vocabulary projections: only the
    positions asked for are projected.

    Raises:
        OutOfRange: a position outside the sequence. BadArgument: ``k`` below 1.
        UnsupportedModelError: not the torch backend.
    """
    import torch

    T = session.seq_len
    if not T:
        raise SessionError("run a prompt first: there is no sequence to read")
    pos = (
        list(range(max(0, T - 16), T))
        if positions is None
        else [int(x) + T if int(x) < 0 else int(x) for x in positions]
    )
    for x in pos:
        if not 0 <= x < T:
            raise OutOfRange(f"position {x} is outside the sequence 0..{T - 1}")
    if not isinstance(k, int) or k < 1:
        raise BadArgument(f"k must be a whole number >= 1, got {k!r}")
    parts = _parts(session)
    L = session.info.n_layers
    sel = torch.tensor(pos)
    resid: list = [None] * L

    def keep(i):
        def hook(_m, _args, out):
            o = out[0] if isinstance(out, tuple) else out
            resid[i] = o[0, sel.to(o.device)].detach()

        return hook

    with (
        _scratch(session) as be,
        torch.inference_mode(),
        _hooks([(m, keep(i)) for i, m in enumerate(parts.layers)], "post"),
    ):
        final = be.forward(session.ids[: max(pos) + 1], all_logits=True)[pos]
    final_ids = np.argmax(final, axis=-1)
    tops, probs, ranks, fprob = [], [], [], []
    with torch.inference_mode():
        for i in range(L):
            h = resid[i]
            # the last layer's output is the final norm's input only before the norm: the lens applies it
            x = parts.lm_head(parts.norm(h[None])[0]).float()
            if parts.final_softcap:
                x = torch.tanh(x / parts.final_softcap) * parts.final_softcap
            pr = torch.softmax(x, dim=-1).cpu().numpy().astype(np.float64)
            order = np.argsort(-pr, axis=-1)
            tops.append(order[:, :k])
            probs.append(np.take_along_axis(pr, order[:, :k], -1))
            fp = pr[np.arange(len(pos)), final_ids]
            fprob.append(fp)
            ranks.append((pr > fp[:, None]).sum(-1))
    return LogitLens(
        np.asarray(pos),
        np.asarray(tops),
        np.asarray(probs),
        final_ids.astype(np.int64),
        np.asarray(ranks),
        np.asarray(fprob),
    )
