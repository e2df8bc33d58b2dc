"""The tooling that enforces the house style runs with the tests (so `.ci/run` runs it too).

* ``ruff check``: the lint rules in pyproject (pyflakes, pycodestyle, isort, bugbear, pyupgrade);
* ``ruff format --check``: the one formatting, applied to every file once (issue 10);
* mypy (``tests/typecheck.py``, config in pyproject ``[tool.mypy]``): attnscope.core and the app's
  state/engine modules type-check clean.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = [sys.executable, "-m", "ruff"]
TYPECHECK = [sys.executable, str(ROOT / "tests" / "typecheck.py")]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*RUFF, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_check_is_clean():
    r = _ruff("check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_is_applied():
    r = _ruff("format", "--check", ".")
    assert r.returncode == 0, "run `ruff format .`:\n" + r.stdout + r.stderr


def test_the_format_check_fails_on_an_unformatted_file(tmp_path):
    """The check must be able to fail: a badly spaced file is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("x=[1,\n 2]\n")
    r = subprocess.run([*RUFF, "format", "--check", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "bad.py" in r.stdout


@pytest.mark.slow  # about a minute on 2 cores without mypy's cache (torch and transformers' stubs)
def test_mypy_is_clean():
    r = subprocess.run(TYPECHECK, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "Success: no issues found" in r.stdout, r.stdout + r.stderr


def test_the_type_check_fails_on_a_type_error(tmp_path):
    """The check must be able to fail, with this project's config and its attnscope.core paths:
    a file that assigns format_bytes()'s str to an int is reported (and the import resolves)."""
    bad = tmp_path / "bad_types.py"
    bad.write_text("from attnscope.core.units import format_bytes\n\nx: int = format_bytes(3)\n")
    r = subprocess.run(
        [*TYPECHECK, "--cache-dir", str(tmp_path / "cache"), str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'bad_types.py:3: error: Incompatible types in assignment (expression has type "str"' in r.stdout
    assert "import-not-found" not in r.stdout and "Found 1 error in 1 file" in r.stdout


def test_typecheck_maps_reported_paths_back_to_the_checkout():
    """mypy reads core/ through .mypy_cache/attnscope_tree/attnscope/core: errors name core/...."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import typecheck
    finally:
        sys.path.remove(str(ROOT / "tests"))
    mapping = typecheck.build_tree()
    assert (typecheck.TREE / "attnscope" / "core").resolve() == ROOT / "core"
    assert (typecheck.TREE / "attnscope" / "app").resolve() == ROOT / "app"
    top_init = (typecheck.TREE / "attnscope" / "__init__.py").resolve()
    assert top_init == ROOT / "packaging" / "namespace" / "__init__.py"
    line = ".mypy_cache/attnscope_tree/attnscope/core/units.py:49: error: x  [arg-type]"
    assert typecheck.real_paths(line, mapping) == "core/units.py:49: error: x  [arg-type]"
    top = ".mypy_cache/attnscope_tree/attnscope/__init__.py:3: error: y"
    assert typecheck.real_paths(top, mapping) == "packaging/namespace/__init__.py:3: error: y"
