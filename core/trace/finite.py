"""Non-finite values in a forward, caught as they happen and named (layer, what, inf or NaN).

A half-precision forward can overflow: float16's largest value is 65504, and Gemma 3 270M's
residual stream passes it in transformers' own forward (hidden states of layer 8 reach inf), after
which every later layer's queries, keys, LSE and the logits are NaN. Maps recomputed from such a
trace are NaN too; drawn as a weight they would look valid. So every tensor a forward produces that
the maps or the next-token list depend on is checked:

* hidden states: the output of each decoder layer (a forward hook on the module holding the layer's
  attention, :func:`watch_layers`);
* queries, new keys and LSE: where the trace records them (:meth:`FiniteWatch.check` from
  :meth:`attnscope.core.trace.torch_trace.TorchTrace.record`);
* logits: after each chunk of the forward.

Cost: one reduction per tensor per chunk, ``amax(|x|)`` (NaN propagates through ``amax``, an
infinity is its own maximum, so one number says finite / inf / NaN), kept on the tensor's device;
the values of a chunk are read in one transfer when the chunk's logits are read anyway
(:meth:`FiniteWatch.flush`), so a GPU forward gains no synchronisation per tensor.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

#: what is checked, in forward order within a layer
WHAT = ("queries", "keys", "LSE", "hidden states", "logits")


@dataclass(frozen=True)
class NonFinite:
    """One tensor of a forward that held a non-finite value.

    ``layer``: decoder layer (None for the logits); ``what``: one of :data:`WHAT`; ``kind``:
    ``"inf"`` or ``"NaN"`` (NaN wins when both occur); ``dtype``: the forward's precision
    (``"float16"``); ``positions``: ``[first, last]`` token positions of the first chunk it was
    seen in (inclusive)."""

    layer: int | None
    what: str
    kind: str
    dtype: str
    positions: tuple[int, int]

    def name(self) -> str:
        """``"hidden states of layer 8 reach inf at float16"``."""
        where = f"{self.what} of layer {self.layer}" if self.layer is not None else self.what
        return f"{where} reach {self.kind} at {self.dtype}"

    def record(self) -> dict:
        """JSON-ready form (export sidecars: ``"nonfinite"``)."""
        d = asdict(self)
        d["positions"] = list(self.positions)
        return d


def _dtype_name(dtype: Any) -> str:
    """``"float16"`` for ``torch.float16`` and for MLX's ``mlx.core.float16``."""
    return str(dtype).rsplit(".", 1)[-1]


def describe(found: list[NonFinite]) -> str:
    """One line for the status bar and the CLI: the first non-finite tensor of the forward, what it
    takes with it, and what to do. ``""`` when ``found`` is empty."""
    if not found:
        return ""
    first = found[0]
    later = [f for f in found[1:] if f.layer is not None]
    layers = sorted({f.layer for f in later if f.layer is not None and f.layer != first.layer})
    rest = []
    if layers:
        rest.append(f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}–{layers[-1]}")
    if any(f.what == "logits" for f in found) and first.what != "logits":
        rest.append("the logits")
    tail = f"; {' and '.join(rest)} follow" if rest else ""
    p0, p1 = first.positions
    pos = f"position {p0}" if p0 == p1 else f"positions {p0}–{p1}"
    fix = " (load at --dtype bfloat16 or float32)" if first.dtype in ("float16", "bfloat16") else ""
    return (
        f"non-finite forward: {first.name()} ({pos}){tail}; their maps are not weights and "
        f"are drawn as non-finite{fix}"
    )


class FiniteWatch:
    """Collects ``amax(|x|)`` of the tensors of a forward chunk (no sync), then reads them at once.

    :meth:`check` during the chunk, :meth:`flush` after it. :attr:`found` holds the first sighting of
    each ``(layer, what)`` that was non-finite, in forward order; :meth:`reset` forgets them (a new
    sequence)."""

    def __init__(self) -> None:
        self._pending: list[tuple[int | None, str, torch.Tensor]] = []
        self.found: list[NonFinite] = []
        self._seen: set[tuple[int | None, str]] = set()
        self.dtype = "float32"
        self.positions = (0, 0)

    def reset(self) -> None:
        self._pending = []
        self.found = []
        self._seen = set()

    def begin(self, first: int, last: int, dtype: Any) -> None:
        """A chunk of token positions ``first .. last`` (inclusive) is about to run at ``dtype``."""
        self._pending = []
        self.positions = (int(first), int(last))
        self.dtype = _dtype_name(dtype)

    def check(self, layer: int | None, what: str, tensor: Any) -> None:
        """Queue one reduction of ``tensor`` (a floating torch tensor; anything else is ignored)."""
        if (layer, what) in self._seen:
            return
        red = self._reduce(tensor)
        if red is not None:
            self._pending.append((layer, what, red))

    def _reduce(self, tensor: Any) -> Any:
        """``amax(|tensor|)`` as a 0-d tensor on the tensor's device (not read), or None: not a
        non-empty floating torch tensor. An array library's watch overrides this and :meth:`_read`
        (:class:`attnscope.core.trace.mlx_trace.MlxFiniteWatch`)."""
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or tensor.numel() == 0:
            return None
        return tensor.detach().abs().amax()

    def _read(self, reductions: list) -> list[float]:
        """The values of :meth:`_reduce`'s results, one transfer per device."""
        by_device: dict[torch.device, list[int]] = {}
        for i, red in enumerate(reductions):
            by_device.setdefault(red.device, []).append(i)
        values: list[float] = [0.0] * len(reductions)
        for idx in by_device.values():
            host = torch.stack([reductions[i].float() for i in idx]).cpu().tolist()
            for i, x in zip(idx, host, strict=True):
                values[i] = float(x)
        return values

    def pending(self) -> list:
        """The queued reductions of this chunk, not read yet (a lazy array library evaluates them
        with the chunk's logits: :class:`attnscope.core.backends.mlx_backend.MlxBackend`)."""
        return [red for _, _, red in self._pending]

    def check_attention(self, layer: int, query: Any, key: Any, lse: Any, n_new: int) -> None:
        """Queue the checks of one attention call: ``query`` ``(B, n_heads, L, D)``, the ``n_new``
        new rows of ``key`` ``(B, n_kv_heads, S, D)`` and ``lse`` ``(B, n_heads, L)`` (torch tensors,
        or the arrays of the watch's library)."""
        self.check(layer, "queries", query)
        self.check(layer, "keys", key[..., key.shape[-2] - n_new :, :])
        self.check(layer, "LSE", lse)

    def flush(self) -> list[NonFinite]:
        """Read the chunk's reductions (one transfer per device) and return what was newly non-finite."""
        pending, self._pending = self._pending, []
        if not pending:
            return []
        values = self._read([red for _, _, red in pending])
        new = []
        for (layer, what, _), x in zip(pending, values, strict=True):
            if math.isfinite(x) or (layer, what) in self._seen:
                continue
            self._seen.add((layer, what))
            nf = NonFinite(layer, what, "NaN" if math.isnan(x) else "inf", self.dtype, self.positions)
            self.found.append(nf)
            new.append(nf)
        return new

    def records(self) -> list[dict]:
        """:attr:`found` as JSON-ready dicts (an export sidecar's ``"nonfinite"``)."""
        return [f.record() for f in self.found]


def _watch_of(attn: torch.nn.Module) -> FiniteWatch | None:
    """The watch of the trace an attention module records into now (None: none)."""
    return getattr(getattr(attn, "_attnscope_trace", None), "finite", None)


def watch_layers(model: torch.nn.Module) -> list:
    """Forward hooks checking each decoder layer's output (its hidden states), once per model.

    A decoder layer is the parent module of an attention module with a ``layer_idx``; its hook
    reports to the :class:`FiniteWatch` of the trace that attention module records into at call
    time (``_attnscope_trace.finite``), so a backend that re-points its attention modules at
    another trace (an experiment's fork) is followed and a second backend on the same model adds
    no hooks. Returns the hook handles (``[]`` when the model is watched already)."""
    if getattr(model, "_attnscope_finite_watched", False):
        return []
    model._attnscope_finite_watched = True  # type: ignore[assignment]
    handles = []
    names = dict(model.named_modules())
    for name, mod in names.items():
        idx = getattr(mod, "layer_idx", None)
        if not type(mod).__name__.endswith("Attention") or idx is None or "." not in name:
            continue
        parent = names.get(name.rsplit(".", 1)[0])
        if parent is None:
            continue

        def hook(_m, _args, out, attn=mod, layer=int(idx)):
            w = _watch_of(attn)
            if w is not None:
                w.check(layer, "hidden states", out[0] if isinstance(out, tuple) else out)

        handles.append(parent.register_forward_hook(hook))
    return handles


@dataclass(frozen=True)
class NonFiniteNotice:
    """A backend notice (:attr:`attnscope.core.backends.base.Backend.notices`): the forward held
    non-finite values; ``str()`` is the one line of :func:`describe`."""

    found: tuple[NonFinite, ...]

    def __str__(self) -> str:
        return describe(list(self.found))


def note(notices: list, watch: FiniteWatch) -> NonFiniteNotice | None:
    """:meth:`FiniteWatch.flush` the chunk; when it found the sequence's first non-finite tensors,
    append one :class:`NonFiniteNotice` to ``notices`` (never two equal ones) and return it."""
    new = watch.flush()
    if not new or len(new) != len(watch.found):  # nothing new, or said already for this sequence
        return None
    notice = NonFiniteNotice(tuple(watch.found))
    if any(str(n) == str(notice) for n in notices):
        return None
    notices.append(notice)
    return notice
