"""Lists with one source: what a backend, an export format or a remote analysis needs is written in one
place (README, "How it works"), and everything else derives it.

* backends: :mod:`attnscope.core.backend_registry` is the only place a backend's name is typed
  (an AST scan of core/ and app/; a module name such as ``find_spec("torch")`` is not a backend name);
* remote analyses: every ``@remotable`` function in the tree is one the engine server offers
  (:func:`attnscope.core.analysis.remotable.served`);
* :class:`attnscope.core.remote.client.RemoteSession` offers :class:`attnscope.core.session.Session`'s
  public surface, with the same signatures.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REGISTRY_FILE = ROOT / "core" / "backend_registry.py"

#: calls whose string argument names a Python module or distribution, not a backend
_MODULE_CALLS = {"find_spec", "import_module", "__import__", "version", "_version"}
#: module names that are not calls: (file, the line stripped) -- the type of an array by its module
_MODULE_NAME_LINES = {
    ("core/remote/wire.py", 'if mod.startswith("torch"):'),
    ("core/remote/wire.py", 'if mod.startswith("mlx"):'),
    ("core/loading/quant_cache.py", '"torch": _version("torch"),'),
    ("core/loading/lean_import.py", '("torch", "torch._prims_common", "torch._refs", "torch._prims"),'),
}


def _py_files():
    for folder in ("core", "app"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def _scan_text(src: str, rel: str, names: set[str]) -> list[str]:
    """'rel:line: source' for each string constant of ``src`` equal to a backend name, outside
    module-name positions."""
    lines = src.splitlines()
    tree = ast.parse(src)
    allowed: set[int] = set()  # ids of constants in a module-name position
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in _MODULE_CALLS:
                allowed.update(id(a) for a in node.args)
            elif (
                name == "get" and isinstance(fn, ast.Attribute) and getattr(fn.value, "attr", "") == "modules"
            ):
                allowed.update(id(a) for a in node.args[:1])  # sys.modules.get("torch")
        elif isinstance(node, ast.Compare) and any(
            isinstance(c, ast.Attribute) and c.attr == "modules" for c in node.comparators
        ):
            allowed.add(id(node.left))  # "torch" in sys.modules
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in allowed:
            line = lines[node.lineno - 1].strip()
            if (rel, line) not in _MODULE_NAME_LINES:
                found.append(f"{rel}:{node.lineno}: {line}")
    return sorted(found, key=lambda h: int(h.split(":")[1]))


def test_backend_names_are_typed_only_in_the_registry():
    """Adding a backend is one register() call: no other module of core/ or app/ types a backend's
    name (derive it: registry.names(), registry.DEFAULT, a spec's label or attributes)."""
    from attnscope.core import backend_registry as registry

    names = set(registry.names())
    assert names >= {"torch", "mlx"}
    found = [
        hit
        for f in _py_files()
        if f != REGISTRY_FILE
        for hit in _scan_text(f.read_text(), f.relative_to(ROOT).as_posix(), names)
    ]
    assert found == [], "\n".join(found)


def test_the_name_scan_finds_a_typed_name():
    """The scan must be able to fail: a default, a comparison and a tuple of names are found; a
    module name handed to find_spec, ``in sys.modules``, ``sys.modules.get`` and a docstring that mentions
    torch are not."""
    src = (
        '"""Runs on torch."""\nimport importlib.util\nimport sys\n\n\n'
        'def f(backend="torch"):\n'
        '    return backend == "mlx" or ("torch", "mlx") or importlib.util.find_spec("torch")\n'
        '\n\nLOADED = "mlx" in sys.modules\nTORCH = sys.modules.get("torch")\nX = other.get("mlx")\n'
    )
    hits = _scan_text(src, "core/x.py", {"torch", "mlx"})
    assert [h.split(":")[1] for h in hits] == ["6", "7", "7", "7", "12"], hits


# -- remote analyses ------------------------------------------------------------------------------------
def _remotable_functions() -> list[str]:
    """Qualified names of every function decorated ``@remotable`` in core/ and app/ (AST)."""
    found = []
    for f in _py_files():
        tree = ast.parse(f.read_text())
        module = "attnscope." + ".".join(f.relative_to(ROOT).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names = {
                    d.id if isinstance(d, ast.Name) else getattr(d, "attr", "") for d in node.decorator_list
                }
                if "remotable" in names:
                    found.append(f"{module}.{node.name}")
    return sorted(found)


def test_every_remotable_function_is_served():
    """Marking a function ``@remotable`` is all it takes: the engine server (which calls
    ``served()`` at start) offers every one in the tree, and nothing else."""
    from attnscope.core.analysis.remotable import served

    marked = _remotable_functions()
    assert len(marked) >= 20  # aggregate, value_weighted, compare_run_b, gqa, roles, sinks, ...
    assert sorted(served()) == marked


@pytest.mark.slow  # a fresh interpreter imports torch, transformers and every analysis module
def test_the_server_offers_what_served_lists():
    """The engine server starts from ``served()``: a fresh interpreter that builds one (no model)
    has every @remotable function registered, including modules nothing else imported."""
    import subprocess
    import sys

    pytest.importorskip("zmq")
    probe = (
        "from attnscope.core.remote.server import EngineServer\n"
        "from attnscope.core.analysis import remotable\n"
        "s = EngineServer(None, port=0)\n"
        "print(len(remotable.REGISTRY))\n"
        "s.close()\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[-1]) == len(_remotable_functions())


# -- RemoteSession keeps Session's surface --------------------------------------------------------------
def _instance_attributes(cls) -> set[str]:
    """Public names the class's methods assign on ``self`` (AST of its source)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"
                    and isinstance(sub.ctx, ast.Store)
                    and not sub.attr.startswith("_")
                ):
                    names.add(sub.attr)
    return names


def test_remote_session_offers_session_s_public_surface():
    """Every public method, property and attribute of Session exists on RemoteSession with the same
    kind and the same parameters (names, order, defaults), so a window or CLI command written for one
    runs on the other. ``Session.load`` is the one exception: a remote session is opened by
    ``RemoteSession.connect`` and loads through ``load_model``."""
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

    public = {n for n in dir(Session) if not n.startswith("_")} - {"load"}
    missing = sorted(n for n in public if not hasattr(RemoteSession, n))
    assert missing == []
    for n in sorted(public):
        a, b = inspect.getattr_static(Session, n), inspect.getattr_static(RemoteSession, n)
        if isinstance(a, property) or isinstance(b, property):
            assert isinstance(a, property) and isinstance(b, property), n
        elif callable(a):
            assert callable(b), n
            pa, pb = inspect.signature(a).parameters, inspect.signature(b).parameters
            assert [(p.name, p.kind, p.default) for p in pa.values()] == [
                (p.name, p.kind, p.default) for p in pb.values()
            ], f"{n}: Session{inspect.signature(a)} vs RemoteSession{inspect.signature(b)}"
    attrs = _instance_attributes(Session) - public
    remote = _instance_attributes(RemoteSession) | {n for n in dir(RemoteSession) if not n.startswith("_")}
    assert sorted(attrs - remote) == []


# -- export formats -------------------------------------------------------------------------------------
def test_export_formats_come_from_one_table():
    """The CLI's --out/--format checks and help, the window's menus, file filters and batch list all
    read attnscope.core.io.formats: what the table holds is what they offer."""
    import argparse

    from attnscope.core.cli.commands import export as cli_export
    from attnscope.core.io import data_writers, formats

    assert formats.DATA_FORMATS == ("npy", "csv", "safetensors")
    assert formats.BATCH_FORMATS == ("png", "svg", "pdf", "npy", "csv", "safetensors")
    assert formats.ANIMATION_FORMATS == ("gif", "mp4")
    assert cli_export.FORMATS == tuple(f".{s}" for s in formats.BATCH_FORMATS)
    p = argparse.ArgumentParser()
    cli_export.add_arguments(p)
    fmt = next(a for a in p._actions if a.dest == "format")
    assert tuple(fmt.choices) == formats.BATCH_FORMATS
    assert data_writers.DATA_FORMATS is formats.DATA_FORMATS
    assert formats.listing("data", last=" or ") == ".npy, .csv or .safetensors"
    assert formats.file_filter("image") == "PNG image (*.png);;SVG vector image (*.svg);;PDF document (*.pdf)"


def test_the_window_lists_the_table_s_formats():
    pytest.importorskip("PySide6")
    from attnscope.app import export_actions, export_dialogs
    from attnscope.core.io import formats

    offered = [fmt for _text, fmt, _figure in export_dialogs.BatchExportDialog.HEAD_FORMATS]
    assert sorted(set(offered)) == sorted(formats.BATCH_FORMATS)
    assert (
        export_actions.DATA_FILTERS == "NumPy array (*.npy);;CSV table (*.csv);;safetensors (*.safetensors)"
    )
    assert export_dialogs.ANIMATION_SUFFIXES == (".gif", ".mp4")
