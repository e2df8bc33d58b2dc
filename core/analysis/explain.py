"""Why a head attends: every score split exactly by rotary frequency band (docs "Why a head attends").

A RoPE model's scaled score is a sum over the 2-D pairs its rotation turns (Su et al. 2021, RoFormer
eq. 13-15), plus the dimensions it does not rotate (partial rotary, e.g. Phi-3 with
``partial_rotary_factor < 1``)::

    s_ij = scale · q_i · k_j = scale · ( Σ_p ⟨q_i^p, k_j^p⟩ + ⟨q_i^pass, k_j^pass⟩ )

with ``q_i`` and ``k_j`` the *post*-RoPE vectors the trace and the KV cache hold (the model's own
rotation already applied: docs/how-it-works.md). Pair ``p`` turns by ``θ_p`` radians per token, so it
repeats every ``2π/θ_p`` tokens (its wavelength); pairs are grouped into bands by wavelength
(:data:`BAND_EDGES`) and each band's part of the score is exact: the parts add up to the score up to the
rounding of a float64 sum of the stored float32 products (tests/core/test_explain.py checks 1e-6 relative).

Nothing is assumed about a family's rotation: the pairs, their angles and any attention scaling (YaRN,
LongRoPE) are read from the model's own rotary module and its own ``apply_rotary_pos_emb``, probed on
unit vectors (:func:`rope_layout`): rotate-half pairing (HF Llama: dim ``d`` with ``d + r/2``),
interleaved pairing, partial rotary, llama3 / yarn / longrope frequencies and Gemma 3's local and global
bases all come out as the model applies them. Rotating the stored vectors back with each position's
inverse gives the pre-RoPE ``q`` and ``k`` (exact: tests/core/test_explain.py compares them with the hooked
``q_proj``/``k_proj`` outputs, after QK-norm where the model has one). The counterfactual row is the
softmax of ``pre-RoPE q · pre-RoPE k · scale`` under the same mask, soft-cap and learned sink: what the
head would do with no position information (the attention-scaling factor of YaRN/LongRoPE, which the
model folds into cos and sin, is removed with the rotation).

A model without RoPE (GPT-2: learned position embeddings added to the input) has one band, said so in
:attr:`BandSplit.note`; its counterfactual row is its actual row.

Torch backend only (the rotation is probed on the model's torch modules); a remote engine runs it where
the model is (``@remotable``).
"""

from __future__ import annotations

import math
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core.analysis.remotable import remotable

if TYPE_CHECKING:
    from attnscope.core.session import Session

#: band edges in tokens of wavelength: a pair whose wavelength is in ``[e_k, e_{k+1})`` is in band k
BAND_EDGES: tuple[float, ...] = (0.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, math.inf)
#: bands shorter than this are "positional" in the head summary (docs "Why a head attends")
SHORT_TOKENS = 64
#: rows of a map that the head-level positional share reads at most (evenly spaced; all rows below)
SHARE_ROWS = 256


def tokens_text(n: float) -> str:
    """A wavelength in tokens for people: ``6``, ``40``, ``1.2k``, ``40k``, ``2.3M``."""
    if not math.isfinite(n):
        return "∞"
    if n < 10:
        return f"{n:.0f}" if n >= 3 else f"{n:.1f}"
    if n < 1000:
        return f"{n:.0f}"
    if n < 1e6:
        k = n / 1e3
        return f"{k:.1f}k" if k < 10 else f"{k:.0f}k"
    m = n / 1e6
    return f"{m:.1f}M" if m < 10 else f"{m:.0f}M"


@dataclass(frozen=True)
class BandSplit:
    """One score (or a row's weighted score) split by rotary frequency band.

    Attributes:
        names: per band, in words: ``"turns every 6–13 tokens"`` (the wavelengths of its pairs).
        wavelengths: per band, the geometric mean wavelength of its pairs, in tokens (float).
        pairs: per band, the indices ``p`` of its rotary pairs (``0 .. n_pairs − 1``, fastest first).
        parts: per band, its part of the scaled score (float, may be negative).
        unrotated: the part of the dimensions the rotation leaves alone (partial rotary: Phi-3 with
            ``partial_rotary_factor < 1``); None when every dimension is rotated.
        rope: False for a model (or layer) without RoPE: then ``parts`` has one entry, the whole score.
        note: one line for a model without RoPE (what the single band means), else "".

    The parts (and ``unrotated``) add up to :attr:`total`, the score itself.
    """

    names: tuple[str, ...]
    wavelengths: tuple[float, ...]
    pairs: tuple[tuple[int, ...], ...]
    parts: tuple[float, ...]
    unrotated: float | None = None
    rope: bool = True
    note: str = ""

    @property
    def total(self) -> float:
        """Σ parts (+ the unrotated part): the score."""
        return float(sum(self.parts) + (self.unrotated or 0.0))

    def shares(self) -> tuple[float, ...]:
        """Each band's signed share ``part / Σ|part|`` (unrotated part included in the denominator):
        the absolute shares add up to 1, a negative one pulled the score down."""
        den = sum(abs(p) for p in self.parts) + abs(self.unrotated or 0.0)
        return tuple(p / den if den else 0.0 for p in self.parts)

    def positional(self, short_tokens: float = SHORT_TOKENS) -> float:
        """The summed part of the bands whose wavelength is below ``short_tokens`` (0 without RoPE)."""
        if not self.rope:
            return 0.0
        return float(sum(p for p, w in zip(self.parts, self.wavelengths, strict=True) if w < short_tokens))

    def to_dict(self) -> dict:
        """JSON-able: ``{"bands": [{name, wavelength, pairs, part, share}], "unrotated", "rope", "note", "total"}``."""
        return {
            "bands": [
                {"name": n, "wavelength": w, "pairs": list(p), "part": v, "share": sh}
                for n, w, p, v, sh in zip(
                    self.names, self.wavelengths, self.pairs, self.parts, self.shares(), strict=True
                )
            ],
            "unrotated": self.unrotated,
            "rope": self.rope,
            "note": self.note,
            "total": self.total,
        }


@dataclass
class Explanation:
    """Why ``head`` of ``layer`` gives key ``key`` the score it does at query ``query``.

    Attributes:
        layer, head, query, key: the cell (query row ``query``, key column ``key``: positions).
        score: the stored scaled score ``q·k·scale`` (float; before a soft-cap, as :attr:`capped` says).
        bands: the score split by rotary band (:class:`BandSplit`).
        row_bands: the same split of the row's weighted score ``Σ_j w_ij s_ij`` (keys ``0 .. query``).
        no_rope_row: ``(query + 1,)`` float32 weights of the row over keys ``0 .. query`` with the
            rotation removed (the counterfactual; the actual row for a model without RoPE).
        row: ``(query + 1,)`` float32 actual weights of the row over the same keys.
        weight: the cell's actual weight (0 where the mask hides it).
        allowed: False when the mask hides the cell (key after the query, or outside a sliding window).
        capped: the layer's soft-cap (Gemma 2) or None; the softmax saw ``cap·tanh(score/cap)``.
        sources: the score split by the components that wrote q and k (filled by
            :mod:`attnscope.core.analysis.qk_sources`), or None.
    """

    layer: int
    head: int
    query: int
    key: int
    score: float
    bands: BandSplit
    row_bands: BandSplit
    no_rope_row: np.ndarray
    row: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    weight: float = 0.0
    allowed: bool = True
    capped: float | None = None
    sources: object | None = None

    def to_dict(self) -> dict:
        """JSON-able (lists and floats); ``sources`` through its own ``to_dict`` when it has one."""
        src = self.sources
        if src is not None and hasattr(src, "to_dict"):
            src = src.to_dict()
        return {
            "layer": self.layer,
            "head": self.head,
            "query": self.query,
            "key": self.key,
            "score": self.score,
            "weight": self.weight,
            "allowed": self.allowed,
            "softcap": self.capped,
            "bands": self.bands.to_dict(),
            "row_bands": self.row_bands.to_dict(),
            "row": [float(x) for x in self.row],
            "no_rope_row": [float(x) for x in self.no_rope_row],
            "sources": src,
        }


# -- the model's rotation, probed ------------------------------------------------------------------
@dataclass(frozen=True)
class RopeLayout:
    """How one layer's rotation pairs the head's dimensions (read from the model: :func:`rope_layout`).

    Attributes:
        rope: False when the layer applies no rotary embedding (then the rest is empty).
        first, second: ``(P,)`` int64 the two dimensions of each pair (fastest pair first).
        unrotated: ``(U,)`` int64 dimensions left alone (partial rotary).
        wavelength: ``(P,)`` float64 tokens per full turn, ``2π / |θ_p|``.
        note: why there is no rotation, when there is none.
    """

    rope: bool
    first: np.ndarray
    second: np.ndarray
    unrotated: np.ndarray
    wavelength: np.ndarray
    note: str = ""


class _Rotary:
    """The rotary pieces of one torch model, found once: per layer its attention module, the rotary
    module that feeds it, the layer type (Gemma 3's local/global) and the family's ``apply_rotary_pos_emb``."""

    def __init__(self, backend):
        import torch
        from attnscope.core.errors import UnsupportedModelError

        model = getattr(backend, "model", None)
        if not isinstance(model, torch.nn.Module):  # MLX: its modules are not torch's
            raise UnsupportedModelError(
                "explain needs the torch backend (it reads the model's own rotary modules)"
            )
        self.backend, self.model = backend, model
        cfg = getattr(model, "config", None)
        self.config = cfg.get_text_config() if cfg is not None and hasattr(cfg, "get_text_config") else cfg
        self.attn: dict[int, object] = {}
        rotaries = []
        for name, mod in model.named_modules():
            cls = type(mod).__name__
            if cls.endswith("Attention") and hasattr(mod, "layer_idx"):
                self.attn.setdefault(int(mod.layer_idx), mod)
            if cls.endswith("RotaryEmbedding") and not any(v in name for v in ("vision", "visual")):
                rotaries.append((name, mod))
        rotaries.sort(key=lambda nm: len(nm[0]))
        self.rotary = rotaries[0][1] if rotaries else None
        self.type = getattr(self.config, "model_type", "this model")
        self._layouts: dict[tuple, RopeLayout] = {}

    def apply_fn(self, layer: int) -> Callable | None:
        attn = self.attn.get(layer)
        if attn is None:
            return None
        if hasattr(attn, "use_rope") and not attn.use_rope:  # SmolLM3 / Llama 4 NoPE layers
            return None
        return getattr(sys.modules.get(type(attn).__module__), "apply_rotary_pos_emb", None)

    def layer_type(self, layer: int) -> str | None:
        from attnscope.core.attention.rope_length import rope_types

        types = rope_types(self.rotary)
        if set(types) == {None}:
            return None
        return list(getattr(self.config, "layer_types", ()))[layer]

    def cos_sin(self, layer: int, positions: np.ndarray, T: int):
        """The model's cos and sin at ``positions`` as its forwards over ``T`` tokens saw them (a
        length-dependent RoPE held at the whole sequence, as :mod:`attnscope.core.attention.rope_length`)."""
        import torch

        mod = self.rotary
        assert mod is not None, "a layer with a rotation has a rotary module (layout() checks it)"
        dtype = getattr(self.model, "dtype", torch.float32)
        device = next((p.device for p in self.model.parameters()), torch.device("cpu"))
        x = torch.zeros(1, dtype=dtype, device=device)
        pos = torch.as_tensor(np.asarray(positions, dtype=np.int64), device=device)[None]  # (1, n)
        rope = getattr(self.backend, "rope", None)
        saved = getattr(rope, "target", None)
        if rope is not None and getattr(rope, "active", False):
            rope.target = max(int(T), 1)
        try:
            with torch.inference_mode():
                lt = self.layer_type(layer)
                cos, sin = mod(x, pos) if lt is None else mod(x, pos, lt)
        finally:
            if rope is not None and getattr(rope, "active", False):
                rope.target = saved
        return cos, sin  # (1, n, r) in the model's dtype

    def _apply(self, layer: int, vecs, cos, sin):
        """The family's own rotation of ``vecs`` ``(n, D)`` float64 at cos/sin ``(1, n, r)``: ``(n, D)``."""
        import torch
        from attnscope.core.errors import UnsupportedModelError

        fn = self.apply_fn(layer)
        assert fn is not None
        q = vecs[None, None]  # (1, 1, n, D)
        try:
            out = fn(q, q.clone(), cos.to(torch.float64), sin.to(torch.float64))
        except Exception as e:  # a family whose rotation takes other arguments or shapes (MLA)
            raise UnsupportedModelError(
                f"{self.type}: its rotary embedding is not one explain can read ({type(e).__name__}: {e})"
            ) from None
        out = out[0] if isinstance(out, tuple | list) else out
        if tuple(out.shape) != tuple(q.shape):
            raise UnsupportedModelError(f"{self.type}: its rotary embedding changes the head's shape")
        return out[0, 0]

    def layout(self, layer: int, head_dim: int, T: int) -> RopeLayout:
        """:func:`rope_layout` of ``layer`` (cached per layer type and length-dependent frequencies)."""
        import torch
        from attnscope.core.errors import UnsupportedModelError

        if self.apply_fn(layer) is None:
            note = (
                f"{self.type} has no rotary position embedding"
                + (" in this layer" if layer in self.attn and self.rotary is not None else "")
                + ": the score is one part (position enters some other way, e.g. GPT-2's learned "
                "position embeddings added to the input)"
            )
            e = np.zeros(0, dtype=np.int64)
            return RopeLayout(False, e, e, np.arange(head_dim), np.zeros(0), note)
        if self.rotary is None:
            raise UnsupportedModelError(f"{self.type}: found a rotation but no rotary embedding module")
        rope = getattr(self.backend, "rope", None)
        key = (self.layer_type(layer), T if getattr(rope, "active", False) else None)
        if key in self._layouts:
            return self._layouts[key]
        D = head_dim
        cos, sin = self.cos_sin(layer, np.ones(D, dtype=np.int64), T)  # position 1 for every probe row
        m = self._apply(layer, torch.eye(D, dtype=torch.float64), cos, sin).cpu().numpy()  # row i = R e_i
        first, second, unrot = [], [], []
        seen: set[int] = set()
        for i in range(D):
            if i in seen:
                continue
            off = [j for j in np.flatnonzero(m[i]) if j != i]
            if not off:
                unrot.append(i)
                continue
            if len(off) != 1 or set(np.flatnonzero(m[off[0]])) - {off[0], i}:
                raise UnsupportedModelError(f"{self.type}: its rotation does not act on pairs of dimensions")
            j = int(off[0])
            first.append(i)
            second.append(j)
            seen.update((i, j))
        first_a, second_a = np.array(first, dtype=np.int64), np.array(second, dtype=np.int64)
        # angle per token: position 1's rotation of e_a is (c, s) in (a, b), scaled by YaRN's factor
        theta = np.abs(np.arctan2(m[first_a, second_a], m[first_a, first_a]))
        with np.errstate(divide="ignore"):
            wl = np.where(theta > 0, 2 * np.pi / theta, np.inf)
        order = np.argsort(wl, kind="stable")
        out = RopeLayout(
            True,
            first_a[order],
            second_a[order],
            np.array(unrot, dtype=np.int64),
            wl[order].astype(np.float64),
        )
        self._layouts[key] = out
        return out

    def blocks(self, layer: int, positions: np.ndarray, lay: RopeLayout, T: int) -> np.ndarray:
        """``(n, P, 2, 2)`` float64: each pair's 2×2 map at each of ``positions`` (``B @ (x_a, x_b)``)."""
        import torch

        n, D = len(positions), int(lay.first.size * 2 + lay.unrotated.size)
        cos, sin = self.cos_sin(layer, positions, T)
        ea = torch.zeros((n, D), dtype=torch.float64)
        eb = torch.zeros((n, D), dtype=torch.float64)
        ea[:, torch.from_numpy(lay.first)] = 1.0
        eb[:, torch.from_numpy(lay.second)] = 1.0
        both = torch.cat([ea, eb])  # (2n, D): one call of the family's rotation
        cs = torch.cat([cos, cos], dim=1), torch.cat([sin, sin], dim=1)
        r = self._apply(layer, both, *cs).cpu().numpy()
        ra, rb = r[:n], r[n:]
        B = np.empty((n, lay.first.size, 2, 2), dtype=np.float64)
        B[:, :, 0, 0], B[:, :, 1, 0] = ra[:, lay.first], ra[:, lay.second]
        B[:, :, 0, 1], B[:, :, 1, 1] = rb[:, lay.first], rb[:, lay.second]
        return B


_ROTARY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _rotary(session: Session) -> _Rotary:
    backend = session.backend
    try:
        r = _ROTARY.get(backend)
    except TypeError:
        r = None
    if r is None:
        r = _Rotary(backend)
        try:
            _ROTARY[backend] = r
        except TypeError:
            pass
    return r


def rope_layout(session: Session, layer: int) -> RopeLayout:
    """How ``layer`` of the session's model pairs its head dimensions, and each pair's wavelength.

    Read from the model itself: its rotary module gives cos and sin at a position (with llama3 / yarn /
    longrope scaling and Gemma 3's per-layer-type bases, at the session's length for a length-dependent
    RoPE), and the family's ``apply_rotary_pos_emb``, applied to the unit vectors, says which dimension
    turns with which (rotate-half, interleaved, partial).

    Raises:
        UnsupportedModelError: not the torch backend, or a rotation that is not one on pairs.
        OutOfRange / NoAttentionMap: a bad layer.
    """
    session._require_run()
    trace = session.trace
    trace._rec(layer)
    return _rotary(session).layout(int(layer), trace.head_dim, trace.seq_len)


def unrotate(session: Session, layer: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Post-RoPE vectors ``x`` ``(..., n, D)`` at ``positions`` ``(n,)`` rotated back: the pre-RoPE ones,
    float64 (the inverse of each position's 2×2 map; YaRN/LongRoPE's attention scaling undone too).
    Unchanged for a layer without RoPE.

    Raises:
        as :func:`rope_layout`.
    """
    lay = rope_layout(session, layer)
    x = np.asarray(x, dtype=np.float64)
    if not lay.rope:
        return x.copy()
    B = _rotary(session).blocks(int(layer), np.asarray(positions, dtype=np.int64), lay, session.trace.seq_len)
    inv = np.linalg.inv(B)  # (n, P, 2, 2)
    a, b = x[..., lay.first], x[..., lay.second]  # (..., n, P)
    out = x.copy()
    out[..., lay.first] = inv[:, :, 0, 0] * a + inv[:, :, 0, 1] * b
    out[..., lay.second] = inv[:, :, 1, 0] * a + inv[:, :, 1, 1] * b
    return out


# -- the splits ----------------------------------------------------------------------------------
def _band_groups(lay: RopeLayout) -> list[np.ndarray]:
    """Indices into the layout's pairs, one array per non-empty band of :data:`BAND_EDGES`."""
    idx = np.searchsorted(np.asarray(BAND_EDGES), lay.wavelength, side="right") - 1
    return [np.flatnonzero(idx == b) for b in range(len(BAND_EDGES) - 1) if np.any(idx == b)]


def _band_name(wl: np.ndarray) -> str:
    lo, hi = tokens_text(float(wl.min())), tokens_text(float(wl.max()))
    return f"turns every {lo} tokens" if lo == hi else f"turns every {lo}–{hi} tokens"


def _split(lay: RopeLayout, q: np.ndarray, k: np.ndarray, scale: float) -> BandSplit:
    """The split of ``scale · q·k`` (``q``, ``k``: ``(D,)`` float64)."""
    if not lay.rope:
        return BandSplit(
            ("the whole score",), (math.inf,), ((),), (float(scale * q @ k),), None, False, lay.note
        )
    pair = scale * (q[lay.first] * k[lay.first] + q[lay.second] * k[lay.second])  # (P,)
    groups = _band_groups(lay)
    unrot = float(scale * q[lay.unrotated] @ k[lay.unrotated]) if lay.unrotated.size else None
    return BandSplit(
        names=tuple(_band_name(lay.wavelength[g]) for g in groups),
        wavelengths=tuple(float(np.exp(np.log(lay.wavelength[g]).mean())) for g in groups),
        pairs=tuple(tuple(int(p) for p in g) for g in groups),
        parts=tuple(float(pair[g].sum()) for g in groups),
        unrotated=unrot,
    )


def _qk(
    session: Session, layer: int, head: int, rows: slice, cols: slice
) -> tuple[np.ndarray, np.ndarray, float]:
    """Stored post-RoPE q rows ``(n_q, D)`` and K rows ``(n_k, D)`` as float64, and the layer's scale."""
    rec = session.trace._rec(layer)
    kv = session.trace.kv_head(head)
    q = rec.q()[head, rows].float().cpu().double().numpy()
    k = rec.keys[kv, cols].float().cpu().double().numpy()
    return q, k, float(rec.scale)


def _check(session: Session, layer, head, query, key) -> tuple[int, int, int, int]:
    from attnscope.core.checks import index

    session._require_run()
    layer = index("layer", layer, session.info.n_layers)
    session.info.arch.check_map(layer)
    head = index("head", head, session.info.n_heads)
    T = session.seq_len
    return layer, head, index("query", query, T), index("key", key, T)


@remotable
def cell_bands(session: Session, layer: int, head: int, query: int, key: int) -> BandSplit:
    """The score of one cell split by band (no forward: the stored q row and cached key).

    Raises:
        SessionError: nothing run. OutOfRange / WrongType: a bad index. UnsupportedModelError: as
        :func:`rope_layout`.
    """
    layer, head, query, key = _check(session, layer, head, query, key)
    lay = rope_layout(session, layer)
    q, k, scale = _qk(session, layer, head, slice(query, query + 1), slice(key, key + 1))
    return _split(lay, q[0], k[0], scale)


@remotable
def row_bands(session: Session, layer: int, head: int, query: int) -> BandSplit:
    """Row ``query``'s weighted score ``Σ_j w_ij s_ij`` split by band: ``⟨q_i^p, Σ_j w_ij k_j^p⟩`` per
    pair, one ``(1, T) @ (T, D)`` product (no forward).

    Raises:
        as :func:`cell_bands`.
    """
    layer, head, query, _ = _check(session, layer, head, query, 0)
    lay = rope_layout(session, layer)
    _, wk = _weighted_key(session, layer, head, query)
    q, _, scale = _qk(session, layer, head, slice(query, query + 1), slice(0, 0))
    return _split(lay, q[0], wk, scale)


#: rows of keys per float64 product in :func:`_weighted_key`: 512 × 64 dims is torch's parallel grain
#: (32,768 elements), so each step runs on the calling thread and never waits at a barrier for others
WEIGHTED_KEY_ROWS = 512


def _weighted_key(session: Session, layer: int, head: int, query: int) -> tuple[np.ndarray, np.ndarray]:
    """Row ``query``'s weights ``(query + 1,)`` float32 and ``Σ_j w_ij k_j`` ``(D,)`` float64.

    float64 matrix-vector products on the cached keys' device, :data:`WEIGHTED_KEY_ROWS` keys at a time:
    converting every key to a float64 numpy array first, or in one multi-threaded copy, took 15-45 ms at
    T = 8,192 on a busy machine (threads waiting at barriers), these ~0.3 ms (docs/benchmarks.md,
    ``attnscope bench --views`` row ``explain_row_8192``)."""
    import torch

    n = query + 1
    row = session.trace.weights(layer, head, slice(query, n), slice(0, n))[0]  # (n,) float32
    rec = session.trace._rec(layer)
    k = rec.keys[session.trace.kv_head(head), :n]  # (n, D)
    w = torch.from_numpy(row).to(k.device, torch.float64)
    wk = torch.zeros(k.shape[1], dtype=torch.float64, device=k.device)
    for a in range(0, n, WEIGHTED_KEY_ROWS):
        b = min(n, a + WEIGHTED_KEY_ROWS)
        wk += torch.mv(k[a:b].double().T, w[a:b])
    return row, wk.cpu().numpy()


def _softmax_row(session: Session, layer: int, head: int, query: int, s: np.ndarray) -> np.ndarray:
    """Weights of scores ``s`` ``(query + 1,)`` under the layer's mask, soft-cap and learned sink."""
    rec = session.trace._rec(layer)
    allowed = session.trace.allowed(layer, slice(query, query + 1), slice(0, query + 1))[0]
    cap = getattr(rec, "softcap", None)
    if cap is not None:
        s = cap * np.tanh(s / cap)
    s = np.where(allowed, s, -np.inf)
    sinks = session.trace.learned_sinks(layer)
    m = s.max()
    if sinks is not None:
        m = max(m, float(sinks[head]))
    e = np.exp(s - m)
    den = e.sum() + (np.exp(float(sinks[head]) - m) if sinks is not None else 0.0)
    return (e / den).astype(np.float32)


@remotable
def explain(
    session: Session, layer: int, head: int, query: int, key: int, *, sources: bool = False, top: int = 10
) -> Explanation:
    """Why ``head`` of ``layer`` gives key ``key`` its score at query ``query`` (docs "Why a head attends").

    The cell's score and its row's weighted score split by rotary band (exact, no forward), the row's
    actual weights and its counterfactual with the rotation removed (pre-RoPE ``q·k·scale``, same mask,
    soft-cap and sink). Positions are token positions of the session's sequence (0-based).

    With ``sources``, :attr:`Explanation.sources` is the score split by the components that wrote the
    query and the key (:func:`attnscope.core.analysis.qk_sources.source_split`, its ``top`` largest pairs:
    one forward of the prefix; None for a key after the query, which the head never scores).

    Returns:
        :class:`Explanation` (``sources`` None unless asked for).

    Raises:
        SessionError: nothing run yet. WrongType / OutOfRange: a bad layer, head or position.
        NoAttentionMap: a hybrid model's layer with no map. UnsupportedModelError: not the torch
        backend, or a rotation explain cannot read (:func:`rope_layout`); with ``sources``, a model whose
        score cannot be split by source (:mod:`attnscope.core.analysis.qk_sources`). BadArgument: ``top`` < 1.
    """
    layer, head, query, key = _check(session, layer, head, query, key)
    split = None
    if sources and key <= query:
        from attnscope.core.analysis.qk_sources import source_split

        split = source_split(session, layer, head, query, key, top=top)
    lay = rope_layout(session, layer)
    n = query + 1
    q, k, scale = _qk(session, layer, head, slice(query, n), slice(0, session.seq_len))
    row, wk = _weighted_key(session, layer, head, query)  # (n,) float32, (D,) float64
    kk = k[:n]
    if lay.rope:
        pos = np.arange(n, dtype=np.int64)
        q0 = unrotate(session, layer, q, np.array([query]))[0]
        k0 = unrotate(session, layer, kk, pos)
        no_rope = _softmax_row(session, layer, head, query, scale * (k0 @ q0))
    else:
        no_rope = row.copy()
    allowed = bool(session.trace.allowed(layer, slice(query, n), slice(key, key + 1))[0, 0])
    rec = session.trace._rec(layer)
    return Explanation(
        layer=layer,
        head=head,
        query=query,
        key=key,
        score=float(scale * q[0] @ k[key]),
        bands=_split(lay, q[0], k[key], scale),
        row_bands=_split(lay, q[0], wk, scale),
        no_rope_row=no_rope,
        row=row,
        weight=float(row[key]) if key < n and allowed else 0.0,
        allowed=allowed,
        capped=getattr(rec, "softcap", None),
        sources=split,
    )


# -- the head-level figure ---------------------------------------------------------------------
def _shares(lay: RopeLayout, q, k, rows: np.ndarray, window, short_tokens) -> np.ndarray:
    """``Var(short part) / (Var(short) + Var(rest))`` per head of the scores of ``rows`` over their visible
    keys: ``q`` ``(h, n, D)`` and ``k`` ``(h, T, D)`` float32 torch (each head's KV head), ``(h,)`` float64.
    One pair of batched products per call (as many multiply-adds as the rows' full scores)."""
    import torch

    h = q.shape[0]
    if not lay.rope:
        return np.zeros(h)
    short = lay.wavelength < short_tokens
    dims = (
        np.concatenate([lay.first[short], lay.second[short]]),
        np.concatenate([lay.first[~short], lay.second[~short], lay.unrotated]),
    )
    T = k.shape[1]
    j = torch.arange(T, device=k.device)[None, :]
    i = torch.from_numpy(rows).to(k.device)[:, None]
    vis = j <= i
    if window is not None:
        vis &= j > i - window
    n = vis.sum().item()
    if n < 2:
        return np.full(h, np.nan)
    var = []
    for d in dims:
        if d.size == 0:
            var.append(torch.zeros(h, dtype=torch.float64))
            continue
        di = torch.from_numpy(d).to(k.device)
        s = torch.bmm(q[..., di], k[..., di].transpose(1, 2)).double()  # (h, n, T)
        s = s.masked_fill(~vis, 0.0)
        mean = s.sum((1, 2)) / n
        var.append(((s - mean[:, None, None]).masked_fill(~vis, 0.0) ** 2).sum((1, 2)).cpu() / n)
    tot = var[0] + var[1]
    out = torch.where(tot > 0, var[0] / tot.clamp_min(1e-300), torch.full_like(tot, float("nan")))
    return out.numpy()


def _layer_qk(session: Session, layer: int, heads: list[int], rows: np.ndarray):
    """Stored q rows ``(h, n, D)`` and each head's keys ``(h, T, D)``, float32 torch (GQA by index)."""
    import torch

    rec = session.trace._rec(layer)
    q = rec.q()[heads].float()[:, torch.from_numpy(rows).to(rec.keys.device)]
    kv = torch.tensor([session.trace.kv_head(h) for h in heads], device=rec.keys.device)
    k = rec.keys.index_select(0, kv).float()
    return q, k, rec


def _rows(T: int, max_rows: int) -> np.ndarray:
    """Query rows the share reads: rows ``1 .. T − 1`` (row 0 has one key), evenly thinned to ``max_rows``."""
    if T <= 1:
        return np.zeros(0, dtype=np.int64)
    rows = np.arange(1, T)
    if rows.size > max_rows:
        rows = np.unique(np.linspace(1, T - 1, max_rows).round().astype(np.int64))
    return rows


@remotable
def head_positional_share(
    session: Session, layer: int, head: int, *, short_tokens: float = SHORT_TOKENS, max_rows: int = SHARE_ROWS
) -> float:
    """The share of a head's score variance over its map carried by bands turning faster than every
    ``short_tokens`` tokens: ``Var(s_short) / (Var(s_short) + Var(s_rest))`` over the visible cells of
    (up to ``max_rows`` evenly spaced) query rows, ``s_rest`` the slower bands plus unrotated dims.

    Near 1: the head's scores vary with position (previous-token, local heads); near 0: with content
    (induction heads). 0 for a model without RoPE; NaN when no row has two visible keys.

    Raises:
        as :func:`cell_bands`.
    """
    layer, head, _, _ = _check(session, layer, head, 0, 0)
    lay = rope_layout(session, layer)
    T = session.seq_len
    rows = _rows(T, int(max_rows))
    if rows.size == 0:
        return float("nan")
    q, k, rec = _layer_qk(session, layer, [head], rows)
    return float(_shares(lay, q, k, rows, rec.sliding_window, short_tokens)[0])


@remotable
def positional_share_grid(
    session: Session,
    *,
    short_tokens: float = SHORT_TOKENS,
    max_rows: int = 64,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> np.ndarray:
    """:func:`head_positional_share` of every head, ``(n_layers, n_heads)`` float32 (NaN rows for layers
    with no map). ``progress(done, n_layers)`` after each layer; ``cancelled()`` checked before each.

    Raises:
        SessionError: nothing run. Cancelled: ``cancelled()`` became true. UnsupportedModelError: as
        :func:`rope_layout`.
    """
    from attnscope.core.errors import Cancelled
    from attnscope.core.trace.base import empty_rows

    session._require_run()
    trace = session.trace
    out = empty_rows(trace)
    T = session.seq_len
    rows = _rows(T, int(max_rows))
    layers = trace.arch.attention_layers
    for n_done, layer in enumerate(layers):
        if cancelled is not None and cancelled():
            raise Cancelled(f"stopped after {n_done} of {len(layers)} layers")
        lay = rope_layout(session, layer)
        if rows.size == 0:
            out[layer] = np.nan
        else:
            q, k, rec = _layer_qk(session, layer, list(range(trace.n_heads)), rows)
            out[layer] = _shares(lay, q, k, rows, rec.sliding_window, short_tokens)
        if progress is not None:
            progress(n_done + 1, len(layers))
    return out
