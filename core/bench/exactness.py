"""Per-dtype exactness of the capture against transformers' eager attention (docs/exactness.md).

The rule (docs/exactness.md): run a model at a reduced precision
(``bfloat16``/``float16``, optionally with ``--quantize int8|int4`` linear layers). AttnScope's
weights, rebuilt in float32 from the stored q rows, keys and LSE of *that* forward, must be at least
as close to a **float32 eager run of the same rounded weights** as transformers' eager attention at
the same dtype (``output_attentions=True``) is. Three forwards over the same token ids:

1. ``ours``: :meth:`attnscope.core.session.Session.load` at ``dtype`` / ``quantize``, one forward,
   every head's ``(T, T)`` map from the Trace (float32).
2. ``eager``: transformers at ``dtype`` with ``attn_implementation="eager"``, quantised by the same
   streamed loader as (1) (:func:`attnscope.core.loading.stream_load.load_quantised`: the very same
   integer weights and scales), ``output_attentions=True`` (maps in ``dtype``, upcast exactly).
3. ``reference``: the model of (2) made float32 in place: every float parameter upcast (exact), every
   quantised linear weight replaced by the float32 weight its kernel multiplies by (int8:
   ``q · scale``; int4: ``(q − 8) · scale + zero`` per group of 128), then eager at float32. So the
   reference differs from (1) and (2) only in the precision of the arithmetic, not in the weights.

Errors are absolute differences of attention weights (probabilities, unitless, in [0, 1]) per
head: the max over the head's ``(T, T)`` map (the rule of docs/exactness.md is on these), and the mean over its
``T (T + 1) / 2`` causal entries (less noisy than one entry). At ``float32`` (2) is the reference
itself (unquantised) or differs from it by float32 roundoff (quantised), and the rule is instead
``ours ≤ FLOAT32_TOL``.

What the comparison can and cannot show: (1) and (2) are two different forwards at ``dtype`` (our
fused kernel, eager's bf16 matmuls), and past the first layer each one's q and k already differ from
the float32 run by the rounding of every earlier layer's activations; that part of the error is the
forward's, shared by both and not removable by any capture. Only in layer 0 do (1) and (2) see the
same q and k, so the difference there is eager's own rounding of scores and weights, which the
capture does not have (:attr:`Exactness.layer0_share`; even there a head's *max* error can come out
below ours where eager's rounding happens to cancel part of the bf16 q·k error at the worst entry).

The models are loaded one after another and each freed before the next (the float32 reference of a
1B model is 5 GB): peak memory ≈ the float32 model + the model at ``dtype`` while it is upcast.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

FLOAT32_TOL = 1e-5  # float32 run: ours vs eager float32, max abs weight error (probability units)


@dataclass(frozen=True)
class Exactness:
    """Result of :func:`measure_exactness`.

    Attributes:
        dtype, quantize: the precision that ran (``"bfloat16"``, ``"int8"``...).
        n_tokens: ``T``, the length of the forward.
        ours_err: ``(n_layers, n_heads)`` float64: max abs difference of AttnScope's weights from the
            float32 reference, per head (probability units).
        eager_err: same shape: transformers eager at ``dtype`` against the same reference (zeros
            at float32 unquantised, where eager is the reference).
        ours_mean_err, eager_mean_err: same shape: the mean abs difference over each head's causal
            entries (None where not measured).
    """

    dtype: str
    quantize: str
    n_tokens: int
    ours_err: np.ndarray
    eager_err: np.ndarray
    ours_mean_err: np.ndarray | None = None
    eager_mean_err: np.ndarray | None = None

    @property
    def float32_rule(self) -> bool:
        """True at float32: eager (the reference itself, or a quantised float32 forward that differs
        from it by float32 roundoff only) is no yardstick, and the rule is ``ours ≤ FLOAT32_TOL``."""
        return self.dtype == "float32"

    @property
    def share_ours_le_eager(self) -> float:
        """Fraction (0–1) of heads where ours is at least as close to the reference as eager."""
        return float(np.mean(self.ours_err <= self.eager_err))

    @property
    def median_ratio(self) -> float | None:
        """Median over heads of ``ours_err / eager_err`` (None where eager has no error anywhere)."""
        ok = self.eager_err > 0
        return float(np.median(self.ours_err[ok] / self.eager_err[ok])) if ok.any() else None

    @property
    def layer0_share(self) -> float:
        """:attr:`share_ours_le_eager` over layer 0's heads only, where both runs see the same q, k."""
        return float(np.mean(self.ours_err[0] <= self.eager_err[0]))

    @property
    def met(self) -> bool:
        """The issue's rule: every head's ours ≤ eager (float32: every head ≤ :data:`FLOAT32_TOL`)."""
        if self.float32_rule:
            return bool(self.ours_err.max() <= FLOAT32_TOL)
        return bool(np.all(self.ours_err <= self.eager_err))

    def summary(self) -> dict:
        """JSON-ready figures: max over heads of each error, the share of heads, the median ratio, met;
        with the mean errors, the mean over heads of each head's mean error and the share by it."""
        means = {}
        if self.ours_mean_err is not None and self.eager_mean_err is not None:
            means = {
                "ours_mean_abs_err": float(self.ours_mean_err.mean()),
                "eager_mean_abs_err": float(self.eager_mean_err.mean()),
                "share_mean_abs_ours_le_eager": float(np.mean(self.ours_mean_err <= self.eager_mean_err)),
            }
        return means | {
            "dtype": self.dtype,
            "quantize": self.quantize,
            "n_tokens": self.n_tokens,
            "n_heads_total": int(self.ours_err.size),
            "ours_max_err": float(self.ours_err.max()),
            "eager_max_err": float(self.eager_err.max()),
            "ours_median_err": float(np.median(self.ours_err)),
            "eager_median_err": float(np.median(self.eager_err)),
            "share_ours_le_eager": self.share_ours_le_eager,
            "median_ratio": self.median_ratio,
            "layer0_share": self.layer0_share,
            "rule": f"ours ≤ {FLOAT32_TOL:g}" if self.float32_rule else "ours ≤ eager for every head",
            "met": self.met,
        }


def _free() -> None:
    from attnscope.core.loading.stream_load import release_freed

    gc.collect()
    release_freed()


def _errors(a: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(L, H, T, T)`` pair -> ``(L, H)`` max abs difference and mean abs difference over the
    causal (lower-triangle) entries, float64."""
    d = np.abs(a.astype(np.float64) - ref.astype(np.float64))  # (L, H, T, T)
    causal = np.tril(np.ones(d.shape[-2:], dtype=bool))
    return d.max(axis=(-2, -1)), d[..., causal].mean(axis=-1)


def capture_weights(folder, dtype: str, quantize: str, ids: Sequence[int], device: str = "cpu") -> np.ndarray:
    """AttnScope's weights of every head after one forward of ``ids``: ``(L, H, T, T)`` float32, ``L`` the
    layers with an attention map (all but a hybrid model's others, in the order of eager's
    ``output_attentions``)."""
    from attnscope.core.session import Session

    s = Session.load(str(folder), dtype=dtype, quantize=quantize, device=device)
    s.backend.forward(list(ids))
    info = s.info
    out = np.stack(
        [
            np.stack([s.trace.weights(layer, h) for h in range(info.n_heads)])
            for layer in info.arch.attention_layers
        ]
    )
    del s
    _free()
    return out


def load_eager(folder, dtype: str, quantize: str, device: str = "cpu"):
    """transformers' eager model of ``folder`` at ``dtype``, quantised as AttnScope's load is."""
    import torch
    from transformers import AutoModelForCausalLM

    if quantize != "none":
        from attnscope.core.loading.stream_load import load_quantised

        got = load_quantised(folder, quantize, dtype, device, "eager")
        if got is not None:
            return got[0]
    m = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype), attn_implementation="eager")
    torch.nn.Module.to(m, torch.device(device)).eval()  # (transformers' wrapped .to confuses mypy)
    if quantize != "none":
        from attnscope.core.loading.quantize import quantize_model

        quantize_model(m, quantize)
    return m


def eager_weights(model, ids: Sequence[int]) -> np.ndarray:
    """``model``'s eager ``output_attentions`` for one forward of ``ids``: ``(L, H, T, T)`` float32."""
    import torch

    device = next(model.parameters()).device
    with torch.inference_mode():
        out = model(torch.tensor([list(ids)], device=device), output_attentions=True, use_cache=False)
    return np.stack([a[0].float().cpu().numpy() for a in out.attentions])


_INT4_NIBBLES: dict[tuple[int, int], object] = {}  # (N, K) -> where each packed nibble came from


def _int4_cpu_source(n: int, k: int):
    """For torch's CPU int4 packing (``aten._convert_weight_to_int4pack_for_cpu``, a fixed
    permutation of nibbles for a given ``(N, K)``), the flat ``(n, k)`` index each packed nibble
    holds: found by packing the index's base-16 digits, one pass per digit."""
    import torch

    key = (n, k)
    if key not in _INT4_NIBBLES:
        idx = torch.arange(n * k, dtype=torch.int64)
        src = torch.zeros(n * k, dtype=torch.int64)
        digit = 0
        while (1 << (4 * digit)) < n * k:
            d = ((idx >> (4 * digit)) & 15).to(torch.int32).reshape(n, k)
            p = torch.ops.aten._convert_weight_to_int4pack_for_cpu(d, 1).reshape(-1)
            nib = torch.stack([p & 15, p >> 4], -1).reshape(-1).to(torch.int64)  # (N·K,) low nibble first
            src |= nib << (4 * digit)
            digit += 1
        _INT4_NIBBLES[key] = src
    return _INT4_NIBBLES[key]


def dequantised_float32(w):
    """The float32 weight a torchao weight-only tensor's linear kernel multiplies by.

    int8 (``Int8Tensor``, per-row): ``q · scale``. CPU int4 (``Int4OpaqueTensor``, which has no
    ``dequantize``): ``(q − 8) · scale + zero`` per group (tinygemm's affine form), ``q`` unpacked
    from torch's CPU int4 layout; equals the kernel applied to a float32 identity matrix bit for bit
    (tests/core/test_exactness.py). Others: their ``dequantize()`` in float32.

    Returns:
        ``(N, K)`` float32 tensor on ``w``'s device.
    """
    import torch

    if type(w).__name__ == "Int4OpaqueTensor":
        n, k = w.shape
        g = w.block_size[1]
        packed = w.qdata.reshape(-1)
        nib = torch.stack([packed & 15, packed >> 4], -1).reshape(-1).to(torch.int32)
        q = torch.empty(n * k, dtype=torch.int32)
        q[_int4_cpu_source(n, k)] = nib
        sz = w.scale_and_zero.float()  # (K / g, N, 2): [..., 0] scale, [..., 1] zero
        scale = sz[..., 0].T.repeat_interleave(g, dim=1)  # (N, K)
        zero = sz[..., 1].T.repeat_interleave(g, dim=1)
        return (q.reshape(n, k).float() - 8) * scale + zero
    try:
        return w.dequantize(output_dtype=torch.float32).float()
    except TypeError:  # a tensor subclass whose dequantize takes no dtype
        return w.dequantize().float()


def to_float32_reference(model) -> None:
    """Make ``model`` float32 in place with the same rounded weights: quantised linear weights
    replaced by :func:`dequantised_float32`, every other float parameter and buffer upcast."""
    import torch
    from attnscope.core.loading.quantize import is_quantised

    with torch.no_grad():
        for mod in model.modules():
            w = getattr(mod, "weight", None)
            if isinstance(mod, torch.nn.Linear) and w is not None and is_quantised(w):
                mod.weight = torch.nn.Parameter(dequantised_float32(w), requires_grad=False)
                del w
                _free()
    model.to(torch.float32)
    model.config.dtype = torch.float32


def measure_exactness(
    model,
    dtype: str,
    quantize: str,
    ids: Sequence[int],
    device: str = "cpu",
    log: Callable[[str], None] = lambda _m: None,
) -> Exactness:
    """Every head's distance from the float32 reference, AttnScope's and eager's (module docstring).

    Args:
        model: a Hugging Face model folder or ``.gguf`` (resolved, converted at ``dtype``, as
            :func:`attnscope.core.loading.resolve.resolve` does), or None for the embedded default.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (a concrete dtype, not ``auto``).
        quantize: ``"none"``, ``"int8"`` or ``"int4"`` (int4 needs ``bfloat16``).
        ids: the prompt's token ids (``T`` of them; ``T × T`` maps per head are held three times
            over as float32: 16 layers × 32 heads × 128² × 4 bytes = 34 MB each for a 1B at T = 128).
        device: ``"cpu"`` or ``"cuda"``.

    Returns:
        :class:`Exactness` with ``(n_layers, n_heads)`` errors.

    Raises:
        ModelLoadError: the model, dtype or quantisation cannot be loaded.
    """
    from attnscope.core.loading.quantize import check_mode
    from attnscope.core.loading.quiet import quiet_transformers
    from attnscope.core.loading.resolve import resolve

    quiet_transformers()
    quantize = check_mode(quantize)
    folder, _name = resolve(model, dtype=dtype)
    log(f"AttnScope capture at {dtype}{'' if quantize == 'none' else ' + ' + quantize}")
    ours = capture_weights(folder, dtype, quantize, ids, device)
    log("transformers eager at the same precision")
    m = load_eager(folder, dtype, quantize, device)
    eager = eager_weights(m, ids)
    if dtype == "float32" and quantize == "none":
        ref = eager
    else:
        log("float32 eager of the same rounded weights")
        to_float32_reference(m)
        ref = eager_weights(m, ids)
    del m
    _free()
    (ours_max, ours_mean), (eager_max, eager_mean) = _errors(ours, ref), _errors(eager, ref)
    return Exactness(
        dtype=dtype,
        quantize=quantize,
        n_tokens=len(ids),
        ours_err=ours_max,
        eager_err=eager_max,
        ours_mean_err=ours_mean,
        eager_mean_err=eager_mean,
    )
