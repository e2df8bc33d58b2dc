"""The tooling that enforces the house style runs with the tests (so `.ci/run` runs it too).

* ``ruff check``: the lint rules in pyproject (pyflakes, pycodestyle, isort, bugbear, pyupgrade);
* ``ruff format --check``: the one formatting, applied to every file once (issue 10).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUFF = [sys.executable, "-m", "ruff"]


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
