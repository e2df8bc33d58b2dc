"""What keeps mypy's view of the code from eroding (the check itself: tests/integration/test_tooling.py).

* every ``session`` parameter in core/ is annotated (``Session``, or ``Session | RemoteSession`` where
  a remote engine's session is accepted too), so the analysis code is checked against the session's
  real attributes and not against ``Any``;
* no module is skipped by mypy (pyproject ``[tool.mypy]`` has no override with ``ignore_errors = true``).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def unannotated_sessions(source: str, filename: str = "<source>") -> list[str]:
    """``"file:line name"`` for each function parameter named ``session`` with no annotation, or
    annotated with ``Any``, in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        a = node.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
            if arg is None or arg.arg != "session":
                continue
            ann = arg.annotation
            if ann is None or "Any" in ast.unparse(ann):
                found.append(f"{filename}:{arg.lineno} {getattr(node, 'name', 'lambda')}")
    return found


def test_every_session_parameter_in_core_is_annotated():
    files = sorted((ROOT / "core").rglob("*.py"))
    assert len(files) > 50  # the walk sees the tree
    missing = [
        hit
        for f in files
        for hit in unannotated_sessions(f.read_text(encoding="utf-8"), f.relative_to(ROOT).as_posix())
    ]
    assert not missing, (
        "annotate these `session` parameters (Session / Session | RemoteSession):\n" + "\n".join(missing)
    )


def test_the_session_check_finds_a_bare_or_any_parameter():
    src = (
        "from typing import Any\n"
        "def a(session, n: int): ...\n"
        "def b(x, *, session=None): ...\n"
        "def c(session: Any): ...\n"
        "def d(session: 'Session'): ...\n"
        "f = lambda session: session\n"
        "class K:\n"
        "    def m(self, session: Session | RemoteSession | None = None): ...\n"
    )
    assert unannotated_sessions(src, "x.py") == ["x.py:2 a", "x.py:3 b", "x.py:4 c", "x.py:6 lambda"]


def ignored_modules(pyproject: str) -> list[str]:
    """The modules of the mypy overrides in ``pyproject`` (TOML text) that set ``ignore_errors = true``."""
    overrides = tomllib.loads(pyproject).get("tool", {}).get("mypy", {}).get("overrides", [])
    out: list[str] = []
    for o in overrides:
        if o.get("ignore_errors"):
            mods = o["module"]
            out += [mods] if isinstance(mods, str) else mods
    return out


def test_mypy_skips_no_module():
    """Every module of core/ and app/ is type-checked: fix a module's errors rather than list it."""
    assert ignored_modules((ROOT / "pyproject.toml").read_text(encoding="utf-8")) == []


def test_the_skip_check_reads_an_override_list():
    toml = (
        "[tool.mypy]\npackages = ['attnscope.app']\n"
        "[[tool.mypy.overrides]]\nmodule = ['attnscope.app.a', 'attnscope.app.b']\nignore_errors = true\n"
        "[[tool.mypy.overrides]]\nmodule = 'attnscope.app.c'\nignore_errors = true\n"
        "[[tool.mypy.overrides]]\nmodule = ['torchao']\nignore_missing_imports = true\n"
    )
    assert ignored_modules(toml) == ["attnscope.app.a", "attnscope.app.b", "attnscope.app.c"]
