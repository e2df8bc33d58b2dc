"""Run mypy over attnscope.core and the app's state/engine modules (config: pyproject ``[tool.mypy]``).

Usage: ``.venv/bin/python tests/typecheck.py [extra mypy arguments or files]``; exit status is mypy's.

Why a script and not a bare ``mypy``: the folders ``core/`` and ``app/`` install as ``attnscope.core``
and ``attnscope.app`` through setuptools' ``package-dir`` mapping, and an editable install reaches them
through an import hook (``__editable___attnscope_*_finder.py``) that static tools cannot follow (mypy
issue 13392, setuptools issue 3518). So this script lays out the package as mypy expects it, as
symlinks read from pyproject's ``package-dir`` (``<cache>/attnscope_tree/attnscope/core -> core``,
...), points ``mypy_path`` there (the config does) and maps the reported paths back to the real files
(``core/session.py:12: error: ...``). After one run a bare ``.venv/bin/python -m mypy`` works too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / ".mypy_cache" / "attnscope_tree"  # the config's mypy_path


def package_dirs() -> dict[str, str]:
    """pyproject's ``[tool.setuptools] package-dir``: package name -> folder relative to the root."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


def build_tree() -> dict[str, str]:
    """(Re)make the symlink tree; return {path prefix as mypy reports it: real path prefix}."""
    mapping: dict[str, str] = {}
    for name, folder in sorted(package_dirs().items(), key=lambda kv: kv[0].count(".")):
        dest = TREE.joinpath(*name.split("."))
        src = ROOT / folder
        rel_dest = dest.relative_to(ROOT).as_posix() + "/"
        if "." not in name:
            # the top package: a real folder holding links to its files, so that the
            # subpackages' links can sit beside them
            dest.mkdir(parents=True, exist_ok=True)
            for entry in src.iterdir():
                if entry.name != "__pycache__":
                    _link(dest / entry.name, entry)
        else:
            _link(dest, src)
        mapping[rel_dest] = folder.rstrip("/") + "/"
        mapping[str(dest) + "/"] = folder.rstrip("/") + "/"
    # the longest prefix first, so attnscope/core/ wins over attnscope/
    return dict(sorted(mapping.items(), key=lambda kv: -len(kv[0])))


def _link(dest: Path, src: Path) -> None:
    if dest.is_symlink() and os.readlink(dest) == str(src):
        return
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    dest.symlink_to(src, target_is_directory=src.is_dir())


def real_paths(text: str, mapping: dict[str, str]) -> str:
    """Rewrite the tree's paths in mypy's output to the files in the checkout."""
    for tree_prefix, real_prefix in mapping.items():
        text = text.replace(tree_prefix, real_prefix)
    return text


def main(argv: list[str]) -> int:
    mapping = build_tree()
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *argv]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    sys.stdout.write(real_paths(r.stdout, mapping))
    sys.stderr.write(real_paths(r.stderr, mapping))
    return r.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
