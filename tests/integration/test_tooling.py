"""The tooling that enforces the house style runs with the tests (so `.ci/run` runs it too).

* ``ruff check``: the lint rules in pyproject (pyflakes, pycodestyle, isort, bugbear, pyupgrade);
* ``ruff format --check``: the one formatting, applied to every file once;
* mypy (``tests/typecheck.py``, config in pyproject ``[tool.mypy]``): attnscope.core and attnscope.app
  type-check clean, every module (tests/integration/test_typing.py keeps it so);
* basedpyright (pyright's engine, the one VS Code runs; config in pyproject ``[tool.pyright]``):
  every ``attnscope.*`` import in the tree resolves through the strict editable install's link tree.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUFF = [sys.executable, "-m", "ruff"]
TYPECHECK = [sys.executable, str(ROOT / "tests" / "typecheck.py")]
sys.path.insert(0, str(ROOT / "tests"))
try:
    import typecheck
finally:
    sys.path.remove(str(ROOT / "tests"))


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


def test_typecheck_maps_reported_paths_back_to_the_checkout(tmp_path):
    """mypy reads core/ through a link tree (the strict install's, or the fallback under
    .mypy_cache/ for an import-hook install): the errors it prints name core/... and app/...."""
    tree = typecheck.installed_tree() or typecheck.fallback_tree()
    assert (tree / "attnscope" / "core" / "units.py").resolve() == ROOT / "core" / "units.py"
    assert (tree / "attnscope" / "app" / "state.py").resolve() == ROOT / "app" / "state.py"
    assert (tree / "attnscope" / "__init__.py").resolve() == typecheck.TOP_INIT
    rel = (tree / "attnscope").relative_to(ROOT).as_posix() if tree.is_relative_to(ROOT) else str(tree)
    out = f"{rel}/core/units.py:49: error: x  [arg-type]\n{rel}/__init__.py:3: error: y\n"
    assert typecheck.real_paths(out) == (
        "core/units.py:49: error: x  [arg-type]\npackaging/namespace/__init__.py:3: error: y\n"
    )
    outside = f"{tmp_path}/other.py:1: error: z\nFound 1 error in 1 file\n"
    assert typecheck.real_paths(outside) == outside


def test_installed_tree_ignores_the_import_hook_and_other_copies(tmp_path):
    """A folder whose attnscope/ is not this checkout's (a wheel installed from elsewhere) is not the
    link tree, and neither is a path with no attnscope at all (an import-hook install)."""
    other = tmp_path / "site" / "attnscope"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    assert typecheck.installed_tree([str(tmp_path / "site")]) is None
    assert typecheck.installed_tree([str(tmp_path)]) is None
    linked = tmp_path / "tree" / "attnscope"
    linked.mkdir(parents=True)
    (linked / "__init__.py").symlink_to(typecheck.TOP_INIT)
    assert typecheck.installed_tree([str(tmp_path / "tree")]) == tmp_path / "tree"


STRICT_INSTALL = typecheck.installed_tree() is not None
needs_static_install = pytest.mark.skipif(
    not STRICT_INSTALL,
    reason="attnscope is installed through setuptools' import hook, which static tools cannot read: "
    "reinstall with `.venv/bin/python -m pip install --no-deps -e . --config-settings editable_mode=strict`"
    " (.ci/setup does)",
)
needs_basedpyright = pytest.mark.skipif(
    shutil.which("basedpyright", path=str(Path(sys.executable).parent)) is None,
    reason="basedpyright is not installed (the 'test' extra installs it)",
)


def _unresolved_attnscope_imports(tmp_path: Path, include: list[str] | None = None) -> list[str]:
    """Run basedpyright with pyproject's [tool.pyright] (checks off: only import resolution) and
    return 'file:line: message' for each attnscope.* import it cannot resolve."""
    cfg = {
        "extends": str(ROOT / "pyproject.toml"),
        "typeCheckingMode": "off",
        "reportMissingImports": "error",
        # `from attnscope.core import missing_module`
        "reportAttributeAccessIssue": "error",
    }
    if include is not None:
        cfg["include"] = include
    (tmp_path / "pyrightconfig.json").write_text(json.dumps(cfg))
    exe = Path(sys.executable).parent / "basedpyright"
    r = subprocess.run(
        [
            str(exe),
            "-p",
            str(tmp_path / "pyrightconfig.json"),
            "--pythonpath",
            sys.executable,
            "--outputjson",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = json.loads(r.stdout)
    bad = []
    for d in report["generalDiagnostics"]:
        line = Path(d["file"]).read_text().splitlines()[d["range"]["start"]["line"]]
        import_line = line.lstrip().startswith(("import attnscope", "from attnscope"))
        missing = d.get("rule") == "reportMissingImports" and "attnscope" in d["message"]
        missing_symbol = (
            d.get("rule") == "reportAttributeAccessIssue" and "unknown import symbol" in d["message"]
        )
        if missing or (missing_symbol and import_line):
            bad.append(f"{d['file']}:{d['range']['start']['line'] + 1}: {d['message']}")
    return bad


@needs_static_install
@needs_basedpyright
@pytest.mark.slow  # one to three minutes on 2 cores: pyright binds torch and transformers
def test_a_static_checker_resolves_every_attnscope_import(tmp_path):
    """core/, app/, tests/ and packaging/: no attnscope.* import that pyright (an editor) cannot follow."""
    assert _unresolved_attnscope_imports(tmp_path) == []


@needs_static_install
@needs_basedpyright
def test_the_import_check_fails_on_a_missing_module(tmp_path):
    """The check must be able to fail: a missing module and a missing submodule are reported, and a
    real import beside them is not."""
    bad = tmp_path / "src" / "bad_imports.py"
    bad.parent.mkdir()
    bad.write_text(
        "import attnscope.core.no_such_module\n"
        "from attnscope.core import no_such_submodule\n"
        "from attnscope.core.units import format_bytes\n"
    )
    found = _unresolved_attnscope_imports(tmp_path, include=[str(bad.parent)])
    assert [f.split(":")[1] for f in found] == ["1", "2"], found
