"""The safetensors format in one place: its dtype names, reading a file's header, checking it, reading
one tensor without a memory map, and writing a file one tensor at a time.

Layout (the safetensors format spec, https://github.com/huggingface/safetensors): ``uint64 n``
little-endian, ``n`` bytes of JSON mapping tensor names to ``{"dtype", "shape", "data_offsets":
[begin, end]}`` (offsets from the end of the header) plus an optional ``"__metadata__"`` object of
strings, then the data. The safetensors library itself validates a header (:func:`check_safetensors`
opens the file with ``safe_open``: dtypes, overlaps, gaps, shapes against byte counts); it does not
hand out the data offsets, which the streamed loads need to read a tensor into memory of their own
(:func:`read_tensor`: page-cache pages of a memory map would count in the process's RSS,
:mod:`attnscope.core.loading.stream_load`), so the header's JSON is parsed here, once, by
:func:`_parse_header`. Every other module (the catalog's counts, the fit estimate, the conversion
cache's damage check, the streamed load, the quantised-weights cache) reads headers through this one.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from attnscope.core.errors import ModelLoadError, first_line

#: safetensors dtype name -> torch dtype name (the safetensors format spec's dtypes that torch has)
DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
#: torch dtype name -> safetensors dtype name (the inverse of :data:`DTYPES`)
NAMES = {torch_name: st for st, torch_name in DTYPES.items()}

_MAX_HEADER = 100 << 20  # bytes: the safetensors library refuses larger headers too


def _parse_header(path: Path) -> tuple[int, dict]:
    """``(n, header)``: the JSON header's byte length and the parsed header (``__metadata__`` kept).

    Raises:
        ModelLoadError: shorter than 8 bytes, a header length past the file, JSON that does not
            parse or is not an object.
        OSError: the file cannot be read.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ModelLoadError(f"{path.name} is truncated: {size} bytes, no safetensors header")
        n = struct.unpack("<Q", raw)[0]
        if n > min(size - 8, _MAX_HEADER):
            raise ModelLoadError(
                f"{path.name} is truncated or not safetensors: header of {n} bytes in a {size}-byte file"
            )
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ModelLoadError(f"{path.name} has a corrupt safetensors header: {first_line(e)}") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path.name} has a corrupt safetensors header")
    return n, header


def check_safetensors(path: Path) -> dict:
    """Validate one ``.safetensors`` file from its header alone and return the header dict
    (``__metadata__`` included when present).

    Raises:
        ModelLoadError: unreadable, header not JSON, data past the end of the file (truncated), or a
            header the safetensors library refuses (:func:`_safetensors_refusal`).
    """
    path = Path(path)
    try:
        n, header = _parse_header(path)
        size = path.stat().st_size
    except OSError as e:
        raise ModelLoadError(f"cannot read {path.name}: {first_line(e)}") from None
    end = max(
        (
            v["data_offsets"][1]
            for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v
        ),
        default=0,
    )
    if 8 + n + end > size:
        raise ModelLoadError(
            f"{path.name} is truncated: its header promises {8 + n + end} bytes, the file has {size}"
        )
    _safetensors_refusal(path)
    return header


def _safetensors_refusal(path: Path) -> None:
    """Raise what the safetensors library itself says when it opens ``path`` (header only, memory
    mapped: no tensor is read), so a file listed as loadable is one the loader opens: ``__metadata__``
    values that are not strings, a dtype it does not know, offsets that overlap, leave gaps or do not
    cover the data, a shape that does not match the byte count.

    Raises:
        ModelLoadError: ``<file> has an invalid safetensors header (<the library's reason>)``.
    """
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np"):
            pass
    except OSError as e:
        raise ModelLoadError(f"cannot read {path.name}: {first_line(e)}") from None
    except Exception as e:  # safetensors_rust.SafetensorError, the one error class of its parser
        why = first_line(e).removeprefix("Error while deserializing header: ")
        raise ModelLoadError(f"{path.name} has an invalid safetensors header ({why})") from None


def read_header(path: Path) -> tuple[int, dict]:
    """``(data_start, entries)`` of a safetensors file: the byte offset of its data section and
    ``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` (offsets relative to data_start;
    ``__metadata__`` left out: :func:`read_metadata`).

    Raises:
        ValueError: not a safetensors file (too short, header length beyond the file, not JSON).
        OSError: the file cannot be read.
    """
    n, header = _parse_any(path)
    header.pop("__metadata__", None)
    return 8 + n, header


def read_metadata(path: Path) -> dict[str, str]:
    """The header's ``__metadata__`` object (``{}`` when there is none).

    Raises:
        ValueError / OSError: as :func:`read_header`.
    """
    meta = _parse_any(path)[1].get("__metadata__")
    return meta if isinstance(meta, dict) else {}


def _parse_any(path: Path) -> tuple[int, dict]:
    # the streamed readers' errors: ValueError for a damaged file (the caller then loads it the
    # ordinary way, or treats a cache entry as damaged), OSError for an unreadable one
    try:
        return _parse_header(path)
    except ModelLoadError as e:
        raise ValueError(str(e)) from None


def read_tensor(f, data_start: int, entry: dict):
    """One tensor of an open safetensors file, read into memory of its own (no memory map).

    Returns a CPU tensor of the stored dtype and shape. Raises ValueError for a dtype not in
    :data:`DTYPES` or a short read.
    """
    import torch

    name = DTYPES.get(entry["dtype"])
    if name is None:
        raise ValueError(f"safetensors dtype {entry['dtype']} not supported")
    begin, end = entry["data_offsets"]
    buf = torch.empty(end - begin, dtype=torch.uint8)
    f.seek(data_start + begin)
    if end > begin and f.readinto(buf.numpy().data) != end - begin:
        raise ValueError("short read: truncated safetensors file")
    return buf.view(getattr(torch, name)).reshape(entry["shape"])


def _raw(t) -> memoryview:
    """The bytes of a plain tensor, row-major, as a buffer (one copy only if not contiguous/CPU)."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def write_safetensors(path: Path, items: list[tuple[str, Any]], meta: dict[str, str], progress=None):
    """Write a safetensors file one tensor at a time (format: 8-byte little-endian header length,
    the JSON header padded to 8 bytes, then each tensor's bytes in header order), fsync'ed.

    Raises:
        OSError: the file cannot be written (ENOSPC, EACCES, ...).
        KeyError: a dtype safetensors has no name for.
    """
    header: dict = {"__metadata__": meta}
    offset = 0
    for key, t in items:
        n = t.numel() * t.element_size()
        header[key] = {
            "dtype": NAMES[str(t.dtype).split(".")[-1]],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        done = 0
        for key, t in items:
            f.write(_raw(t))
            done += t.numel() * t.element_size()
            if progress is not None:
                progress(f"caching {key}", done / max(offset, 1))
        f.flush()
        os.fsync(f.fileno())
