"""The import contract: every module under core/ imports with Qt, pyqtgraph and app/ made unimportable.

core/ (installed as ``attnscope.core``) is the headless engine the CLI, notebooks and a remote server
drive; it must never pull in the GUI (docs/development.md, "Layout"). The check runs in a fresh interpreter in
which a meta-path finder refuses PySide6, pyqtgraph, superqt and ``attnscope.app``, and walks the
whole core package, so a new module is covered the day it is added. The namespace itself is checked
too: pyproject lists every package folder, and no module imports the bare names ``core``/``app``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import importlib, pkgutil, sys

BLOCKED = ("PySide6", "pyqtgraph", "superqt", "shiboken6")
PKG = sys.argv[1]

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED or name == "attnscope.app" or name.startswith("attnscope.app."):
            raise ImportError(f"core must not import {name}")
        return None

sys.meta_path.insert(0, Block())
core = importlib.import_module(PKG)

failed = []
names = [PKG] + [m.name for m in pkgutil.walk_packages(core.__path__, PKG + ".")]
for name in names:
    try:
        importlib.import_module(name)
    except ImportError as e:
        # only a third-party framework missing on this machine (mlx on Windows) is optional
        if "core must not import" in str(e) or e.name is None or e.name.startswith(("attnscope", "core")):
            failed.append(f"{name}: {e}")
        else:  # an optional framework missing on this machine (e.g. mlx on Windows) is not a violation
            print(f"optional: {name}: {e}")
print(f"checked {len(names)} modules")
for f in failed:
    print("VIOLATION", f)
sys.exit(1 if failed else 0)
"""


def test_every_core_module_imports_without_qt_or_app():
    r = subprocess.run(
        [sys.executable, "-c", PROBE, "attnscope.core"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout + r.stderr
    n = int(r.stdout.split("checked ")[1].split()[0])
    n_files = sum(1 for p in (ROOT / "core").rglob("*.py"))
    assert n == n_files, f"walked {n} modules, core/ has {n_files} .py files"


def test_the_probe_catches_a_violation(tmp_path):
    """The blocker must really refuse: a fake core module that imports PySide6 is reported."""
    pkg = tmp_path / "core"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "bad.py").write_text("import PySide6.QtCore\n")
    r = subprocess.run(
        [sys.executable, "-c", PROBE, "core"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 1 and "VIOLATION core.bad" in r.stdout, r.stdout + r.stderr


def test_pyproject_lists_every_package_folder():
    """A new subpackage of core/ or app/ not listed in pyproject would be missing from the wheel."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = {"attnscope"}
    for folder, name in (("core", "attnscope.core"), ("app", "attnscope.app")):
        assert cfg["package-dir"][name] == folder
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    assert listed == found


def test_no_module_imports_the_bare_core_or_app_names():
    """Inside the project every import goes through the attnscope namespace (one name per module)."""
    import re

    bare = re.compile(r"^\s*(from|import)\s+(core|app)(\.|\s|$)", re.M)
    offenders = []
    for folder in ("core", "app", "tests", "packaging"):
        for f in (ROOT / folder).rglob("*.py"):
            if f.name == "test_import_contract.py":
                continue
            for m in bare.finditer(f.read_text()):
                offenders.append(f"{f.relative_to(ROOT)}: {m.group(0).strip()}")
    assert offenders == []
