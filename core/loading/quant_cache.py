"""A cache of quantised weights, so ``--quantize int8|int4`` quantises a checkpoint once.

Why: the streamed quantised load (:mod:`attnscope.core.loading.stream_load`) spends ≈ 80 % of its
time in torchao's quantisation (Llama-3.2-1B-shaped int8: 18 s a load against 0.15 s for a warm
bf16 load; 8B: 160–170 s). The first quantised load therefore writes the quantised state dict to
``cache_root()/"quantised"/<name>-<key>-<dtype>-<mode>`` and later loads read it back tensor by
tensor, calling no quantiser.

Key (:func:`cache_key`): the checkpoint's identity as the folder's resolved path, each safetensors
file's name, size and mtime (ns), and config.json's SHA-256, plus the load dtype, the quantise mode,
the device type (int4 packs differently on CPU and CUDA) and the torchao, torch and transformers
versions (any of them may change the packed data or the parameter names). A changed checkpoint,
dtype or library gets a new entry; the old one stays until cleared (``attnscope models
--clear-cache`` or the app's converted-cache dialog).

Format: one safetensors file, ``weights.safetensors``, laid out as torchao's
``torchao.prototype.safetensors.safetensors_support.flatten_tensor_state_dict`` lays a state dict
out: a quantised ``<module>.<leaf>`` is stored as its inner tensors ``<module>._<leaf>_<inner>``
(``qdata``, ``scale``, ...) with a JSON description per tensor in the header's metadata (torchao's
``TensorSubclassAttributeJSONEncoder``) and ``"tensor_names"`` listing the state dict's names; it
is rebuilt with torchao's ``unflatten_tensor_state_dict`` (its own constructors). torchao 0.18's
safetensors support lacks the CPU int4 tensor (``Int4OpaqueTensor``): that one is stored the same
way with its attributes in a small JSON of ours (``"_encoder": "attnscope"``) and rebuilt with the
class's own constructor from the same inner tensors and attributes. The file is written here by
:func:`attnscope.core.loading.safetensors_header.write_safetensors` one tensor at a time (``safetensors.torch.save_file`` needs the whole
dict in memory, and torchao's flatten clones every inner tensor), so writing costs no second copy
of the model. No pickle anywhere.

An entry is written to ``<entry>.partial-<pid>`` (and fsync'ed) and renamed when complete, as the
GGUF conversion cache does (:func:`attnscope.core.loading.gguf_convert.convert`): a half-written
entry is never read. Where the entry cannot be written (no space, an unwritable cache folder) or
would leave less than :data:`KEEP_FREE` (or 5 % of the disk) free, the load still succeeds and
:func:`write` returns the one line that says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from attnscope.core.loading.cache_folder import ConvertedModel, cache_entries, cache_root
from attnscope.core.loading.safetensors_header import (
    read_header,
    read_metadata,
    read_tensor,
    write_safetensors,
)

FORMAT = 1  # bump when the entry layout changes: old entries then get a new key
SUBDIR = "quantised"
WEIGHTS = "weights.safetensors"
SOURCE = "attnscope_source.json"
KEEP_FREE = 1 << 30  # bytes (or 5 % of the disk, if more) an entry must leave free, else it is not written
_OWN = "attnscope"  # "_encoder" of the subclasses torchao's safetensors support lacks


def root() -> Path:
    """The folder holding every quantised-weights entry: ``cache_root()/"quantised"``, beside the
    GGUF conversion cache (``ATTNSCOPE_QUANT_CACHE_DIR`` overrides it: the test suite keeps its
    entries in a temporary folder while sharing the real conversion cache)."""
    env = os.environ.get("ATTNSCOPE_QUANT_CACHE_DIR")
    return Path(env) if env else cache_root() / SUBDIR


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


def cache_key(folder: Path, files: list[Path], mode: str, dtype: str, device_type: str) -> str:
    """16 hex digits identifying (checkpoint, dtype, mode, device type, library versions).

    Args:
        folder: the model folder; files: its safetensors files
            (:func:`attnscope.core.loading.stream_load.safetensors_files`).

    Raises:
        OSError: a file cannot be stat'ed.
    """
    folder = Path(folder)
    try:
        config = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()
    except OSError:
        config = ""
    ident = {
        "format": FORMAT,
        "folder": str(folder.resolve()),
        "files": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files],
        "config": config,
        "mode": mode,
        "dtype": dtype,
        "device": device_type,
        "torchao": _version("torchao"),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def display_name(folder: Path) -> str:
    """A readable name for a model folder: the repository for a Hugging Face cache snapshot
    (``models--org--Name/snapshots/<commit>`` -> ``Name``), else the folder's own name."""
    folder = Path(folder)
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name.split("--")[-1]
    return folder.name


def entry_dir(folder: Path, files: list[Path], mode: str, dtype: str, device_type: str) -> Path:
    """The entry for these weights: ``root()/<name>-<key>-<dtype>-<mode>`` (it may not exist yet)."""
    key = cache_key(folder, files, mode, dtype, device_type)
    return root() / f"{display_name(folder)}-{key}-{dtype}-{mode}"


def is_complete(entry: Path) -> bool:
    """A finished entry: not a ``.partial-<pid>`` folder, with its weights and source record."""
    return ".partial" not in entry.name and (entry / WEIGHTS).is_file() and (entry / SOURCE).is_file()


# -- writing ----------------------------------------------------------------------------------------
def _is_subclass(t) -> bool:
    import torch

    return isinstance(t, torch.Tensor) and type(t) is not torch.Tensor and hasattr(t, "tensor_data_names")


def _inner_names(t) -> list[str]:
    """The inner tensors of a torchao tensor that are set, in flatten_tensor_state_dict's order."""
    names = list(t.tensor_data_names) + list(getattr(t, "optional_tensor_data_names", []) or [])
    return [n for n in names if getattr(t, n, None) is not None]


def _encode_value(v):
    import torch

    if isinstance(v, torch.Size):
        return {"_type": "torch.Size", "_data": list(v)}
    if isinstance(v, torch.dtype):
        return {"_type": "torch.dtype", "_data": str(v).split(".")[-1]}
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, list | tuple):
        return [_encode_value(x) for x in v]
    raise TypeError(f"cannot store attribute of type {type(v).__name__}")


def _decode_value(v):
    import torch

    if isinstance(v, dict) and v.get("_type") == "torch.Size":
        return torch.Size(v["_data"])
    if isinstance(v, dict) and v.get("_type") == "torch.dtype":
        return getattr(torch, v["_data"])
    if isinstance(v, list):
        return [_decode_value(x) for x in v]
    return v


def _own_classes() -> dict:
    """torchao tensor classes its 0.18 safetensors support lacks, rebuilt here by name."""
    out = {}
    try:
        from torchao.prototype.quantization.int4 import Int4OpaqueTensor

        out["Int4OpaqueTensor"] = Int4OpaqueTensor
    except ImportError:
        pass
    return out


def describe(t) -> str:
    """The JSON that describes one state-dict tensor in the file's metadata.

    torchao's encoder (``TensorSubclassAttributeJSONEncoder``) for the classes its safetensors
    support knows; ours (``"_encoder": "attnscope"``, same fields) for :func:`_own_classes`.

    Raises:
        TypeError: a tensor subclass neither knows.
    """
    import torch

    if type(t) is torch.Tensor:
        return json.dumps({"_type": "Tensor"})
    from torchao.prototype.safetensors.safetensors_utils import (
        ALLOWED_TENSORS_SUBCLASSES,
        TensorSubclassAttributeJSONEncoder,
    )

    name = type(t).__name__
    if name in ALLOWED_TENSORS_SUBCLASSES:
        return json.dumps(t, cls=TensorSubclassAttributeJSONEncoder)
    if name in _own_classes() and _is_subclass(t):
        attrs = list(getattr(t, "optional_tensor_attribute_names", []) or []) + list(t.tensor_attribute_names)
        return json.dumps(
            {
                "_type": name,
                "_encoder": _OWN,
                "_data": {a: _encode_value(getattr(t, a)) for a in attrs},
                "_tensor_data_names": _inner_names(t),
            }
        )
    raise TypeError(f"{name} cannot be stored in the quantised-weights cache")


def _stored(name: str, t) -> list[tuple[str, Any]]:
    """``(file key, plain tensor)`` pairs one state-dict entry is stored as (torchao's naming)."""
    if not _is_subclass(t):
        return [(name, t)]
    module, _, leaf = name.rpartition(".")
    return [(f"{module}._{leaf}_{inner}", getattr(t, inner)) for inner in _inner_names(t)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _remove_stale_partials(entry: Path) -> None:
    """Delete ``<entry>.partial-<pid>`` folders whose process is gone (an interrupted write)."""
    for d in entry.parent.glob(f"{entry.name}.partial-*"):
        pid = d.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def write(model, keys: list[str], entry: Path, source: dict, progress=None) -> str | None:
    """Write ``model``'s tensors named ``keys`` (its checkpoint's names) into the cache ``entry``.

    Args:
        model: the freshly quantised model (quantised weights are torchao tensors).
        keys: state-dict names to store, in the order they are stored.
        entry: :func:`entry_dir`'s folder; written as ``<entry>.partial-<pid>``, renamed at the end.
        source: written as ``attnscope_source.json`` (where the weights came from, the key's parts).
        progress: ``progress(message, fraction)`` per tensor written.

    Returns:
        None when the entry is complete (or another process completed it first), else one line
        saying why the cache was not written (the caller's load is unaffected).
    """
    tmp = entry.with_name(f"{entry.name}.partial-{os.getpid()}")
    try:
        tensors = {k: _get(model, k) for k in keys}
        meta = {k: describe(t) for k, t in tensors.items()}
        meta["tensor_names"] = json.dumps(list(keys))
        meta["format"] = "pt"
        items = [pair for k, t in tensors.items() for pair in _stored(k, t)]
        need = sum(t.numel() * t.element_size() for _, t in items)
        entry.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(entry)
        disk = shutil.disk_usage(entry.parent)
        free = disk.free
        if free < need + max(KEEP_FREE, disk.total // 20):  # never fill the disk with a cache
            from attnscope.core.units import format_bytes

            return (
                f"quantised weights not cached: {format_bytes(need)} needed, {format_bytes(free)} free "
                f"in {entry.parent} (the next load quantises again)"
            )
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        write_safetensors(tmp / WEIGHTS, items, meta, progress)
        (tmp / SOURCE).write_text(json.dumps(dict(source, bytes=need), indent=1))
        if entry.exists():  # another process finished the same entry meanwhile: keep its
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        tmp.rename(entry)
        return None
    except (OSError, TypeError, KeyError, ValueError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        text = (str(e).strip() or type(e).__name__).splitlines()[0][:200]
        return f"quantised weights not cached ({text}): the next load quantises again"
    except BaseException:  # cancelled from ``progress`` (or interrupted): no partial entry left
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _get(model, key: str):
    prefix, _, leaf = key.rpartition(".")
    mod = model.get_submodule(prefix) if prefix else model
    t = getattr(mod, leaf)
    import torch

    # a plain parameter's data; a torchao weight is its own Parameter (torch returns the subclass)
    return t.data if type(t) is torch.nn.Parameter else t


# -- reading ----------------------------------------------------------------------------------------
def read(entry: Path, device: str = "cpu") -> Iterator[tuple[str, Any]]:
    """Yield ``(state-dict name, tensor)`` from a complete entry, one at a time, in stored order;
    quantised weights rebuilt as the torchao tensors that were stored (inner tensors moved to
    ``device`` first). Each tensor is read into memory of its own (no memory map).

    Raises:
        ValueError: a damaged file (short read, inconsistent metadata, an unknown class).
        OSError: the file cannot be read.
    """
    path = Path(entry) / WEIGHTS
    start, header = read_header(path)
    meta = read_metadata(path)
    with open(path, "rb") as f:
        try:
            names = json.loads(meta["tensor_names"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: no tensor_names in its metadata") from None
        for name in names:
            desc = json.loads(meta.get(name) or "{}")
            kind = desc.get("_type")
            if kind in ("Tensor", "torch.Tensor"):
                if name not in header:
                    raise ValueError(f"{path}: {name} missing")
                yield name, read_tensor(f, start, header[name]).to(device)
                continue
            module, _, leaf = name.rpartition(".")
            prefix = f"{module}._{leaf}_"
            inner = {}
            for d in desc.get("_tensor_data_names") or []:
                if prefix + d not in header:
                    raise ValueError(f"{path}: {prefix + d} missing")
                inner[d] = read_tensor(f, start, header[prefix + d]).to(device)
            yield name, _rebuild(name, desc, inner, meta[name])


def _rebuild(name: str, desc: dict, inner: dict, raw_desc: str):
    if desc.get("_encoder") == _OWN:
        cls = _own_classes().get(str(desc.get("_type")))
        if cls is None:
            raise ValueError(f"{name}: unknown tensor class {desc.get('_type')!r}")
        attrs = {k: _decode_value(v) for k, v in (desc.get("_data") or {}).items()}
        return cls(**inner, **attrs)
    from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

    module, _, leaf = name.rpartition(".")
    flat = {f"{module}._{leaf}_{k}": v for k, v in inner.items()}
    out, _ = unflatten_tensor_state_dict(flat, {"tensor_names": json.dumps([name]), name: raw_desc})
    if name not in out:
        raise ValueError(f"{name}: torchao could not rebuild it")
    return out[name]


def set_repr(module, mode: str, device_type: str) -> None:
    """Give a linear layer whose weight was set from the cache the ``extra_repr`` torchao's
    ``quantize_`` gives it (``weight=Int8Tensor(...)`` in ``repr(model)``), where torchao has it."""
    import types
    from functools import partial

    try:
        from torchao.quantization.utils import _linear_extra_repr, _module_extra_repr
    except ImportError:  # a torchao without these private helpers: repr is cosmetic
        return
    if mode == "int4" and device_type == "cpu":  # PrototypeInt4WeightOnlyConfig's transform
        module.extra_repr = types.MethodType(_linear_extra_repr, module)
    else:  # Int8WeightOnlyConfig's and Int4WeightOnlyConfig's transforms
        module.extra_repr = types.MethodType(
            partial(_module_extra_repr, original_extra_repr=module.extra_repr, parameter_name="weight"),
            module,
        )


# -- listing ----------------------------------------------------------------------------------------
def list_entries() -> list[ConvertedModel]:
    """Every folder under :func:`root` as :class:`attnscope.core.loading.cache_folder.ConvertedModel`
    (``kind`` e.g. ``"int8 weights"``; ``source`` the model folder; incomplete ones flagged)."""

    def row(d: Path, meta: dict) -> ConvertedModel:
        mode = str(meta.get("mode") or d.name.split(".partial")[0].rsplit("-", 1)[-1])
        lib = meta.get("torchao")
        return ConvertedModel(
            path=d,
            name=d.name,
            source=str(meta.get("folder") or ""),
            sha256=str(meta.get("key") or ""),
            size_bytes=sum(f.stat().st_size for f in d.rglob("*") if f.is_file()),
            complete=is_complete(d),
            kind=f"{mode} weights" + (f" (torchao {lib})" if lib else ""),
        )

    return cache_entries(root(), row)


def load_into(
    model,
    entry: Path,
    keys: set[str],
    device: str,
    mode: str,
    set_fn: Callable,
    params: set[str],
    progress: Callable[[str, float], None] | None = None,
) -> bool:
    """Set every tensor of the cache ``entry`` into the meta-built ``model`` with ``set_fn(model,
    key, tensor, is_buffer)``; True when it held exactly ``keys`` and all were set.
    ``progress(message, fraction)`` is called per tensor (fraction of ``keys`` done).

    False (and the model possibly half set: the caller's quantising loop then sets every key again)
    when the entry is damaged or holds other names.
    """
    import torch

    device_type = torch.device(device).type
    seen = set()
    try:
        for key, t in read(entry, device):
            if key not in keys:
                break
            set_fn(model, key, t, key not in params)
            if _is_subclass(t):
                set_repr(model.get_submodule(key.rpartition(".")[0]), mode, device_type)
            seen.add(key)
            if progress is not None:
                progress(f"cached {key}", len(seen) / max(len(keys), 1))
    except (OSError, ValueError, KeyError, TypeError):
        seen = set()
    if seen == keys:
        return True
    for mod in model.modules():  # the caller quantises again: no repr of ours left behind
        mod.__dict__.pop("extra_repr", None)
    shutil.rmtree(entry, ignore_errors=True)  # damaged or foreign: the fresh load writes it again
    return False
