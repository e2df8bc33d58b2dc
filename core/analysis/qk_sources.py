"""Why a head attends, by source: one attention score split into (query-side part × key-side part).

The residual stream entering layer ``L`` at a position ``p`` is a sum of components (Elhage et al. 2021,
"A Mathematical Framework for Transformer Circuits", the residual stream as a sum of what every earlier
sublayer wrote): the embedding (a token embedding; a GPT-2-style learned position embedding as its own
component; Gemma's ``√hidden`` embedding scale included), every earlier layer's every attention head's
output ``(Σ_j α_pj v_j) W_O^h`` (the head's slice ``[h·D, (h+1)·D)`` of the output projection's input,
through that projection without its bias), each output projection's bias, and each layer's MLP output (a
mixture of experts counts as its layer's MLP). Sandwich-norm families (Gemma 2/3, OLMo 2) pass each
sublayer's output through a norm before adding it: a head's component there is its output through that
norm with the norm's scale frozen at its value for the real sublayer output, and the layer's MLP
component is the normed MLP output itself.

With the pre-attention norm's scale at ``i`` and at ``j`` frozen at its value for the real residual stream
there (RMSNorm ``w ⊙ x / rms(x)``; LayerNorm ``w ⊙ (x − mean x) / σ(x) + b``, whose centring is linear
too), the norm is an affine map, and so is everything up to the post-RoPE query and key: the q/k
projections, a QK-norm (Qwen 3, Gemma 3, OLMo 2) with its own scale frozen the same way, and the rotary
rotation at ``i`` or ``j``. So ``q_i = Σ_c q_i(c) + q_i(bias)`` and ``k_j = Σ_d k_j(d) + k_j(bias)``, and
the stored scaled score ``s_ij = scale · q_i · k_j`` splits into a table ``scale · q_i(c) · k_j(d)`` over
query-side components ``c`` and key-side components ``d`` whose entries add up to ``s_ij``. Exact: the
components sum to the residual stream (checked at ``i`` and ``j``) and their images sum to the model's
``q_i``, ``k_j`` (checked against the Trace); linearised: the norms' scales, which in the real model depend
on every component at once, are held at the values the real residual gave them, so an entry is what a
component contributes through the norm as it was, not what removing it would change.

Cost: one forward of ``ids[: i + 1]`` in a separate cache, stopped at layer ``L``'s output projection,
capturing only positions ``i`` and ``j``, then one batched call of layer ``L``'s attention module on the
components (``tests/core/test_qk_sources.py``; ``attnscope bench`` measures the ratio to a prefill).

Torch backend only (module hooks); a model whose residual stream is not the sum of these components, or
whose query is not affine in it, is refused in one line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from attnscope.core.analysis.remotable import remotable
from attnscope.core.checks import index
from attnscope.core.errors import BadArgument, OutOfRange, SessionError, UnsupportedModelError

if TYPE_CHECKING:
    from attnscope.core.session import Session

#: relative mismatch above which a check refuses (float32 round-off is ~1e-6; half dtypes get wider)
CHECK_TOL = {"float32": 1e-3, "float64": 1e-6}
HALF_TOL = 3e-2

APPROXIMATION = (
    "Exact: the residual stream at the query and the key is the sum of these components (embedding, every "
    "earlier head, output-projection bias and MLP), and their images add up to the model's query and key, "
    "so the table adds up to the score. Linearised: the pre-attention norm's scale at each of the two "
    "positions{qk}{post} is frozen at its value for the real residual stream, which makes the query and "
    "key linear in the components; a part is what a component contributes through the norm as it was, "
    "not what removing it would change."
)


class _Stop(Exception):
    """Raised from a hook to end the capture forward once layer ``L``'s attention inputs are in."""


class _Caught(Exception):
    def __init__(self, query, key):
        super().__init__("probe")
        self.query, self.key = query, key


class _Probe:
    """Trace ``overrides`` that catch layer ``L``'s post-RoPE query and key instead of attending."""

    def __init__(self, module):
        self.module = module

    def attend(self, module, query, key, value, scaling, window, softcap=None, sinks=None):
        raise _Caught(query.detach(), key.detach())


# -- the result ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceSplit:
    """One score of head ``head`` of layer ``layer`` (query ``query``, key ``key``) split by source.

    Attributes:
        score: the stored scaled score ``scale · q_i · k_j`` (before any soft-cap), float64 from the Trace.
        pairs: the ``top`` largest parts by magnitude, ``(query component, key component, value)``.
        query_totals: every query-side component and its part paired with the whole key
            (``scale · q_i(c) · k_j``), largest magnitude first; they add up to :attr:`score`.
        key_totals: the same for every key-side component (``scale · q_i · k_j(d)``).
        rest: the sum of every part not in :attr:`pairs` (``score − Σ pairs`` up to round-off).
        approximation: what is exact and what is a linearisation (one paragraph).
        components: the component names, in model order; :attr:`table` is indexed by them.
        table: ``(n_components, n_components)`` float64, query-side components × key-side components;
            its entries add up to the score.
        query_error, key_error: ``|Σ images − q_i|/|q_i|`` (and for ``k_j``), the check against the Trace.
        residual_error: the largest ``|Σ components − residual|/|residual|`` at the two positions.
    """

    layer: int
    head: int
    kv_head: int
    query: int
    key: int
    query_token: str
    key_token: str
    score: float
    pairs: tuple[tuple[str, str, float], ...]
    query_totals: tuple[tuple[str, float], ...]
    key_totals: tuple[tuple[str, float], ...]
    rest: float
    approximation: str
    components: tuple[str, ...] = ()
    table: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)), repr=False)
    query_error: float = 0.0
    key_error: float = 0.0
    residual_error: float = 0.0
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> float:
        """The sum of every part of :attr:`table` (equals :attr:`score` up to round-off)."""
        return float(self.table.sum())

    def pair_line(self, pair: tuple[str, str, float]) -> str:
        """``"query: L3 H5 at 'John' × key: embedding of 'Mary'  +1.234"``."""
        q, k, v = pair
        return f"query: {self.label(q, self.query_token)} × key: {self.label(k, self.key_token)}  {v:+.4f}"

    @staticmethod
    def label(component: str, token: str) -> str:
        """A component at a position in words: ``"embedding of 'Mary'"``, ``"L3 H5 at 'John'"``."""
        if component.endswith("embedding"):
            return f"{component} of {token!r}"
        return f"{component} at {token!r}"

    def lines(self) -> list[str]:
        """The split as text: the score, the top pairs, the rest, the approximation."""
        out = [
            f"layer {self.layer} head {self.head} (KV head {self.kv_head}), query {self.query} {self.query_token!r}"
            f" → key {self.key} {self.key_token!r}: score {self.score:+.4f}",
            *(self.pair_line(p) for p in self.pairs),
            f"rest ({len(self.components) ** 2 - len(self.pairs)} more pairs): {self.rest:+.4f}",
        ]
        return out + list(self.notes)

    def to_dict(self) -> dict:
        """JSON-ready: every field but the table (names, parts rounded to 7 digits)."""
        return {
            "layer": self.layer,
            "head": self.head,
            "kv_head": self.kv_head,
            "query": self.query,
            "key": self.key,
            "query_token": self.query_token,
            "key_token": self.key_token,
            "score": self.score,
            "pairs": [{"query": q, "key": k, "value": round(v, 7)} for q, k, v in self.pairs],
            "query_totals": {n: round(v, 7) for n, v in self.query_totals},
            "key_totals": {n: round(v, 7) for n, v in self.key_totals},
            "rest": round(self.rest, 7),
            "approximation": self.approximation,
            "checks": {
                "query_error": self.query_error,
                "key_error": self.key_error,
                "residual_error": self.residual_error,
            },
            "notes": list(self.notes),
        }


# -- the model's pieces -----------------------------------------------------------------------------------
PRE_NORMS = (
    "input_layernorm",
    "ln_1",
    "attention_norm",
    "attn_norm",
    "norm1",
    "pre_attention_layernorm",
    "self_attn_layer_norm",
    "input_norm",
)

#: (attention-output norm, MLP-output norm) of sandwich-norm layers: Gemma 2/3 and OLMo 2; GLM-4
SANDWICH = (
    ("post_self_attn_layernorm", "post_mlp_layernorm"),
    ("post_attention_layernorm", "post_feedforward_layernorm"),
)


def _attn_module(layer):
    return next((getattr(layer, n) for n in ("self_attn", "attn", "attention") if hasattr(layer, n)), None)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _eps(norm) -> float:
    return next(
        (float(getattr(norm, n)) for n in ("variance_epsilon", "eps", "epsilon") if hasattr(norm, n)), 1e-6
    )


def _frozen(norm, y, ref):
    """``norm`` applied to rows ``y`` (``(..., d)``) with its scale frozen at ``ref`` (broadcastable to
    ``y``): ``(norm(y) − b)·σ(y)/σ(ref) + b``, the affine map that equals ``norm`` at ``y = ref`` (RMSNorm:
    ``σ = rms``; LayerNorm, or any norm with a bias: ``σ`` of the centred vector). Computed in ``y``'s dtype."""
    import torch

    eps = _eps(norm)
    bias = getattr(norm, "bias", None)
    centred = isinstance(norm, torch.nn.LayerNorm) or bias is not None

    def sigma(x):
        x = x.double()
        if centred:
            x = x - x.mean(-1, keepdim=True)
        return torch.sqrt((x * x).mean(-1, keepdim=True) + eps)

    b = bias.detach().double() if bias is not None else 0.0
    out = (norm.forward(y).double() - b) * sigma(y) / sigma(ref) + b  # .forward: no hooks (a QK-norm's own)
    return out.to(y.dtype)


@dataclass
class _Capture:
    """What one forward of ``ids[: i + 1]`` left, at the positions asked for."""

    positions: list[int]
    x0: dict = field(default_factory=dict)  # position -> (hidden,) layer 0's input
    resid: dict = field(default_factory=dict)  # position -> (hidden,) layer L's input
    attn_in: dict = field(default_factory=dict)  # position -> (hidden,) layer L's attention input
    z: dict = field(default_factory=dict)  # (layer, position) -> (n_heads·D,) o_proj input
    o: dict = field(default_factory=dict)  # (layer, position) -> (hidden,) o_proj output (sandwich norms)
    mlp: dict = field(default_factory=dict)  # (layer, position) -> (hidden,) what the MLP adds
    call: dict = field(default_factory=dict)  # position -> (args, kwargs, local index) of layer L's attention
    qk_real: dict = field(default_factory=dict)  # (name, position) -> (tensor, local index, chunk length)


def _layout(session: Session, layer: int) -> dict:
    """The modules of the decoder that the split hooks, checked."""
    from attnscope.core.analysis.head_effects import _parts

    parts = _parts(session)  # UnsupportedModelError: not torch, no o_proj
    be = session.backend  # the torch backend (checked above): its model runs the hooked forward
    model: Any = be.model
    cfg: Any = getattr(model, "config", None)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    layers = parts.layers
    for li in range(layer):
        if parts.out_proj[li] is None or parts.mlp[li] is None:
            raise UnsupportedModelError(
                f"{session.info.architecture}: layer {li} has no attention output projection or MLP to hook, "
                "so the residual stream cannot be split into head and MLP outputs"
            )
    # sandwich norms: (the attention output's norm, the MLP output's norm) under each family's names
    pairs = [next((pr for pr in SANDWICH if all(hasattr(ly, n) for n in pr)), None) for ly in layers]
    sandwich = [pr is not None for pr in pairs]
    attn = _attn_module(layers[layer])
    dec: Any = model.get_decoder() if hasattr(model, "get_decoder") else model
    wpe = getattr(dec, "wpe", None) or getattr(getattr(model, "transformer", None), "wpe", None)
    return {
        "parts": parts,
        "attn": attn,
        "sandwich": sandwich,
        "post_attn": [getattr(ly, pr[0]) if pr else None for ly, pr in zip(layers, pairs, strict=True)],
        "mlp_out": [
            getattr(ly, pr[1]) if pr else m for ly, pr, m in zip(layers, pairs, parts.mlp, strict=True)
        ],
        "residual_multiplier": float(getattr(cfg, "residual_multiplier", None) or 1.0),
        "wpe": wpe,
        "qk_norms": {n: getattr(attn, n) for n in ("q_norm", "k_norm") if getattr(attn, n, None) is not None},
    }


def _capture(session: Session, lay: dict, layer: int, ids: list[int], positions: list[int]) -> _Capture:
    """One forward of ``ids`` (from an empty cache of its own), stopped at layer ``layer``'s output
    projection, keeping the residual stream's parts at ``positions`` only. Chunked prefill is followed:
    positions are absolute."""
    import torch
    from attnscope.core.analysis.head_effects import _hooks, _scratch

    parts = lay["parts"]
    cap = _Capture(sorted(set(positions)))
    state = {"start": 0, "n": 0}
    last = max(positions)

    def local():
        s, n = state["start"], state["n"]
        return [(p, p - s) for p in cap.positions if s <= p < s + n]

    def first(_m, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        state["start"] = state["start"] + state["n"]
        state["n"] = int(x.shape[1])
        for p, lp in local():
            cap.x0[p] = x[0, lp].detach().clone()

    def keep(store, li, pre: bool):
        def hook(_m, args, out=None):
            t = args[0] if pre else _first(out)
            for p, lp in local():
                store[(li, p)] = t[0, lp].detach().clone()

        return hook

    def resid_hook(_m, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        for p, lp in local():
            cap.resid[p] = x[0, lp].detach().clone()

    def attn_hook(_m, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        for p, lp in local():
            cap.attn_in[p] = x[0, lp].detach().clone()
            cap.call[p] = (args, dict(kwargs), lp)

    def qk_hook(name):
        def hook(_m, args):
            for p, lp in local():
                cap.qk_real[(name, p)] = (args[0].detach().clone(), lp, state["n"])

        return hook

    def stop(_m, _args):
        if state["start"] <= last < state["start"] + state["n"]:
            raise _Stop

    pre = [(parts.out_proj[li], keep(cap.z, li, True)) for li in range(layer)]
    pre += [(m, qk_hook(n)) for n, m in lay["qk_norms"].items()]
    pre.append((parts.out_proj[layer], stop))
    post = [(lay["mlp_out"][li], keep(cap.mlp, li, False)) for li in range(layer)]
    post += [(parts.out_proj[li], keep(cap.o, li, False)) for li in range(layer) if lay["sandwich"][li]]
    handles = [
        parts.layers[0].register_forward_pre_hook(first, with_kwargs=True),
        parts.layers[layer].register_forward_pre_hook(resid_hook, with_kwargs=True),
        lay["attn"].register_forward_pre_hook(attn_hook, with_kwargs=True),
    ]
    try:
        with _scratch(session) as be, torch.inference_mode(), _hooks(pre), _hooks(post, "post"):
            with contextlib.suppress(_Stop):
                # a length-dependent RoPE (LongRoPE) runs at the whole sequence's frequencies, as the
                # stored scores were rotated: the fork's default (tests/core/test_explain_longrope.py)
                be.forward(list(ids))
    finally:
        for h in handles:
            h.remove()
    return cap


# -- the components ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Components:
    """The residual stream entering a layer, split into its components, at some positions.

    Attributes:
        names: ``(C,)`` component names in model order (``"embedding"``, ``"L0 H1"``, ``"L0 attn bias"``,
            ``"L0 MLP"``, …; ``"token embedding"`` and ``"position embedding"`` for a learned-position model).
        positions: ``(P,)`` the positions.
        vectors: ``(P, C, hidden)`` float32: each component at each position; they add up to the residual.
        residual: ``(P, hidden)`` float32: the layer's real input at those positions.
    """

    names: tuple[str, ...]
    positions: tuple[int, ...]
    vectors: np.ndarray
    residual: np.ndarray

    @property
    def residual_error(self) -> float:
        """The largest ``|Σ components − residual| / |residual|`` over the positions."""
        tot = self.vectors.astype(np.float64).sum(1)
        r = self.residual.astype(np.float64)
        return float(np.max(np.linalg.norm(tot - r, axis=-1) / np.maximum(np.linalg.norm(r, axis=-1), 1e-30)))


def _components(session: Session, lay: dict, cap: _Capture, layer: int):
    """``(names, {position: (C, hidden) tensor})`` of the residual stream entering ``layer`` (module
    docstring), and the largest residual-sum error."""
    import torch

    parts = lay["parts"]
    info = session.info
    H = info.n_heads
    rm = lay["residual_multiplier"]
    names: list[str] = []
    rows: dict[int, list] = {p: [] for p in cap.positions}
    with torch.inference_mode():
        for p in cap.positions:
            x0 = cap.x0[p]
            if lay["wpe"] is not None:
                pos = lay["wpe"].weight[p].detach().to(x0.dtype)
                rows[p] += [x0 - pos, pos]
            else:
                rows[p].append(x0)
        if lay["wpe"] is not None:
            names += ["token embedding", "position embedding"]
        else:
            names.append("embedding")
        for li in range(layer):
            proj = parts.out_proj[li]
            has_bias = getattr(proj, "bias", None) is not None
            post = lay["post_attn"][li]
            if post is not None and getattr(post, "bias", None) is not None:
                has_bias = True
            names += [f"L{li} H{h}" for h in range(H)]
            if has_bias:
                names.append(f"L{li} attn bias")
            names.append(f"L{li} MLP")
            for p in cap.positions:
                z = cap.z[(li, p)]
                D = z.shape[-1] // H  # a head's width at the projection's input (MLA: v_head_dim)
                # head h alone through the projection: a block-diagonal batch of n_heads rows, then zeros
                batch = torch.zeros((H + 1, H * D), dtype=z.dtype, device=z.device)
                for h in range(H):
                    batch[h, h * D : (h + 1) * D] = z[h * D : (h + 1) * D]
                out = _first(proj(batch))
                heads, bias = out[:H] - out[H], out[H]
                if post is not None:  # sandwich norm: frozen at the real sublayer output
                    ref = cap.o[(li, p)]
                    zero = _frozen(post, torch.zeros_like(bias)[None], ref)[0]
                    heads = _frozen(post, heads, ref) - zero
                    bias = _frozen(post, bias[None], ref)[0]
                rows[p] += list(heads * rm)
                if has_bias:
                    rows[p].append(bias * rm)
                rows[p].append(cap.mlp[(li, p)] * rm)
    vecs = {p: torch.stack(r) for p, r in rows.items()}
    err = 0.0
    for p in cap.positions:
        r = cap.resid[p].double()
        e = float(
            torch.linalg.vector_norm(vecs[p].double().sum(0) - r)
            / torch.linalg.vector_norm(r).clamp_min(1e-30)
        )
        err = max(err, e)
    return names, vecs, err


def _tolerance(dtype) -> float:
    return CHECK_TOL.get(str(dtype).replace("torch.", ""), HALF_TOL)


def _refuse_sum(session: Session, err: float, tol: float) -> None:
    if err > tol:
        raise UnsupportedModelError(
            f"{session.info.architecture}: the residual stream is not the sum of embedding, head and MLP "
            f"outputs (relative difference {err:.1e}), so a score cannot be split by source for it"
        )


@remotable
def residual_components(session: Session, layer: int, positions: Sequence[int]) -> Components:
    """The residual stream entering ``layer`` at ``positions``, split into its components (module docstring).

    One forward of ``ids[: max(positions) + 1]`` in a separate cache, stopped at ``layer``.

    Raises:
        SessionError: nothing run yet. OutOfRange: a layer or position outside the model or sequence.
        UnsupportedModelError: not the torch backend; a residual stream that is not the sum of the
            components (checked, relative difference above :data:`CHECK_TOL`).
    """
    T = session.seq_len
    if not T:
        raise SessionError("run a prompt first: there is no sequence to split")
    layer = index("layer", layer, session.info.n_layers)
    pos = [index("position", p, T) for p in positions]
    if not pos:
        raise BadArgument("give at least one position")
    lay = _layout(session, layer)
    cap = _capture(session, lay, layer, session.ids[: max(pos) + 1], pos)
    names, vecs, err = _components(session, lay, cap, layer)
    _refuse_sum(session, err, _tolerance(_model_dtype(session)))
    return Components(
        tuple(names),
        tuple(cap.positions),
        np.stack([vecs[p].float().cpu().numpy() for p in cap.positions]),
        np.stack([cap.resid[p].float().cpu().numpy() for p in cap.positions]),
    )


# -- the split -----------------------------------------------------------------------------------------------
def _pre_norm(session: Session, lay: dict, cap: _Capture, layer: int, positions: list[int]):
    """The module that turns layer ``layer``'s residual into its attention's input (None: identity),
    found by checking candidates against the captured input."""
    import torch

    ly = lay["parts"].layers[layer]
    tol = _tolerance(_model_dtype(session))
    cands = [getattr(ly, n) for n in PRE_NORMS if isinstance(getattr(ly, n, None), torch.nn.Module)] + [None]
    with torch.inference_mode():
        for c in cands:
            ok = True
            for p in positions:
                x, a = cap.resid[p], cap.attn_in[p]
                y = x if c is None else c(x[None])[0]
                err = float(
                    torch.linalg.vector_norm((y - a).double())
                    / torch.linalg.vector_norm(a.double()).clamp_min(1e-30)
                )
                ok = ok and err <= tol
            if ok:
                return c
    raise UnsupportedModelError(
        f"{session.info.architecture}: layer {layer}'s attention input is not a norm of its residual stream, "
        "so a score cannot be split by source for it"
    )


def _select(real, lp: int, n: int, probe_shape) -> Any:
    """Position ``lp`` of a captured QK-norm input ``real`` (one chunk of ``n`` positions), shaped as one
    row of the probe's input (``probe_shape``, sequence length 1)."""
    if n == 1:
        return real
    axes = [
        a
        for a in range(1, real.dim())
        if real.shape[a] == n
        and probe_shape[a] == 1
        and all(real.shape[b] == probe_shape[b] for b in range(1, real.dim()) if b != a)
    ]
    if len(axes) != 1:
        raise UnsupportedModelError("the QK-norm's input has no sequence axis to read one position from")
    return real.narrow(axes[0], lp, 1)


def _probe(session: Session, be, lay: dict, cap: _Capture, U: dict, i: int, j: int):
    """Layer ``L``'s attention module called on the rows ``U[i]`` (at position ``i``) and ``U[j]`` (at
    ``j``), one sequence of length 1 per row, with QK-norms frozen at the real rows' scales; returns
    ``(query (n_i, n_heads, D), key (n_j, n_kv_heads, D))`` post-RoPE, caught before attending."""
    import torch
    from attnscope.core.analysis.head_effects import _hooks

    attn = lay["attn"]
    ni, nj = U[i].shape[0], U[j].shape[0]
    hidden = torch.cat([U[i], U[j]])[:, None, :]  # (B, 1, hidden): one sequence per row
    args, kwargs, lp = cap.call[i]
    kwargs = dict(kwargs)
    pe = kwargs.get("position_embeddings")
    if pe is not None:
        _, _, lpj = cap.call[j]
        pej = cap.call[j][1]["position_embeddings"]

        def rows(a, b):
            a, b = a[:, lp : lp + 1], b[:, lpj : lpj + 1]  # (1, 1, ...) the rows at i and j
            return torch.cat([a.expand(ni, *a.shape[1:]), b.expand(nj, *b.shape[1:])])

        if isinstance(pe, torch.Tensor):  # one tensor (DeepSeek's complex frequencies), not (cos, sin)
            kwargs["position_embeddings"] = rows(pe, pej)
        else:
            kwargs["position_embeddings"] = tuple(rows(a, b) for a, b in zip(pe, pej, strict=True))
    for k in ("cache", "past_key_values", "past_key_value", "layer_past", "attention_mask"):
        if k in kwargs:
            kwargs[k] = None
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    dev = hidden.device
    if kwargs.get("position_ids") is not None:
        kwargs["position_ids"] = torch.tensor([[i]] * ni + [[j]] * nj, device=dev)
    if kwargs.get("cache_position") is not None:
        kwargs["cache_position"] = torch.tensor([i], device=dev)
    if args:
        args = (hidden, *args[1:])
    else:
        kwargs["hidden_states"] = hidden

    def frozen_hook(name):
        def hook(mod, inp, out):
            x = inp[0]
            ri, li, n = cap.qk_real[(name, i)]
            rj, lj, nj_ = cap.qk_real[(name, j)]
            ref = torch.cat(
                [
                    _select(ri, li, n, x.shape).expand(ni, *x.shape[1:]),
                    _select(rj, lj, nj_, x.shape).expand(nj, *x.shape[1:]),
                ]
            )
            return _frozen(mod, x, ref)

        return hook

    be.trace.overrides = _Probe(attn)
    try:
        with (
            torch.inference_mode(),
            _hooks([(m, frozen_hook(n)) for n, m in lay["qk_norms"].items()], "post"),
        ):
            attn(*args, **kwargs)
    except _Caught as c:
        q, k = c.query, c.key  # (B, n_heads, 1, D), (B, n_kv_heads, 1, D)
    else:
        raise UnsupportedModelError(
            f"{session.info.architecture}: its attention never called the attention function"
        )
    finally:
        be.trace.overrides = None
    return q[:ni, :, 0], k[ni:, :, 0]


@remotable
def source_split(
    session: Session, layer: int, head: int, query: int, key: int, *, top: int = 10
) -> SourceSplit:
    """Split the score of ``head`` (layer ``layer``) at query ``query``, key ``key`` by source (module docstring).

    Args:
        layer, head: a query head of a layer with an attention map; its KV head is
            ``head // (n_heads // n_kv_heads)``.
        query, key: positions ``0 <= key <= query < seq_len``.
        top: how many of the largest parts :attr:`SourceSplit.pairs` lists (``>= 1``).

    Returns:
        A :class:`SourceSplit` whose table adds up to the stored score (float32: to ~1e-6 relative of the
        parts' size; tests/core/test_qk_sources.py).

    Raises:
        SessionError: nothing run yet. OutOfRange: a layer, head or position outside the model or sequence,
        or a key after the query. BadArgument: ``top`` below 1. NoAttentionMap: a layer with no softmax
        attention. UnsupportedModelError: not the torch backend; a residual stream that is not the sum of
        its components, or a query/key that is not affine in it (each checked).
    """
    import torch
    from attnscope.core.analysis.head_effects import _scratch

    T = session.seq_len
    if not T:
        raise SessionError("run a prompt first: there is no score to split")
    info = session.info
    layer = index("layer", layer, info.n_layers)
    info.arch.check_map(layer)
    head = index("head", head, info.n_heads)
    i = index("query", query, T)
    j = index("key", key, T)
    if j > i:
        raise OutOfRange(f"key {j} comes after query {i}: a causal head never scores it")
    if isinstance(top, bool) or not isinstance(top, int | np.integer) or top < 1:
        raise BadArgument(f"top must be a whole number >= 1, got {top!r}")
    kv = info.arch.kv_head(head)
    lay = _layout(session, layer)  # UnsupportedModelError first: not the torch backend
    rec = session.trace._rec(layer)
    q_real = rec.q()[head, i].double()
    k_real = rec.keys[kv, j].double()
    score = float(rec.scale * (q_real @ k_real))

    pos = sorted({i, j})
    cap = _capture(session, lay, layer, session.ids[: i + 1], pos)
    names, vecs, rerr = _components(session, lay, cap, layer)
    dtype = _model_dtype(session)
    tol = _tolerance(dtype)
    _refuse_sum(session, rerr, tol)
    norm = _pre_norm(session, lay, cap, layer, pos)
    U = {}
    with torch.inference_mode():
        for p in pos:
            c = vecs[p]
            zero = torch.zeros_like(c[:1])
            if norm is None:
                lin, const = c, zero
            else:
                ref = cap.resid[p][None]
                const = _frozen(norm, zero, ref)  # the norm's bias (zero for RMSNorm)
                lin = _frozen(norm, c, ref) - const
            U[p] = torch.cat([lin, const, zero])  # (C + 2, hidden): components, the bias row, zeros
    with _scratch(session) as be:
        qs, ks = _probe(session, be, lay, cap, U, i, j)
    C = len(names)
    qh, kh = qs[:, head].double(), ks[:, kv].double()  # (C + 2, D)
    qc = torch.cat([qh[:C] - qh[C + 1], qh[C : C + 1]])  # components' images, then the constant
    kc = torch.cat([kh[:C] - kh[C + 1], kh[C : C + 1]])
    qerr = float(
        torch.linalg.vector_norm(qc.sum(0) - q_real.to(qc.device))
        / torch.linalg.vector_norm(q_real).clamp_min(1e-30)
    )
    kerr = float(
        torch.linalg.vector_norm(kc.sum(0) - k_real.to(kc.device))
        / torch.linalg.vector_norm(k_real).clamp_min(1e-30)
    )
    if max(qerr, kerr) > tol:
        raise UnsupportedModelError(
            f"{info.architecture}: layer {layer}'s query/key is not affine in the residual stream with its norms' "
            f"scales frozen (relative difference {max(qerr, kerr):.1e} from the captured ones), so a score cannot "
            "be split by source for it"
        )
    all_names = (*names, "bias")
    table = (rec.scale * (qc @ kc.T)).cpu().numpy()  # (C + 1, C + 1) float64
    flat = np.argsort(-np.abs(table), axis=None, kind="stable")[: int(top)]
    n = table.shape[1]
    pairs = tuple((all_names[f // n], all_names[f % n], float(table.flat[f])) for f in flat)
    qt, kt = table.sum(1), table.sum(0)
    by = np.argsort(-np.abs(qt), kind="stable")
    bk = np.argsort(-np.abs(kt), kind="stable")
    qk = " and the QK-norm's scale" if lay["qk_norms"] else ""
    post = " (and the post-sublayer norms' scales of earlier layers)" if any(lay["sandwich"][:layer]) else ""
    notes = []
    allowed = session.trace.allowed(layer, slice(i, i + 1), slice(j, j + 1))
    if not bool(np.asarray(allowed).all()):
        notes.append(f"key {j} is outside layer {layer}'s window at query {i}: the head gives it no weight")
    toks = session.tokens
    return SourceSplit(
        layer=layer,
        head=head,
        kv_head=kv,
        query=i,
        key=j,
        query_token=toks[i].text,
        key_token=toks[j].text,
        score=score,
        pairs=pairs,
        query_totals=tuple((all_names[c], float(qt[c])) for c in by),
        key_totals=tuple((all_names[c], float(kt[c])) for c in bk),
        rest=float(table.sum() - sum(p[2] for p in pairs)),
        approximation=APPROXIMATION.format(qk=qk, post=post),
        components=all_names,
        table=table,
        query_error=qerr,
        key_error=kerr,
        residual_error=rerr,
        notes=tuple(notes),
    )


def _model_dtype(session: Session):
    """The torch dtype of the session's model (the torch backend: the split's checks ran first)."""
    be = session.backend
    return be.model.dtype
