"""The per-user cache folder (:func:`cache_root`) and what its entries are: one
:class:`ConvertedModel` per folder, listed by :func:`cache_entries` from the ``attnscope_source.json``
each keeps (:func:`cache_source_record`). Two caches live in it: GGUF conversions
(:mod:`attnscope.core.loading.conversion_cache`) and quantised weights
(:mod:`attnscope.core.loading.quant_cache`); :func:`attnscope.core.loading.conversion_cache.list_converted`
lists both. Also the memoised file hash (:func:`file_sha256`), kept in the same folder."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import platformdirs


def cache_root() -> Path:
    """Per-user folder for converted models (``ATTNSCOPE_CACHE_DIR`` overrides it)."""
    env = os.environ.get("ATTNSCOPE_CACHE_DIR")
    return Path(env) if env else Path(platformdirs.user_cache_dir("attnscope", appauthor=False))


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    """SHA-256 of a file, memoised in the cache folder by (path, size, mtime)."""
    st = path.stat()
    memo_path = cache_root() / "hashes.json"
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    if key in memo:
        return memo[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    memo[key] = h.hexdigest()
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        memo_path.write_text(json.dumps(memo))
    except OSError:
        pass
    return memo[key]


@dataclass(frozen=True)
class ConvertedModel:
    """One entry of the conversion cache (``cache_root()/"converted"``)."""

    path: Path
    name: str  # folder name: ``<gguf stem>-<first 16 hex of its SHA-256>``
    source: str  # the GGUF it came from ("" if unknown, e.g. a ``.partial`` leftover)
    sha256: str
    size_bytes: int
    complete: bool  # False for an interrupted conversion (``.partial-<pid>``) or a damaged one
    kind: str = ""  # "" for a GGUF conversion; "int8 weights (torchao …)" for loading.quant_cache


def _tree_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def cache_source_record(folder: Path) -> dict:
    """The ``attnscope_source.json`` a cache entry keeps about where it came from, as a dict of
    strings (values kept as written when they are strings or numbers, else ``str()``-ed); ``{}``
    when the file is missing, unreadable, not JSON, or not an object (a damaged or hand-edited
    file such as ``[1, 2]``: the entry is still listed, its source unknown). Never raises."""
    try:
        meta = json.loads((Path(folder) / "attnscope_source.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def cache_entries(base: Path, row: Callable[[Path, dict], ConvertedModel]) -> list[ConvertedModel]:
    """One :class:`ConvertedModel` per folder under ``base`` (none when it is missing), each built
    by ``row(folder, source record)`` from :func:`cache_source_record`: the one lister of both caches
    (GGUF conversions here, quantised weights in :mod:`attnscope.core.loading.quant_cache`)."""
    if not base.is_dir():
        return []
    return [row(d, cache_source_record(d)) for d in base.iterdir() if d.is_dir()]
