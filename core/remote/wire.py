"""The engine protocol's messages: JSON headers plus raw little-endian array buffers, never pickle.

A message is a ZeroMQ multipart message ``[header, buffer_0, buffer_1, ...]``: ``header`` is UTF-8
JSON; every numpy array inside it is replaced by ``{"__nd__": i, "dtype": "<f4", "shape": [...],
"z": false}`` and its bytes travel as frame ``1 + i``, C-contiguous and little-endian, as
safetensors lays tensors out after its JSON header (``z``: the frame is zstd-compressed). Other
values: ``{"__tuple__": [...]}``, ``{"__slice__": [start, stop, step]}``, ``{"__path__": "..."}``,
``{"__dict__": [[key, value], ...]}`` for dicts whose keys are not all strings,
``{"__str_nd__": [s, ...], "dtype": "<U5" | "|O", "shape": [...]}`` for an array of strings (a
numpy ``str_`` array, or an ``object`` array holding only ``str``, as head-role labels are: the
strings in C order, in the JSON; no other object array can travel), and
``{"__dc__": "attnscope.core.x.Y", "f": {...}}`` for frozen dataclasses. Decoding a dataclass is
limited to the names the caller allows (the server: :data:`SERVER_DATACLASSES`; the client: any
dataclass defined in ``attnscope.core``), so a message can build data, never run code.

Request header: ``{"v": 1, "id": n, "token": str | None, "op": str, "args": {...}, "session":
[instance, generation] | None, "compress": bool}``. Replies to request ``id``: any number of
``{"id", "kind": "progress", "args": [...]}`` then one ``{"id", "kind": "result", "result": ...,
"state": {...} | None, "compute_s": s}`` or ``{"id", "kind": "error", "type": ..., "error": one
line}``. While a request runs the engine may also send ``{"id": -1, "kind": "alive"}`` (a keepalive
that tells it whether the client is still there); clients skip it as an answer to no request.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np

VERSION = 1

#: numpy dtypes allowed on the wire (kinds: bool, signed/unsigned int, float)
_KINDS = "biuf"

#: the dataclasses a server decodes in requests (what ops take as arguments)
SERVER_DATACLASSES = frozenset(
    {
        "attnscope.core.sampling.Sampling",
        "attnscope.core.analysis.experiments.Experiment",
        "attnscope.core.analysis.head_effects.Target",
    }
)

#: a reply buffer is zstd-compressed only above this size (smaller ones gain nothing)
COMPRESS_MIN_BYTES = 1 << 20


class WireError(ValueError):
    """A message that does not follow the protocol (one line saying what is wrong)."""


def _to_numpy(x):
    """A torch tensor / MLX array as numpy, else None."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        return x.detach().cpu().numpy()
    if mod.startswith("mlx"):
        return np.asarray(x)
    return None


def encode(value, compress: bool = False) -> tuple[bytes, list]:
    """``value`` as ``(header_bytes, buffers)``; ``compress``: zstd buffers of 1 MiB and more
    when the ``zstandard`` package is there (``ValueError`` for a value the wire cannot carry)."""
    enc = _Encoder(_compressor() if compress else None)
    header = json.dumps(enc.enc(value), separators=(",", ":"), allow_nan=True).encode()
    return header, enc.buffers


def decode(header: bytes, buffers: list, allow_dataclass=None):
    """Inverse of :func:`encode`. ``buffers``: bytes-like frames. ``allow_dataclass(name) -> bool``
    says which dataclasses may be built (default: none).

    Raises:
        WireError: not JSON, a bad array reference, a dtype or size that does not fit, a class not
        allowed.
    """
    try:
        obj = json.loads(bytes(header))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WireError(f"malformed message: not JSON ({e})") from None
    return _Decoder(buffers, allow_dataclass or (lambda name: False)).dec(obj)


# Encoder and decoder are classes, not recursive nested functions: a nested function that calls
# itself is a reference cycle (function -> closure cell -> function) holding every buffer of the
# message until Python's cyclic collector runs. An engine then kept ~8 sent 2048² maps (16.8 MB
# each) alive between collections, and every new map was computed into fresh pages (4,096 page
# faults, +3-4 ms a map: the remote map bench, docs/remote.md).
class _Encoder:
    def __init__(self, compressor):
        self.buffers: list = []
        self.zc = compressor

    def enc(self, x):
        if x is None or isinstance(x, bool | str):
            return x
        if isinstance(x, int | float):
            return x
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, np.ndarray) and x.dtype.kind in "UO":
            return _str_array(x)
        if isinstance(x, np.ndarray) or _to_numpy(x) is not None:
            a = x if isinstance(x, np.ndarray) else _to_numpy(x)
            if a.dtype.kind not in _KINDS:
                raise ValueError(f"cannot send an array of dtype {a.dtype}")
            a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
            z = self.zc is not None and a.nbytes >= COMPRESS_MIN_BYTES
            self.buffers.append(self.zc.compress(a.data) if z else a.data)
            return {"__nd__": len(self.buffers) - 1, "dtype": a.dtype.str, "shape": list(a.shape), "z": z}
        if isinstance(x, tuple):
            return {"__tuple__": [self.enc(v) for v in x]}
        if isinstance(x, list):
            return [self.enc(v) for v in x]
        if isinstance(x, slice):
            return {"__slice__": [self.enc(x.start), self.enc(x.stop), self.enc(x.step)]}
        if isinstance(x, Path):
            return {"__path__": str(x)}
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("__") for k in x):
                return {k: self.enc(v) for k, v in x.items()}
            return {"__dict__": [[self.enc(k), self.enc(v)] for k, v in x.items()]}
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            cls = type(x)
            fields = {f.name: self.enc(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init}
            return {"__dc__": f"{cls.__module__}.{cls.__qualname__}", "f": fields}
        raise ValueError(f"cannot send a {type(x).__name__} to or from the engine")


class _Decoder:
    def __init__(self, buffers: list, allow):
        self.buffers = buffers
        self.allow = allow
        self.zd: Any = None  # a zstandard.ZstdDecompressor, made at the first compressed buffer

    def array(self, d):
        try:
            i, dtype, shape = d["__nd__"], np.dtype(d["dtype"]), tuple(int(s) for s in d["shape"])
        except (KeyError, TypeError, ValueError) as e:
            raise WireError(f"malformed array reference: {e}") from None
        if not isinstance(i, int) or not 0 <= i < len(self.buffers):
            raise WireError(f"array reference {i!r} names no buffer")
        if dtype.kind not in _KINDS or dtype.byteorder == ">" or any(s < 0 for s in shape):
            raise WireError(f"bad array: dtype {dtype.str}, shape {shape}")
        buf = self.buffers[i]
        if d.get("z"):
            if self.zd is None:
                self.zd = _decompressor()
            buf = self.zd.decompress(bytes(buf), max_output_size=int(np.prod(shape)) * dtype.itemsize)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if len(memoryview(buf).cast("B")) != n:
            raise WireError(f"array buffer holds {len(memoryview(buf).cast('B'))} bytes, shape needs {n}")
        return np.frombuffer(buf, dtype=dtype).reshape(shape)

    def dec(self, x):
        dec = self.dec
        if isinstance(x, list):
            return [dec(v) for v in x]
        if not isinstance(x, dict):
            return x
        if "__nd__" in x:
            return self.array(x)
        if "__str_nd__" in x:
            return _str_array_of(x)
        if "__tuple__" in x:
            return tuple(dec(v) for v in _list(x["__tuple__"]))
        if "__slice__" in x:
            parts = _list(x["__slice__"])
            if len(parts) != 3 or not all(p is None or isinstance(p, int) for p in parts):
                raise WireError("a slice is [start, stop, step] of integers or null")
            return slice(*parts)
        if "__path__" in x:
            return Path(str(x["__path__"]))
        if "__dict__" in x:
            return {_key(dec(k)): dec(v) for k, v in _list(x["__dict__"])}
        if "__dc__" in x:
            return _dataclass(
                str(x["__dc__"]), {k: dec(v) for k, v in dict(x.get("f") or {}).items()}, self.allow
            )
        return {k: dec(v) for k, v in x.items()}


#: a string array's dtypes on the wire: numpy ``str_`` (``<U``) and ``object`` (of str only)
_STR_KINDS = "UO"


def _str_array(a: np.ndarray) -> dict:
    """An array of strings as JSON: its strings in C order, its dtype and shape (ValueError for an
    object array holding anything but str)."""
    flat = a.ravel(order="C").tolist()
    if not all(isinstance(v, str) for v in flat):
        bad = next(type(v).__name__ for v in flat if not isinstance(v, str))
        raise ValueError(f"cannot send an object array holding a {bad} (only strings travel)")
    return {"__str_nd__": flat, "dtype": a.dtype.str, "shape": list(a.shape)}


def _str_array_of(d: dict) -> np.ndarray:
    """Inverse of :func:`_str_array` (WireError for anything but strings of a matching count)."""
    try:
        dtype, shape = np.dtype(d["dtype"]), tuple(int(s) for s in d["shape"])
    except (KeyError, TypeError, ValueError) as e:
        raise WireError(f"malformed string array: {e}") from None
    flat = d["__str_nd__"]
    if dtype.kind not in _STR_KINDS or dtype.byteorder == ">" or any(s < 0 for s in shape):
        raise WireError(f"bad string array: dtype {dtype.str}, shape {shape}")
    if not isinstance(flat, list) or not all(isinstance(v, str) for v in flat):
        raise WireError("malformed string array: expected a list of strings")
    if len(flat) != int(np.prod(shape, dtype=np.int64)):
        raise WireError(f"string array holds {len(flat)} strings, shape {shape} needs {int(np.prod(shape))}")
    out = np.empty(len(flat), dtype=dtype)
    out[:] = flat  # a str_ dtype narrower than a string truncates it, as numpy itself does
    return out.reshape(shape)


def _list(x) -> list:
    if not isinstance(x, list):
        raise WireError(f"malformed message: expected a list, got {type(x).__name__}")
    return x


def _key(k):
    return tuple(k) if isinstance(k, list) else k


def _dataclass(name: str, fields: dict, allow):
    if not allow(name):
        raise WireError(f"malformed message: {name} is not accepted here")
    mod, _, cls_name = name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(mod), cls_name)
    except (ImportError, AttributeError):
        raise WireError(f"unknown data type {name}") from None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise WireError(f"{name} is not a data type")
    try:
        return cls(**fields)
    except (TypeError, ValueError) as e:
        raise WireError(f"bad {cls_name}: {e}") from None


def core_dataclass(name: str) -> bool:
    """The client's rule: any class under ``attnscope.core`` (checked to be a dataclass on decode)."""
    return name.startswith("attnscope.core.") and "__" not in name


def pack(obj: dict, compress: bool = False) -> list:
    """``obj`` as the frames of one message."""
    header, buffers = encode(obj, compress)
    return [header, *buffers]


def unpack(frames: list, allow_dataclass=None) -> dict:
    """The frames of one message as a dict (:func:`decode`). Raises WireError."""
    if not frames:
        raise WireError("malformed message: no frames")
    bufs = [f.buffer if hasattr(f, "buffer") else f for f in frames[1:]]
    head = frames[0].bytes if hasattr(frames[0], "bytes") else frames[0]
    obj = decode(head, bufs, allow_dataclass)
    if not isinstance(obj, dict):
        raise WireError("malformed message: the header is not an object")
    return obj


def _compressor():
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard.ZstdCompressor(level=1)


def _decompressor():
    try:
        import zstandard
    except ImportError:
        raise WireError("the engine sent zstd-compressed data: pip install zstandard") from None
    return zstandard.ZstdDecompressor()


def have_compression() -> bool:
    """True when zstd compression is available here (``pip install zstandard``)."""
    return _compressor() is not None
