"""Which heads matter: head ablation, activation patching and direct logit attribution (the logit lens is
:mod:`attnscope.core.analysis.logit_lens`).

Every number here is exact for the forward that runs (no gradient estimate): an effect is the change in
a :class:`Target` when a head's output — its slice of the attention output projection's input,
``z_i^h = Σ_j α_ij^h v_j`` (``(n_heads·head_dim,)`` per position, head ``h`` at ``[h·D, (h+1)·D)``) —
is replaced, as a plain transformers forward with a hook on ``o_proj``'s input would compute it
(tests/core/test_head_effects.py checks this against exactly such hooks). GQA-aware: a KV head's effect
replaces the outputs of the whole group of query heads that read it at once
(:meth:`attnscope.core.arch.ArchConfig.group`).

Scopes (Wang et al. 2022, "Interpretability in the Wild" for the IOI task; Heimersheim & Nanda 2024,
"How to use and interpret activation patching"):

* ``"readout"``: the head's output is replaced only at the read-out position ``p``. Positions before
  ``p`` are unchanged in every layer, so the session's own KV cache of ``ids[:p]`` is read (never
  written) and the heads of a layer cost one decode step from that layer on, together.
* ``"everywhere"``: replaced at every position ``0..p``; the layers from the head's own up re-run over
  ``ids[:p + 1]`` (the layers below are reused).

Direct logit attribution (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"):
the residual stream entering the final norm at ``p`` is the sum of the embedding, every head's output
through its slice of ``W_O``, every output-projection bias and every MLP output. With the final norm's
scale frozen at its value for that residual (RMSNorm ``w ⊙ x / rms(x)``, LayerNorm likewise after
centring), the norm is linear, so the target logit splits exactly into those parts (plus the norm's
and unembedding's biases). A family whose residual stream is not that sum (post-norm sublayers) is
refused in one line.

The logit lens is :mod:`attnscope.core.analysis.logit_lens`.

On the MLX backend (its own llama/mistral/qwen2/qwen3 models) every public function here runs in
:mod:`attnscope.core.analysis.mlx_heads` instead, through the models' intervention seams rather than hooks
(:data:`BACKEND_IMPLS`); mlx-lm's families are refused in one line.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from attnscope.core.analysis.remotable import remotable
from attnscope.core.checks import index
from attnscope.core.errors import BadArgument, Cancelled, OutOfRange, SessionError, UnsupportedModelError

if TYPE_CHECKING:
    from attnscope.core.session import Session

TARGET_KINDS = ("logprob", "logit_diff", "kl")
METHODS = ("zero", "mean", "resample")
SCOPES = ("readout", "everywhere")

#: the analyses of a backend whose layers torch hooks cannot reach, by backend name: a module with this
#: module's public functions (attnscope.core.analysis.mlx_heads registers "mlx" when the package is imported)
BACKEND_IMPLS: dict[str, Any] = {}


def _backend_impl(session: Session, name: str) -> Callable | None:
    """``name`` as implemented for the session's backend, or None (the torch path below)."""
    impl = BACKEND_IMPLS.get(str(getattr(getattr(session, "backend", None), "name", "")))
    return getattr(impl, name, None)


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


def token_id(session: Session, token: int | str, what: str = "token") -> int:
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
    session: Session,
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


def provenance(session: Session, target: Target, **what) -> dict:
    """What a result was computed on, for its export (JSON-ready): the model, the prompt and its token ids,
    the target with its tokens' texts, and ``what`` (method, scope, site; ``corrupt`` / ``source``, the
    corrupted or resample prompt, as ``corrupt_prompt`` and ``corrupt_ids``: a text with its token ids)."""
    tok = session.tokenizer
    out: dict = {
        "model": session.info.name,
        "prompt": session.prompt,
        "chat_template": bool(session.chat_template),
        "ids": [int(i) for i in session.ids],
        "target": target.to_json(),
        "target_text": tok.decode([target.token]) if target.token >= 0 else None,
        "other_text": tok.decode([target.other]) if target.other >= 0 else None,
        "position_token": tok.decode([session.ids[target.position]]),
    }
    for key, v in what.items():
        if isinstance(v, str) and key in ("corrupt", "source"):
            out[f"{key}_prompt"] = v
            out[f"{key}_ids"] = [int(i) for i in session.encode(v, session.chat_template)]
        elif v is not None and not isinstance(v, str) and key in ("corrupt", "source"):
            out[f"{key}_ids"] = [int(i) for i in v]
        else:
            out[key] = v
    return out


def csv_preamble(prov: dict) -> str:
    """``# key: value`` lines heading a CSV export (the provenance of :func:`provenance`; read with
    ``pandas.read_csv(path, comment="#")``)."""
    import json

    keys = (
        "model",
        "prompt",
        "corrupt",
        "source",
        "target",
        "target_text",
        "other_text",
        "method",
        "scope",
        "site",
    )
    lines = [f"# {k}: {json.dumps(prov[k], ensure_ascii=False)}" for k in keys if k in prov]
    return "\n".join(lines) + "\n"


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
    # each layer's query / key / value projection (outputs ``(B, L, n_heads·D)`` / ``(B, L, n_kv_heads·D)``);
    # None where the layer has none or a fused one (GPT-2's c_attn, Phi-3's qkv_proj)
    q_proj: list = field(default_factory=list)
    k_proj: list = field(default_factory=list)
    v_proj: list = field(default_factory=list)


def _parts(session: Session) -> _Parts:
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
    qkv: dict[str, list] = {"q": [], "k": [], "v": []}
    info = session.info
    arch = info.arch
    widths = {
        "q": info.n_heads * info.head_dim,
        "k": info.n_kv_heads * info.head_dim,
        "v": info.n_kv_heads * info.head_dim,
    }
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
        for name in "qkv":
            mod = getattr(attn, f"{name}_proj", None) if attn is not None else None
            qkv[name].append(mod if getattr(mod, "out_features", None) == widths[name] else None)
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
        list(layers),
        outs,
        mlps,
        norm,
        head,
        getattr(cfg, "final_logit_softcapping", None),
        not post,
        qkv["q"],
        qkv["k"],
        qkv["v"],
    )


def _clean_logits(session: Session, position: int) -> np.ndarray:
    """The session's own logits at ``position`` (the logits after it was fed)."""
    n = session.n_prompt
    if position >= n - 1:
        return session.logits_at(position - (n - 1))
    with _scratch(session) as be:
        return be.forward(session.ids[: position + 1])


def _model_logits(session: Session, be, ids: Sequence[int], own: bool = True) -> np.ndarray:
    """The model's ``(vocab,)`` logits after ``ids`` (a prefix of the session's sequence, or another
    prompt): with ``own``, the session's own where it computed them; else a forward in the scratch
    backend ``be``."""
    n, p = session.n_prompt, len(ids) - 1
    if own and p >= n - 1 and list(session.ids[: p + 1]) == list(ids):
        return session.logits_at(p - (n - 1))
    be.reset()
    out = be.forward(list(ids))
    be.reset()
    return out


@contextlib.contextmanager
def _scratch(session: Session) -> Iterator[Any]:
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


def _put(x, cols: Sequence[slice], value, positions: slice):
    """``x`` (``(B, L, width)``) with ``cols`` at ``positions`` replaced by ``value`` (None = zeros; else
    ``(L?, width)`` rows, the last ones used, or one row broadcast)."""
    x = x.clone()
    for sl in cols:
        if value is None:
            x[:, positions, sl] = 0
        else:
            v = value[..., sl].to(x.dtype)
            x[:, positions, sl] = v[-x[:, positions].shape[1] :] if v.dim() > 1 and v.shape[0] > 1 else v
    return x


def _replace_heads(heads: Sequence[int], D: int, value, positions: slice) -> Callable:
    """A forward pre-hook putting ``value`` (None = zeros; else ``(L?, n_heads·D)`` rows, broadcast) into
    the slices of ``heads`` at ``positions`` of the output projection's input."""
    cols = [slice(h * D, (h + 1) * D) for h in heads]

    def hook(_mod, args):
        (x, *rest) = args
        return (_put(x, cols, value, positions), *rest)

    return hook


def _replace_out(cols: Sequence[slice], value, positions: slice) -> Callable:
    """A forward hook putting ``value`` into ``cols`` of a projection's output (q/k/v_proj)."""

    def hook(_mod, _args, out):
        return _put(out, cols, value, positions)

    return hook


def _check(cancelled: Callable[[], bool] | None, done: int, total: int) -> None:
    if cancelled is not None and cancelled():
        raise Cancelled(f"stopped after {done} of {total} heads")


# -- sites: what a unit replaces ------------------------------------------------------------------------
#: ``"output"``: a head's slice of the output projection's input (its ``Σ_j α_ij v_j``);
#: ``"query"``: its slice of q_proj's output (the query side alone, before RoPE / QK-norm);
#: ``"kv"``: a KV head's slices of k_proj's and v_proj's outputs (its keys and values, the GQA group's
#: shared side).
SITES = ("output", "query", "kv")


@dataclass(frozen=True)
class _Unit:
    layer: int
    site: str  # "output" | "query" | "kv"
    heads: tuple[int, ...]  # query heads (output, query) or one KV head (kv)
    row: str  # which result array: "query" (per query head), "kv" (per KV head), "kv_side"
    col: int


def _site_modules(parts: _Parts, u: _Unit, D: int) -> list[tuple[Any, str, str, list[slice]]]:
    """``(module, "pre"|"post", value key, column slices)`` for a unit."""
    cols = [slice(h * D, (h + 1) * D) for h in u.heads]
    if u.site == "output":
        return [(parts.out_proj[u.layer], "pre", "z", cols)]
    if u.site == "query":
        return [(parts.q_proj[u.layer], "post", "q", cols)]
    return [(parts.k_proj[u.layer], "post", "k", cols), (parts.v_proj[u.layer], "post", "v", cols)]


def _hookable(parts: _Parts, site: str, layers: Sequence[int]) -> bool:
    """Whether every layer in ``layers`` has the module(s) ``site`` replaces."""
    need = {"output": [parts.out_proj], "query": [parts.q_proj], "kv": [parts.k_proj, parts.v_proj]}[site]
    return all(i < len(mods) and mods[i] is not None for mods in need for i in layers)


def _need_site(parts: _Parts, site: str, layers: Sequence[int], architecture: str) -> None:
    if site not in SITES:
        raise BadArgument(f"site must be one of {', '.join(SITES)}, got {site!r}")
    if not _hookable(parts, site, layers):
        what = {"output": "output projection", "query": "query projection (q_proj)"}.get(
            site, "separate key and value projections (k_proj, v_proj)"
        )
        raise UnsupportedModelError(f"{architecture}: its attention layers have no {what} to patch")


def _unit_hooks(parts: _Parts, u: _Unit, D: int, values: dict | None, positions: slice) -> list:
    """The hooks replacing unit ``u``: ``values[(key, layer)]`` rows, or zeros where ``values`` is None
    (or has no entry)."""
    out = []
    for mod, kind, key, cols in _site_modules(parts, u, D):
        v = None if values is None else values.get((key, u.layer))
        fn = _replace_heads(u.heads, D, v, positions) if kind == "pre" else _replace_out(cols, v, positions)
        out.append((mod, fn, kind))
    return out


@contextlib.contextmanager
def _apply(hooks: Sequence[tuple[Any, Callable, str]]) -> Iterator[None]:
    handles = []
    try:
        for mod, fn, kind in hooks:
            handles.append(
                mod.register_forward_pre_hook(fn) if kind == "pre" else mod.register_forward_hook(fn)
            )
        yield
    finally:
        for h in handles:
            h.remove()


# -- captures -------------------------------------------------------------------------------------------
def _capture_inputs(be, parts: _Parts, ids: list[int]) -> list:
    """Every layer's output-projection input for ``ids`` from an empty cache: ``(L, n_heads·D)`` float32 each."""
    got = _capture_sites(be, parts, ids, ("z",))
    return [got.get(("z", i)) for i in range(len(parts.out_proj))]


def _site_hooks(parts: _Parts, keys: Sequence[str], got: dict) -> list:
    """Hooks appending, per model call, each site's activation of the call's one sequence (``(L, width)``
    float32) to ``got[(key, layer)]``: ``"z"`` the output projection's input, ``"q"``/``"k"``/``"v"`` the
    projections' outputs (where the layer has them)."""

    def keep_in(i):
        def hook(_m, args):
            got.setdefault(("z", i), []).append(args[0][0].detach().float())

        return hook

    def keep_out(key, i):
        def hook(_m, _args, out):
            got.setdefault((key, i), []).append(out[0].detach().float())

        return hook

    hooks: list = []
    for i, p in enumerate(parts.out_proj):
        if p is not None and "z" in keys:
            hooks.append((p, keep_in(i), "pre"))
    for key, mods in (("q", parts.q_proj), ("k", parts.k_proj), ("v", parts.v_proj)):
        if key in keys:
            hooks += [(m, keep_out(key, i), "post") for i, m in enumerate(mods) if m is not None]
    return hooks


def _joined(got: dict) -> dict:
    """``{(key, layer): (L, width)}`` from :func:`_site_hooks`' pieces (one per forward chunk)."""
    import torch

    return {k: v[0] if len(v) == 1 else torch.cat(v, dim=0) for k, v in got.items()}


def _capture_sites(
    be, parts: _Parts, ids: list[int], keys: Sequence[str] = ("z", "q", "k", "v"), logits: list | None = None
) -> dict:
    """``{(key, layer): (L, width) float32}`` for ``ids`` from an empty cache: ``"z"`` the output
    projection's input, ``"q"``/``"k"``/``"v"`` the projections' outputs (where the layer has them).
    ``logits``: the forward's ``(vocab,)`` logits at the last position are appended to it (the same as
    a plain :meth:`forward` of ``ids``: the hooks only read)."""
    import torch

    got: dict = {}  # (key, layer) -> one (L_chunk, width) piece per forward chunk
    be.reset()
    with torch.inference_mode(), _apply(_site_hooks(parts, keys, got)):
        lg = be.forward(list(ids))
    if logits is not None:
        logits.append(lg)
    be.reset()
    # the backend runs a long sequence in chunks: each hook fired once per chunk
    return _joined(got)


# -- re-running from a layer -----------------------------------------------------------------------------
class _Runner:
    """The logits at the read-out position of ``ids`` with some hooks in place, in a scratch backend ``be``
    with its own KV cache: the fallback where the session's own cache cannot be read
    (:class:`_SessionReadout`: a hybrid model, a check step that fails) or the whole
    sequence cannot be re-run from a layer (:class:`_Everywhere`: a hybrid model).

    Layers below a unit's layer see the same inputs with or without its hooks, so their outputs are
    reused: one recording forward keeps every decoder layer's call (its input hidden states and the
    keyword arguments the model passed: position embeddings, masks), and a unit re-runs only the layers
    from its own on, then the final norm and the unembedding at the read-out position.

    * ``readout`` scope: the prefix ``ids[:p]`` is in the KV cache (unchanged by a read-out patch), the
      recording is the decode step of ``ids[p]``; a re-run appends position ``p`` to layers ≥ the unit's
      and is cropped off again.
    * ``everywhere``: the recording is the forward of ``ids`` (chunk by chunk, as the backend runs it);
      a re-run feeds each chunk's recorded input to the layers ≥ the unit's with a fresh cache.

    Where the re-run cannot be trusted (a hybrid model's recurrent states, a length-dependent RoPE, or a
    check re-run from layer 0 that does not give the model's own logits: a logit scale after the
    unembedding), or ``reuse=False``, every unit runs a whole forward instead (:attr:`reuse` False):
    slower, the same numbers.
    """

    def __init__(self, be, parts: _Parts, ids: Sequence[int], scope: str, reuse: bool = True):
        import torch

        self.be, self.parts, self.ids, self.scope = be, parts, list(ids), scope
        self.p = len(self.ids) - 1
        n = len(parts.layers)
        chunks: list[list] = []
        reuse = reuse and not (getattr(be, "hybrid", False) or getattr(be.rope, "active", False))

        def keep(i):
            def hook(_m, args, kwargs):
                if i == 0 or not chunks:
                    chunks.append([None] * n)
                chunks[-1][i] = (args, dict(kwargs))

            return hook

        be.reset()
        handles = (
            [
                layer.register_forward_pre_hook(keep(i), with_kwargs=True)
                for i, layer in enumerate(parts.layers)
            ]
            if reuse
            else []
        )
        try:
            with torch.inference_mode():
                if scope == "readout":
                    if self.p:
                        be.forward(self.ids[: self.p])
                    chunks.clear()
                    self.clean = be.forward([self.ids[self.p]])
                else:
                    self.clean = be.forward(self.ids)
        finally:
            for h in handles:
                h.remove()
        self.chunks = chunks
        self._restore()
        self.reuse = reuse and bool(chunks) and all(c is not None for chunk in chunks for c in chunk)
        if self.reuse:
            again = self._from(0)
            scale = 1.0 + float(np.max(np.abs(self.clean)))
            self.reuse = bool(np.max(np.abs(again - self.clean)) <= 1e-5 * scale)
        if not self.reuse:
            self.chunks = []  # nothing recorded is kept where it is not used

    def _restore(self) -> None:
        if self.scope == "readout":
            self.be.truncate(self.p)
        else:
            self.be.reset()

    def logits(self, layer: int, hooks: Sequence[tuple[Any, Callable, str]]) -> np.ndarray:
        """``(vocab,)`` float32 logits at the read-out position with ``hooks`` (all on layer ``layer``)."""
        import torch

        with torch.inference_mode(), _apply(hooks):
            if self.reuse:
                return self._from(layer)
            if self.scope == "readout":
                out = self.be.forward([self.ids[self.p]])
            else:
                out = self.be.forward(self.ids)
            self._restore()
            return out

    def _from(self, layer: int) -> np.ndarray:
        import torch

        be, parts = self.be, self.parts
        cache = be.cache if self.scope == "readout" else be._new_cache()
        h = None
        with torch.inference_mode():
            for chunk in self.chunks:
                args, kw = chunk[layer]
                h = args[0] if args else kw["hidden_states"]
                for i in range(layer, len(parts.layers)):
                    h = _call_layer(parts.layers[i], h, chunk[i], cache)
            assert h is not None
            x = _read_out(parts, h)[-1]
        if self.scope == "readout":  # drop position p from the layers the re-run appended it to
            for cl in be._cache_layers():
                if getattr(cl, "keys", None) is not None and cl.keys.numel() and cl.keys.shape[-2] > self.p:
                    cl.keys = cl.keys[..., : self.p, :]
                    cl.values = cl.values[..., : self.p, :]
        return x.cpu().numpy()


def _call_layer(layer, h, call: tuple, cache: Any, widen: int = 0):
    """One decoder layer on ``h`` with a recorded call's other arguments (``(args, kwargs)``), the KV cache
    argument set to ``cache`` and, with ``widen``, the per-position arguments of a one-position call
    (position embeddings, position ids) repeated for ``widen`` positions (:func:`_widen`)."""
    args, kw = call
    kw = dict(kw)
    for name in ("cache", "past_key_values"):
        if name in kw:
            kw[name] = cache
    if widen:
        kw = {
            k: (v if k in ("attention_mask", "cache", "past_key_values") else _widen(k, v, widen))
            for k, v in kw.items()
        }
        args = tuple(_widen("", a, widen) for a in args[1:])
    else:
        args = tuple(args[1:])
    if call[0]:
        out = layer(h, *args, **kw)
    else:
        kw["hidden_states"] = h
        out = layer(**kw)
    return out[0] if isinstance(out, tuple) else out


def _widen(name: str, x, n: int):
    """A one-position argument repeated for ``n`` positions as a view: ``(1, 1, …)`` tensors (position
    embeddings' cos/sin, position ids) become ``(1, n, …)``, a ``cache_position`` of one ``(n,)``."""
    import torch

    if isinstance(x, tuple | list):
        return type(x)(_widen(name, v, n) for v in x)
    if isinstance(x, torch.Tensor):
        if x.dim() >= 2 and x.shape[0] == 1 and x.shape[1] == 1:
            return x.expand(1, n, *x.shape[2:])
        if name == "cache_position" and x.dim() == 1 and x.shape[0] == 1:
            return x.expand(n)
    return x


def _read_out(parts: _Parts, h):
    """``(L, vocab)`` float32 logits of ``h`` (``(1, L, hidden)``): final norm, unembedding, soft-cap."""
    import torch

    x = parts.lm_head(parts.norm(h))[0].float()
    if parts.final_softcap:
        x = torch.tanh(x / parts.final_softcap) * parts.final_softcap
    return x


@contextlib.contextmanager
def _attending(be, how) -> Iterator[None]:
    """``be``'s attention modules call ``how.attend`` (the Trace's overrides seam,
    :func:`attnscope.core.backends.hf_attention.attnscope_attention`) inside the block."""
    saved = be.trace.overrides
    be.trace.overrides = how
    try:
        yield
    finally:
        be.trace.overrides = saved


@contextlib.contextmanager
def _rope_at(be, length: int) -> Iterator[None]:
    """A length-dependent RoPE held at the frequencies of ``max(length, be.rope_floor)`` positions (the
    session's sequence, in a fork) for a model call made outside :meth:`TorchBackend.forward`."""
    rope = getattr(be, "rope", None)
    if rope is None or not rope.active:
        yield
        return
    saved = rope.target
    rope.target = max(length, int(getattr(be, "rope_floor", 0) or 0))
    try:
        yield
    finally:
        rope.target = saved


def _record_calls(parts: _Parts, run: Callable[[], Any], skip: bool = False) -> tuple[list, Any]:
    """Every decoder layer's call ``(args, kwargs)`` during ``run()``, and ``run()``'s result. ``skip``:
    the layers do nothing (each returns its input), so only the embedding, the arguments the model builds
    for its layers (position embeddings, masks) and the read-out run."""
    calls: list = [None] * len(parts.layers)

    def keep(i):
        def hook(_m, args, kwargs):
            calls[i] = (args, dict(kwargs))

        return hook

    def passthrough(*args, **kwargs):
        return args[0] if args else kwargs["hidden_states"]

    handles = [
        layer.register_forward_pre_hook(keep(i), with_kwargs=True) for i, layer in enumerate(parts.layers)
    ]
    if skip:
        for layer in parts.layers:
            layer.forward = passthrough
    try:
        out = run()
    finally:
        for h in handles:
            h.remove()
        if skip:
            for layer in parts.layers:
                layer.__dict__.pop("forward", None)
    return calls, out


_LIBC: list = []


def _release_memory() -> None:
    """Hand freed heap memory back to the system (glibc's ``malloc_trim``). A sweep's many large
    temporaries of the same sizes otherwise stay resident as freed-but-kept heap, and the process's
    resident memory grows by tens of MB per head at 2,048 tokens (``attnscope bench --heads``, peak
    memory); trimmed after each head it stays at one head's working set. A no-op without glibc."""
    if not _LIBC:
        import ctypes
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.append(libc.malloc_trim)
        except (OSError, AttributeError):
            _LIBC.append(None)
    if _LIBC[0] is not None:
        _LIBC[0](0)


class _HeapTrim:
    """:func:`_release_memory` where the process's resident memory has grown by more than ``limit``
    bytes since the last trim (read from ``/proc/self/statm``, a few microseconds): a loop of large
    temporaries calls :meth:`step` after each iteration. A trim hands the freed pages back, and the next
    iteration faults them in again (zero-filled): trimming only on growth keeps that cost to the
    iterations that grew the heap. Without ``/proc`` every step trims (a no-op without glibc)."""

    def __init__(self, limit: int = 16 << 20):
        self.limit = limit
        self.mark = _resident()

    def step(self) -> None:
        now = _resident()
        if now is None or self.mark is None or now - self.mark > self.limit:
            _release_memory()
            self.mark = _resident()


def _resident() -> int | None:
    """The process's resident memory in bytes (``/proc/self/statm``), or None where there is none."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _page_size() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return 4096


_PAGE = _page_size()


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    scale = 1.0 + float(np.max(np.abs(b)))
    return bool(np.max(np.abs(np.asarray(a) - np.asarray(b))) <= 1e-5 * scale)


# -- the read-out scope over the session's own KV cache ----------------------------------------------------
_VIEW_LAYER: list = []


def _view_layer_class():
    """A transformers ``DynamicLayer`` that hands out its keys/values followed by the new ones and keeps
    nothing: a read-only view of a prefix of another cache."""
    if not _VIEW_LAYER:
        import torch
        from transformers.cache_utils import DynamicLayer

        class _ViewLayer(DynamicLayer):
            def update(self, key_states, value_states, *args, **kwargs):
                if not self.is_initialized:
                    return key_states, value_states
                keys, values = cast(Any, self.keys), cast(Any, self.values)
                return torch.cat([keys, key_states], dim=-2), torch.cat([values, value_states], dim=-2)

        _VIEW_LAYER.append(_ViewLayer)
    return _VIEW_LAYER[0]


def _prefix_view(sb, p: int):
    """A cache whose layers read the first ``p`` positions of backend ``sb``'s KV cache as views (no copy)
    and store nothing: the session's cache is never written, and nothing needs cropping after a step."""
    view = _view_layer_class()
    cache = sb._DynamicCache()
    layers = []
    for cl in sb._cache_layers():
        v = view()
        keys = getattr(cl, "keys", None)
        if keys is not None and keys.numel():
            v.keys, v.values = keys[..., :p, :], cl.values[..., :p, :]
            v.device, v.is_initialized = keys.device, True
        layers.append(v)
    cache.layers = layers
    cache.layer_class_to_replicate = None
    return cache


def _holds_prefix(sb, ids: Sequence[int]) -> bool:
    """Whether backend ``sb``'s KV cache holds ``ids[:-1]`` (a non-hybrid torch cache)."""
    p = len(ids) - 1
    held = getattr(sb, "_ids", None)
    return (
        held is not None
        and not getattr(sb, "hybrid", False)
        and hasattr(sb, "_cache_layers")
        and getattr(sb, "seq_len", 0) >= p
        and list(held[:p]) == list(ids[:p])
    )


class _TreeAttend:
    """Attention for a batched read-out step laid out along the positions: ``n`` query rows, all at
    position ``p``, over keys ``0 .. p − 1`` (the prefix, shared: read once, never expanded or copied per
    row) followed by the ``n`` rows' own keys ``p .. p + n − 1``; row ``b`` sees the prefix and its own key
    ``p + b`` only, so each row is the decode step of position ``p`` with its own patch. The layer's
    window, soft-cap and learned sinks apply as in
    :func:`attnscope.core.attention.fused.sdpa_with_lse`; accumulated in float32."""

    def attend(self, module, query, key, value, scaling, window, softcap=None, sinks=None):
        import torch

        _, H, n, D = query.shape
        Hkv, S = key.shape[1], key.shape[2]
        G, p = H // Hkv, S - n
        scale = float(scaling) if scaling is not None else D**-0.5
        q = query[0].float().reshape(Hkv, G * n, D)
        k, v = key[0].float(), value[0].float()  # (Hkv, S, D)
        s_pre = torch.matmul(q, k[:, :p].transpose(-1, -2)) * scale  # (Hkv, G·n, p)
        q4 = q.reshape(Hkv, G, n, D)
        s_own = (q4 * k[:, None, p:]).sum(-1).reshape(Hkv, G * n, 1) * scale  # row b · its own key
        if softcap:
            s_pre = softcap * torch.tanh(s_pre / softcap)
            s_own = softcap * torch.tanh(s_own / softcap)
        if window is not None and p - window + 1 > 0:  # keys j <= p - window are outside the window
            s_pre[..., : p - window + 1] = float("-inf")
        parts = [s_pre, s_own]
        if sinks is not None:
            sk = sinks.float().reshape(Hkv, G, 1, 1).expand(Hkv, G, n, 1).reshape(Hkv, G * n, 1)
            parts.append(sk)
        w = torch.softmax(torch.cat(parts, dim=-1), dim=-1)
        own_v = v[:, None, p:].expand(Hkv, G, n, v.shape[-1]).reshape(Hkv, G * n, v.shape[-1])
        out = torch.matmul(w[..., :p], v[:, :p]) + w[..., p : p + 1] * own_v
        return out.reshape(1, H, n, v.shape[-1]).to(query.dtype), None


class _SessionReadout:
    """The read-out scope over the session's own KV cache: no prefix forward, no second cache.

    The prefix ``ids[:p]`` is in the session backend ``sb``'s cache already (its prefill); a cache of
    views onto its first ``p`` positions (:func:`_prefix_view`) serves every step and is never written,
    so the session's cache, logits and Trace stay exactly as they were. One recording decode step of
    ``ids[p]`` on the model (its attention modules pointed at the scratch backend ``be``'s Trace, which
    records nothing) keeps every decoder layer's call; then every unit of a layer runs in ONE step from
    that layer on (:meth:`batch`): ``n`` rows laid along the positions, each attending to the shared
    prefix and its own position ``p`` (:class:`_TreeAttend`). A check step of one unpatched row from
    layer 0 must give the recorded logits (:attr:`reuse`; else the caller falls back to :class:`_Runner`).

    With ``keys``, the recording step also keeps those sites' activations at ``p`` (:func:`_site_hooks`):
    :attr:`rows`, ``{(key, layer): (1, width) float32}`` (a read-out patch's values, without a forward of
    the whole prompt).
    """

    def __init__(self, sb, be, parts: _Parts, ids: Sequence[int], keys: Sequence[str] = ()):
        import torch

        self.be, self.parts = be, parts
        self.p = p = len(ids) - 1
        self.cache = _prefix_view(sb, p)
        x = torch.tensor([[int(ids[p])]], device=be.device)
        kw = {be._cache_kw: self.cache, "use_cache": True, "logits_to_keep": 1}
        got: dict = {}
        with torch.inference_mode(), _rope_at(be, p + 1), _apply(_site_hooks(parts, keys, got)):
            self.calls, res = _record_calls(parts, lambda: be.model(input_ids=x, **kw))
        self.rows = {k: v.clone() for k, v in _joined(got).items()}  # (1, width) each
        self.clean = res.logits[0, -1].float().cpu().numpy()
        self.reuse = all(c is not None for c in self.calls)
        if self.reuse:
            self.reuse = _close(self.batch(0, [], 1)[0], self.clean)

    def batch(self, layer: int, hooks: Sequence[tuple[Any, Callable, str]], n: int) -> np.ndarray:
        """``(n, vocab)`` float32 logits at the read-out position: one step of ``n`` rows from layer
        ``layer`` on, row ``b`` changed by the hooks that touch position ``b`` of the step
        (:func:`_row_hooks`)."""
        import torch

        h = self.calls[layer][0][0] if self.calls[layer][0] else self.calls[layer][1]["hidden_states"]
        h = h[:, -1:].expand(1, n, h.shape[-1])
        with torch.inference_mode(), _apply(hooks), _attending(self.be, _TreeAttend()):
            for i in range(layer, len(self.parts.layers)):
                h = _call_layer(self.parts.layers[i], h, self.calls[i], self.cache, widen=n)
            return _read_out(self.parts, h).cpu().numpy()

    def logits(self, layer: int, hooks: Sequence[tuple[Any, Callable, str]]) -> np.ndarray:
        """``(vocab,)``: :meth:`batch` of one row (hooks at the step's one position)."""
        return self.batch(layer, hooks, 1)[0]


class _KeepKV:
    """A one-layer cache for a walk over ``n`` positions in chunks: the attention layer's ``update``
    writes each chunk's keys and values after the ones before and hands back all of them so far
    (:class:`_WalkReadout` reads the layer's keys and values from it, then drops it)."""

    def __init__(self, n: int):
        self.n, self.end = n, 0
        self.keys: Any = None
        self.values: Any = None

    def update(self, key_states, value_states, *args, **kwargs):
        if self.keys is None:
            b, h, _, _ = key_states.shape
            self.keys = key_states.new_empty(b, h, self.n, key_states.shape[-1])
            self.values = value_states.new_empty(b, h, self.n, value_states.shape[-1])
        lo, self.end = self.end, self.end + key_states.shape[-2]
        self.keys[..., lo : self.end, :] = key_states
        self.values[..., lo : self.end, :] = value_states
        return self.keys[..., : self.end, :], self.values[..., : self.end, :]


def _cut_call(call: tuple, n: int, lo: int, hi: int) -> tuple:
    """A recorded layer call over ``n`` positions cut to positions ``lo..hi − 1``: its per-position
    arguments (position embeddings ``(1, n, …)``, position ids, a ``cache_position`` of ``n``) sliced."""
    import torch

    def cut(name: str, x):
        if isinstance(x, tuple | list):
            return type(x)(cut(name, v) for v in x)
        if isinstance(x, torch.Tensor):
            if x.dim() >= 2 and x.shape[0] == 1 and x.shape[1] == n:
                return x[:, lo:hi]
            if name == "cache_position" and x.dim() == 1 and x.shape[0] == n:
                return x[lo:hi]
        return x

    args, kw = call
    return (tuple(cut("", a) for a in args), {k: cut(k, v) for k, v in kw.items()})


def _layer_view(be, n_layers: int, layer: int, keys, values):
    """A cache of :func:`_view_layer_class` layers, all empty but ``layer``'s, which reads ``keys`` and
    ``values`` (``(1, n_kv_heads, p, D)``) and stores nothing."""
    view = _view_layer_class()
    cache = be._DynamicCache()
    layers = [view() for _ in range(n_layers)]
    v = layers[layer]
    v.keys, v.values, v.device, v.is_initialized = keys, values, keys.device, True
    cache.layers = layers
    cache.layer_class_to_replicate = None
    return cache


class _WalkReadout:
    """The read-out scope of a prompt the session's KV cache does not hold (a patch's corrupted prompt),
    without a KV cache of that prompt.

    One walk up the layers of the whole prompt ``ids`` (as :class:`_Everywhere`: a recording call in
    which the layers do nothing keeps their arguments; each layer runs in chunks of positions, as a
    prefill does) holds only the current layer's input and output and that layer's keys and values.
    Beside it, every unit's decode row of the read-out position ``p`` runs layer by layer: at layer ``l``
    the units of ``l`` join the batch as copies of the walk's row ``p`` (its input to ``l``), and the
    batch takes layer ``l``'s step over the prompt's keys and values ``0..p − 1`` (:class:`_TreeAttend`),
    in chunks of at most ``chunk`` rows, with each unit's hooks on its own layer only
    (:func:`_row_hooks`). The layer's keys and values are then dropped. A KV cache of the
    prompt (``2·n_layers·n_kv_heads·head_dim`` values per token, 94 MB for SmolLM2-135M at 2,048 tokens in
    float32) is never built: the sweep's memory stays at one layer's working set
    (``attnscope bench --heads``, read-out patching's peak).

    :attr:`rows` are the walk's activations of ``keys``' sites at ``p`` (``{(key, layer): (1, width)
    float32}``), :attr:`clean` its ``(vocab,)`` logits there; after :meth:`sweep`, :attr:`reuse` says
    whether one unpatched decode row, run beside the walk from layer 0, gave the walk's own logits
    (:func:`_close`); where it did not, the caller uses a scratch KV cache (:class:`_SessionReadout`).
    ``decode_calls``: every layer's call of a one-position step at ``p`` (the clean run's recording
    step, :attr:`_SessionReadout.calls`: the same positions)."""

    def __init__(self, be, parts: _Parts, ids: Sequence[int], decode_calls: list, keys: Sequence[str] = ()):
        import torch

        self.be, self.parts, self.ids, self.keys = be, parts, list(ids), tuple(keys)
        self.p = len(self.ids) - 1
        self.decode_calls = decode_calls
        self.rows: dict = {}
        self.clean: np.ndarray | None = None
        self.results: list = []
        x = torch.tensor([self.ids], device=be.device)
        try:
            with torch.inference_mode(), _rope_at(be, len(self.ids)):
                self.calls, _ = _record_calls(
                    parts, lambda: be.model(input_ids=x, use_cache=False, logits_to_keep=1), skip=True
                )
        except Exception:  # a layer whose caller needs its real output: the scratch cache instead
            self.calls = [None]
        self.reuse = all(c is not None for c in self.calls) and all(c is not None for c in decode_calls)
        self.reuse = self.reuse and all(
            any(k in c[1] for k in ("cache", "past_key_values")) for c in self.calls
        )

    def _walk_hooks(self, layer: int) -> list:
        """Hooks keeping layer ``layer``'s sites at the read-out position during the walk."""
        got = self.rows

        def keep_in(key):
            def hook(_m, args):
                got[key] = args[0][0, -1:].detach().float().clone()

            return hook

        def keep_out(key):
            def hook(_m, _args, out):
                got[key] = out[0, -1:].detach().float().clone()

            return hook

        hooks: list = []
        if "z" in self.keys and self.parts.out_proj[layer] is not None:
            hooks.append((self.parts.out_proj[layer], keep_in(("z", layer)), "pre"))
        for key, mods in (("q", self.parts.q_proj), ("k", self.parts.k_proj), ("v", self.parts.v_proj)):
            if key in self.keys and layer < len(mods) and mods[layer] is not None:
                hooks.append((mods[layer], keep_out((key, layer)), "post"))
        return hooks

    def sweep(
        self,
        units: Sequence[_Unit],
        D: int,
        values: dict | None,
        check: Callable[[], None],
        tick: Callable[[int, int], None] | None = None,
        reduce: Callable[[np.ndarray], Any] = lambda row: row,
        chunk: int = 64,
        walk_chunk: int = 0,
    ) -> None:
        """Run the walk and every unit's row; :attr:`results` = ``reduce`` of each unit's ``(vocab,)``
        float32 logits (default the logits), in ``units``' order; sets :attr:`rows`, :attr:`clean` and
        :attr:`reuse`. ``check()`` (cancel) before each layer and chunk; ``tick(layer + 1, n_layers)``
        after each layer. ``walk_chunk``: the walk's positions per layer call (default the prefill's
        chunk, :data:`attnscope.core.backends.base.PREFILL_CHUNK`)."""
        import torch
        from attnscope.core.backends.base import PREFILL_CHUNK

        walk_chunk = walk_chunk or PREFILL_CHUNK

        parts, be = self.parts, self.be
        n = len(parts.layers)
        order = sorted(range(len(units)), key=lambda j: units[j].layer)
        # row 0: an unpatched row from layer 0, the check that the decode rows give the walk's own logits
        batch_units: list[_Unit | None] = [None]
        first = self.calls[0]
        h = first[0][0] if first[0] else first[1]["hidden_states"]
        rows = h[:, -1:].clone()
        trim = _HeapTrim()
        nxt = 0
        with torch.inference_mode(), _rope_at(be, len(self.ids)):
            for i in range(n):
                check()
                joining = []
                while nxt < len(order) and units[order[nxt]].layer == i:
                    joining.append(order[nxt])
                    nxt += 1
                if joining:
                    rows = torch.cat([rows, h[:, -1:].expand(1, len(joining), h.shape[-1])], dim=1)
                    batch_units += [units[j] for j in joining]
                # the walk's layer i in chunks of positions (a prefill's working set, not a whole
                # prompt's), its keys and values written into one buffer
                T = h.shape[1]
                kv = _KeepKV(T)
                h_out = torch.empty_like(h)
                with _attending(be, _PlainAttend()), _apply(self._walk_hooks(i)):
                    for lo in range(0, T, walk_chunk):
                        hi = min(lo + walk_chunk, T)
                        call = _cut_call(self.calls[i], T, lo, hi)
                        h_out[:, lo:hi] = _call_layer(parts.layers[i], h[:, lo:hi], call, kv)
                h = h_out
                keys, vals = kv.keys, kv.values
                del kv, h_out
                if keys is None:
                    self.reuse = False
                    return
                cache = _layer_view(be, n, i, keys[..., : self.p, :], vals[..., : self.p, :])
                here = [u if u is not None and u.layer == i else None for u in batch_units]
                outs = []
                with _attending(be, _TreeAttend()):
                    for lo in range(0, rows.shape[1], chunk):
                        check()
                        hi = min(lo + chunk, rows.shape[1])
                        with _apply(_row_hooks(parts, here[lo:hi], D, values)):
                            outs.append(
                                _call_layer(
                                    parts.layers[i],
                                    rows[:, lo:hi],
                                    self.decode_calls[i],
                                    cache,
                                    widen=hi - lo,
                                )
                            )
                rows = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
                del cache, keys, vals, outs
                trim.step()
                if tick is not None:
                    tick(i + 1, n)
            self.clean = _read_out(parts, h[:, -1:])[-1].cpu().numpy()
            del h
            out: list = [None] * len(units)
            # each unit's logits reduced as they come (``n_units × vocab`` floats are not kept)
            for lo in range(0, rows.shape[1], chunk):
                logits = _read_out(parts, rows[:, lo : lo + chunk]).cpu().numpy()
                for b, row in enumerate(logits, start=lo):
                    if b == 0:
                        self.reuse = self.reuse and _close(row, self.clean)
                        if not self.reuse:
                            return
                    else:
                        out[order[b - 1]] = reduce(row)
        self.results = out


# -- the everywhere scope: one pass over the sequence, layers below each unit reused -----------------------
class _PlainAttend:
    """Causal attention without the LSE (nothing is recorded in a sweep): PyTorch's fused
    ``scaled_dot_product_attention`` for a full causal square without window, cap or sinks; else
    :func:`attnscope.core.attention.fused.sdpa_with_lse`."""

    def attend(self, module, query, key, value, scaling, window, softcap=None, sinks=None):
        import torch
        from attnscope.core.attention.fused import sdpa_with_lse

        causal = getattr(module, "is_causal", True)
        if window is None and softcap is None and sinks is None and query.shape[2] == key.shape[2]:
            out = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, is_causal=causal, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
            )
            return out, None
        return sdpa_with_lse(
            query,
            key,
            value,
            scale=scaling,
            causal=causal,
            sliding_window=window,
            exact_half=False,
            softcap=softcap,
            sinks=sinks,
        )


class _Everywhere:
    """The everywhere scope without a KV cache: the whole of ``ids`` runs through each layer in one call.

    A recording model call in which the layers do nothing keeps each layer's arguments (position
    embeddings, masks) and layer 0's input; :meth:`layers` then walks up the layers once, keeping only
    the current layer's input ``(1, len(ids), hidden)``, and at each layer asked for hands out a function
    that re-runs the layers from there with a unit's hooks and reads the logits at the last position. At
    the end of the walk the unpatched logits must equal ``clean`` (the model's own, e.g. the session's):
    :attr:`reuse`, else the caller recomputes with whole forwards (:class:`_Runner`).
    """

    def __init__(self, be, parts: _Parts, ids: Sequence[int], clean: np.ndarray):
        import torch

        self.be, self.parts, self.ids, self.clean = be, parts, list(ids), clean
        x = torch.tensor([self.ids], device=be.device)
        try:
            with torch.inference_mode(), _rope_at(be, len(self.ids)):
                self.calls, _ = _record_calls(
                    parts, lambda: be.model(input_ids=x, use_cache=False, logits_to_keep=1), skip=True
                )
        except Exception:  # a layer whose caller needs its real output: whole forwards instead
            self.calls = [None]
        self.reuse = all(c is not None for c in self.calls)

    def _run(self, h, start: int, stop: int):
        trim = _HeapTrim()
        for i in range(start, stop):
            h = _call_layer(self.parts.layers[i], h, self.calls[i], None)
            # each layer frees its whole-sequence temporaries (projections, MLP activations) around the
            # tensors that live on (the walk's input kept for the units, this layer's output), and glibc
            # keeps them as heap: untrimmed, the resident memory grows by about 4 KiB per token per layer
            # run, in the walk and in each unit's re-run alike (most of the sweep's peak above the
            # prefill's, ``attnscope bench --heads``); trimmed once it has grown, it stays near one
            # layer's working set
            trim.step()
        return h

    def layers(self, wanted: Sequence[int]) -> Iterator[tuple[int, Callable]]:
        """``(layer, from_here)`` for each of ``wanted`` (ascending); ``from_here(hooks)`` gives the
        ``(vocab,)`` float32 logits at the last position with ``hooks`` on that layer. Sets
        :attr:`reuse` after the last."""
        import torch

        n = len(self.parts.layers)
        first = self.calls[0]
        h = first[0][0] if first[0] else first[1]["hidden_states"]
        cur = 0
        with torch.inference_mode(), _attending(self.be, _PlainAttend()):
            for layer in sorted(wanted):
                h = self._run(h, cur, layer)
                cur = layer

                def from_here(hooks, h=h, layer=layer):
                    with torch.inference_mode(), _apply(hooks), _attending(self.be, _PlainAttend()):
                        return _read_out(self.parts, self._run(h, layer, n)[:, -1:])[-1].cpu().numpy()

                yield layer, from_here
            last = _read_out(self.parts, self._run(h, cur, n)[:, -1:])[-1].cpu().numpy()
        self.reuse = _close(last, self.clean)


def _row_hooks(parts: _Parts, units: Sequence[_Unit | None], D: int, values: dict | None) -> list:
    """Hooks for a batched read-out step (:meth:`_SessionReadout.batch`): the step's position ``b`` has
    unit ``units[b]`` replaced, by ``values[(key, layer)]``'s last row or zeros (None: position ``b`` is
    left as it is): what :func:`_unit_hooks` does to a step of one position, position by position."""
    by_mod: dict[int, tuple[Any, str, list]] = {}
    for b, u in enumerate(units):
        if u is None:  # a row left as it is
            continue
        for mod, kind, key, cols in _site_modules(parts, u, D):
            v = None if values is None else values.get((key, u.layer))
            by_mod.setdefault(id(mod), (mod, kind, []))[2].append((b, cols, v))

    def put(x, rows):
        x = x.clone()
        for b, cols, v in rows:
            for sl in cols:
                x[:, b, sl] = 0 if v is None else v[-1, sl].to(x.dtype)
        return x

    hooks: list = []
    for mod, kind, rows in by_mod.values():
        if kind == "pre":

            def pre(_m, args, rows=rows):
                return (put(args[0], rows), *args[1:])

            hooks.append((mod, pre, "pre"))
        else:

            def post(_m, _args, out, rows=rows):
                return put(out, rows)

            hooks.append((mod, post, "post"))
    return hooks


def _runner(session: Session, be, parts: _Parts, ids: Sequence[int], scope: str, clean=None):
    """The cheapest exact runner for ``ids`` (the read-out position last): the read-out scope over the
    session's own KV cache where it holds the prefix (:class:`_SessionReadout`), the everywhere scope in
    one pass (:class:`_Everywhere`, ``clean`` = the model's logits at the last position), else
    :class:`_Runner` in the scratch backend ``be``."""
    sb = session.backend
    if not getattr(be, "hybrid", False):
        if scope == "readout" and _holds_prefix(sb, ids):
            run: Any = _SessionReadout(sb, be, parts, ids)
            if run.reuse:
                return run
        elif scope == "everywhere" and clean is not None:
            run = _Everywhere(be, parts, ids, clean)
            if run.reuse:
                return run
    return _Runner(be, parts, ids, scope)


def _readout_pair(
    session: Session, be, parts: _Parts, clean_ids: list[int], bad: list[int], keys: Sequence[str]
) -> dict | None:
    """The read-out scope of a patch, both runs batched: ``{"clean": :class:`_SessionReadout` over the
    session's own KV cache, "corrupt": :class:`_WalkReadout` of the corrupted prompt}`` (no KV cache of
    it; its rows and logits come with its :meth:`_WalkReadout.sweep`). None where this cannot serve (a
    hybrid model, a read-out position 0, a check step that does not give the model's own logits): the
    caller captures with whole forwards and re-runs with :class:`_Runner`."""
    sb, p = session.backend, len(clean_ids) - 1
    if getattr(be, "hybrid", False) or p == 0 or not _holds_prefix(sb, clean_ids):
        return None
    clean = _SessionReadout(sb, be, parts, clean_ids, keys)
    if not clean.reuse:
        return None
    corrupt: Any = _WalkReadout(be, parts, bad, clean.calls, keys)
    if not corrupt.reuse:
        corrupt = _cached_readout(be, parts, bad, keys)
    return None if corrupt is None else {"clean": clean, "corrupt": corrupt}


def _cached_readout(be, parts: _Parts, bad: list[int], keys: Sequence[str]) -> _SessionReadout | None:
    """:class:`_SessionReadout` of ``bad`` over the scratch backend ``be``'s KV cache, its prefix
    ``bad[:-1]`` run into it once (kept there until the caller's ``be.reset()``): where a
    :class:`_WalkReadout` cannot serve. None where the check step fails."""
    be.reset()
    be.forward(list(bad[:-1]))
    corrupt = _SessionReadout(be, be, parts, bad, keys) if _holds_prefix(be, bad) else None
    if corrupt is None or not corrupt.reuse:
        be.reset()
        return None
    return corrupt


def _evaluate(
    run,
    make_runner: Callable[[], Any],
    parts: _Parts,
    units: Sequence[_Unit],
    D: int,
    values: dict | None,
    scope: str,
    check: Callable[[], None],
    step: Callable[[_Unit, np.ndarray], None],
) -> bool:
    """Every unit's logits at the read-out position, handed to ``step(unit, logits)`` as they come;
    ``check()`` (cancel) before each unit or batched step. Returns whether layers below each unit were
    reused. ``values``: what a unit
    puts in (:func:`_unit_hooks`), None for zeros. ``make_runner()`` gives whole forwards where an
    :class:`_Everywhere` pass did not check out (then every unit is handed over again)."""
    per_layer: dict[int, list[_Unit]] = {}
    for u in units:
        per_layer.setdefault(u.layer, []).append(u)
    if isinstance(run, _SessionReadout):
        for layer in sorted(per_layer):
            us = per_layer[layer]
            check()
            batch = run.batch(layer, _row_hooks(parts, us, D, values), len(us))
            _release_memory()
            for u, row in zip(us, batch, strict=True):
                check()  # per unit, as the unbatched paths: a cancel stops where it is asked
                step(u, row)
        return True
    if isinstance(run, _Everywhere):
        for layer, from_here in run.layers(list(per_layer)):
            for u in per_layer[layer]:
                check()
                step(u, from_here(_unit_hooks(parts, u, D, values, slice(None))))
                _release_memory()
        if run.reuse:
            return True
        run = make_runner()
    pos = slice(-1, None) if scope == "readout" else slice(None)
    for u in units:
        check()
        step(u, run.logits(u.layer, _unit_hooks(parts, u, D, values, pos)))
        _release_memory()
    return bool(run.reuse)


# -- ablation -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadEffects:
    """Change in the target when each head's output is replaced.

    Attributes:
        query: ``(n_layers, n_heads)`` float64: target(changed) − target(clean) (for ``kl``: the KL itself).
        kv: ``(n_layers, n_kv_heads)`` float64: the same with the whole GQA group of query heads that
            read the KV head replaced at once.
        kv_side: ``(n_layers, n_kv_heads)``: the same with the KV head's keys and values replaced
            (k_proj's and v_proj's output slices: the K/V side alone, every query head of the group still
            reading them); NaN where the layers have no separate k/v projections (fused QKV).
        clean: the target on the clean run.
        target, method, scope: what was measured and how.
        layers: the real indices of the layers measured (layers with an attention map).
        reused: whether layers below each head's were reused (False: one whole forward per head).
    """

    query: np.ndarray
    kv: np.ndarray
    clean: float
    target: Target
    method: str
    scope: str
    layers: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default=())
    kv_side: np.ndarray | None = None
    reused: bool = True

    def top(self, k: int = 10) -> list[tuple[int, int, float]]:
        """The ``k`` query heads of largest |effect|: ``(layer, head, effect)``, largest first."""
        flat = np.argsort(-np.abs(np.nan_to_num(self.query)), axis=None)[:k]
        H = self.query.shape[1]
        return [(int(i // H), int(i % H), float(self.query.flat[i])) for i in flat]

    def to_json(self) -> dict:
        out = {
            "target": self.target.to_json(),
            "method": self.method,
            "scope": self.scope,
            "clean": self.clean,
            "query_heads": np.round(self.query, 7).tolist(),
            "kv_heads": np.round(self.kv, 7).tolist(),
            "layers": list(self.layers),
        }
        if self.kv_side is not None:
            out["kv_side"] = np.round(self.kv_side, 7).tolist()
        return out


def _groups(session: Session) -> list[list[int]]:
    arch = session.info.arch
    return [list(arch.group(k)) for k in range(arch.n_kv_heads)]


def _layers_of(session: Session, layers: Sequence[int] | None) -> tuple[int, ...]:
    att = tuple(session.info.arch.attention_layers)
    if layers is None:
        return att
    out = []
    for x in layers:
        i = index("layer", x, session.info.n_layers)
        if i not in att:
            raise OutOfRange(f"layer {i} has no attention map (its heads cannot be ablated)")
        out.append(i)
    return tuple(sorted(set(out)))


def _units(
    session: Session, parts: _Parts, layers: Sequence[int], kv_side: bool, site: str = "output"
) -> list[_Unit]:
    H = session.info.n_heads
    groups = _groups(session)
    units: list[_Unit] = []
    if site in ("output", "query"):
        units += [_Unit(layer, site, (h,), "query", h) for layer in layers for h in range(H)]
        units += [_Unit(layer, site, tuple(g), "kv", k) for layer in layers for k, g in enumerate(groups)]
    if site == "kv" or kv_side:
        units += [_Unit(layer, "kv", (k,), "kv_side", k) for layer in layers for k in range(len(groups))]
    return units


@remotable
def head_effects(
    session: Session,
    target: Target | None = None,
    method: str = "zero",
    scope: str = "readout",
    source: str | Sequence[int] | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    layers: Sequence[int] | None = None,
    kv_side: bool = True,
) -> HeadEffects:
    """Ablate every query head, every KV head's group, and every KV head's keys and values, one at a time,
    and measure ``target``.

    Args:
        target: default :func:`make_target` (log-prob of the next token at the last position).
        method: ``"zero"``; ``"mean"`` (the head's output averaged over this sequence's positions
            ``0..p``); ``"resample"`` (the head's output from ``source``, a second prompt of token ids or
            text, at the same positions: it must be at least ``p + 1`` tokens long).
        scope: ``"readout"`` (only at the read-out position, KV cache of the prefix reused) or
            ``"everywhere"`` (every position ``0..p``).
        progress: ``progress(done, total)`` after each head; ``cancelled()`` is checked before each.
        layers: the layers to sweep (default every attention layer); the others stay NaN.
        kv_side: also the K/V side of each KV head (:attr:`HeadEffects.kv_side`), where the layers
            have separate k/v projections.

    Cost, readout: no forward of the prefix: the session's own KV cache holds ``ids[:p]`` and is read
    through views, never written (:class:`_SessionReadout`); one recording decode step of ``ids[p]``,
    then every unit of a layer (its query heads, GQA groups and K/V sides) in ONE step from that layer
    on, the units laid along the positions and each attending to the shared prefix and itself: one step
    per layer, not per head. Everywhere: ``ids[:p + 1]`` goes through each layer in one call without a
    KV cache (:class:`_Everywhere`): the layers below each head are walked once for the whole sweep,
    and a head costs the layers from its own up (on average about half a forward).
    Memory: readout, one layer's keys/values for the step (the prefix is shared, not copied per unit);
    everywhere, one layer's input ``(p + 1, hidden)`` and one layer's working set. ``mean`` and
    ``resample`` add one forward of ``ids[:p + 1]`` (or the source) to capture what is put in.
    Where this cannot be trusted (a hybrid model's recurrent states; a check step that does not give
    the model's own logits) every head runs a whole forward instead (:attr:`HeadEffects.reused` False).

    Raises:
        BadArgument: unknown method/scope, resample without a source or with one too short.
        OutOfRange: a layer outside the model or without attention.
        UnsupportedModelError: not the torch backend. Cancelled: ``cancelled()`` became true.
    """
    if (impl := _backend_impl(session, "head_effects")) is not None:
        return impl(session, target, method, scope, source, progress, cancelled, layers, kv_side)
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
    sweep = _layers_of(session, layers)
    side = kv_side and _hookable(parts, "kv", sweep)
    units = _units(session, parts, sweep, side)
    total = len(units)
    out = {
        "query": np.full((info.n_layers, H), np.nan),
        "kv": np.full((info.n_layers, info.n_kv_heads), np.nan),
        "kv_side": np.full((info.n_layers, info.n_kv_heads), np.nan),
    }
    with _scratch(session) as be, torch.inference_mode():
        values: dict | None = None
        if method == "mean":
            sites = _capture_sites(be, parts, ids, ("z", "k", "v") if side else ("z",))
            values = {key: r.mean(dim=0, keepdim=True) for key, r in sites.items()}
        elif method == "resample":
            src = _source_ids(session, source, p + 1)
            values = _capture_sites(be, parts, src[: p + 1], ("z", "k", "v") if side else ("z",))
            if scope == "readout":
                values = {key: r[-1:] for key, r in values.items()}
        clean_in = _model_logits(session, be, ids) if scope == "everywhere" else None
        run = _runner(session, be, parts, ids, scope, clean_in)
        clean_logits = run.clean
        clean = target.value(clean_logits, clean_logits)
        done = [0]

        def check() -> None:
            _check(cancelled, min(done[0], total), total)

        def step(u: _Unit, logits: np.ndarray) -> None:
            effect = target.value(logits, clean_logits)
            out[u.row][u.layer, u.col] = effect if target.kind == "kl" else effect - clean
            done[0] += 1
            if progress is not None:
                progress(min(done[0], total), total)

        reused = _evaluate(
            run,
            lambda: _Runner(be, parts, ids, scope, reuse=False),
            parts,
            units,
            D,
            values,
            scope,
            check,
            step,
        )
    return HeadEffects(
        out["query"],
        out["kv"],
        clean,
        target,
        method,
        scope,
        sweep,
        kv_side=out["kv_side"] if side else None,
        reused=reused,
    )


def _source_ids(session: Session, source, need: int) -> list[int]:
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
        denoise: ``(n_layers, n_heads)``: corrupted run with the head's output (``site="query"``: its
            query projection) taken from the clean run: (t_patched − t_corrupt) / (t_clean − t_corrupt)
            (1 = the head alone restores the behaviour). NaN for ``site="kv"``.
        noise: ``(n_layers, n_heads)``: clean run with the head's output from the corrupted run:
            (t_clean − t_patched) / (t_clean − t_corrupt) (1 = the head alone breaks it).
        denoise_kv, noise_kv: ``(n_layers, n_kv_heads)``: the same for whole GQA groups (``site="kv"``:
            for the KV head's keys and values, k_proj's and v_proj's outputs).
        clean, corrupt: the target on each run.
        site: ``"output"``, ``"query"`` or ``"kv"`` (:data:`SITES`).
        method: ``"exact"`` (:func:`patch_heads`) or ``"attribution"`` (:func:`attribution_patching`, the
            first-order estimate).
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
    site: str = "output"
    method: str = "exact"

    def agreement(self, exact: PatchResult) -> dict:
        """How well this estimate matches ``exact`` (same target, scope and site): per direction and per
        array, Spearman's rank correlation over the finite entries and the largest absolute error (in
        fractions of the clean − corrupted difference). ``{"denoise": {"spearman": r, "max_error": e},
        "noise": ..., "denoise_kv": ..., "noise_kv": ...}``."""
        out = {}
        for name in ("denoise", "noise", "denoise_kv", "noise_kv"):
            a, b = np.asarray(getattr(self, name)).ravel(), np.asarray(getattr(exact, name)).ravel()
            ok = np.isfinite(a) & np.isfinite(b)
            if ok.sum() < 2:
                continue
            out[name] = {
                "spearman": _spearman(a[ok], b[ok]),
                "max_error": float(np.max(np.abs(a[ok] - b[ok]))),
            }
        return out

    def to_json(self) -> dict:
        r = lambda a: np.round(a, 7).tolist()  # noqa: E731
        return {
            "target": self.target.to_json(),
            "scope": self.scope,
            "site": self.site,
            "method": self.method,
            "clean": self.clean,
            "corrupt": self.corrupt,
            "denoise": r(self.denoise),
            "noise": r(self.noise),
            "denoise_kv": r(self.denoise_kv),
            "noise_kv": r(self.noise_kv),
            "layers": list(self.layers),
        }


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN where either side is constant."""

    def ranks(x):
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=np.float64)
        _, inv = np.unique(x, return_inverse=True)
        return np.bincount(inv, weights=r)[inv] / np.bincount(inv)[inv]  # ties: their mean rank

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _corrupt_ids(session: Session, corrupt, p: int) -> list[int]:
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
    vocab = session.info.vocab_size
    if any(not 0 <= i < vocab for i in bad):
        raise BadArgument(f"the corrupted prompt has a token id outside the vocabulary 0..{vocab - 1}")
    return bad[: p + 1]


def _patch_target(session: Session, target: Target | None) -> Target:
    target = make_target(session) if target is None else target
    if target.kind == "kl":
        raise BadArgument("patching measures a log-prob or a logit difference, not a KL divergence")
    return target


@remotable
def patch_heads(
    session: Session,
    corrupt: str | Sequence[int],
    target: Target | None = None,
    scope: str = "everywhere",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    site: str = "output",
    layers: Sequence[int] | None = None,
) -> PatchResult:
    """Activation patching of every head between the session's sequence (clean) and ``corrupt`` (text,
    encoded as the session's prompt was, or token ids), which must be as long up to the read-out position
    (the IOI-style swap of two names keeps the length).

    ``site`` says what is patched (:data:`SITES`): ``"output"`` each query head's output and each GQA
    group's outputs together; ``"query"`` each query head's query projection (and each group's queries
    together); ``"kv"`` each KV head's keys and values (k_proj's and v_proj's output slices). Exact: a plain
    transformers forward with that slice replaced by a hook computes the same (tests/core/test_head_effects.py).

    Cost, ``scope="readout"``: the clean prefix is the session's own cache (read, never written); one
    recording decode step of the read-out position keeps the clean run's activations there and its
    logits, then every unit of a layer runs in ONE step from that layer on (:class:`_SessionReadout`, as
    :func:`head_effects`' read-out scope). The corrupted prompt runs once, as one walk up the layers with
    every denoising unit's row beside it (:class:`_WalkReadout`): no KV cache of it is built.
    ``"everywhere"``: one forward of each prompt captures its activations and logits; each unit re-runs
    the layers from its own up (:class:`_Everywhere`).

    Raises:
        BadArgument: prompts of different lengths; a target that is not a logit difference or log-prob;
            an unknown site. UnsupportedModelError: not the torch backend; a site the layers do not have
            (a fused QKV projection). Cancelled: as :func:`head_effects`.
    """
    if (impl := _backend_impl(session, "patch_heads")) is not None:
        return impl(session, corrupt, target, scope, progress, cancelled, site, layers)
    import torch

    if scope not in SCOPES:
        raise BadArgument(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    target = _patch_target(session, target)
    parts = _parts(session)
    info = session.info
    D, H = info.head_dim, info.n_heads
    p = target.position
    clean_ids = session.ids[: p + 1]
    bad = _corrupt_ids(session, corrupt, p)
    sweep = _layers_of(session, layers)
    _need_site(parts, site, sweep, info.architecture)
    units = _units(session, parts, sweep, False, site)
    total = 2 * len(units)
    out = {
        k: np.full((info.n_layers, n), np.nan)
        for k, n in (("dn", H), ("ns", H), ("dkv", info.n_kv_heads), ("nkv", info.n_kv_heads))
    }
    keys = {"output": ("z",), "query": ("q",), "kv": ("k", "v")}[site]
    ids_of = {"clean": clean_ids, "corrupt": bad}
    done, shown = [0], [0]  # units done; the progress shown (the walk's ticks run ahead of its units)

    def check() -> None:
        _check(cancelled, min(done[0], total), total)

    def tick(layer: int, n_layers: int) -> None:  # the corrupted prompt's walk, layer by layer
        est = len(units) * layer // n_layers
        if progress is not None and est > shown[0]:
            shown[0] = est
            progress(est, total)

    with _scratch(session) as be, torch.inference_mode():
        runners = _readout_pair(session, be, parts, clean_ids, bad, keys) if scope == "readout" else None
        if runners is not None and isinstance(runners["corrupt"], _WalkReadout):
            # the corrupted prompt's walk, with every denoising unit's row beside it (its values: the
            # clean run's read-out activations); where its check fails, a scratch KV cache instead
            walk = runners["corrupt"]
            walk.sweep(units, D, runners["clean"].rows, check, tick, reduce=target.value)
            if not walk.reuse:
                cached = _cached_readout(be, parts, bad, keys)
                runners = None if cached is None else {"clean": runners["clean"], "corrupt": cached}
        rows, logits = {}, {}
        for name, run_ids in ids_of.items():
            if runners is not None:  # the read-out position's activations and logits, from its step
                rows[name], logits[name] = runners[name].rows, runners[name].clean
                continue
            lg: list = []
            rows[name] = _capture_sites(be, parts, run_ids, keys, lg)
            logits[name] = lg[0]
            if scope == "readout":
                rows[name] = {k: r[-1:] for k, r in rows[name].items()}
        t = {name: target.value(lg) for name, lg in logits.items()}
        diff = t["clean"] - t["corrupt"]
        for into, src, key in (("corrupt", "clean", "d"), ("clean", "corrupt", "n")):
            run_ids = ids_of[into]
            if runners is not None:
                run = runners[into]
            else:
                run = _runner(
                    session, be, parts, run_ids, scope, logits[into] if scope == "everywhere" else None
                )

            def record(u: _Unit, tv: float, key=key) -> None:
                frac = ((tv - t["corrupt"]) if key == "d" else (t["clean"] - tv)) / diff if diff else np.nan
                name = (
                    ("dn" if key == "d" else "ns") if u.row == "query" else ("dkv" if key == "d" else "nkv")
                )
                out[name][u.layer, u.col] = frac
                done[0] += 1
                if progress is not None and done[0] > shown[0]:
                    shown[0] = done[0]
                    progress(min(done[0], total), total)

            def step(u: _Unit, lg: np.ndarray, record=record) -> None:
                record(u, target.value(lg))

            if isinstance(run, _WalkReadout):  # every unit's target came with the walk (its sweep)
                for u, tv in zip(units, run.results, strict=True):
                    check()
                    record(u, tv)
                continue

            def whole(run_ids: list[int] = run_ids) -> _Runner:
                return _Runner(be, parts, run_ids, scope, reuse=False)

            _evaluate(
                run,
                whole,
                parts,
                units,
                D,
                rows[src],
                scope,
                check,
                step,
            )
            if runners is None or into == "clean":  # the scratch cache holds the corrupted prefix until then
                be.reset()
    return PatchResult(
        out["dn"], out["ns"], out["dkv"], out["nkv"], t["clean"], t["corrupt"], target, scope, sweep, site
    )


# -- attribution patching ------------------------------------------------------------------------------------
class _TraceOutputs:
    """The clean prompt's head outputs (every layer's output-projection input ``z``) rebuilt from the
    session's own prefill instead of one more forward: its Trace keeps each layer's post-RoPE query rows
    and the KV cache its keys and values, so ``z`` of layer ``l`` is that layer's attention alone,
    ``softmax(q Kᵀ·scale + mask) V`` per head (window, soft-cap and learned sinks as the layer recorded them;
    :class:`_PlainAttend`), computed when a layer's product needs it (:meth:`rows`).

    :meth:`open` checks the formula against the model itself before it is used: one decode step of the
    read-out token over a view of the session's cache (:func:`_prefix_view`, nothing written) gives every
    layer's ``z`` at the read-out position and the clean logits there; each layer's rebuilt row must match
    (:func:`_close`), else None and the caller runs the plain forward (a family whose output projection
    reads more than the attention, a hybrid or MLA cache, a length-dependent RoPE, a prefix the session
    no longer holds)."""

    def __init__(self, sb, p: int, logits: np.ndarray):
        self.sb, self.p, self.logits = sb, p, logits

    @classmethod
    def open(cls, session: Session, be, parts: _Parts, ids: Sequence[int]) -> _TraceOutputs | None:
        import torch

        sb = session.backend
        p = len(ids) - 1
        trace = getattr(sb, "trace", None)
        rope = getattr(sb, "rope", None)
        if (
            p < 1
            or not _holds_prefix(sb, ids)
            or getattr(sb, "seq_len", 0) < p + 1
            or list(getattr(sb, "_ids", [])[: p + 1]) != list(ids)
            or getattr(session.info, "kv_latent_dim", 0)
            or (rope is not None and rope.active)
            or trace is None
            or not hasattr(trace, "layers")
        ):
            return None
        layers = sb._cache_layers()
        for i, proj in enumerate(parts.out_proj):
            if proj is None:
                continue
            rec = trace.layers[i] if i < len(trace.layers) else None
            cl = layers[i] if i < len(layers) else None
            keys, values = getattr(cl, "keys", None), getattr(cl, "values", None)
            if (
                rec is None
                or rec.store is None
                or rec.n_rows() < p + 1
                or keys is None
                or values is None
                or keys.shape[-2] < p + 1
                or values.shape[-2] < p + 1
            ):
                return None
        got: dict = {}

        def keep(i):
            def hook(_m, args):
                got[i] = args[0][0, -1].detach()

            return hook

        hooks = [(m, keep(i), "pre") for i, m in enumerate(parts.out_proj) if m is not None]
        x = torch.tensor([[int(ids[p])]], device=be.device)
        kw = {be._cache_kw: _prefix_view(sb, p), "use_cache": True, "logits_to_keep": 1}
        with torch.inference_mode(), _apply(hooks), _rope_at(be, p + 1):
            logits = be.model(input_ids=x, **kw).logits[0, -1].float().cpu().numpy()
        out = cls(sb, p, logits)
        with torch.inference_mode():
            for i, z in got.items():
                mine = out.rows(i, p, slice(None))[0]
                if mine.shape != z.shape or not _close(mine.float().cpu().numpy(), z.float().cpu().numpy()):
                    return None
        return out

    def rows(self, layer: int, first: int, rows: slice):
        """``(R, n_heads·D)`` in the model's dtype: layer ``layer``'s ``z`` at ``rows`` of the positions
        ``first..p`` (``slice(None)`` all of them, ``slice(-1, None)`` the read-out position)."""
        rec = self.sb.trace.layers[layer]
        cl = self.sb._cache_layers()[layer]
        n = self.p + 1
        lo = range(first, n)[rows].start if rows.start is not None else first
        q = rec.q()[None, :, lo:n]  # (1, n_heads, R, D)
        k, v = cl.keys[..., :n, :], cl.values[..., :n, :]
        out, _ = _PlainAttend().attend(
            None, q, k, v, rec.scale, rec.sliding_window, softcap=rec.softcap, sinks=rec.sinks
        )  # (1, n_heads, R, Dv)
        return out[0].transpose(0, 1).reshape(out.shape[2], -1)


def _shared_prefix(session: Session, clean: Sequence[int], bad: Sequence[int]) -> int:
    """How many leading positions the two runs share and the session's KV cache holds (their keys and
    values read from there, :func:`_prefix_view`); 0 where the cache cannot serve them (a hybrid model's
    recurrent states, an MLA cache, a length-dependent RoPE, a non-causal attention layer; learned sinks,
    whose fused kernel after a prefix has no exact gradient), and where it is under a quarter of the prompt
    (the runs from position 0 are then faster). At most ``len(clean) − 1``: the read-out position always
    runs."""
    sb = session.backend
    trace = getattr(sb, "trace", None)
    if any(getattr(rec, "sinks", None) is not None for rec in getattr(trace, "layers", ())):
        return 0
    rope = getattr(sb, "rope", None)
    model = getattr(sb, "model", None)
    if (
        getattr(sb, "hybrid", True)
        or not hasattr(sb, "_cache_layers")
        or getattr(session.info, "kv_latent_dim", 0)
        or (rope is not None and rope.active)
        or model is None
        or any(
            getattr(m, "is_causal", True) is False for m in model.modules() if hasattr(m, "_attnscope_trace")
        )
    ):
        return 0
    f = next((i for i, (a, b) in enumerate(zip(clean, bad, strict=True)) if a != b), len(clean))
    f = min(f, len(clean) - 1)
    if f < len(clean) // 4:
        # a short shared prefix saves little and costs much: the runs after a prefix attend as a
        # rectangle, without the fused causal kernel a whole-prompt run uses (forward and backward); at
        # 2,048 tokens on SmolLM2 a run after a 1-token prefix took 1.25 x one from position 0
        # (``attnscope bench --heads``, whose corrupted prompt changes position 1)
        return 0
    held = list(getattr(sb, "_ids", [])[:f])
    if f < 1 or getattr(sb, "seq_len", 0) < f or held != list(clean[:f]):
        return 0
    layers = sb._cache_layers()
    if any(getattr(cl, "keys", None) is not None and cl.keys.shape[-2] < f for cl in layers):
        return 0
    return f


def _prefix_call(be, sb, ids: Sequence[int], first: int) -> dict:
    """``be.model``'s keyword arguments for ``ids[first:]`` after the session backend ``sb``'s cached
    positions ``0..first − 1`` (a view, never written; :func:`_prefix_view`), or ``ids`` whole from an
    empty cache (``first = 0``); the read-out position's logits only."""
    import torch

    if not first:
        return {
            "input_ids": torch.tensor([list(ids)], device=be.device),
            "use_cache": False,
            "logits_to_keep": 1,
        }
    return {
        "input_ids": torch.tensor([list(ids[first:])], device=be.device),
        be._cache_kw: _prefix_view(sb, first),
        "use_cache": True,
        "logits_to_keep": 1,
    }


def _capture_after(be, sb, parts: _Parts, ids: Sequence[int], keys: Sequence[str], first: int) -> tuple:
    """``({(key, layer): (len(ids) − first, width) float32}, (vocab,) logits)``: :func:`_capture_sites`'s
    activations at positions ``first..`` of ``ids``, the positions before read from the session's cache."""
    import torch

    if not first:
        lg: list = []
        return _capture_sites(be, parts, list(ids), keys, lg), lg[0]
    got: dict = {}

    def keep_in(i):
        def hook(_m, args):
            got[("z", i)] = args[0][0].detach().float()

        return hook

    def keep_out(key, i):
        def hook(_m, _args, out):
            got[(key, i)] = out[0].detach().float()

        return hook

    hooks: list = []
    if "z" in keys:
        hooks += [(m, keep_in(i), "pre") for i, m in enumerate(parts.out_proj) if m is not None]
    for key, mods in (("q", parts.q_proj), ("k", parts.k_proj), ("v", parts.v_proj)):
        if key in keys:
            hooks += [(m, keep_out(key, i), "post") for i, m in enumerate(mods) if m is not None]
    with torch.inference_mode(), _apply(hooks), _rope_at(be, len(ids)):
        lg = be.model(**_prefix_call(be, sb, ids, first)).logits[0, -1].float().cpu().numpy()
    return got, lg


class _GradAttend(_PlainAttend):
    """:class:`_PlainAttend` for the forwards with gradients, also when the rows follow a cached prefix
    (fewer query rows than keys, bottom-right causal): PyTorch's fused attention with that boolean mask
    where there is no window, cap or sinks (differentiable, no score matrix kept)."""

    def attend(self, module, query, key, value, scaling, window, softcap=None, sinks=None):
        import torch

        L, S = query.shape[2], key.shape[2]
        if window is None and softcap is None and sinks is None and L < S:
            allowed = torch.ones(L, S, dtype=torch.bool, device=query.device).tril_(S - L)
            out = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=allowed, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
            )
            return out, None
        return super().attend(module, query, key, value, scaling, window, softcap=softcap, sinks=sinks)


def _metric(target: Target, x):
    """The target on ``(vocab,)`` torch logits, differentiable."""
    import torch

    if target.kind == "logit_diff":
        return x[target.token] - x[target.other]
    return torch.log_softmax(x.double(), dim=-1)[target.token]


#: positions per chunk of a position-wise MLP's recompute and backward in attribution patching's backward
_MLP_ROWS = 256


def _position_wise(mlp) -> bool:
    """Whether ``mlp`` maps each position's vector alone (a dense MLP: its children are linear maps and
    parameter-free activations, nothing else): its output at a position depends on its input there only,
    so it can run over the positions in chunks. A mixture of experts (a router and a list of experts, or
    experts as bare parameters) is not taken, nor anything with a submodule of its own."""
    import torch

    linear: tuple = (torch.nn.Linear,)
    try:
        from transformers.pytorch_utils import Conv1D  # GPT-2's linear map

        linear += (Conv1D,)
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    if mlp is None or list(mlp.parameters(recurse=False)):
        return False
    kids = list(mlp.children())
    n = 0
    for kid in kids:
        if isinstance(kid, linear) and not list(kid.children()):
            n += 1
        elif list(kid.parameters()) or list(kid.children()):
            return False
    return n >= 2


def _chunks(n: int, rows: int) -> list[tuple[int, int]]:
    """``[(start, stop)]`` over ``0..n``: ``rows`` positions each from 0, a last chunk of under ``rows / 2``
    joined to the one before. A chunk's matmuls then give the same bits as the whole sequence's (the BLAS
    blocks the whole one's rows at those boundaries too; a chunk of a few rows takes a small-matrix path
    that rounds differently): measured equal at 257 to 2,100 positions, 256 a chunk."""
    cuts = list(range(0, n, rows)) + [n]
    if len(cuts) > 2 and cuts[-1] - cuts[-2] < rows // 2:
        del cuts[-2]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def _chunked_mlp() -> Any:
    """A ``torch.autograd.Function`` running a position-wise MLP over ``(1, T, hidden)`` in chunks of
    :data:`_MLP_ROWS` positions: its forward keeps only the input (no ``T × intermediate`` tensor is held
    or allocated whole); its backward takes the gradient into each chunk's input from that chunk re-run
    with gradients (``torch.autograd.grad``; no weight gradient). Composes with a non-reentrant checkpoint:
    the input is what the checkpoint recomputes.

    Where the backward reaches the MLP before anything else of its layer that the checkpoint must
    recompute (a pre-norm layer: only the residual sum follows the MLP), reading the input runs the
    layer's re-run from inside that backward, output gradient in hand: the re-run's forward of the MLP
    then takes each chunk's gradient as it computes the chunk (``ahead``), so the MLP runs forward twice
    in all, as unchunked. Otherwise (a norm after the MLP, Gemma's) the backward re-runs the chunks: one
    more forward of the MLP."""
    import torch

    ahead: dict = {}  # run -> ((B, T), gradient into its output) while its backward reads its input
    done: dict = {}  # run -> the gradient into its input, taken by the re-run's forward

    def same(t):
        return t

    class _Chunked(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, run, rows):
            ctx.run, ctx.rows = run, rows
            ctx.save_for_backward(x)
            g = ahead.pop(run, None)
            out = None
            if g is not None and g[0] == tuple(x.shape[:2]):
                # the checkpoint's re-run, from inside this MLP's own backward: forward and backward of
                # each chunk at once (its own graph, out of the checkpoint's saved-tensor hooks)
                gx = torch.empty_like(x)
                with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(same, same):
                    for i, j in _chunks(x.shape[1], rows):
                        xi = x[:, i:j].detach().requires_grad_(True)
                        y = run(xi)
                        (gx[:, i:j],) = torch.autograd.grad(y, xi, g[1][:, i:j])
                        if out is None:
                            out = y.new_empty((x.shape[0], x.shape[1], *y.shape[2:]))
                        out[:, i:j] = y.detach()
                        del y
                done[run] = gx
                return out
            for i, j in _chunks(x.shape[1], rows):
                y = run(x[:, i:j])
                if out is None:
                    out = y.new_empty((x.shape[0], x.shape[1], *y.shape[2:]))
                out[:, i:j] = y
                del y
            return out

        @staticmethod
        def backward(ctx, g):
            ahead[ctx.run] = (tuple(g.shape[:2]), g)
            try:
                (x,) = ctx.saved_tensors  # may run the layer's re-run, which takes the gradient
            finally:
                ahead.pop(ctx.run, None)
            gx = done.pop(ctx.run, None)
            if gx is not None:
                return gx, None, None
            gx = torch.empty_like(x)
            with torch.enable_grad():
                for i, j in _chunks(x.shape[1], ctx.rows):
                    xi = x[:, i:j].detach().requires_grad_(True)
                    (gx[:, i:j],) = torch.autograd.grad(ctx.run(xi), xi, g[:, i:j])
            return gx, None, None

    return _Chunked


@contextlib.contextmanager
def _chunk_mlps(parts: _Parts, rows: int) -> Iterator[None]:
    """Within: each layer's position-wise MLP (:func:`_position_wise`) called on ``(1, T, hidden)`` with
    ``T > rows`` runs through :func:`_chunked_mlp` (``rows`` positions at a time); anything else as it is."""
    import torch

    fn = _chunked_mlp()
    mlps = [m for m in parts.mlp if _position_wise(m)]

    def wrap(mlp):
        run = type(mlp).forward.__get__(mlp)

        def forward(*args, **kwargs):
            x = args[0] if len(args) == 1 and not kwargs else None
            if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[0] != 1 or x.shape[1] <= rows:
                return run(*args, **kwargs)
            return fn.apply(x, run, rows)

        return forward

    for m in mlps:
        m.forward = wrap(m)
    try:
        yield
    finally:
        for m in mlps:
            m.__dict__.pop("forward", None)


def _grad_run(
    be,
    parts: _Parts,
    ids: Sequence[int],
    target: Target,
    keys: Sequence[str],
    src: Callable[[tuple[str, int]], Any],
    rows: slice,
    D: int,
    keep: bool = False,
    sb=None,
    first: int = 0,
):
    """One forward with gradients and one backward: ``(target value, {(key, layer): Σ over ``rows`` of
    (src − activation) · ∂target/∂activation, per head of the projection (float64)}, the activations'
    ``rows`` (float32, ``keep`` only, else None))``. ``src(key, layer)``: that activation's ``rows``
    ``(R, width)`` in the other run, asked for once, as its gradient arrives (a dict of
    :func:`_capture_after` popped, or :meth:`_TraceOutputs.rows`). ``first``: the run covers positions
    ``first..`` of ``ids`` only, the positions before read from the session backend ``sb``'s KV cache
    (:func:`_shared_prefix`: both runs share them, so their activations' differences are 0); the
    activations' rows are those positions'.

    Gradients flow into the activations only (no weight gradients are formed), and each activation's
    product is taken by a hook on it as its gradient arrives: no activation or gradient of the whole
    sequence is kept beyond its layer. Each decoder layer is checkpointed (``torch.utils.checkpoint``,
    non-reentrant): the forward keeps only each layer's input and the backward re-runs one layer at a
    time (one more forward's time). The re-run fires the activations' hooks again with the same values
    as the forward's, before the layer's backward reaches them, so the activation a product needs (and,
    with ``keep``, the copy kept for the other direction) is taken there: nothing but the checkpointed
    inputs is held from the forward to the backward. A position-wise MLP (:func:`_position_wise`) runs in
    chunks of :data:`_MLP_ROWS` positions, in the forward, the re-run and its backward (:func:`_chunked_mlp`):
    its ``T × intermediate`` tensors are never whole, and the re-run keeps only its input. What remains
    beyond the session's own memory is each layer's checkpointed input, one layer's recomputed graph (its
    attention's) and its ``src`` rows (and, with ``keep``, the kept activations, which replace the inputs
    layer by layer as the backward frees them)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    per: dict = {}
    got: dict | None = {} if keep else None
    seen: set = set()  # a checkpoint's re-run fires the forward hooks again
    width: dict = {}  # heads of each activation's projection
    here: dict = {}  # (key, layer) -> the re-run's activation rows, until its product is taken
    start: dict = {}
    trim = _HeapTrim()

    def on_act(k, a):
        if k in seen:
            # the layer's re-run in the backward: the same activation, read by the product below
            rows_a = a[0, rows].detach()
            here[k] = rows_a
            if got is not None and k not in got:
                got[k] = rows_a.float().clone()
            return
        seen.add(k)
        width[k] = a.shape[-1] // D

        def hook(g):
            mine = here.pop(k, None)
            if mine is None:  # the backward reached the activation without re-running its layer
                raise SessionError(f"attribution patching: layer {k[1]} was not re-run in the backward")
            delta = src(k).to(device=mine.device, dtype=torch.float32) - mine.float()
            per[k] = (delta * g[0, rows].float()).sum(0).double().reshape(-1, D).sum(-1).cpu().numpy()
            trim.step()  # the layer's backward temporaries, freed but kept as heap (as in the forward)

        a.register_hook(hook)

    def keep_in(i):
        def hook(_m, args):
            on_act(("z", i), args[0])

        return hook

    def keep_out(key, i):
        def hook(_m, _args, out):
            on_act((key, i), out)

        return hook

    def needs_grad(_m, _args, out):
        if not out.requires_grad:  # frozen weights: the graph starts at the embeddings' output
            out.requires_grad_(True)
        start.setdefault("x", out)
        return out

    def checkpointed(layer):
        run = layer.forward

        def forward(*args, **kwargs):
            out = checkpoint(run, *args, use_reentrant=False, **kwargs)
            # the layer's temporaries are freed, but glibc keeps them as heap between the long-lived
            # tensors each layer leaves (its checkpointed input): handed back whenever the resident
            # memory grew by 16 MiB (:class:`_HeapTrim`), or the forward's resident memory grows by about
            # 4 KiB per token per layer; a trim after every layer cost 61 trims and their page faults
            trim.step()
            return out

        return forward

    hooks: list = [(be.model.get_input_embeddings(), needs_grad, "post")]
    if "z" in keys:
        hooks += [(m, keep_in(i), "pre") for i, m in enumerate(parts.out_proj) if m is not None]
    for key, mods in (("q", parts.q_proj), ("k", parts.k_proj), ("v", parts.v_proj)):
        if key in keys:
            hooks += [(m, keep_out(key, i), "post") for i, m in enumerate(mods) if m is not None]
    # plain fused attention (its backward keeps no score matrix; nothing is recorded), and a
    # length-dependent RoPE at the session's frequencies (TorchBackend.rope_floor)
    with (
        torch.inference_mode(False),
        torch.enable_grad(),
        _apply(hooks),
        _attending(be, _GradAttend()),
        _rope_at(be, len(ids)),
        _chunk_mlps(parts, _MLP_ROWS),
    ):
        for layer in parts.layers:
            layer.forward = checkpointed(layer)
        try:
            res = be.model(**_prefix_call(be, sb, ids, first))
            m = _metric(target, res.logits[0, -1].float())
            del res
            # the gradient into the embeddings' output: every activation's hook fires on the way
            torch.autograd.grad(m, [start["x"]], allow_unused=True)
        finally:
            for layer in parts.layers:
                layer.__dict__.pop("forward", None)
    for k in seen:  # an activation the target does not depend on
        per.setdefault(k, np.zeros(width[k]))
    if got is not None and (missing := seen - got.keys()):  # a layer the backward did not re-run
        raise SessionError(
            f"attribution patching: no backward through layer {min(i for _k, i in missing)}; "
            "run one direction at a time (directions=('denoise',) or ('noise',))"
        )
    return float(m.detach()), per, got


@remotable
def attribution_patching(
    session: Session,
    corrupt: str | Sequence[int],
    target: Target | None = None,
    scope: str = "everywhere",
    site: str = "output",
    directions: Sequence[str] = ("denoise", "noise"),
) -> PatchResult:
    """Attribution patching (Nanda 2023, "Attribution Patching: Activation Patching At Industrial Scale";
    Syed et al. 2023): the first-order estimate of every head's patch at once, from one forward and one
    backward per direction.

    For a site activation ``a`` (a head's slice of the output projection's input, of q_proj's output, or a KV
    head's k_proj and v_proj output slices), patching the clean value into the corrupted run changes the
    target by about ``(a_clean − a_corrupt) · ∂t/∂a`` with the gradient taken on the corrupted run
    (denoising), and the corrupted value into the clean run by ``(a_corrupt − a_clean) · ∂t/∂a`` on the
    clean run (noising), summed over the patched positions (``readout``: the read-out position only). The
    result has :func:`patch_heads`'s shape and fractions (``method="attribution"``); a group's estimate is
    the sum of its heads' (the estimate is linear). Exact where the target is linear in the activation
    (tests/core/test_head_effects.py: the last layer of a model whose last MLP and final norm are linear);
    elsewhere :meth:`PatchResult.agreement` against :func:`patch_heads` says how close it is.

    ``directions``: ``("denoise",)`` runs one forward with gradients and one backward on the corrupted
    prompt; the clean run's activations (``site="output"``) are rebuilt from the session's Trace and KV
    cache (:class:`_TraceOutputs`: each layer's attention alone), else one plain forward of the clean prompt
    gives them. The default runs both directions (two forwards with gradients). Every run starts at the
    first position where the prompts differ (:func:`_shared_prefix`), the positions before it read from the
    session's KV cache.

    Raises:
        as :func:`patch_heads`; BadArgument: an unknown direction.
    """
    if (impl := _backend_impl(session, "attribution_patching")) is not None:
        return impl(session, corrupt, target, scope, site, directions)
    import torch

    if scope not in SCOPES:
        raise BadArgument(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    bad_dir = [d for d in directions if d not in ("denoise", "noise")]
    if bad_dir or not directions:
        raise BadArgument(f"directions are 'denoise' and/or 'noise', got {list(directions)!r}")
    target = _patch_target(session, target)
    parts = _parts(session)
    info = session.info
    D, H, Hkv = info.head_dim, info.n_heads, info.n_kv_heads
    p = target.position
    clean_ids = session.ids[: p + 1]
    bad = _corrupt_ids(session, corrupt, p)
    sweep = _layers_of(session, None)
    _need_site(parts, site, sweep, info.architecture)
    keys = {"output": ("z",), "query": ("q",), "kv": ("k", "v")}[site]
    runs = {"denoise": ("corrupt", "clean"), "noise": ("clean", "corrupt")}
    ids_of = {"clean": clean_ids, "corrupt": bad}
    rows = slice(-1, None) if scope == "readout" else slice(None)
    acts: dict = {}  # run -> {(key, layer): its rows (R, width)}
    products: dict = {}  # direction -> {(key, layer): per head}
    t: dict = {}
    # the positions before the first changed token are the same in both runs (a causal model): their
    # activations' differences are 0 and their keys and values are in the session's cache, so every run
    # below starts after them
    first = _shared_prefix(session, clean_ids, bad)
    sb = session.backend
    with _scratch(session) as be:
        # the clean run is the session's own: its head outputs come from its Trace and KV cache
        traced = _TraceOutputs.open(session, be, parts, clean_ids) if site == "output" else None
        if traced is not None:
            t["clean"] = target.value(traced.logits)
        for i, d in enumerate(directions):
            into, src = runs[d]
            if src == "clean" and traced is not None:
                src_of = lambda k, tr=traced: tr.rows(k[1], first, rows)  # noqa: E731
            else:
                if src not in acts:  # the other run's activations, and its target, from one plain forward
                    got, lg = _capture_after(be, sb, parts, ids_of[src], keys, first)
                    acts[src] = {k: v if scope == "everywhere" else v[rows].clone() for k, v in got.items()}
                    del got
                    t[src] = target.value(lg)
                src_of = acts.pop(src).pop
            later = any(runs[e][1] == into for e in directions[i + 1 :])
            t[into], products[d], kept = _grad_run(
                be, parts, ids_of[into], target, keys, src_of, rows, D, keep=later, sb=sb, first=first
            )
            del src_of
            if kept is not None:
                acts[into] = kept
            _release_memory()
        for name in ("clean", "corrupt"):
            if name not in t:
                with torch.inference_mode():
                    t[name] = target.value(be.forward(ids_of[name]))
                    be.reset()
    diff = t["clean"] - t["corrupt"]
    out = {
        k: np.full((info.n_layers, n), np.nan)
        for k, n in (("denoise", H), ("noise", H), ("denoise_kv", Hkv), ("noise_kv", Hkv))
    }
    groups = _groups(session)
    for d in directions:
        per = products[d]
        sign = 1.0 if d == "denoise" else -1.0
        for layer in sweep:
            if site == "kv":
                kvh = per[("k", layer)] + per[("v", layer)]
                out[f"{d}_kv"][layer] = sign * kvh / diff if diff else np.nan
                continue
            heads = per[(keys[0], layer)]
            out[d][layer] = sign * heads / diff if diff else np.nan
            out[f"{d}_kv"][layer] = [sign * heads[g].sum() / diff if diff else np.nan for g in groups]
    return PatchResult(
        out["denoise"],
        out["noise"],
        out["denoise_kv"],
        out["noise_kv"],
        t["clean"],
        t["corrupt"],
        target,
        scope,
        sweep,
        site,
        "attribution",
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
def logit_attribution(session: Session, target: Target | None = None) -> LogitAttribution:
    """Direct logit attribution of ``target`` (``logprob`` and ``kl`` targets are attributed as the raw
    logit of the token; ``logit_diff`` as the difference) at its position.

    Raises:
        UnsupportedModelError: not the torch backend; a post-norm family, or one whose residual stream is
            not the sum of its parts (checked: :attr:`LogitAttribution.residual_error` above 1e-3).
    """
    if (impl := _backend_impl(session, "logit_attribution")) is not None:
        return impl(session, target)
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
