"""Fit per device before loading: where ``--device-map auto|balanced|sequential`` will put each layer.

Source of the placement: transformers' own ``from_pretrained(device_map=...)`` path
(``transformers.integrations.accelerate._get_device_map``, accelerate's algorithm as transformers
ships it): for ``auto``/``balanced`` ``get_balanced_memory`` (the model's bytes spread evenly over the
GPUs, plus a buffer of 1.25 × the largest no-split block), for ``sequential`` ``get_max_memory``
(GPU 0 filled first); then ``infer_auto_device_map`` assigns whole decoder layers (the model's
``_no_split_modules``) to the GPUs in order, then to ``"cpu"``, then to ``"disk"``. This module calls
those same public functions on a *skeleton* of the model built on the ``meta`` device from its config
(no weight is read or allocated: about 20 ms for a Llama-3.1-8B config once transformers is imported),
so the map it reports is the map the load will compute; it re-implements no placement.

Free memory per device (bytes): by default what the load itself measures (accelerate's
``get_max_memory``: ``torch.cuda.mem_get_info`` per GPU, ``psutil.virtual_memory().available`` for
``"cpu"``; transformers then keeps 10 % of the CPU's back), or a dict the caller injects
(``{0: 24e9, 1: 24e9, "cpu": 64e9}``, as ``max_memory=`` would be). ``"disk"`` is unlimited for the
placement; its verdict uses the free space under the offload folder (:func:`attnscope.core.loading.cache_folder.cache_root`).

Per device, in bytes (:class:`DeviceFit`):

* weights: the parameters placed there (each once: a tied ``lm_head`` counts with the embedding), at
  the load dtype; with ``--quantize int8|int4`` the decoder's ``nn.Linear`` weights at
  :data:`attnscope.core.loading.fit.QUANT_BYTES` each. The *placement* is computed at the float dtype,
  because a device-mapped load quantises after dispatch (:func:`attnscope.core.backends.torch_load.load_torch`).
* KV cache and capture: per decoder layer, ``2 × n_kv_heads × head_dim × T`` cache elements and
  ``n_heads × T × head_dim`` query rows (model dtype) + ``n_heads × T`` LSE floats, on that layer's
  *execution* device: a layer placed on ``"cpu"``/``"disk"`` runs on the first GPU of the map when
  there is one (accelerate's ``dispatch_model``: its weights are copied in per forward), else on the CPU.
* offload buffer: the largest layer that is copied in per forward (on ``"cpu"``/``"disk"`` when a GPU
  executes it, on ``"disk"`` when the CPU does), counted on its execution device, as
  ``infer_auto_device_map`` reserves room for it there.
* runtime: :data:`attnscope.core.loading.fit.RUNTIME_BYTES` (Python, torch, tokenizer) in CPU RAM.

The verdict per device is :mod:`attnscope.core.loading.fit`'s (``fits`` up to 80 % of free, ``tight``
up to all of it); the whole map takes the worst device's, and is ``does not fit`` with a ``problem``
when the load will refuse it (``--quantize`` needs the whole model on one device:
:func:`attnscope.core.loading.quantize.device_map_problem`).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

from attnscope.core import backend_registry as registry
from attnscope.core.kv_formula import dtype_bytes, kv_cache_bytes
from attnscope.core.loading.fit import (
    FITS,
    NO_FIT,
    QUANT_BYTES,
    TIGHT,
    UNKNOWN,
    _verdict,
    capture_bytes,
    human_bytes,
)

_ORDER = {FITS: 0, UNKNOWN: 1, TIGHT: 2, NO_FIT: 3}  # worst device decides the map's verdict
_CACHE_SIZE = 256
# one computation at a time: the caches below are shared, and the picker may run a superseded
# request's thread while a newer one starts
_lock = threading.RLock()


@dataclass(frozen=True)
class DeviceFit:
    """What one device holds under a device map; every size in bytes."""

    device: str  # "cuda:0", "cpu", "disk"
    weights_bytes: int
    kv_cache_bytes: int = 0
    capture_bytes: int = 0
    offload_bytes: int = 0  # the largest offloaded layer copied in per forward (module docstring)
    runtime_bytes: int = 0
    free_bytes: int | None = None  # None: could not be read
    n_layers: int = 0  # decoder layers placed here
    verdict: str = UNKNOWN

    @property
    def total_bytes(self) -> int:
        return (
            self.weights_bytes
            + self.kv_cache_bytes
            + self.capture_bytes
            + self.offload_bytes
            + self.runtime_bytes
        )


@dataclass(frozen=True)
class DeviceMapFit:
    """The per-device fit of one model under one ``--device-map`` strategy (sizes in bytes).

    ``device_map`` is the ``{module name: placement}`` accelerate computed (placements as it writes
    them: GPU index ``int``, ``"cpu"``, ``"disk"``), in model order.
    """

    strategy: str  # "auto" | "balanced" | "sequential"
    devices: tuple[DeviceFit, ...]
    device_map: tuple[tuple[str, int | str], ...]
    context: int
    dtype: str
    quantize: str = "none"
    problem: str = ""  # why the load will refuse this map (--quantize across several devices), "" if none

    @property
    def verdict(self) -> str:
        if self.problem:
            return NO_FIT
        return max((d.verdict for d in self.devices), key=lambda v: _ORDER.get(v, 1), default=UNKNOWN)

    @property
    def weights_bytes(self) -> int:
        return sum(d.weights_bytes for d in self.devices)

    @property
    def total_bytes(self) -> int:
        return sum(d.total_bytes for d in self.devices)

    def device(self, name: str) -> DeviceFit | None:
        return next((d for d in self.devices if d.device == name), None)

    def label(self) -> str:
        """``"cuda:0 14.9 GB · cuda:1 1.20 GB · cpu 0.40 GB"``: each device's total, in map order."""
        return " · ".join(f"{d.device} {human_bytes(d.total_bytes)}" for d in self.devices)

    def summary(self) -> str:
        """One line per device: what it holds and its verdict against its free memory (first, the
        reason the load will refuse the map, if it will)."""
        lines = [f"refused: {self.problem}"] if self.problem else []
        for d in self.devices:
            free = f"{human_bytes(d.free_bytes)} free" if d.free_bytes is not None else "free unknown"
            parts = [f"weights {human_bytes(d.weights_bytes)}"]
            if d.kv_cache_bytes or d.capture_bytes:
                parts.append(f"KV cache {human_bytes(d.kv_cache_bytes)}")
                parts.append(f"capture {human_bytes(d.capture_bytes)}")
            if d.offload_bytes:
                parts.append(f"offload buffer {human_bytes(d.offload_bytes)}")
            if d.runtime_bytes:
                parts.append(f"runtime {human_bytes(d.runtime_bytes)}")
            layers = f"{d.n_layers} layer{'s' if d.n_layers != 1 else ''}" if d.n_layers else "no layer"
            lines.append(
                f"{d.device}: {d.verdict}, {human_bytes(d.total_bytes)} of {free} ({layers}; {', '.join(parts)})"
            )
        return "\n".join(lines)


def placement_name(where) -> str:
    """accelerate's placement → this module's device name: ``0`` → ``"cuda:0"``; "cpu"/"disk" kept."""
    return f"cuda:{where}" if isinstance(where, int) else str(where)


# -- the skeleton ---------------------------------------------------------------------------------------
_skeletons: OrderedDict = OrderedDict()


def skeleton(config, dtype: str):
    """The model ``from_pretrained`` would build for ``config``, on the ``meta`` device at ``dtype``
    (``AutoModelForCausalLM.from_config`` under ``torch.device("meta")``: shapes and dtypes, no
    storage). Memoised by (config object, dtype); the first call imports transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    key = (id(config), dtype)  # the entry stores the config too, so its id is not reused meanwhile
    if key in _skeletons:
        _skeletons.move_to_end(key)
        return _skeletons[key][1]
    quiet = logging.getLogger("transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with torch.device("meta"):
            try:
                model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
            except ValueError:  # a multimodal checkpoint's language model (Qwen2.5-VL's): text_only builds it
                from attnscope.core.loading.text_only import causal_lm_class

                model = causal_lm_class(config)._from_config(config, dtype=getattr(torch, dtype))
    finally:
        quiet.setLevel(level)
    _skeletons[key] = (config, model)
    while len(_skeletons) > 16:
        _skeletons.popitem(last=False)
    return model


def _no_split(model) -> set[str]:
    return set(getattr(model, "_no_split_modules", None) or ())


def infer_map(model, strategy: str, max_memory: dict | None = None) -> dict:
    """``{module: placement}`` for ``strategy``, exactly as ``from_pretrained`` computes it
    (``transformers.integrations.accelerate._get_device_map`` without a quantizer); ``max_memory``
    None measures free memory as the load does."""
    from transformers.integrations.accelerate import (
        get_balanced_memory,
        get_max_memory,
        infer_auto_device_map,
    )

    no_split = _no_split(model)
    quiet = logging.getLogger("accelerate.utils.modeling")  # "Device 0 is not available" for injected GPUs
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        if strategy != "sequential":
            budget = get_balanced_memory(
                model,
                max_memory=None if max_memory is None else dict(max_memory),
                no_split_module_classes=no_split,
            )
        else:
            budget = get_max_memory(None if max_memory is None else dict(max_memory))
        return dict(
            infer_auto_device_map(
                model,
                max_memory=budget,
                no_split_module_classes=no_split,
                no_placement_params=getattr(model, "_no_placement_params", None),
            )
        )
    finally:
        quiet.setLevel(level)


class MeasuredFree(dict):
    """Free bytes per device as :func:`measured_free` read them. Passed to :func:`device_fit`, the
    placement is computed as a load without ``max_memory`` computes it, within :func:`run_budget`
    (10 % of the CPU, and of a single GPU, kept back, and room for the run), where a plain dict is
    taken as ``max_memory`` itself."""


def measured_free() -> MeasuredFree:
    """Free memory per device as the load measures it (accelerate's ``get_max_memory()``: GPU
    indices then ``"cpu"``), plus ``"disk"``: free space under the offload folder. Bytes."""
    from accelerate.utils import get_max_memory

    free = MeasuredFree(get_max_memory())
    free["disk"] = disk_free()
    return free


#: tokens of KV cache and capture a device-mapped load keeps room for on each execution device
#: (capped at the model's context): what the first prompts of a session need
RESERVE_CONTEXT = 4096
#: the share of the CPU's available memory transformers lets a map use when it measures it itself
CPU_SHARE = 0.90


def _geometry(config) -> tuple[int, int, int, int, int]:
    """``(n_layers, n_heads, n_kv_heads, head_dim, max_context)`` of a transformers config."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_heads = int(getattr(text, "num_attention_heads", 0) or 0)
    n_kv = int(getattr(text, "num_key_value_heads", None) or n_heads)
    head_dim = int(getattr(text, "head_dim", None) or (text.hidden_size // n_heads if n_heads else 0))
    n_layers = int(getattr(text, "num_hidden_layers", 0) or 0)
    max_ctx = int(getattr(text, "max_position_embeddings", 0) or RESERVE_CONTEXT)
    return n_layers, n_heads, n_kv, head_dim, max_ctx


def run_budget(config, dtype: str, free: dict | None = None, backend: str = registry.DEFAULT) -> dict:
    """The ``max_memory`` a device-mapped load gives accelerate: free memory less the room the run
    needs, so the layers placed in RAM or on a GPU leave space for what the session adds.

    Per device, bytes: the measured free memory (accelerate's ``get_max_memory``; the CPU's, and a
    lone GPU's, at :data:`CPU_SHARE`, as transformers and accelerate take them when they measure), less, on the device the layers
    execute on (the first GPU, else the CPU), the KV cache and capture of *every* layer at
    ``min(RESERVE_CONTEXT, max context)`` tokens (:func:`attnscope.core.kv_formula.kv_cache_bytes`,
    :func:`attnscope.core.loading.fit.capture_bytes`), and on the CPU the process's runtime
    (:data:`attnscope.core.loading.fit.RUNTIME_BYTES`). Never below 0. Without this, accelerate fills
    RAM with layers and the first prefill has no room (docs/real-size.md "Quantised weights and several devices").

    Args:
        config: a transformers config. dtype: the load dtype. free: measured free bytes per device
            (:func:`measured_free`; ``"disk"`` ignored); None measures now.
    """
    if free is None:
        free = measured_free()
    n_layers, n_heads, n_kv, head_dim, max_ctx = _geometry(config)
    T = min(RESERVE_CONTEXT, max_ctx)
    run = kv_cache_bytes(n_layers, n_kv, head_dim, T, dtype) + capture_bytes(
        n_layers, n_heads, head_dim, T, dtype
    )
    budget: dict = {}
    gpus = sorted(k for k in free if isinstance(k, int))
    for k, v in free.items():
        if k == "disk" or v is None:
            continue
        # transformers' own shares when it measures: 90 % of the CPU, and of a lone GPU (accelerate)
        room = int(v * CPU_SHARE) if k == "cpu" or len(gpus) == 1 else int(v)
        if k == "cpu":
            room -= registry.get(backend).runtime_bytes
        if k == (gpus[0] if gpus else "cpu"):
            room -= run
        budget[k] = max(0, room)
    return budget


def disk_free() -> int | None:
    """Free bytes on the file system of the offload folder (the cache root or its nearest parent)."""
    from attnscope.core.loading.cache_folder import cache_root

    p = cache_root()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return int(shutil.disk_usage(p).free)
    except OSError:
        return None


# -- the fit ----------------------------------------------------------------------------------------------
def _where(name: str, dm: dict):
    """Placement of module or parameter ``name``: its own entry or its nearest ancestor's (``""`` is the root)."""
    probe = name
    while True:
        if probe in dm:
            return dm[probe]
        if not probe:
            return None
        probe = probe.rsplit(".", 1)[0] if "." in probe else ""


def _first_inside(name: str, dm: dict):
    """A module split across devices (its children in the map): the placement of its first child."""
    prefix = name + "."
    return next((v for k, v in dm.items() if k.startswith(prefix)), None)


def _linear_weights(model) -> set[str]:
    """Parameter names :func:`attnscope.core.loading.quantize.quantize_model` makes int8/int4."""
    from attnscope.core.loading.quantize import linear_targets

    return {f"{n}.weight" for n in linear_targets(model)}


def device_fit(
    config,
    strategy: str,
    *,
    context: int,
    dtype: str = "bfloat16",
    quantize: str = "none",
    free: dict | None = None,
    backend: str = registry.DEFAULT,
) -> DeviceMapFit:
    """Per-device fit of the model ``config`` describes under ``strategy`` at ``context`` tokens.

    Args:
        config: a transformers ``PretrainedConfig`` (from config.json, or derived from a GGUF).
        strategy: ``auto``, ``balanced`` or ``sequential`` (:func:`attnscope.core.loading.device_map.check_device_map`).
        dtype: the load dtype (``"bfloat16"``...), already resolved (not ``"auto"``).
        quantize: ``none|int8|int4``: bytes of the decoder's linear weights after loading.
        free: free bytes per device ``{0: ..., 1: ..., "cpu": ..., "disk": ...}``, taken as the
            load's ``max_memory``; None or a :class:`MeasuredFree` (:func:`measured_free`): placed
            as a load without ``max_memory`` places it, within :func:`run_budget` (None is measured
            once, then cached).

    Raises:
        ModelLoadError: unknown strategy. ValueError: negative context, unknown dtype or quantisation.
    """
    from attnscope.core.loading.device_map import check_device_map

    strat = check_device_map(strategy)
    if strat is None:
        raise ValueError("device_fit needs a strategy (auto, balanced or sequential)")
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    quantize = quantize or "none"
    if quantize != "none" and quantize not in QUANT_BYTES:
        raise ValueError(f"unknown quantisation {quantize!r}")
    dtype_bytes(dtype)  # ValueError on an unknown dtype
    with _lock:
        values = None if free is None else tuple(sorted(((str(k), v) for k, v in free.items()), key=str))
        free_key = (type(free).__name__, values)
        # keyed by the config object (configs are memoised per file: entry_config), which the entry
        # keeps alive; serialising it for a key would cost 40 ms a call
        key = (id(config), strat, dtype, quantize, int(context), free_key, backend)
        hit = _fits.get(key)
        if hit is not None:
            _fits.move_to_end(key)
            return hit[1]
        fit = _device_fit(config, strat, int(context), dtype, quantize, free, backend)
        _fits[key] = (config, fit)
        while len(_fits) > _CACHE_SIZE:
            _fits.popitem(last=False)
        return fit


_fits: OrderedDict = OrderedDict()


def _device_fit(config, strategy, context, dtype, quantize, free, backend) -> DeviceMapFit:
    from attnscope.core.loading.quantize import device_map_problem

    model = skeleton(config, dtype)
    measured = free is None or isinstance(free, MeasuredFree)  # place as the load will: run_budget
    if free is None:
        free = measured_free()
    elif "disk" not in free:
        free = {**free, "disk": disk_free()}
    if measured:
        placement_free = run_budget(config, dtype, free, backend)
    else:
        placement_free = {k: v for k, v in free.items() if k != "disk"}
    dm = infer_map(model, strategy, placement_free)

    quantised = _linear_weights(model) if quantize != "none" else set()
    weights: dict = {}
    for name, p in model.named_parameters():  # each parameter once: a tied lm_head is not repeated
        where = _where(name, dm)
        if where is None:
            continue
        size = p.numel() * (QUANT_BYTES[quantize] if name in quantised else p.element_size())
        weights[where] = weights.get(where, 0) + size

    gpus = sorted({w for w in dm.values() if isinstance(w, int)})
    main = gpus[0] if gpus else "cpu"  # accelerate's dispatch_model: where offloaded layers execute
    slow = ("cpu", "disk") if gpus else ("disk",)

    _, n_heads, n_kv, head_dim, _ = _geometry(config)
    kv_layer = kv_cache_bytes(1, n_kv, head_dim, context, dtype)
    cap_layer = capture_bytes(1, n_heads, head_dim, context, dtype)

    no_split = set(_no_split(model))
    layers = [n for n, m in model.named_modules() if type(m).__name__ in no_split]
    n_layers: dict = {}
    kv: dict = {}
    cap: dict = {}
    offload: dict = {}
    for name in layers:
        where = _where(name, dm)
        if where is None:
            where = _first_inside(name, dm)
        n_layers[where] = n_layers.get(where, 0) + 1
        run_on = main if where in slow else ("cpu" if where == "disk" else where)
        kv[run_on] = kv.get(run_on, 0) + kv_layer
        cap[run_on] = cap.get(run_on, 0) + cap_layer
        if where in slow:
            size = sum(
                p.numel() * (QUANT_BYTES[quantize] if f"{name}.{n}" in quantised else p.element_size())
                for n, p in model.get_submodule(name).named_parameters()
            )
            offload[run_on] = max(offload.get(run_on, 0), size)

    order = [*gpus, "cpu", "disk"]
    present = [d for d in order if d in weights or d in kv or d == "cpu"]
    runtime = registry.get(backend).runtime_bytes
    devices = []
    for d in present:
        f = free.get(d)
        f = None if f is None else int(f)
        dev = DeviceFit(
            device=placement_name(d),
            weights_bytes=int(weights.get(d, 0)),
            kv_cache_bytes=int(kv.get(d, 0)),
            capture_bytes=int(cap.get(d, 0)),
            offload_bytes=int(offload.get(d, 0)),
            runtime_bytes=runtime if d == "cpu" else 0,
            free_bytes=f,
            n_layers=int(n_layers.get(d, 0)),
        )
        devices.append(replace(dev, verdict=_verdict(dev.total_bytes, f)))
    return DeviceMapFit(
        strategy=strategy,
        devices=tuple(devices),
        device_map=tuple(dm.items()),
        context=context,
        dtype=dtype,
        quantize=quantize,
        problem=device_map_problem(quantize, dm.values()) or "",
    )


# -- catalog entries --------------------------------------------------------------------------------------
_configs: dict = {}


def entry_config(entry):
    """The transformers config ``from_pretrained`` will build for a catalog entry: ``config.json``
    through :func:`attnscope.core.loading.describe_model.transformers_config` for a folder; for a GGUF the
    config transformers derives from its metadata (``AutoConfig.from_pretrained(..., gguf_file=)``,
    a few seconds for a large vocabulary: memoised per (path, size, mtime)). None when unreadable."""
    p = Path(entry.path)
    try:
        st = (p / "config.json" if entry.format != "gguf" else p).stat()
    except OSError:
        return None
    key = (str(p), entry.format, st.st_size, st.st_mtime_ns)
    with _lock:
        if key not in _configs:
            _configs[key] = _read_config(p, entry.format)
        return _configs[key]


def _read_config(p: Path, fmt: str):
    try:
        if fmt == "gguf":
            from transformers import AutoConfig

            quiet = logging.getLogger("transformers")
            level = quiet.level
            quiet.setLevel(logging.ERROR)
            try:
                return AutoConfig.from_pretrained(p.parent, gguf_file=p.name)
            finally:
                quiet.setLevel(level)
        from attnscope.core.loading.describe_model import transformers_config

        return transformers_config(json.loads((p / "config.json").read_text()))
    except Exception:  # noqa: BLE001 - unreadable metadata: no per-device fit, never a crash
        return None


def device_fit_entry(
    entry,
    strategy: str,
    context: int,
    dtype: str = "auto",
    quantize: str = "none",
    free: dict | None = None,
    device: str | None = None,
) -> DeviceMapFit | None:
    """:func:`device_fit` for a :class:`attnscope.core.loading.catalog_entry.CatalogEntry` at the dtype it
    would load at (``"auto"`` resolved as :func:`attnscope.core.loading.fit.estimate_entry` does,
    int4 at bfloat16), ``context`` capped at its max context. None when its config cannot be read
    or transformers cannot build it. ``device``: what ``"auto"`` is resolved for (default ``"cuda"``
    when ``free`` names a GPU or CUDA is available, else ``"cpu"``)."""
    from attnscope.core.loading.precision import entry_dtype
    from attnscope.core.loading.quantize import load_dtype

    config = entry_config(entry)
    if config is None:
        return None
    ctx = min(context, entry.max_context) if entry.max_context else context
    if device is None:
        device = "cuda" if (any(isinstance(k, int) for k in free) if free is not None else _cuda()) else "cpu"
    dev_free = None if free is None else free.get(0 if device.startswith("cuda") else "cpu")
    dtype, _reason = entry_dtype(entry, dtype, device, dev_free)
    dtype, _forced = load_dtype(quantize or "none", dtype)
    try:
        return device_fit(config, strategy, context=ctx, dtype=dtype, quantize=quantize, free=free)
    except (ValueError, TypeError, KeyError, AttributeError, RuntimeError):
        return None


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch, no CUDA
        return False
