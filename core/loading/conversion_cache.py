"""GGUF → safetensors, converted once into the per-user cache and reused.

A GGUF file is dequantised (streamed tensor by tensor, :mod:`attnscope.core.loading.gguf_convert`) and
saved as safetensors + tokenizer in ``cache_root()/"converted"`` (:mod:`attnscope.core.loading.cache_folder`),
keyed by the file's SHA-256 and the dtype, so later loads read plain safetensors (≈0.3 s instead of
≈20 s for the default model). A damaged or stale entry is converted again. :func:`list_converted` and
:func:`clear_converted` cover the whole cache, the quantised-weights entries
(:mod:`attnscope.core.loading.quant_cache`) included.

Every failure is raised as :class:`attnscope.core.errors.ModelLoadError` with a one-line message.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

from attnscope.core.errors import ModelLoadError, UnsupportedModelError, first_line
from attnscope.core.loading.cache_folder import (
    ConvertedModel,
    _tree_bytes,
    cache_entries,
    cache_root,
    file_sha256,
)
from attnscope.core.loading.checks import check_gguf
from attnscope.core.loading.progress import ProgressFn, no_progress
from attnscope.core.loading.quiet import quiet_transformers
from attnscope.core.loading.safetensors_header import check_safetensors


def converted_dir(gguf: Path, dtype: str = "float32") -> Path:
    """Cache folder holding the safetensors conversion of ``gguf`` at ``dtype`` (keyed by its
    SHA-256 and the dtype: ``<stem>-<16 hex>-<dtype>``)."""
    return cache_root() / "converted" / f"{gguf.stem}-{file_sha256(gguf)[:16]}-{dtype}"


def _is_converted(folder: Path) -> bool:
    """A finished conversion: config.json plus one safetensors file or a complete shard index."""
    if not (folder / "config.json").is_file():
        return False
    if (folder / "model.safetensors").is_file():
        return True
    index = folder / "model.safetensors.index.json"
    try:
        return index.is_file() and all(
            (folder / f).is_file() for f in set(json.loads(index.read_text())["weight_map"].values())
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


#: JSON files of a converted folder up to this size are parsed in full by :func:`converted_damage`;
#: a larger one (a big vocabulary's tokenizer.json) is checked for its closing brace only
_FULL_JSON_BYTES = 1 << 20


def _json_problem(path: Path) -> str:
    """Why the JSON file ``path`` is unusable (truncated, not JSON), ``""`` when it reads."""
    try:
        size = path.stat().st_size
        if size <= _FULL_JSON_BYTES:
            json.loads(path.read_bytes())
            return ""
        with open(path, "rb") as f:
            head = f.read(64).lstrip()
            f.seek(max(0, size - 64))
            tail = f.read().rstrip()
    except OSError as e:
        return f"{path.name} cannot be read: {first_line(e)}"
    except ValueError as e:
        return f"{path.name} is truncated or not JSON: {first_line(e)}"
    if not (head.startswith(b"{") and tail.endswith(b"}")):
        return f"{path.name} is truncated or not JSON ({size} bytes, no closing brace)"
    return ""


def converted_damage(folder: Path) -> str:
    """Why a finished conversion-cache entry (:func:`_is_converted`) cannot be loaded, one line; ``""``
    when it looks sound.

    Cheap (no tensor is read): config.json and the other JSON files parse (:func:`_json_problem`),
    a tokenizer is there, and every safetensors shard's header is valid and its data fits in the
    file (:func:`check_safetensors`: a truncated or cut shard, the usual damage of a full disk or a
    killed copy). Flipped bits inside the data are not detected.
    """
    folder = Path(folder)
    for name in (
        "config.json",
        "model.safetensors.index.json",
        "generation_config.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.json",
    ):
        if (folder / name).is_file():
            why = _json_problem(folder / name)
            if why:
                return why
    if not any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return "its tokenizer is missing"
    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        shards = [folder / "model.safetensors"]
    else:
        try:
            shards = sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"{index.name} is not a valid safetensors index: {first_line(e)}"
    for shard in shards:
        try:
            check_safetensors(shard)
        except ModelLoadError as e:
            return str(e)
    return ""


def convert_gguf(
    gguf: Path, progress: ProgressFn = no_progress, dtype: str = "float32", notes: list[str] | None = None
) -> Path:
    """Convert a GGUF once into a cached HF folder (safetensors at ``dtype`` + tokenizer); return it.

    Streamed tensor by tensor (:mod:`attnscope.core.loading.gguf_convert`): peak memory is about one 2 GB shard,
    not the float32 state dict transformers' loader builds. ``progress`` is called per tensor
    and may raise :class:`attnscope.core.errors.Cancelled`; a cancelled or failed conversion leaves no
    cache entry. The cache holds one copy per (file hash, dtype). A cached entry that is damaged
    (:func:`converted_damage`: a truncated shard, a cut JSON file) or was made by an older
    conversion (:func:`attnscope.core.loading.gguf_convert.is_current`) is removed and converted
    again, with a progress line saying so and, where ``notes`` is given, one line appended to it.
    ``notes`` also gets what the conversion recorded the file holds and it does not reproduce.

    Raises:
        ModelLoadError: broken file, or a quantisation transformers cannot dequantise.
        Cancelled: raised by ``progress``.
    """
    from attnscope.core.errors import Cancelled
    from attnscope.core.loading import gguf_convert

    gguf = Path(gguf)
    check_gguf(gguf)
    try:  # before hashing the file: an unwritable cache folder is said at once
        (cache_root() / "converted").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelLoadError(_cache_unwritable(gguf, e)) from None
    out = converted_dir(gguf, dtype)
    damage = converted_damage(out) if _is_converted(out) else None
    # made by an older conversion (one that dropped RoPE scaling, head size, pre-tokenizer): stale
    stale = damage == "" and not gguf_convert.is_current(out)
    if damage == "" and not stale:
        if notes is not None:
            notes.extend(gguf_convert.conversion_notes(out))
        return out
    shutil.rmtree(out, ignore_errors=True)  # an incomplete leftover, a damaged or a stale entry
    if stale:
        redo = f"the cached conversion of {gguf.name} was made by an older AttnScope: converted again"
        progress(f"The cached conversion of {gguf.name} is out of date: converting it again…", 0.02)
    elif damage:
        redo = f"the cached conversion of {gguf.name} was damaged ({damage}): converted again"
        progress(f"The cached conversion of {gguf.name} is damaged ({damage}): converting it again…", 0.02)
    else:
        progress(f"Converting {gguf.name} to {dtype} (first load only)…", 0.02)
    quiet_transformers()

    def per_tensor(msg: str, frac: float) -> None:
        progress(f"Converting {gguf.name} to {dtype}: {msg}", min(0.95, 0.05 + 0.9 * frac))

    try:
        gguf_convert.convert(
            gguf,
            out,
            dtype,
            per_tensor,
            source={"gguf": str(gguf), "sha256": file_sha256(gguf), "dtype": dtype},
        )
    except (UnsupportedModelError, Cancelled):
        raise
    except MemoryError:
        raise ModelLoadError(f"cannot convert {gguf.name}: out of memory") from None
    except OSError as e:
        if _in_cache(e):
            raise ModelLoadError(_cache_unwritable(gguf, e)) from None
        raise ModelLoadError(f"cannot load {gguf.name}: {first_line(e)}") from None
    except Exception as e:
        raise ModelLoadError(f"cannot load {gguf.name}: {first_line(e)}") from None
    progress("Converted.", 0.95)
    if (damage or stale) and notes is not None:
        notes.append(redo)
    if notes is not None:
        notes.extend(gguf_convert.conversion_notes(out))
    return out


def _in_cache(e: OSError) -> bool:
    """Whether ``e`` is about writing the cache folder: a path inside :func:`cache_root`, or a full disk."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    root = cache_root().absolute()
    for name in (e.filename, getattr(e, "filename2", None)):
        if name is not None:
            p = Path(os.fsdecode(name)).absolute()
            if p == root or root in p.parents:
                return True
    return False


def _cache_unwritable(gguf: Path, e: OSError) -> str:
    """The one line for a conversion the cache folder cannot hold (unwritable, missing, full)."""
    why = e.strerror or first_line(e)
    named = " (ATTNSCOPE_CACHE_DIR)" if os.environ.get("ATTNSCOPE_CACHE_DIR") else ""
    return (
        f"cannot convert {gguf.name}: the cache folder {cache_root()}{named} cannot be created or "
        f"written ({why}); set ATTNSCOPE_CACHE_DIR to a folder you can write, with room for the model"
    )


def _converted_row(d: Path, meta: dict) -> ConvertedModel:
    return ConvertedModel(
        path=d,
        name=d.name,
        source=str(meta.get("gguf") or ""),
        sha256=str(meta.get("sha256") or ""),
        size_bytes=_tree_bytes(d),
        # a damaged entry (a truncated shard) reads as incomplete: the next load converts it again
        complete=".partial" not in d.name and _is_converted(d) and not converted_damage(d),
    )


def list_converted() -> list[ConvertedModel]:
    """Every folder in the conversion cache and the quantised-weights entries beside it
    (:func:`attnscope.core.loading.quant_cache.list_entries`), largest first (sizes in bytes, summed
    file sizes). A damaged source record lists the entry with its source unknown (:func:`cache_source_record`)."""
    from attnscope.core.loading.quant_cache import list_entries

    out = list_entries() + cache_entries(cache_root() / "converted", _converted_row)
    return sorted(out, key=lambda c: (-c.size_bytes, c.name))


def clear_converted(name: str | None = None) -> int:
    """Delete one converted model (by folder ``name``) or, with None, the whole conversion cache
    (quantised-weights entries included).

    The next load of the same GGUF converts it again (of the same model with ``--quantize``,
    quantises it again). Returns the bytes freed.

    Raises:
        ModelLoadError: ``name`` is not in the cache.
    """
    root = cache_root() / "converted"
    targets = list_converted() if name is None else [c for c in list_converted() if c.name == name]
    if name is not None and not targets:
        raise ModelLoadError(f"{name} is not in the conversion cache ({root})")
    freed = 0
    for c in targets:
        freed += c.size_bytes
        shutil.rmtree(c.path, ignore_errors=True)
    return freed
