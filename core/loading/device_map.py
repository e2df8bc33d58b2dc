"""``--device-map auto|balanced|sequential``: one model across several devices, through accelerate.

transformers' ``from_pretrained(device_map=..., max_memory=..., offload_folder=...)`` places whole
decoder layers on the GPUs in turn, then on the CPU, then on disk (accelerate's
``infer_auto_device_map``; "balanced" spreads layers evenly over the GPUs, "sequential" fills GPU 0
first), and hooks each layer so that its inputs move to its device. AttnScope's attention function
runs inside each layer, so every layer's queries, LSE and cached keys live on that layer's
execution device; the Trace keeps them there (:class:`attnscope.core.trace.torch_trace.TorchTrace`, one row store per
device) and only a requested tile of weights (``n_q × n_k`` float32) comes to the host.

Layers offloaded to CPU or disk execute on the first GPU of the map when there is one, else on the
CPU (accelerate's ``dispatch_model`` copies their weights in for each forward), so on a CPU-only
machine a ``device_map`` with disk offload computes exactly what the plain CPU model computes
(tests/core/test_device_map.py). What each device will hold *before* loading:
:mod:`attnscope.core.loading.fit_devices`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from attnscope.core.errors import ModelLoadError

DEVICE_MAPS = ("auto", "balanced", "sequential")


def check_device_map(value: str | None) -> str | None:
    """Validate ``--device-map``: None/"" (one device) or one of :data:`DEVICE_MAPS`.

    Raises:
        ModelLoadError: any other value (one line naming the choices).
    """
    if value in (None, "", "none"):
        return None
    v = str(value).strip().lower()
    if v not in DEVICE_MAPS:
        raise ModelLoadError(f"unknown device map {value!r}: choose one of {', '.join(DEVICE_MAPS)}")
    return v


def load_kwargs(
    device_map: str | dict | None, offload_folder: Path | None = None, max_memory: dict | None = None
) -> dict:
    """Keyword arguments for ``from_pretrained``: ``{}`` without a device map, else ``device_map``
    (a strategy name, or an explicit ``{module name: device}`` dict as accelerate takes), the disk
    offload folder (created) and ``max_memory`` (``{0: "20GiB", "cpu": "30GiB"}``) where given."""
    if device_map is None:
        return {}
    kw: dict = {"device_map": device_map}
    if offload_folder is not None:
        Path(offload_folder).mkdir(parents=True, exist_ok=True)
        kw["offload_folder"] = str(offload_folder)
    if max_memory:
        kw["max_memory"] = max_memory
    return kw


def execution_device(where) -> str:
    """The torch device a placement computes on: an int ``N`` → ``"cuda:N"``; "cpu" and "disk" → "cpu"."""
    if isinstance(where, int):
        return f"cuda:{where}"
    w = str(where)
    return "cpu" if w in ("cpu", "disk", "meta") else w


def input_device(model) -> str:
    """Where the token ids must go: the execution device of the input embeddings (accelerate's
    ``hf_device_map``), or the device of the model's first parameter without a map."""
    dm = getattr(model, "hf_device_map", None)
    if dm:
        emb = next((v for k, v in dm.items() if "embed" in k), None)
        return execution_device(emb if emb is not None else next(iter(dm.values())))
    return str(next(model.parameters()).device)


def placement(model) -> dict[str, int]:
    """Parameter bytes per placement (``"cuda:0"``, ``"cpu"``, ``"disk"``) from ``hf_device_map``;
    ``{device: bytes}`` of the whole model without one. The per-device fit of a loaded model.

    Bytes are what each parameter really holds (:func:`attnscope.core.loading.quantize.tensor_bytes`):
    a torchao quantised weight counts its integer data and scales, not the float size its
    ``numel() * element_size()`` reports."""
    from attnscope.core.loading.quantize import tensor_bytes

    dm = getattr(model, "hf_device_map", None)
    sizes: Counter = Counter()
    if not dm:
        for p in model.parameters():
            sizes[str(p.device)] += tensor_bytes(p)
        return dict(sizes)
    mods = dict(model.named_modules())
    for name, where in dm.items():
        mod = mods.get(name) if name else model
        if mod is None:
            continue
        key = f"cuda:{where}" if isinstance(where, int) else str(where)
        # an offloaded parameter sits on "meta": count its bytes from shape and dtype
        sizes[key] += sum(tensor_bytes(p) for p in mod.parameters())
    return dict(sizes)


def describe(model) -> str:
    """One line for the status bar: ``"layers on cuda:0 (7.10 GB), cuda:1 (7.02 GB), disk (218 MB)"``
    (:func:`attnscope.core.units.format_bytes`, as the picker's Fit column writes sizes)."""
    from attnscope.core.units import format_bytes

    parts = [f"{k} ({format_bytes(v)})" for k, v in placement(model).items()]
    return "layers on " + ", ".join(parts) if parts else ""


def strategy_name(device_map: str | dict | None) -> str:
    """How a load was asked to place the model: the strategy name, ``"custom"`` for an explicit
    ``{module: device}`` dict, ``""`` for one device."""
    if isinstance(device_map, dict):
        return "custom"
    return check_device_map(device_map) or ""


def info_fields(model, device_map: str | dict | None) -> dict:
    """:class:`attnscope.core.loading.model_info.ModelInfo` fields of a loaded model: ``device_map``
    (:func:`strategy_name`) and ``device_placement`` (``((placement, bytes), ...)``, :func:`placement`;
    empty without a map)."""
    name = strategy_name(device_map)
    if not name:
        return {"device_map": "", "device_placement": ()}
    return {"device_map": name, "device_placement": tuple(placement(model).items())}


def record(info) -> dict:
    """The ``"device_map"`` entry of a sidecar or session file for a loaded model's ModelInfo:
    ``{"strategy": "auto", "placement": {"cpu": 1.2e9 bytes, "disk": 3.4e8}}``; ``{}`` on one device."""
    name = getattr(info, "device_map", "") or ""
    if not name:
        return {}
    return {"strategy": name, "placement": {k: int(v) for k, v in getattr(info, "device_placement", ())}}


def describe_info(info) -> str:
    """:func:`describe` from a ModelInfo (no model needed: a snapshot crossing threads, a remote
    session): ``"device map auto: cpu (412 MB), disk (96.0 MB)"``; ``""`` on one device."""
    from attnscope.core.units import format_bytes

    name = getattr(info, "device_map", "") or ""
    if not name:
        return ""
    parts = [f"{k} ({format_bytes(v)})" for k, v in getattr(info, "device_placement", ())]
    return f"device map {name}: " + ", ".join(parts)
