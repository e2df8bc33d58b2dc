"""Head interventions on the MLX backend's own models: what head ablation, activation patching, direct
logit attribution and the logit lens (:mod:`attnscope.core.analysis.head_effects`) need from a model,
with numpy arrays in and out.

The torch backend reaches a transformers model's projections through module hooks. The hand-written MLX
models (:mod:`attnscope.core.backends.mlx_arch`) have the same places as seams instead: every decoder
layer takes a :class:`attnscope.core.backends.mlx_arch.LayerEdit`, data that says which site values it
replaces (a boolean mask and the values: heads are column blocks, positions rows, batch rows units) and
which it records. :class:`MlxSites` builds those edits from the backend-neutral requests of
:mod:`attnscope.core.backends.head_sites` (it is a :class:`attnscope.core.backends.head_sites.HeadSites`):

* :meth:`MlxSites.capture`: the clean values of the sites (``"z"`` o_proj's input, ``"q"``/``"k"``/``"v"``
  the projections' outputs, ``"input"``/``"resid"``/``"mlp"`` hidden states), ``(L, width)`` float32;
* :class:`MlxRunner`: logits at the read-out position with some units replaced (:class:`RowEdit`), one
  unit per batch row, layers below the units' layer reused (their inputs recorded once; exact, the same
  computation on the same inputs). ``readout`` scope: the prefix ``ids[:p]`` stays in a KV cache that
  every row reads (expanded, not copied) and position ``p`` runs as one decode step; ``everywhere``: the
  layers from the units' layer on run over every position with fresh caches;
* :meth:`MlxSites.gradients`: ``∂t/∂a`` for every site activation (``mx.value_and_grad`` through a zero
  ``add`` at each site), for attribution patching;
* the weights direct logit attribution projects through (:meth:`MlxSites.out_proj`,
  :meth:`MlxSites.final_norm`, :meth:`MlxSites.unembedding`) and :meth:`MlxSites.unembed_probs` for
  the lens.

mlx-lm's families (:mod:`attnscope.core.backends.mlx_lm_arch`) run mlx-lm's own layers, which have no
such seams: refused in one line (:func:`sites_of`). Call from the backend's thread (MLX streams are per
thread, :mod:`attnscope.core.backends.mlx_backend`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from attnscope.core.backends.head_sites import RowEdit
from attnscope.core.backends.mlx_arch import CausalLM, LayerEdit
from attnscope.core.backends.mlx_backend import float_weight
from attnscope.core.errors import UnsupportedModelError

__all__ = ["MlxRunner", "MlxSites", "RowEdit", "sites_of"]


class _Fresh:
    """A KV cache for a whole run from position 0 (any batch size): attends to exactly the keys and values
    of the run, keeps nothing."""

    offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        return keys, values


class _SharedPrefix:
    """A layer's cached prefix ``(1, n_kv_heads, p, D)``, read by ``n`` batch rows (broadcast, no copy),
    followed by the rows' own new positions; the cache is not changed."""

    def __init__(self, cache, n: int):
        self.cache, self.n, self.offset = cache, n, cache.offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if not self.offset:
            return keys, values
        c, p = self.cache, self.offset
        pk, pv = c.keys[..., :p, :], c.values[..., :p, :]
        pk = mx.broadcast_to(pk, (self.n, *pk.shape[1:]))
        pv = mx.broadcast_to(pv, (self.n, *pv.shape[1:]))
        return mx.concatenate([pk, keys], axis=2), mx.concatenate([pv, values], axis=2)


def sites_of(backend) -> MlxSites:
    """The intervention seams of an MLX backend's model.

    Raises:
        UnsupportedModelError: an mlx-lm family (its layers have no seams) or a released model.
    """
    model = getattr(backend, "model", None)
    if model is None:
        raise UnsupportedModelError(
            "the model's weights were released: load it again to intervene on its heads"
        )
    if not isinstance(model, CausalLM):
        raise UnsupportedModelError(
            f"{backend.info.architecture} runs through mlx-lm on the MLX backend, whose layers cannot be "
            "intervened on (head ablation, patching, direct logit attribution, the logit lens): use --backend torch"
        )
    check = getattr(backend, "_check_thread", None)
    if check is not None:
        check()
    return MlxSites(model)


def _np(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32))


class MlxSites:
    """The seams of one :class:`attnscope.core.backends.mlx_arch.CausalLM` (module docstring)."""

    def __init__(self, model: CausalLM):
        self.model = model
        a = model.args
        self.n_layers, self.head_dim = a.num_hidden_layers, a.head_dim
        self.n_heads, self.n_kv_heads = a.n_heads, a.n_kv_heads
        D = a.head_dim
        self.widths = {"z": a.n_heads * D, "q": a.n_heads * D, "k": a.n_kv_heads * D, "v": a.n_kv_heads * D}
        self.dtype = model.model.norm.weight.dtype  # activations' dtype (the model's)

    # -- plain runs ---------------------------------------------------------------------------------
    def capture(self, ids: Sequence[int], keys: Sequence[str], last: bool = False) -> tuple[np.ndarray, dict]:
        """One forward of ``ids`` from an empty cache: ``(logits (vocab,) float32 at the last position,
        {(key, layer): (L, width) float32})`` for the sites ``keys`` of every layer (``last``: the last
        position's row only, ``(1, width)``; the others are never kept)."""
        edits: list[LayerEdit | None] = [LayerEdit(record=tuple(keys)) for _ in range(self.n_layers)]
        logits = self.model(self._ids(ids), [_Fresh()] * self.n_layers, last_only=True, edits=edits)
        rows = slice(-1, None) if last else slice(None)
        kept = {(k, i): e.kept[k][0, rows] for i, e in enumerate(edits) if e is not None for k in keys}
        del edits  # only what is returned stays referenced while MLX evaluates
        mx.eval(logits, *kept.values())
        return _np(logits[0, -1]), {key: _np(a) for key, a in kept.items()}

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """``(vocab,)`` float32 logits after ``ids`` (one forward from an empty cache)."""
        return self.capture(ids, ())[0]

    def lens(self, ids: Sequence[int], positions: Sequence[int]) -> tuple[np.ndarray, list[mx.array]]:
        """One forward of ``ids``: the logits at ``positions`` ``(P, vocab)`` float32 and each layer's
        output hidden states at them (``(P, hidden)`` MLX arrays, for :meth:`unembed_probs`)."""
        pos = mx.array(np.asarray(positions, dtype=np.int32))
        edits: list[LayerEdit | None] = [LayerEdit(record=("resid",)) for _ in range(self.n_layers)]
        self.model(self._ids(ids), [_Fresh()] * self.n_layers, last_only=True, edits=edits)  # fills kept
        resid = [e.kept["resid"][0][pos] for e in edits if e is not None]
        del edits  # the positions asked for are all that stays
        final = self.model.unembed(resid[-1]).astype(mx.float32)  # the model's logits there
        mx.eval(final, *resid)
        return _np(final), resid

    def unembed_probs(self, h: mx.array) -> np.ndarray:
        """Hidden states ``(P, hidden)`` through the final norm, the unembedding and a softmax (float32):
        ``(P, vocab)`` float64."""
        z = self.model.unembed(h[None])[0].astype(mx.float32)
        return np.array(mx.softmax(z, axis=-1)).astype(np.float64)

    def _ids(self, ids: Sequence[int]) -> mx.array:
        return mx.array(np.asarray(list(ids), dtype=np.int32)[None])

    # -- weights (float64) --------------------------------------------------------------------------
    def out_proj(self, layer: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Layer ``layer``'s o_proj: weight ``(hidden, n_heads·D)`` and bias ``(hidden,)`` (or None), float64."""
        proj = self.model.model.layers[layer].self_attn.o_proj
        bias = proj.get("bias") if hasattr(proj, "get") else None
        w = np.array(float_weight(proj).astype(mx.float32)).astype(np.float64)
        return w, None if bias is None else np.array(bias.astype(mx.float32)).astype(np.float64)

    def final_norm(self) -> tuple[np.ndarray, float]:
        """The final RMSNorm's weight ``(hidden,)`` float64 and epsilon."""
        norm = self.model.model.norm
        return np.array(norm.weight.astype(mx.float32)).astype(np.float64), float(norm.eps)

    def unembedding(self, tokens: Sequence[int]) -> np.ndarray:
        """The unembedding rows of ``tokens``: ``(len(tokens), hidden)`` float64."""
        m = self.model
        layer = m.model.embed_tokens if m.args.tie_word_embeddings else m.lm_head
        w = float_weight(layer)[mx.array(np.asarray(list(tokens), dtype=np.int32))]
        return np.array(w.astype(mx.float32)).astype(np.float64)

    # -- gradients ----------------------------------------------------------------------------------
    def gradients(self, ids: Sequence[int], keys: Sequence[str], target: Any) -> tuple[float, dict]:
        """``target`` (``logit_diff``: ``logit[token] − logit[other]``; else ``log softmax[token]``) on the
        last position's float32 logits, and its gradient with respect to every site in ``keys`` of every
        layer: ``(value, {(key, layer): (L, width) float32})`` (``mx.value_and_grad`` through a zero delta
        added at each site; no weight gradients)."""

        def metric(x: mx.array) -> mx.array:
            if target.kind == "logit_diff":
                return x[target.token] - x[target.other]
            return x[target.token] - mx.logsumexp(x)

        L = len(list(ids))
        x = self._ids(ids)
        zeros = {
            f"{k}:{i}": mx.zeros((1, L, self.widths[k]), dtype=self.dtype)
            for i in range(self.n_layers)
            for k in keys
        }

        def f(deltas):
            edits: list[LayerEdit | None] = [
                LayerEdit(add={k: deltas[f"{k}:{i}"] for k in keys}) for i in range(self.n_layers)
            ]
            logits = self.model(x, [_Fresh()] * self.n_layers, last_only=True, edits=edits)
            return metric(logits[0, -1].astype(mx.float32))

        value, grads = mx.value_and_grad(f)(zeros)
        mx.eval(value, grads)
        out = {}
        for name, g in grads.items():
            k, i = name.split(":")
            out[(k, int(i))] = _np(g[0])
        return float(value.item()), out

    def runner(self, ids: Sequence[int], scope: str) -> MlxRunner:
        """A :class:`MlxRunner` on ``ids`` (read-out position: the last)."""
        return MlxRunner(self, ids, scope)


class MlxRunner:
    """Logits at the read-out position ``p`` (the last of ``ids``) with units replaced, one per batch row,
    every unit of a batch in the same layer: the layers below it are reused (module docstring).

    Attributes:
        clean: ``(vocab,)`` float32: the logits at ``p`` with nothing replaced.
        max_rows: the most rows a batch should have (``everywhere`` keeps ``rows × (p + 1)`` hidden states
            per layer).
    """

    def __init__(self, sites: MlxSites, ids: Sequence[int], scope: str):
        self.sites, self.scope = sites, scope
        ids = list(ids)
        self.p = len(ids) - 1
        model, n = sites.model, sites.n_layers
        from attnscope.core.backends.mlx_arch import KVCache

        self.prefix: list[Any] = []
        if scope == "readout":
            self.prefix = [KVCache() for _ in range(n)]
            if self.p:
                model(sites._ids(ids[: self.p]), self.prefix, last_only=True)
                mx.eval(*(a for c in self.prefix for a in c.state()))
            run = ids[self.p :]
            caches: list[Any] = [_SharedPrefix(c, 1) for c in self.prefix]
        else:
            run = ids
            caches = [_Fresh()] * n
        edits: list[LayerEdit | None] = [LayerEdit(record=("input",)) for _ in range(n)]
        logits = model(sites._ids(run), caches, last_only=True, edits=edits)
        self.inputs = [e.kept["input"] for e in edits if e is not None]  # (1, L_run, hidden) each
        mx.eval(logits, *self.inputs)
        self.clean = _np(logits[0, -1])
        self.length = len(run)
        self.max_rows = 64 if scope == "readout" else max(1, min(16, 4096 // len(run)))

    def batch(self, layer: int, rows: Sequence[Sequence[RowEdit]]) -> np.ndarray:
        """``(len(rows), vocab)`` float32 logits at ``p``: row ``b`` with ``rows[b]``'s replacements in
        layer ``layer`` (at position ``p`` only for ``readout``, at every position for ``everywhere``)."""
        s, n = self.sites, len(rows)
        edit = self._edit(rows)
        edits: list[LayerEdit | None] = [None] * s.n_layers
        edits[layer] = edit
        x = self.inputs[layer]
        x = mx.broadcast_to(x, (n, *x.shape[1:]))
        if self.scope == "readout":
            caches: list[Any] = [_SharedPrefix(c, n) for c in self.prefix]
        else:
            caches = [_Fresh()] * s.n_layers
        logits = s.model.from_layer(x, layer, caches, last_only=True, edits=edits)
        return _np(logits[:, -1])

    def _edit(self, rows: Sequence[Sequence[RowEdit]]) -> LayerEdit:
        s, n, L, D = self.sites, len(rows), self.length, self.sites.head_dim
        replace = {}
        for key in sorted({e.key for r in rows for e in r}):
            w = s.widths[key]
            mask = np.zeros((n, 1, w), dtype=bool)
            val = np.zeros((n, L, w), dtype=np.float32)
            for b, row in enumerate(rows):
                for e in row:
                    if e.key != key:
                        continue
                    for h in e.heads:
                        sl = slice(h * D, (h + 1) * D)
                        mask[b, 0, sl] = True
                        if e.value is not None:
                            v = np.asarray(e.value, dtype=np.float32)[..., sl]
                            val[b, :, sl] = v[-L:] if v.ndim > 1 and v.shape[0] > 1 else v
            replace[key] = (mx.array(mask), mx.array(val))
        return LayerEdit(replace=replace)
