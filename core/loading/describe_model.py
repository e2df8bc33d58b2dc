"""Describing one model from its files, before anything loads: a Hugging Face folder or a GGUF file.

Qt-free. Metadata is read cheaply: ``config.json`` + safetensors headers for folders, the GGUF
header and tensor table (:mod:`attnscope.core.loading.gguf_meta`) for GGUF files. No weight is
read. A ``config.json`` is read through transformers' own config class for its model type
(:func:`transformers_config`), so omitted fields take the defaults the loaded model will run with;
the first such read imports transformers. Each :class:`attnscope.core.loading.catalog_entry.CatalogEntry`
says whether AttnScope can run the model and, if not, exactly why (the same checks and messages
:func:`attnscope.core.loading.resolve.resolve` raises at load time). Descriptions are memoised by
the files' size and modification time.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from attnscope.core.errors import ModelLoadError, UnsupportedModelError
from attnscope.core.loading import safetensors_header
from attnscope.core.loading.catalog_entry import CatalogEntry
from attnscope.core.loading.checkpoint_dtype import (
    config_dtype,
    gguf_checkpoint_dtype,
    gguf_is_quantised,
    normalise,
)
from attnscope.core.loading.checks import check_hf_folder, gguf_problem, read_gguf
from attnscope.core.loading.resolve import model_name
from attnscope.core.loading.safetensors_header import check_safetensors

_memo: dict[tuple, CatalogEntry] = {}


def file_stamp(path: Path) -> tuple:
    """``(size in bytes, mtime in ns)`` of a file (links followed), ``(None, None)`` when it cannot be
    read: what an entry is memoised on."""
    try:
        st = path.stat()
        return (st.st_size, st.st_mtime_ns)
    except OSError:
        return (None, None)


def _files_stamp(folder: Path) -> tuple:
    """(name, size, mtime) of every file directly in ``folder`` (links followed): what a folder's
    entry is memoised on, so a shard added, removed, finished or cut is described afresh."""
    try:
        return tuple(sorted((f.name, *file_stamp(f)) for f in folder.iterdir()))
    except OSError:
        return ()


def _int(v) -> int:
    if isinstance(v, list):  # per-layer values (some GGUFs): the largest
        v = max((x for x in v if isinstance(x, int | float)), default=0)
    try:
        return int(v or 0)
    except (TypeError, ValueError):
        return 0


_config_memo: dict[str, object] = {}


def transformers_config(cfg: dict):
    """transformers' own config object for a parsed ``config.json`` (its class fills every field the file
    omits with the default the model will run with), the text config of a multimodal one; None when
    ``model_type`` is missing or unknown to the installed transformers, or the config is refused.

    Built with ``AutoConfig.for_model(**cfg)``; memoised by the file's content. The first call imports
    transformers (a few seconds).
    """
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return None
    try:
        key = json.dumps(cfg, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return None
    if key not in _config_memo:
        try:
            import logging

            from transformers import AutoConfig

            logging.getLogger("transformers").setLevel(logging.ERROR)
            conf = AutoConfig.for_model(**cfg)
            conf = conf.get_text_config() if hasattr(conf, "get_text_config") else conf
        except Exception:  # unknown model type, a value the class refuses, transformers missing
            conf = None
        _config_memo[key] = conf
    return _config_memo[key]


def config_geometry(cfg: dict) -> dict:
    """Attention geometry from a parsed ``config.json`` (any decoder family, nested ``text_config`` too).

    Returns a dict with ``n_layers, n_heads, n_kv_heads, head_dim, max_context, sliding_window``
    (0 / None where absent). Fields the file omits take transformers' defaults for its model type
    (:func:`transformers_config`): a Qwen2 config without ``use_sliding_window`` uses no window, a
    Gemma 3 one without ``head_dim`` has 256, a Mistral one without ``sliding_window`` 4096, as the
    loaded model will (:func:`attnscope.core.loading.model_info.info_from_config` reads the same object). The window is None
    when no layer of ``layer_types`` is a sliding one. Configs transformers cannot build are read as
    they are (``use_sliding_window`` then defaults to false, as in transformers' Qwen2 family).
    """
    conf = transformers_config(cfg)
    if conf is not None:
        try:
            n_heads = _int(getattr(conf, "num_attention_heads", 0))
            hidden = _int(getattr(conf, "hidden_size", 0))
            types = getattr(conf, "layer_types", None)
            window = getattr(conf, "sliding_window", None)
            if window is not None and getattr(conf, "use_sliding_window", True) is False:
                window = None
            if types and not any("sliding" in str(t) for t in types):
                window = None
            mla = _int(
                getattr(conf, "kv_lora_rank", 0)
            )  # MLA: per-head keys of nope + rope size, n_kv = n_heads
            return dict(
                n_layers=_int(getattr(conf, "num_hidden_layers", 0)),
                n_heads=n_heads,
                n_kv_heads=n_heads if mla else (_int(getattr(conf, "num_key_value_heads", None)) or n_heads),
                head_dim=(
                    _int(getattr(conf, "qk_nope_head_dim", 0)) + _int(getattr(conf, "qk_rope_head_dim", 0))
                    if mla
                    else _int(getattr(conf, "head_dim", None)) or (hidden // n_heads if n_heads else 0)
                ),
                max_context=_int(getattr(conf, "max_position_embeddings", 0)),
                sliding_window=_int(window) or None,
            )
        except (TypeError, ValueError, AttributeError):
            pass
    c = cfg
    if isinstance(cfg.get("text_config"), dict) and not (cfg.get("num_hidden_layers") or cfg.get("n_layer")):
        c = {**cfg, **cfg["text_config"]}
    n_heads = _int(c.get("num_attention_heads") or c.get("n_head") or c.get("num_heads"))
    n_layers = _int(c.get("num_hidden_layers") or c.get("n_layer") or c.get("num_layers"))
    hidden = _int(c.get("hidden_size") or c.get("n_embd") or c.get("d_model"))
    n_kv = _int(c.get("num_key_value_heads") or c.get("n_kv_heads")) or n_heads
    head_dim = _int(c.get("head_dim")) or (hidden // n_heads if n_heads else 0)
    max_ctx = _int(
        c.get("max_position_embeddings")
        or c.get("n_positions")
        or c.get("max_sequence_length")
        or c.get("seq_length")
    )
    window = c.get("sliding_window") if c.get("use_sliding_window", "max_window_layers" not in c) else None
    return dict(
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        max_context=max_ctx,
        sliding_window=_int(window) or None,
    )


def _folder_bytes(folder: Path, skip: Iterable[Path] = ()) -> int:
    """Bytes of the files directly in ``folder`` (following the HF cache's symlinks to blobs), less
    ``skip``; subfolders (Meta's ``original/``) are not counted."""
    skipped = set(skip)
    total = 0
    for f in folder.iterdir():
        try:
            if f not in skipped and f.is_file():
                total += f.stat().st_size
        except OSError:
            pass
    return total


def _support(folder: Path) -> tuple[str, tuple[tuple[str, str], ...], dict]:
    """``(reason, refused_by, config)`` of a model folder, from the very checks the loaders make:
    :func:`attnscope.core.loading.checks.check_hf_folder` for each registered backend (the files,
    the config) and each backend's family rule. ``reason`` is "" when some backend runs the folder
    (then ``refused_by`` names the backends that refuse this file, and why); else the reason a load
    on the default (first registered) backend gives."""
    from attnscope.core.backend_registry import names
    from attnscope.core.backend_registry import problem as backend_problem
    from attnscope.core.loading.checks import check_config

    backends = names()
    refused: dict[str, str] = {}  # backend -> why it refuses this folder's config
    runs: dict[str, str] = {}  # backend -> "" when it runs the folder, else why not (refusal or family)
    cfg: dict = {}
    for b in backends:
        try:
            if not cfg:
                cfg = check_hf_folder(folder, b)  # files and config, once one backend has passed them
            else:
                check_config(cfg, b)
        except UnsupportedModelError as e:  # this backend refuses the config; another may run it
            refused[b] = runs[b] = str(e)
            continue
        except ModelLoadError as e:  # the files themselves: no backend loads them
            return str(e), (), {}
        runs[b] = backend_problem(str(cfg.get("model_type") or ""), b) or ""
    if any(not why for why in runs.values()):
        return "", tuple(refused.items()), cfg
    return runs[backends[0]], (), cfg  # what a load on the default backend says


def _quant_bits(quantization: dict, layer: str) -> int:
    """Bits of one mlx-lm quantised layer: its per-layer entry (``quantization[<layer path>]``,
    mlx-lm's mixed-precision layout) or the folder's ``bits``."""
    own = quantization.get(layer)
    bits = own.get("bits") if isinstance(own, dict) else quantization.get("bits")
    return _int(bits) or 4


def count_parameters(headers: dict[str, dict], cfg: dict) -> tuple[int, Counter[str], bool]:
    """``(parameters, parameters per safetensors dtype, packed)`` of a folder's weights, from the
    safetensors headers of the files the loader reads (``{tensor name: {"dtype", "shape"}}``, merged).

    An mlx-lm quantised folder (config ``"quantization": {"bits", "group_size"}``) stores each
    quantised matrix as ``<layer>.weight`` of packed ``uint32`` words beside ``<layer>.scales`` and
    ``<layer>.biases`` (mlx ``nn.quantize``): its logical size is ``words × 32 / bits`` per row
    (per-layer bits where the config gives them), counted at the scales' dtype, and the scales and
    biases are quantisation constants, not parameters (as mlx-lm's own count leaves them out). Every
    other tensor counts ``prod(shape)``. ``packed``: some matrix was packed.
    """
    q = cfg.get("quantization") if isinstance(cfg.get("quantization"), dict) else None
    n_params, packed = 0, False
    dtypes: Counter[str] = Counter()
    for k, v in headers.items():
        n = 1
        for d in v.get("shape", []):
            n *= int(d)
        dtype = str(v.get("dtype", "?"))
        layer, _, leaf = k.rpartition(".")
        if q is not None and f"{layer}.scales" in headers:
            if leaf in ("scales", "biases"):
                continue
            if leaf == "weight" and dtype == "U32":
                n = n * 32 // _quant_bits(q, layer)
                dtype = str(headers[f"{layer}.scales"].get("dtype", dtype))
                packed = True
        n_params += n
        dtypes[dtype] += n
    return n_params, dtypes, packed


def _unread_copies(folder: Path, files: list[Path]) -> list[str]:
    """Other weight files of ``folder`` the loader does not read: a second copy of the weights
    (Mistral's ``consolidated.safetensors``, Meta's ``original/`` folder of ``consolidated.*.pth``)."""
    read = set(files)
    out = [p.name for p in sorted(folder.glob("*.safetensors")) if p not in read]
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        if any(sub.glob("*.safetensors")) or any(sub.glob("*.pth")) or any(sub.glob("*.bin")):
            out.append(f"{sub.name}/")
    return out


def describe_hf_folder(
    folder: Path, source: str = "user", name: str | None = None, size_bytes: int | None = None, note: str = ""
) -> CatalogEntry:
    """Describe a Hugging Face model folder from ``config.json`` and its safetensors headers.

    Never raises for a broken folder: the entry comes back with ``supported=False`` and the
    message :func:`attnscope.core.loading.checks.check_hf_folder` gives (bad config, truncated or
    invalid safetensors, ...): the list calls a folder supported exactly when a loader accepts it.
    Parameters and size count the files the loader reads
    (:func:`attnscope.core.loading.weight_files.weight_files`), once: a second copy of the weights beside
    them is left out and named in ``note``. ``note`` (given) comes first, e.g. what is incomplete in
    the folder's cache repo.
    """
    from attnscope.core.loading.quantize import file_quantization
    from attnscope.core.loading.weight_files import weight_files

    folder = Path(folder)
    key = ("hf", str(folder), source, name, _files_stamp(folder), size_bytes, note)
    if key in _memo:
        return _memo[key]
    reason, refused_by, cfg = _support(folder)
    if not cfg:
        try:
            cfg = json.loads((folder / "config.json").read_text())
            cfg = cfg if isinstance(cfg, dict) else {}
        except (OSError, ValueError):
            cfg = {}
    geo = config_geometry(cfg)
    kind = _attention_fields(cfg)
    try:
        files = weight_files(folder, cfg)
    except ModelLoadError:
        files = []
    headers: dict[str, dict] = {}
    for shard in files:
        if shard.suffix != ".safetensors":
            continue
        try:
            header = check_safetensors(shard)
        except ModelLoadError:
            continue
        if kind["text_only"]:  # the language model's tensors alone: the vision tower is not loaded
            from attnscope.core.loading.text_only import language_header

            header = language_header(header)
        headers.update({k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)})
    n_params, dtypes, packed = count_parameters(headers, cfg)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "")
    if not dtype and dtypes:
        st = dtypes.most_common(1)[0][0]
        dtype = safetensors_header.DTYPES.get(st, st.lower())
    checkpoint = config_dtype(cfg) or normalise(dtype) or ""
    label = file_quantization(folder) if packed else ""
    text_cfg = cfg.get("text_config")
    text_cfg = text_cfg if isinstance(text_cfg, dict) else {}
    unread = _unread_copies(folder, files) if folder.is_dir() else []
    notes = [note] if note else []
    if unread:
        notes.append(f"not read, so not counted: {', '.join(unread)} (another copy of the weights)")
    entry = CatalogEntry(
        source=source,
        name=name or model_name(folder),
        path=folder,
        format="hf",
        architecture=str(cfg.get("model_type") or text_cfg.get("model_type") or ""),
        n_params=n_params,
        dtype=label or dtype or "?",
        size_bytes=(
            _folder_bytes(folder, skip=[folder / u for u in unread]) if size_bytes is None else size_bytes
        ),
        supported=not reason,
        reason=reason,
        model_ref=str(folder),
        checkpoint_dtype=checkpoint,
        quantised=packed,
        note="; ".join(notes),
        refused_by=refused_by,
        **geo,
        **kind,
    )
    _memo[key] = entry
    return entry


def _attention_fields(cfg: dict) -> dict:
    """CatalogEntry's attention fields from a parsed ``config.json``
    (:func:`attnscope.core.loading.attention_kind.geometry` of the config transformers builds)."""
    from attnscope.core.loading import attention_kind

    conf = transformers_config(cfg)  # the text config of a multimodal one
    text_only = isinstance(cfg.get("text_config"), dict) or isinstance(cfg.get("vision_config"), dict)
    if conf is None:
        return dict(text_only=text_only)
    g = attention_kind.geometry(conf)
    line = attention_kind.describe(g)
    return dict(
        attention_kind=line,
        n_experts=g.n_experts,
        experts_active=g.experts_active,
        kv_latent_dim=g.kv_latent_dim,
        rope_head_dim=g.rope_head_dim,
        text_only=text_only,
    )


def describe_gguf(path: Path, source: str = "user", name: str | None = None) -> CatalogEntry:
    """Describe a GGUF file from its header and tensor table (no weights read).

    Never raises for a broken file: the entry comes back unsupported with the message
    :func:`attnscope.core.loading.checks.check_gguf` would raise (truncated, a tensor type transformers cannot
    dequantise, a split file, an architecture that cannot run).
    """
    from attnscope.core.loading.gguf_meta import model_type_of

    path = Path(path)
    key = ("gguf", str(path), source, name, file_stamp(path))
    if key in _memo:
        return _memo[key]
    size = file_stamp(path)[0] or 0
    try:
        h = read_gguf(path)
    except ModelLoadError as e:
        entry = CatalogEntry(
            source,
            name or path.name,
            path,
            "gguf",
            "",
            0,
            0,
            0,
            0,
            0,
            0,
            "?",
            size,
            False,
            str(e),
            None,
            str(path),
        )
        _memo[key] = entry
        return entry
    problem = gguf_problem(h)
    n_heads = _int(h.arch_value("attention.head_count"))
    n_kv = _int(h.arch_value("attention.head_count_kv")) or n_heads
    hidden = _int(h.arch_value("embedding_length"))
    head_dim = _int(h.arch_value("attention.key_length")) or (hidden // n_heads if n_heads else 0)
    entry = CatalogEntry(
        source=source,
        name=name or path.name,
        path=path,
        format="gguf",
        architecture=model_type_of(h),
        n_params=h.n_params,
        n_layers=_int(h.arch_value("block_count")),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        max_context=_int(h.arch_value("context_length")),
        dtype=h.quant_name(),
        size_bytes=size,
        supported=problem is None,
        reason=problem[1] if problem else "",
        sliding_window=_int(h.arch_value("attention.sliding_window")) or None,
        model_ref=str(path),
        checkpoint_dtype=gguf_checkpoint_dtype(h),
        quantised=gguf_is_quantised(h),
        **_gguf_attention_fields(h, n_heads, n_kv),
    )
    _memo[key] = entry
    return entry


def _gguf_attention_fields(h, n_heads: int, n_kv: int) -> dict:
    """CatalogEntry's attention fields from a GGUF header (llama.cpp's keys: ``expert_count``,
    ``expert_used_count``, ``attention.kv_lora_rank``, ``rope.dimension_count``)."""
    from attnscope.core.loading.attention_kind import AttentionGeometry, describe

    n_layers = _int(h.arch_value("block_count"))
    latent = _int(h.arch_value("attention.kv_lora_rank"))
    g = AttentionGeometry(
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_heads if latent else n_kv,
        kv_latent_dim=latent,
        rope_head_dim=_int(h.arch_value("rope.dimension_count")) if latent else 0,
        n_experts=_int(h.arch_value("expert_count")),
        experts_active=_int(h.arch_value("expert_used_count")),
        shared_experts=_int(h.arch_value("expert_shared_count")),
        attention_layers=n_layers,
    )
    return dict(
        attention_kind=describe(g),
        n_experts=g.n_experts,
        experts_active=g.experts_active,
        kv_latent_dim=g.kv_latent_dim,
        rope_head_dim=g.rope_head_dim,
    )


def is_model_gguf(p: Path) -> bool:
    """A .gguf that is a model: not a vision projector, not a later part of a split file."""
    n = p.name.lower()
    if not n.endswith(".gguf") or n.startswith("mmproj") or "-mmproj" in n:
        return False
    import re

    m = re.search(r"-(\d{5})-of-(\d{5})\.gguf$", n)
    return not (m and int(m.group(1)) > 1)


def describe_path(path: str | os.PathLike, source: str = "user") -> list[CatalogEntry]:
    """Entries for a user path: a model folder, a GGUF file, or a library folder (two levels deep).

    A missing path gives one unsupported entry saying so, so a remembered path that vanished
    stays visible (and removable) instead of disappearing silently.
    """
    from attnscope.core.loading.gguf_meta import is_gguf_file

    p = Path(path).expanduser()
    if not p.exists():
        return [
            CatalogEntry(
                source,
                p.name,
                p,
                "gguf" if p.suffix.lower() == ".gguf" else "hf",
                "",
                0,
                0,
                0,
                0,
                0,
                0,
                "?",
                0,
                False,
                f"no such file or folder: {p}",
                None,
                str(p),
            )
        ]
    if p.is_file():
        if p.suffix.lower() == ".gguf" or is_gguf_file(p):
            return [describe_gguf(p, source)]
        return [
            CatalogEntry(
                source,
                p.name,
                p,
                "gguf",
                "",
                0,
                0,
                0,
                0,
                0,
                0,
                "?",
                file_stamp(p)[0] or 0,
                False,
                f"{p.name}: expected a .gguf file or a Hugging Face model folder",
                None,
                str(p),
            )
        ]
    if (p / "config.json").is_file():
        return [describe_hf_folder(p, source)]
    out: list[CatalogEntry] = []
    for depth_glob in ("*", "*/*", "*/*/*"):
        for child in sorted(p.glob(depth_glob)):
            rel = child.relative_to(p)
            if child.is_file() and is_model_gguf(child) and len(rel.parts) <= 3:
                out.append(describe_gguf(child, source, name=str(rel.with_suffix(""))))
            elif child.is_dir() and len(rel.parts) <= 2 and (child / "config.json").is_file():
                out.append(describe_hf_folder(child, source, name=str(rel)))
    if not out:
        ggufs = sorted(p.glob("*.gguf"))
        out.append(
            CatalogEntry(
                source,
                p.name,
                p,
                "hf",
                "",
                0,
                0,
                0,
                0,
                0,
                0,
                "?",
                0,
                False,
                f"{p} holds no model: no config.json, and no .gguf file or model folder inside"
                if not ggufs
                else f"{p}: only split or projector GGUFs inside",
                None,
                str(p),
            )
        )
    return out
