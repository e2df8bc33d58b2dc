"""The layers contract (pyproject ``[tool.importlinter]``): the data path written down and checked,
imports inside functions included, plus "core never imports the app or Qt" and no import cycles.

import-linter builds its graph with grimp, which reads every import statement of every module (a
function-level ``from attnscope.core.io.head_export import x`` counts like a top-level one), so an
analysis that reaches up into ``core/io`` or a loader that reaches into a backend fails here with the
importing line named. The contract's exceptions are listed in pyproject, each saying why.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
needs_import_linter = pytest.mark.skipif(
    LINT_IMPORTS is None, reason="import-linter is not installed (the 'test' extra installs it)"
)


def _lint(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


@needs_import_linter
def test_the_layers_contract_is_kept():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 kept, 0 broken" in r.stdout, r.stdout


@needs_import_linter
def test_the_contract_sees_an_import_inside_a_function(tmp_path):
    """The check must be able to fail, on the kind of import the old contract missed: a low layer
    that imports a high one inside a function body, and a cycle closed the same way."""
    pkg = tmp_path / "toy"
    (pkg / "high").mkdir(parents=True)
    (pkg / "low").mkdir()
    for init in ("__init__.py", "high/__init__.py", "low/__init__.py"):
        (pkg / init).write_text("")
    (pkg / "high" / "view.py").write_text("from toy.low import maths\n")
    (pkg / "low" / "maths.py").write_text("def f():\n    from toy.high import view\n\n    return view\n")
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = toy\n\n"
        "[importlinter:contract:layers]\nname = toy layers\ntype = layers\nlayers =\n    toy.high\n    toy.low\n"
    )
    r = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "toy.low.maths -> toy.high.view (l.2)" in r.stdout, r.stdout
