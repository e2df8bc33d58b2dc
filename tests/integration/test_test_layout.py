"""The tests folder's layout: tests/core (no Qt), tests/app (the window), tests/integration (CLI,
engine, packaging, docs, tooling), tests/gpu; and the Qt-free lane that tests/core must keep.

The lane is ``ATTNSCOPE_HEADLESS=1 pytest -p no:pytest-qt tests/core`` (docs/development.md): with it,
tests/conftest.py refuses any import of Qt, pyqtgraph or the app."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
GROUPS = ("core", "app", "integration", "gpu")
#: fixtures that only exist with pytest-qt or build a window (conftest's `window` too, but that name is also
#: a parameter of core tests: a sliding window)
QT_FIXTURES = {"qtbot", "qapp", "make_window", "remote_window"}


def _test_files(group: str) -> list[Path]:
    return sorted((TESTS / group).glob("test_*.py"))


def test_every_test_file_is_in_a_group_and_names_are_unique():
    assert not sorted(p.name for p in TESTS.glob("test_*.py")), "a test file outside tests/<group>/"
    names = [p.name for g in GROUPS for p in _test_files(g)]
    assert len(names) == len(set(names)), "two test files share a name (pytest imports them by name)"
    assert all(len(_test_files(g)) > 0 for g in ("core", "app", "integration"))


@pytest.mark.parametrize("path", _test_files("core"), ids=lambda p: p.name)
def test_no_core_test_asks_for_qt(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mods = [node.module or ""]
        else:
            mods = []
        for m in mods:
            assert not m.startswith(("PySide6", "pyqtgraph", "pytestqt", "attnscope.app")), (
                f"{path.name}:{node.lineno} imports {m}: a test of the window belongs in tests/app"
            )
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            args = {a.arg for a in node.args.args}
            assert not args & QT_FIXTURES, (
                f"{path.name}:{node.lineno} {node.name} asks for {sorted(args & QT_FIXTURES)}: tests/app"
            )


@pytest.mark.slow
def test_the_headless_lane_collects_tests_core_without_qt():
    """Every tests/core module imports (collection) with Qt, pyqtgraph and the app refused, and the
    refusal is real: the same lane refuses to collect a GUI test file."""
    env = dict(os.environ, ATTNSCOPE_HEADLESS="1")
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:pytest-qt",
        "-p",
        "no:cacheprovider",
        "--collect-only",
    ]
    core = subprocess.run(cmd + [str(TESTS / "core")], env=env, capture_output=True, text=True, timeout=600)
    assert core.returncode == 0, core.stdout[-3000:] + core.stderr[-2000:]
    assert " tests collected" in core.stdout or "tests collected" in core.stdout
    app = subprocess.run(
        cmd + [str(TESTS / "app" / "test_heatmap_exact_tiles.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert app.returncode != 0 and "the headless lane (ATTNSCOPE_HEADLESS=1) imports no" in app.stdout
