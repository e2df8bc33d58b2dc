"""Reading a GGUF file's header (metadata + tensor table) without touching its weights.

Format (ggml's ``docs/gguf.md``, versions 2 and 3): ``"GGUF"``, ``uint32 version``,
``uint64 n_tensors``, ``uint64 n_kv``; then ``n_kv`` key/value pairs (``string key``,
``uint32 value_type``, value); then ``n_tensors`` tensor infos (``string name``, ``uint32 n_dims``,
``uint64 dims[n_dims]`` fastest-varying first, ``uint32 ggml_type``, ``uint64 offset``); the
tensor data start at the next multiple of ``general.alignment`` (default 32).

Why not ``gguf.GGUFReader``: it builds a numpy view for every element of every metadata array,
which takes 1.8 s for the embedded SmolLM2 file (49 152-token vocabulary) and several seconds for a
150 000-token one; a catalog of a dozen files must not stall for that. This reader walks the same
bytes with ``struct`` and keeps only the lengths of large arrays (≈ 0.1 s for SmolLM2). It also
keeps a tensor's raw type id when the id is unknown to the ``gguf`` package, so that the message
can name it, where ``GGUFReader`` raises ``ValueError`` on the whole file.
"""

from __future__ import annotations

import mmap
import struct
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_KEPT_ARRAY = 64  # arrays longer than this keep only their length and element type

# value type id -> (struct code, size); 8 = string, 9 = array
_SCALARS = {
    0: ("B", 1),
    1: ("b", 1),
    2: ("H", 2),
    3: ("h", 2),
    4: ("I", 4),
    5: ("i", 4),
    6: ("f", 4),
    7: ("?", 1),
    10: ("Q", 8),
    11: ("q", 8),
    12: ("d", 8),
}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The bytes are not a readable GGUF header (bad magic, version, truncated, corrupt)."""


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array too long to keep: its element type id and length."""

    type_id: int
    length: int


@dataclass(frozen=True)
class TensorInfo:
    """One row of the tensor table. ``shape`` is in numpy order (slowest-varying first)."""

    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int  # bytes from the start of the data section

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        """ggml type name (``"Q4_K"``), or ``"unknown type id N"``."""
        return ggml_type_name(self.type_id)

    def n_bytes(self) -> int | None:
        """Bytes of this tensor's data, or None for a type id the gguf package does not know."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.type_id)]
        except (ValueError, KeyError):
            return None
        return self.n_elements // block * size


@dataclass(frozen=True)
class GGUFHeader:
    """Everything in a GGUF file except the weights."""

    path: Path
    version: int
    metadata: dict = field(hash=False)  # key -> int | float | bool | str | list | ArrayInfo
    tensors: tuple[TensorInfo, ...]
    data_offset: int  # absolute file offset of the data section
    file_size: int

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default=None):
        """``metadata["<architecture>.<key>"]`` (e.g. ``"block_count"``)."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    def quant_name(self) -> str:
        """The file's quantisation: ``general.file_type`` (``"Q4_K_M"``), else the commonest 2-D tensor type."""
        from gguf import LlamaFileType

        ft = self.metadata.get("general.file_type")
        if isinstance(ft, int):
            try:
                return LlamaFileType(ft).name.removeprefix("MOSTLY_").removeprefix("ALL_")
            except ValueError:
                pass
        types = Counter(t.type_name for t in self.tensors if len(t.shape) >= 2)
        return types.most_common(1)[0][0] if types else "?"

    def truncated_tensor(self) -> TensorInfo | None:
        """The first tensor whose data run past the end of the file, or None."""
        for t in self.tensors:
            nb = t.n_bytes()
            if nb is not None and self.data_offset + t.offset + nb > self.file_size:
                return t
        return None


def ggml_type_name(type_id: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"unknown type id {type_id}"


@lru_cache(maxsize=1)
def dequantizable_types() -> frozenset[int]:
    """ggml type ids that transformers can load from a GGUF file.

    transformers (``modeling_gguf_pytorch_utils.load_gguf_checkpoint``) turns every tensor into
    numpy through ``gguf.dequantize(data, type)``; a type is loadable iff that call is
    implemented. It is probed on one zero block of each type the gguf package knows (≈ 3 ms),
    so a newer gguf release widens the set by itself. With gguf 0.19 all but Q8_1, Q8_K, I8,
    I16, I32, I64, F64 and Q1_0 dequantise.
    """
    import numpy as np
    from gguf import GGML_QUANT_SIZES, dequantize

    ok = set()
    for qtype, (_block, size) in GGML_QUANT_SIZES.items():
        try:
            dequantize(np.zeros((1, size), dtype=np.uint8), qtype)
        except NotImplementedError:
            continue
        except Exception:  # noqa: BLE001 - implemented, just unhappy with a zero block
            pass
        ok.add(int(qtype))
    return frozenset(ok)


def dequantizable_names() -> list[str]:
    return [ggml_type_name(t) for t in sorted(dequantizable_types())]


def unsupported_tensors(header: GGUFHeader) -> list[TensorInfo]:
    """Tensors whose ggml type transformers cannot dequantise, in file order."""
    ok = dequantizable_types()
    return [t for t in header.tensors if t.type_id not in ok]


# GGUF ``general.architecture`` -> transformers ``model_type`` where they differ
# (transformers ``load_gguf_checkpoint``: qwen2moe, qwen3moe, gpt-oss, minimax-m2; gemma3 GGUFs
# hold only the text backbone and load as ``gemma3_text``).
_GGUF_TO_MODEL_TYPE = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
    "gemma3": "gemma3_text",
    "gemma4": "gemma4_text",
}


def model_type_of(header: GGUFHeader) -> str:
    """The transformers ``model_type`` a GGUF file loads as (``"llama"``, ``"qwen2"`` ...)."""
    arch = header.architecture
    if arch == "llama" and str(header.metadata.get("general.name", "")) == "mistral":
        return "mistral"  # transformers' own rule for llama.cpp's Mistral files
    return _GGUF_TO_MODEL_TYPE.get(arch, arch)


@lru_cache(maxsize=1)
def transformers_gguf_architectures() -> frozenset[str]:
    """GGUF architectures transformers can convert (keys of its ``GGUF_CONFIG_MAPPING``)."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    return frozenset(k for k in GGUF_CONFIG_MAPPING if k not in ("general", "tokenizer"))


def transformers_can_convert(header: GGUFHeader) -> bool:
    arch = header.architecture
    return arch in transformers_gguf_architectures() or model_type_of(header).removesuffix("_text") in (
        transformers_gguf_architectures()
    )


class _Cursor:
    def __init__(self, buf, size: int, endian: str):
        self.buf, self.size, self.pos, self.e = buf, size, 0, endian

    def take(self, fmt: str, n: int):
        if self.pos + n > self.size:
            raise GGUFFormatError(f"header is truncated at byte {self.pos}")
        v = struct.unpack_from(self.e + fmt, self.buf, self.pos)[0]
        self.pos += n
        return v

    def string(self) -> str:
        n = self.take("Q", 8)
        if n > self.size - self.pos:
            raise GGUFFormatError(f"header is truncated or corrupt: a {n}-byte string at byte {self.pos}")
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_string(self) -> None:
        n = self.take("Q", 8)
        if n > self.size - self.pos:
            raise GGUFFormatError(f"header is truncated or corrupt: a {n}-byte string at byte {self.pos}")
        self.pos += n

    def value(self, type_id: int):
        if type_id in _SCALARS:
            code, n = _SCALARS[type_id]
            return self.take(code, n)
        if type_id == _STRING:
            return self.string()
        if type_id == _ARRAY:
            et = self.take("I", 4)
            count = self.take("Q", 8)
            if count > MAX_KEPT_ARRAY:
                if et in _SCALARS:
                    n = _SCALARS[et][1] * count
                    if self.pos + n > self.size:
                        raise GGUFFormatError(f"header is truncated inside an array at byte {self.pos}")
                    self.pos += n
                elif et == _STRING:
                    for _ in range(count):
                        self.skip_string()
                else:
                    for _ in range(count):
                        self.value(et)
                return ArrayInfo(et, count)
            return [self.value(et) for _ in range(count)]
        raise GGUFFormatError(f"header is corrupt: unknown metadata value type {type_id} at byte {self.pos}")


#: parsed headers by (resolved path, size, mtime_ns, inode): a load asks for the same file's header
#: from its checks, its precision and its quantisation steps; a rewritten file is parsed again
_HEADERS: OrderedDict[tuple, GGUFHeader] = OrderedDict()
_HEADERS_KEPT = 8
_headers_lock = threading.Lock()


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """Parse ``path``'s GGUF header and tensor table; weights are never read. The file is parsed
    once while it is unchanged (same size, modification time and inode; the last
    :data:`_HEADERS_KEPT` files are kept), so the steps of one load share one parse.

    Returns:
        :class:`GGUFHeader` (metadata values: ints, floats, bools, strings, short lists, or
        :class:`ArrayInfo` for arrays longer than :data:`MAX_KEPT_ARRAY`).

    Raises:
        FileNotFoundError: no such file.
        GGUFFormatError: not GGUF (magic), unsupported version (only 2 and 3), truncated or corrupt.
    """
    path = Path(path)
    st = path.stat()  # FileNotFoundError
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    with _headers_lock:
        header = _HEADERS.get(key)
        if header is not None:
            _HEADERS.move_to_end(key)
    if header is None:
        header = _parse_gguf_header(path, st.st_size)
        with _headers_lock:
            _HEADERS[key] = header
            while len(_HEADERS) > _HEADERS_KEPT:
                _HEADERS.popitem(last=False)
    return header if header.path == path else replace(header, path=path)


def _parse_gguf_header(path: Path, size: int) -> GGUFHeader:
    """The parse behind :func:`read_gguf_header` (errors as there)."""
    if size < 24:
        raise GGUFFormatError(f"{path.name} is not a GGUF file (only {size} bytes)")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != GGUF_MAGIC:
            raise GGUFFormatError(f"{path.name} is not a GGUF file (bad magic bytes)")
        endian = "<"
        version = struct.unpack_from("<I", buf, 4)[0]
        if version & 0xFFFF == 0 and version > 0xFFFF:  # a big-endian file
            endian, version = ">", struct.unpack_from(">I", buf, 4)[0]
        if version not in (2, 3):
            raise GGUFFormatError(f"{path.name}: unsupported GGUF version {version} (2 and 3 are read)")
        c = _Cursor(buf, size, endian)
        c.pos = 8
        n_tensors, n_kv = c.take("Q", 8), c.take("Q", 8)
        if n_tensors > size or n_kv > size:
            raise GGUFFormatError(f"{path.name}: header is corrupt ({n_tensors} tensors, {n_kv} keys)")
        meta: dict = {}
        for _ in range(n_kv):
            key = c.string()
            meta[key] = c.value(c.take("I", 4))
        tensors = []
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.take("I", 4)
            if n_dims > 8:
                raise GGUFFormatError(
                    f"{path.name}: tensor {name} has {n_dims} dimensions: header is corrupt"
                )
            dims = [c.take("Q", 8) for _ in range(n_dims)]
            type_id = c.take("I", 4)
            offset = c.take("Q", 8)
            tensors.append(TensorInfo(name, tuple(reversed(dims)), type_id, offset))
        align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
        align = align if isinstance(align, int) and align > 0 else DEFAULT_ALIGNMENT
        data_offset = (c.pos + align - 1) // align * align
    return GGUFHeader(path, version, meta, tuple(tensors), data_offset, size)


def is_gguf_file(path: str | Path) -> bool:
    """True when ``path`` is a file that starts with the GGUF magic bytes (Ollama blobs have no suffix)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False
