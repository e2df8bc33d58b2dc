"""The logit lens (nostalgebraist 2020, "interpreting GPT: the logit lens"): each layer's residual stream
at the positions asked for, read through the final norm and the unembedding.

Two parts, each exact for the model that runs (docs/heads.md "Logit lens"):

* **Residuals** (:func:`residuals`): every decoder layer's output at the positions ``P``. The session's
  KV cache already holds every position's keys and values, and the residual at ``P`` after layer ``i``
  depends only on that cache and on the residual at ``P`` after layer ``i − 1``. So the ``|P|`` positions
  run as queries through the layers against the cached K/V (query ``p`` sees keys ``≤ p`` and, in a
  sliding-window layer, the last ``window`` of them; ``P`` need not be contiguous nor sorted), and the
  cache is not changed: the cost of a ``|P|``-token chunk, not of a prefill. Each attention layer derives
  the keys of ``P`` again from the residuals it is given; they must equal the cached ones (to 1e-4 of
  their largest magnitude in float32, 5e-2 in half precision), which checks positions, RoPE and every
  layer's input on the way, and every attention layer must attend through AttnScope's attention function
  (which applies the per-query mask). Where that check fails, and for the families this cannot serve (a hybrid
  model: its recurrent / convolution states are not a K/V cache of every position; a length-dependent
  RoPE, whose cached keys may have been rotated for another length), the residuals come from a forward
  of ``ids[:max(P) + 1]`` in a scratch backend instead: the same numbers, at the cost of that prefill.
* **Projection** (:func:`project`): float32, in tiles of :data:`ROW_BLOCK` residuals × :data:`VOCAB_BLOCK`
  rows of the unembedding. Each tile's logits update a running log-sum-exp, a running top-``k`` and, for
  each row, the count of logits above the final token's (its rank): no ``(rows × vocab)`` tensor and no
  sort of the vocabulary. The floor is the unembedding matmul itself, ``2 · n_layers · |P| · d_model ·
  vocab`` FLOPs (docs/heads.md "How fast"). A bfloat16 pass would be faster on CPUs with bfloat16 dot
  products, and a bound on its error could keep the top tokens and ranks exact (the candidates recomputed
  in float32), but not the probabilities: the log-sum-exp moves by up to that bound times the probability
  not recomputed, and probabilities within 1e-6 left 38 % of SmolLM2's vocabulary to recompute for a
  layer's 64 positions on average (docs/heads.md). So the lens is float32 throughout.

Torch backend only for now (:func:`residuals` needs hookable layers; :func:`project` takes torch tensors
and nothing else of the backend).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from attnscope.core.analysis.head_effects import _backend_impl, _hooks, _parts, _scratch
from attnscope.core.analysis.remotable import remotable
from attnscope.core.errors import BadArgument, OutOfRange, SessionError

if TYPE_CHECKING:
    from attnscope.core.session import Session

#: rows of the unembedding projected at a time: one tile is ``ROW_BLOCK × VOCAB_BLOCK`` float32 logits
#: (32 MiB at most), reused for every tile: few enough tiles that a busy 2-core machine's thread
#: hand-offs do not dominate, small enough that the lens's peak stays near the prefill's
VOCAB_BLOCK = 4096
#: residuals projected at a time (64 positions × 30 layers fit one tile)
ROW_BLOCK = 2048
LOG2E = 1.4426950408889634
#: query positions run through the layers at a time (the backend's prefill chunk)
QUERY_CHUNK = 512
#: re-derived keys of ``P`` against the cached ones: largest difference over largest magnitude
KEY_TOL = {"float32": 1e-4, "float64": 1e-9}
HALF_KEY_TOL = 5e-2


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


def lens_positions(session: Session, positions: Sequence[int] | None, k: int) -> list[int]:
    """The positions a lens reads (default: the last 16; negative ones count from the end), checked, and
    ``k`` checked: the one rule every backend's lens applies.

    Raises:
        SessionError: no prompt has run. BadArgument: no position, or ``k`` below 1. OutOfRange: a
        position outside the sequence.
    """
    T = session.seq_len
    if not T:
        raise SessionError("run a prompt first: there is no sequence to read")
    pos = (
        list(range(max(0, T - 16), T))
        if positions is None
        else [int(x) + T if int(x) < 0 else int(x) for x in positions]
    )
    if not pos:
        raise BadArgument("give at least one position to read")
    for x in pos:
        if not 0 <= x < T:
            raise OutOfRange(f"position {x} is outside the sequence 0..{T - 1}")
    if not isinstance(k, int) or k < 1:
        raise BadArgument(f"k must be a whole number >= 1, got {k!r}")
    return pos


@remotable
def logit_lens(session: Session, positions: Sequence[int] | None = None, k: int = 5) -> LogitLens:
    """The logit lens at ``positions`` (default: the last 16), ``k`` top tokens per layer and position.

    The final prediction (``final_ids``) is the last layer's lens, i.e. the model's own logits
    (``softcap(lm_head(norm(h)))``; a logit scale after the unembedding does not move the top token).

    Cost: ``|P|`` positions run through the layers against the KV cache (:func:`residuals`; a forward
    of ``ids[:max(positions) + 1]`` where that cannot be done) and ``n_layers × |P|`` float32 vocabulary
    projections in blocks (:func:`project`).

    Raises:
        SessionError: no prompt has run. OutOfRange: a position outside the sequence. BadArgument: no
        position, or ``k`` below 1. UnsupportedModelError: a backend without these seams (mlx-lm's
        families on the MLX backend; :mod:`attnscope.core.analysis.mlx_heads` runs the MLX backend's own).
    """
    if (impl := _backend_impl(session, "logit_lens")) is not None:
        return impl(session, positions, k)
    import torch

    pos = lens_positions(session, positions, k)
    parts = _parts(session)
    resid = residuals(session, pos, parts)
    L, P = len(resid), len(pos)
    with torch.inference_mode():
        # the last layer's output is the final norm's input: the lens applies the norm to every layer
        last = project(_normed(parts, resid[-1]), parts.lm_head, k, softcap=parts.final_softcap)
        final_ids = last.top_ids[:, 0].clone()
        if L > 1:
            rest = project(
                _normed(parts, torch.cat(resid[:-1])),
                parts.lm_head,
                k,
                final_ids=final_ids.repeat(L - 1),
                softcap=parts.final_softcap,
            )
            top_ids = torch.cat([rest.top_ids, last.top_ids]).view(L, P, -1)
            top_logits = torch.cat([rest.top_logits, last.top_logits]).view(L, P, -1)
            lse = torch.cat([rest.lse, last.lse]).view(L, P)
            final_logit = torch.cat([rest.final_logit, last.top_logits[:, 0]]).view(L, P)
            rank = torch.cat([rest.rank, torch.zeros(P, dtype=torch.int64)]).view(L, P)
        else:
            top_ids, top_logits = last.top_ids[None], last.top_logits[None]
            lse, final_logit = last.lse[None], last.top_logits[None, :, 0]
            rank = torch.zeros((1, P), dtype=torch.int64)
    lse_np = lse.numpy()
    return LogitLens(
        np.asarray(pos),
        top_ids.numpy().astype(np.int64),
        np.exp(top_logits.double().numpy() - lse_np[..., None]),
        final_ids.numpy().astype(np.int64),
        rank.numpy().astype(np.int64),
        np.exp(final_logit.double().numpy() - lse_np),
    )


def _normed(parts, h):
    """The final norm of ``h`` (``(R, d_model)``, the model's dtype, as the model applies it), float32."""
    return parts.norm(h[None])[0].float()


# -- residuals -------------------------------------------------------------------------------------------
def residuals(session: Session, positions: Sequence[int], parts: Any = None) -> list:
    """Every decoder layer's output at ``positions``: ``n_layers`` torch tensors ``(P, d_model)`` in the
    model's dtype (row ``j`` is position ``positions[j]``), the cache and Trace of the session unchanged.

    From the KV cache (the module docstring says how and when that is checked) where the family allows,
    else from a forward of ``ids[:max(positions) + 1]`` in a scratch backend.

    Raises:
        UnsupportedModelError: not the torch backend.
    """
    parts = parts if parts is not None else _parts(session)
    pos = [int(p) for p in positions]
    got = _cached_residuals(session, parts, pos)
    return got if got is not None else _forward_residuals(session, parts, pos)


def _forward_residuals(session: Session, parts, pos: list[int]) -> list:
    """:func:`residuals` by a forward of ``ids[:max(pos) + 1]`` with the layers' outputs hooked (the
    backend runs it in chunks: each layer's calls are counted off to find the asked positions)."""
    import torch

    L = len(parts.layers)
    sel = torch.tensor(pos)
    seen = [0] * L  # positions each layer has output so far
    rows: list[dict] = [{} for _ in range(L)]

    def keep(i):
        def hook(_m, _args, out):
            o = out[0] if isinstance(out, tuple) else out
            a, n = seen[i], o.shape[1]
            for j in torch.nonzero((sel >= a) & (sel < a + n))[:, 0].tolist():
                rows[i][j] = o[0, pos[j] - a].detach()
            seen[i] = a + n

        return hook

    with (
        _scratch(session) as be,
        torch.inference_mode(),
        _hooks([(m, keep(i)) for i, m in enumerate(parts.layers)], "post"),
    ):
        be.forward(session.ids[: max(pos) + 1])
    return [torch.stack([r[j] for j in range(len(pos))]) for r in rows]


class _Rows:
    """Trace ``overrides`` (:meth:`attnscope.core.backends.torch_backend.TorchBackend.fork`): query row
    ``j`` is position ``pos[j]`` and sees the cached keys ``≤ pos[j]`` (within the layer's window)."""

    def __init__(self, pos: list[int]):
        self.pos = np.asarray(pos)
        self.masks: dict = {}
        self.layers: set[int] = set()  # the layers that attended through here

    def attend(self, module, query, key, value, scaling, window, softcap=None, sinks=None):
        import torch
        from attnscope.core.attention.fused import sdpa_with_lse
        from attnscope.core.attention.masks import causal_allowed

        self.layers.add(int(getattr(module, "layer_idx", -1)))
        S = key.shape[-2]
        got = self.masks.get((S, window, query.device))
        if got is None:
            got = torch.from_numpy(causal_allowed(self.pos, np.arange(S), window)).to(query.device)
            self.masks[(S, window, query.device)] = got
        if softcap is None and sinks is None and query.device.type == "cpu" and query.shape[0] == 1:
            # the fork records nothing (capture=False), so no LSE is wanted: torch's own call reaches the
            # same fused CPU kernel with the same mask (equal outputs), without sdpa_with_lse's mask
            # conversion, empty-row check and LSE refinement per layer (7 % of the residuals' time)
            out = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=got, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
            )
            return out, None
        return sdpa_with_lse(
            query,
            key,
            value,
            scale=scaling,
            causal=False,
            mask=got,
            exact_half=False,
            softcap=softcap,
            sinks=sinks,
        )


def _frozen_layer(keys, values, index, worst: dict):
    """A cache layer holding ``keys``/``values`` (``(1, n_kv_heads, S, D)``) that stores nothing:
    ``update`` returns them and records how far the new keys are from the cached ones at ``index``."""
    from transformers.cache_utils import DynamicLayer

    class Frozen(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            cached: Any = self.keys
            ref = cached.index_select(-2, index.to(cached.device))
            if ref.shape == key_states.shape:
                diff = float((key_states.float() - ref.float()).abs().max())
                scale = float(ref.float().abs().max()) or 1.0
                worst["err"] = max(worst.get("err", 0.0), diff / scale)
            else:  # a layout this check cannot read: trust nothing
                worst["err"] = float("inf")
            return self.keys, self.values

    layer = Frozen()
    layer.keys, layer.values = keys, values
    layer.device = keys.device
    layer.is_initialized = True
    return layer


class _Done(Exception):
    """Raised by the last layer's hook to end a forward whose logits nobody reads (a ``(1, vocab)``
    projection that reads the whole unembedding: 3 % of the residuals' time on SmolLM2)."""


def _cached_residuals(session: Session, parts, pos: list[int]) -> list | None:
    """:func:`residuals` from the KV cache; None where the family or the check rules it out."""
    import torch

    be = session.backend
    if getattr(be, "hybrid", False) or getattr(getattr(be, "rope", None), "active", False):
        return None
    n = max(pos) + 1
    layers = be._cache_layers()
    if len(layers) < len(parts.layers):
        return None
    for cl in layers:
        keys = getattr(cl, "keys", None)
        if keys is None or keys.dim() != 4 or keys.shape[0] != 1 or keys.shape[-2] < n:
            return None
    dtype = str(layers[0].keys.dtype).rsplit(".", 1)[-1]
    tol = KEY_TOL.get(dtype, HALF_KEY_TOL)
    L = len(parts.layers)
    out: list[list] = [[] for _ in range(L)]

    def keep(i):
        def hook(_m, _args, o):
            o = o[0] if isinstance(o, tuple) else o
            out[i].append(o[0].detach())
            if i == L - 1 and all(len(r) == len(out[i]) for r in out):
                raise _Done  # every layer has run: the final norm and the unembedding are not needed

        return hook

    worst: dict = {}
    attention = set(session.info.arch.attention_layers)
    for a in range(0, len(pos), QUERY_CHUNK):
        chunk = pos[a : a + QUERY_CHUNK]
        index = torch.tensor(chunk)
        cache = be._DynamicCache()
        cache.layers = [
            _frozen_layer(cl.keys[..., :n, :], cl.values[..., :n, :], index, worst) for cl in layers
        ]
        cache.layer_class_to_replicate = None
        ids = torch.tensor([[session.ids[p] for p in chunk]], device=be.device)
        rows = _Rows(chunk)
        with (
            be.fork(overrides=rows, capture=False) as scratch,
            torch.inference_mode(),
            _hooks([(m, keep(i)) for i, m in enumerate(parts.layers)], "post"),
        ):
            try:
                scratch.model(
                    input_ids=ids,
                    position_ids=torch.tensor([chunk], device=be.device),
                    use_cache=True,
                    logits_to_keep=1,
                    **{be._cache_kw: cache},
                )
            except _Done:
                pass
        if rows.layers != attention:  # a layer attended some other way: its mask is not known to be right
            return None
    if not worst or worst["err"] > tol or any(len(o) != len(out[0]) for o in out):
        return None
    return [torch.cat(o) for o in out]


# -- projection ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Projection:
    """:func:`project`'s result for ``R`` rows (torch tensors on the CPU).

    Attributes:
        top_ids: ``(R, k)`` int64, highest logit first; ``top_logits`` ``(R, k)`` float32 those logits.
        lse: ``(R,)`` float64, the log-sum-exp of each row's logits (probability = ``exp(logit − lse)``).
        final_logit: ``(R,)`` float32, the logit of ``final_ids[r]`` (None without ``final_ids``).
        rank: ``(R,)`` int64, how many logits exceed it (None without ``final_ids``).
    """

    top_ids: Any
    top_logits: Any
    lse: Any
    final_logit: Any = None
    rank: Any = None


def project(
    x,
    head,
    k: int,
    final_ids=None,
    softcap: float | None = None,
    block: int = VOCAB_BLOCK,
    rows: int = ROW_BLOCK,
) -> Projection:
    """Logits of ``x`` through the unembedding ``head``, reduced tile by tile: ``rows`` rows of ``x``
    against ``block`` rows of the unembedding at a time.

    Args:
        x: ``(R, d_model)`` float32 torch tensor, already through the final norm.
        head: the unembedding: a module with ``weight`` ``(vocab, d_model)`` (and optional ``bias``),
            read ``block`` rows at a time in float32; anything else is called on row groups instead.
        k: top tokens kept per row (at most the vocabulary).
        final_ids: ``(R,)`` int token per row whose logit, probability and rank are wanted.
        softcap: final-logit soft-capping ``cap · tanh(z / cap)`` (Gemma 2/3), applied to every logit.
        block: vocabulary rows per tile.
        rows: rows of ``x`` per tile.

    Returns:
        :class:`Projection`. Peak extra memory: one ``(rows, block)`` float32 tile and one boolean
        tile (32 and 8 MiB at most at the defaults), reused by every tile.
    """
    import torch

    R = x.shape[0]
    weight: Any = getattr(head, "weight", None)
    plain = isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.shape[1] == x.shape[1]
    if plain and not isinstance(head, torch.nn.Linear | torch.nn.Embedding):
        plain = type(head).forward is torch.nn.Linear.forward
    bias: Any = getattr(head, "bias", None) if plain else None
    fid = None if final_ids is None else torch.as_tensor(final_ids, dtype=torch.int64)
    if not plain:  # a head that is not a plain matrix: its own call, on groups of rows
        step = max(1, block // 64)
        parts = []
        for r in range(0, R, step):
            z = _cap(head(x[r : r + step]).float(), softcap, inplace=True)
            f = None if fid is None else fid[r : r + step].to(z.device)
            state = _Running(z.shape[0], k, z.device, f)
            if f is not None:
                state.zf = z.gather(1, f[:, None])[:, 0].clone()
            state.add(z, 0)
            parts.append(state)
        return _joined(parts)
    x = x.to(weight.device)
    V = weight.shape[0]
    zf = None
    if fid is not None:
        # the final tokens' logits by the same product as the tiles' (x against their rows of the
        # unembedding: ``|P|`` distinct tokens, a sliver of the work), so that the rank compares the tile's
        # logits with the very float the tile holds for the final token (a dot product summed in
        # another order differs by ~1e-5 and moved ranks by one); each tile checks that float, and
        # :func:`_recount` redoes the rows where a BLAS gave another one
        ids, inv = torch.unique(fid, return_inverse=True)
        zu = torch.mm(x, weight.index_select(0, ids.to(weight.device)).float().T)
        if bias is not None:
            zu += bias.index_select(0, ids.to(bias.device)).float()
        zf = _cap(zu, softcap, inplace=True).gather(1, inv.to(zu.device)[:, None])[:, 0]
    rows = max(1, min(rows, R))
    spans = [(r, min(R, r + rows)) for r in range(0, R, rows)] or [(0, 0)]
    states = []
    for r0, r1 in spans:
        state = _Running(r1 - r0, k, x.device, None if fid is None else fid[r0:r1])
        if zf is not None:
            state.zf = zf[r0:r1].clone()
        states.append(state)
    # a logits tile and a comparison tile, reused: each a contiguous view of its first n * nb elements
    nmax = rows * min(block, V)
    zbuf = torch.empty(nmax, dtype=torch.float32, device=x.device)
    tbuf = torch.empty(nmax, dtype=torch.bool, device=x.device) if fid is not None else None
    for a in range(0, V, block):  # the vocabulary block outermost: it stays in cache for every row tile
        b = min(V, a + block)
        wT = weight[a:b].float().T
        bb = None if bias is None else bias[a:b].float()
        for (r0, r1), state in zip(spans, states, strict=True):
            n, nb = r1 - r0, b - a
            z = _tile(x[r0:r1], wT, bb, softcap, zbuf)
            state.add(z, a, None if tbuf is None else tbuf[: n * nb].view(n, nb))
    for (r0, r1), state in zip(spans, states, strict=True):
        if state.redo is not None and bool(state.redo.any()):
            _recount(state, x[r0:r1], weight, bias, softcap, block, zbuf)
    return _joined(states)


def _tile(x, wT, bias, softcap, buf):
    """One tile of logits ``(rows, vocab block)`` float32 in ``buf``'s first elements: ``x @ wT`` (the
    block's rows of the unembedding, transposed), its bias, the soft-cap. :func:`project` and
    :func:`_recount` both call it, so a recount compares the very floats the tile held."""
    import torch

    n, nb = x.shape[0], wT.shape[1]
    z = torch.mm(x, wT, out=buf[: n * nb].view(n, nb))
    if bias is not None:
        z += bias
    return _cap(z, softcap, inplace=True)


def _recount(state, x, weight, bias, softcap, block: int, zbuf) -> None:
    """The ranks of ``state``'s rows marked ``redo`` counted again against the final token's logit as
    their tiles computed it (the same products as :func:`project`'s, so the same floats)."""
    import torch

    rows = torch.nonzero(state.redo)[:, 0]
    zf, fid = state.zf[rows], state.fid[rows]
    rank = torch.zeros(rows.numel(), dtype=torch.int64, device=x.device)
    for a in range(0, weight.shape[0], block):
        b = min(weight.shape[0], a + block)
        bb = None if bias is None else bias[a:b].float()
        z = _tile(x, weight[a:b].float().T, bb, softcap, zbuf).index_select(0, rows)
        gt = z > zf[:, None]
        own = fid - a
        inside = torch.nonzero((own >= 0) & (own < b - a))[:, 0]
        gt[inside, own[inside]] = False
        rank += gt.sum(1)
    state.rank[rows] = rank
    state.redo[rows] = False


def _joined(states: list) -> Projection:
    """One :class:`Projection` of the row tiles' :class:`_Running` states, in order."""
    import torch

    parts = [s.result() for s in states]
    names = ("top_ids", "top_logits", "lse", "final_logit", "rank")
    return Projection(
        *(None if getattr(parts[0], n) is None else torch.cat([getattr(p, n) for p in parts]) for n in names)
    )


def _count(gt):
    """The number of True in each row of ``gt`` (``(R, n)`` bool, overwritten), ``(R,)`` int64.

    Its bytes are added in place, the right half of the columns onto the left, while a byte cannot
    overflow (7 halvings: at most 128 in a byte), then the few columns left are summed: no temporary of
    the tile's size (a sum with ``dtype=`` converts the whole tile first, a fresh 2-byte tile each time),
    and faster than a sum or ``count_nonzero`` of booleans on the CPU."""
    import torch

    u = gt.view(torch.uint8)
    width, most = u.shape[1], 1
    while width > 64 and most <= 64:
        half = width // 2
        u[:, :half] += u[:, width - half : width]  # an odd width keeps its middle column as it is
        width, most = width - half, most * 2
    return u[:, :width].sum(1, dtype=torch.int64)


def _cap(z, cap: float | None, inplace: bool = False):
    if not cap:
        return z
    if inplace:
        return z.div_(cap).tanh_().mul_(cap)
    import torch

    return torch.tanh(z / cap) * cap


class _Running:
    """The per-row running reductions of :func:`project`: top-``k``, log-sum-exp, and the final token's rank."""

    def __init__(self, R: int, k: int, device, fid):
        import torch

        self.k = k
        self.top_v = torch.empty((R, 0), dtype=torch.float32, device=device)
        self.top_i = torch.empty((R, 0), dtype=torch.int64, device=device)
        self.m = torch.full((R,), -float("inf"), dtype=torch.float32, device=device)
        self.s = torch.zeros(R, dtype=torch.float64, device=device)
        self.fid: Any = None if fid is None else fid.to(device)
        self.zf: Any = torch.zeros(R, dtype=torch.float32, device=device) if fid is not None else None
        self.rank: Any = torch.zeros(R, dtype=torch.int64, device=device) if fid is not None else None
        self.redo: Any = torch.zeros(R, dtype=torch.bool, device=device) if fid is not None else None

    def add(self, z, a: int, scratch=None) -> None:
        """Fold ``z`` (``(R, nb)`` float32 logits of vocabulary ids ``a .. a + nb``) in; ``z`` is
        overwritten. ``scratch``: an ``(R, nb)`` bool tensor the rank may overwrite (else one is made)."""
        import torch

        zmax = z.amax(1)
        self._top(z, a, zmax)
        if self.fid is not None:
            gt = torch.gt(z, self.zf[:, None], out=scratch) if scratch is not None else z > self.zf[:, None]
            own = self.fid - a
            inside = (own >= 0) & (own < z.shape[1])
            if bool(inside.any()):  # the final token is not above itself
                r = torch.nonzero(inside)[:, 0]
                got = z[r, own[r]]
                other = got != self.zf[r]  # not the float compared with: the row is counted again
                if bool(other.any()):
                    self.redo[r[other]] = True
                    self.zf[r[other]] = got[other]
                gt[r, own[r]] = False
            self.rank += _count(gt)
        m_new = torch.maximum(self.m, zmax)
        scale = torch.exp((self.m - m_new).double())
        # exp(z − m) as 2^((z − m)·log2 e) (torch's exp2 is several times faster than its exp on the CPU):
        # each term's relative error grows by |z − m| · 2^-23 at most; the terms are <= 1 and summed in
        # float32 (relative error ~1e-7), the blocks add in float64
        self.s = self.s * scale + z.sub_(m_new[:, None]).mul_(LOG2E).exp2_().sum(1).double()
        self.m = m_new

    def _top(self, z, a: int, zmax) -> None:
        """Merge the block's top-``k`` into the running one: only for the rows whose block holds a logit
        above their ``k``-th best so far (an equal logit does not enter: the lower id stays first)."""
        import torch

        rows = None
        if self.top_v.shape[1] >= self.k:
            hit = zmax > self.top_v[:, -1]
            rows = torch.nonzero(hit)[:, 0]
            if rows.numel() == 0:
                return
            if rows.numel() == z.shape[0]:
                rows = None
            else:
                z = z.index_select(0, rows)
        bv, bi = z.topk(min(self.k, z.shape[1]), dim=1)
        bi += a
        tv = torch.cat([self.top_v if rows is None else self.top_v[rows], bv], 1)
        ti = torch.cat([self.top_i if rows is None else self.top_i[rows], bi], 1)
        # highest first, equal logits by id (a stable sort of the whole vocabulary's order); at most 2k wide
        ti, j = ti.sort(1)
        tv, j = tv.gather(1, j).sort(dim=1, descending=True, stable=True)
        tv, ti = tv[:, : self.k], ti.gather(1, j[:, : self.k])
        if rows is None:
            self.top_v, self.top_i = tv, ti
        else:
            self.top_v[rows], self.top_i[rows] = tv, ti

    def result(self) -> Projection:
        import torch

        lse = self.m.double() + torch.log(self.s)
        return Projection(
            self.top_i.cpu(),
            self.top_v.cpu(),
            lse.cpu(),
            None if self.zf is None else self.zf.cpu(),
            None if self.rank is None else self.rank.cpu(),
        )


__all__ = ["LogitLens", "Projection", "logit_lens", "project", "residuals"]
