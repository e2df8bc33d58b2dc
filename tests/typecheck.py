"""Run mypy over attnscope.core and attnscope.app, every module checked (config: pyproject ``[tool.mypy]``).

Usage: ``.venv/bin/python tests/typecheck.py [extra mypy arguments or files]``; exit status is mypy's.

The folders ``core/`` and ``app/`` install as ``attnscope.core`` and ``attnscope.app`` through
setuptools' ``package-dir`` mapping. ``.ci/setup`` installs them as a strict editable install
(``pip install -e . --config-settings editable_mode=strict``): a link tree,
``build/__editable__.attnscope-*/attnscope/core/session.py -> core/session.py``, on ``sys.path``
through a plain ``.pth`` line, which static tools read like any folder. mypy would treat that folder
as an installed library (errors silenced), so this script names it in ``MYPYPATH`` (the project's
own code) and reports the paths mypy prints as the files they link to (``core/session.py:12: ...``).

A venv installed editable the older way (``pip install -e .``: setuptools' import hook,
``__editable___attnscope_*_finder.py``, which no static tool can follow: mypy issue 13392,
setuptools issue 3518) has no link tree; for it the script lays one out under ``.mypy_cache/``
from pyproject's ``package-dir``. Reinstalling with ``editable_mode=strict`` makes that unneeded.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FALLBACK_TREE = ROOT / ".mypy_cache" / "attnscope_tree"  # only for an import-hook install
TOP_INIT = ROOT / "packaging" / "namespace" / "__init__.py"


def package_dirs() -> dict[str, str]:
    """pyproject's ``[tool.setuptools] package-dir``: package name -> folder relative to the root."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


def installed_tree(path: list[str] | None = None) -> Path | None:
    """The folder on ``sys.path`` (or ``path``) whose ``attnscope/`` links to this checkout, as a
    static tool finds it (``sys.path`` only, no import hooks): a strict editable install's link
    tree. None when only setuptools' import hook reaches the package, or when the ``attnscope``
    found is another copy (a wheel installed from elsewhere)."""
    search = [p for p in (sys.path if path is None else path) if p and Path(p).resolve() != ROOT]
    spec = importlib.machinery.PathFinder.find_spec("attnscope", search)
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin)
    return origin.parent.parent if origin.resolve() == TOP_INIT else None


REINSTALL = ".venv/bin/python -m pip install --no-deps -e . --config-settings editable_mode=strict"


def unlinked_files(tree: Path) -> list[str]:
    """What the link tree at ``tree`` is missing: the .py files of the package-dir folders it lacks,
    and ``"<path> (removed)"`` for each of its links whose file is gone. A strict editable install
    links the files it saw when it ran: a module added since is not importable, and a removed one
    still listed, until the install is rerun (:data:`REINSTALL`). Paths relative to the root."""
    missing = []
    for name, folder in package_dirs().items():
        dest = tree.joinpath(*name.split("."))
        for f in sorted((ROOT / folder).glob("*.py" if "." not in name else "**/*.py")):
            if not (dest / f.relative_to(ROOT / folder)).exists():
                missing.append(f.relative_to(ROOT).as_posix())
    for link in sorted(tree.rglob("*.py")):
        if link.is_symlink() and not link.exists():
            missing.append(f"{link.relative_to(tree).as_posix()} (removed)")
    return missing


def fallback_tree() -> Path:
    """Lay out the package-dir mapping as symlinks under .mypy_cache/ (an import-hook install)."""
    for name, folder in sorted(package_dirs().items(), key=lambda kv: kv[0].count(".")):
        dest = FALLBACK_TREE.joinpath(*name.split("."))
        src = ROOT / folder
        if "." not in name:
            # the top package: a real folder holding links to its files, so that the
            # subpackages' links can sit beside them
            dest.mkdir(parents=True, exist_ok=True)
            for entry in src.iterdir():
                if entry.name != "__pycache__":
                    _link(dest / entry.name, entry)
        else:
            _link(dest, src)
    return FALLBACK_TREE


def _link(dest: Path, src: Path) -> None:
    if dest.is_symlink() and os.readlink(dest) == str(src):
        return
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    dest.symlink_to(src, target_is_directory=src.is_dir())


_PATH_AT_LINE_START = re.compile(r"^([^\s:][^:\n]*\.pyi?)(?=:)", re.M)


def real_paths(text: str) -> str:
    """Rewrite each path that starts a line of mypy's output to the checkout file it links to,
    relative to the root (``build/__editable__.../attnscope/core/units.py:3: error`` ->
    ``core/units.py:3: error``); paths outside the checkout are left as they are."""

    def repl(m: re.Match[str]) -> str:
        real = (ROOT / m.group(1)).resolve()
        return real.relative_to(ROOT).as_posix() if real.is_relative_to(ROOT) else m.group(1)

    return _PATH_AT_LINE_START.sub(repl, text)


def main(argv: list[str]) -> int:
    tree = installed_tree() or fallback_tree()
    env = {**os.environ, "MYPYPATH": str(tree)}
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *argv]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    sys.stdout.write(real_paths(r.stdout))
    sys.stderr.write(real_paths(r.stderr))
    return r.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
