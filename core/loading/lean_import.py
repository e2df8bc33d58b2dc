"""Import transformers without the work a local load never needs (docs/benchmarks.md, "Start-up").

:func:`prepare` must run before transformers is first imported (``Session.load`` calls it). It
changes three things of that import, none of what transformers does when a feature is used:

* **The model-zoo scan once, and kept.** transformers builds its lazy-module table by reading every
  file under ``transformers/models`` (``create_import_structure_from_path``, behind an ``lru_cache``
  of 128 entries for about 560 folders), once from ``transformers/__init__.py`` and again from
  ``transformers/models/__init__.py``: the small cache has lost the first scan by then. The cache is
  made unbounded, so the second scan is a hit, and its result is kept in the cache folder for the
  next start while transformers' version and folder are unchanged (:class:`_ScanCache`).
* **torchao and accelerate when used.** ``transformers.quantizers.quantizer_torchao`` imports torchao
  at module level (and with it torch's compiler, about 1.3 s on a 2-core machine); a dozen modules
  (``modeling_utils``, ``integrations.accelerate``, ``integrations.peft``, ``generation.utils``, the
  losses) import accelerate. Only a transformers module's own module-level ``if
  is_torchao_available():``/``if is_accelerate_available():`` whose block holds nothing but
  ``from … import …`` (and no ``else``) is answered False; each name that block would have imported
  becomes a :class:`Deferred`, which imports the library when called or read. A torchao-quantised
  checkpoint or a ``device_map`` load imports the library then, as before
  (tests/integration/test_startup_imports.py). Which blocks qualify is read from the module's source
  once per install and kept in the cache folder (:class:`_BlockCache`).

* **torch's compiler when used.** A few transformers modules mark functions for ``torch.compile``
  as they are defined (``@torch._dynamo.allow_in_graph``, ``@torch._dynamo.assume_constant_result``,
  ``@torch.compiler.allow_in_graph``, ``@torch.compiler.disable``) and ``masking_utils`` imports
  ``TransformGetItemToIndex`` from ``torch._dynamo``: each imports torch's compiler (dynamo, inductor,
  about 0.6 s of CPU on a 2-core machine), which a model that is never compiled does not use. While a
  transformers module executes and ``torch._dynamo`` is not imported, those names are stand-ins
  (:class:`_DynamoStandIn`): ``assume_constant_result`` sets the mark as torch does, ``allow_in_graph``
  keeps the function and registers it with dynamo when dynamo is imported (by ``torch.compile`` or
  anything else), ``disable`` wraps the function so that, once dynamo is imported, calls go through
  ``torch._dynamo.disable`` (before that nothing can be compiling); ``TransformGetItemToIndex`` is a
  :class:`Deferred`. Any other use of ``torch._dynamo`` imports it (tests/integration/test_startup_imports.py).

A transformers already imported is left as it is (:func:`prepare` returns False).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import marshal
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

#: the availability checks whose module-level answer is deferred (the library they guard)
DEFERRED_CHECKS = ("is_torchao_available", "is_accelerate_available")
_IMPORT_UTILS = "transformers.utils.import_utils"
_lock = threading.Lock()
_prepared: list[bool] = []
#: module name -> the (module, name, bound_as) its guarded block did not import
_pending: dict[str, list[tuple[str, str, str]]] = {}


#: a module-level ``if <check>(…):``'s imports: ``(level, module, ((name, as_name or None), …))`` per
#: ``from … import …``, or None when the block holds anything else (or has an ``else``)
Imports = tuple[tuple[int, str, tuple[tuple[str, str | None], ...]], ...] | None


def block_table(tree: ast.Module) -> dict[int, tuple[str, Imports]]:
    """Each line of the test of a module-level ``if name(…):`` of ``tree`` -> ``(name, its imports)``
    (:data:`Imports`; None unless the block is only ``from … import …`` with no ``else``)."""
    table: dict[int, tuple[str, Imports]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Call)):
            continue
        func = node.test.func
        name = func.id if isinstance(func, ast.Name) else ""
        imports: Imports = None
        if not node.orelse and all(isinstance(stmt, ast.ImportFrom) for stmt in node.body):
            imports = tuple(
                (stmt.level, stmt.module or "", tuple((a.name, a.asname) for a in stmt.names))
                for stmt in node.body
                if isinstance(stmt, ast.ImportFrom)
            )
        for line in range(node.test.lineno, (node.test.end_lineno or node.test.lineno) + 1):
            table.setdefault(line, (name, imports))
    return table


def deferrable_block(tree: ast.Module, line: int, check: str) -> Imports:
    """The imports (:data:`Imports`) of the module-level ``if <check>(…):`` of ``tree`` whose test is
    on ``line``, when that block holds nothing but ``from … import …`` and has no ``else``; None
    otherwise (the check then answers as it would)."""
    name, imports = block_table(tree).get(line, ("", None))
    return imports if name == check else None


BLOCKS_FILE = "transformers_deferrable_blocks.marshal"


class _BlockCache:
    """:func:`block_table` of each transformers file a check is called from, kept in the cache folder
    (:data:`BLOCKS_FILE`, marshal) per file while its size and time are unchanged: parsing
    ``modeling_utils.py``, ``generation/utils.py`` and the others took about 0.25 s of each start.
    Any failure to read or write the file only means the files are parsed."""

    def __init__(self) -> None:
        self.tables: dict[str, tuple[int, int, dict]] = {}
        self.read = False

    def _file(self) -> str:
        from attnscope.core.loading.cache_folder import cache_root

        return os.path.join(cache_root(), BLOCKS_FILE)

    def _load(self) -> None:
        self.read = True
        try:
            with open(self._file(), "rb") as f:
                version, tables = marshal.load(f)
            if version == sys.version and isinstance(tables, dict):
                self.tables = tables
        except (OSError, ValueError, EOFError, TypeError):
            pass

    def get(self, path: str) -> dict[int, tuple[str, Imports]]:
        if not self.read:
            self._load()
        st = os.stat(path)
        hit = self.tables.get(path)
        if hit is not None and hit[0] == st.st_mtime_ns and hit[1] == st.st_size:
            return hit[2]
        with open(path, encoding="utf-8") as f:
            table = block_table(ast.parse(f.read()))
        self.tables[path] = (st.st_mtime_ns, st.st_size, table)
        self._save()
        return table

    def _save(self) -> None:
        try:
            target = self._file()
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = f"{target}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                marshal.dump((sys.version, self.tables), f)
            os.replace(tmp, target)
        except (OSError, ValueError):
            pass


_blocks = _BlockCache()


def _deferred_check(real, name: str):
    """``real`` (an ``is_*_available``), answering False to a transformers module's module-level
    ``if`` that only imports names (:func:`deferrable_block`); those names become :class:`Deferred`."""

    @functools.wraps(real)
    def check(*args, **kwargs):
        caller = sys._getframe(1)
        module = caller.f_globals.get("__name__", "")
        path = caller.f_globals.get("__file__")
        if caller.f_code.co_name != "<module>" or not module.startswith("transformers.") or not path:
            return real(*args, **kwargs)
        if not real(*args, **kwargs):
            return False
        try:
            found, block = _blocks.get(path).get(caller.f_lineno, ("", None))
            block = block if found == name else None
        except (OSError, SyntaxError, ValueError):
            block = None
        if block is None:
            return True
        package = caller.f_globals.get("__package__") or module.rpartition(".")[0]
        names = _pending.setdefault(module, [])
        for level, from_module, imported in block:
            source = importlib.util.resolve_name("." * level + from_module, package)
            names += [(source, attr, as_name or attr) for attr, as_name in imported]
        return False

    check.deferred = True  # type: ignore[attr-defined]  # marks the wrapper: prepare() runs once
    return check


class Deferred:
    """Stands for ``module.attr`` until used: a call or an attribute read imports ``module`` then.
    (An ``isinstance`` against it would fail: transformers' guarded names are functions, or classes
    of training code that are called or read.)"""

    __slots__ = ("where",)

    def __init__(self, module: str, attr: str) -> None:
        self.where = (module, attr)

    def resolve(self):
        """The real object (imports its module)."""
        module, attr = self.where
        return getattr(importlib.import_module(module), attr)

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.resolve(), name)

    def __repr__(self) -> str:
        return f"<deferred {self.where[0]}.{self.where[1]}>"


def _fill_deferred(module) -> None:
    """Bind a :class:`Deferred` for each name ``module``'s deferred blocks did not import (and, once
    ``transformers.models`` is imported, keep the model-zoo scan)."""
    if module.__name__ == "transformers.models" and _scan_cache:
        _scan_cache[0].save()
    for source, attr, as_name in _pending.pop(module.__name__, ()):
        if as_name not in vars(module):
            setattr(module, as_name, Deferred(source, attr))


SCAN_FILE = "transformers_import_structure.marshal"


def _scan_key(models: str) -> tuple:
    """What the scan of ``models`` (the ``transformers/models`` folder) depends on: Python (the
    marshal format), transformers' version and where it is, the folder's and its index's times."""
    version = getattr(sys.modules.get("transformers"), "__version__", "")
    init = os.path.join(models, "__init__.py")
    return (sys.version, version, models, os.stat(models).st_mtime_ns, os.stat(init).st_mtime_ns)


class _ScanCache:
    """``create_import_structure_from_path`` with an unbounded cache, read from and kept in the cache
    folder (:data:`SCAN_FILE`, marshal: plain dicts, sets and strings) while :func:`_scan_key` holds.
    Any failure to read or write it only means the scan runs."""

    def __init__(self, scan, models: str) -> None:
        #: ``loaded``: the scans were read from the file; ``saved``: this run wrote them
        self.scan, self.models, self.memo, self.loaded, self.saved = scan, models, {}, False, False
        try:
            self.key = _scan_key(models)
            with open(self._file(), "rb") as f:
                key, memo = marshal.load(f)
            if tuple(key) == self.key and isinstance(memo, dict):
                self.memo, self.loaded = memo, True
        except (OSError, ValueError, EOFError, TypeError):
            pass

    @staticmethod
    def _file() -> str:
        from attnscope.core.loading.cache_folder import cache_root

        return os.path.join(cache_root(), SCAN_FILE)

    def __call__(self, module_path):
        path = os.fspath(module_path)
        hit = self.memo.get(path)
        if hit is None:
            hit = self.memo[path] = self.scan(module_path)
        return hit

    def save(self) -> None:
        """Write the scans of this run when they were not read from the file (atomic replace)."""
        if self.loaded or self.saved or not self.memo or not hasattr(self, "key"):
            return
        try:
            target = self._file()
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = f"{target}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                marshal.dump((self.key, self.memo), f)
            os.replace(tmp, target)
            self.saved = True
        except (OSError, ValueError):
            pass


_scan_cache: list[_ScanCache] = []


def _patch_import_utils(iu) -> None:
    scan = iu.create_import_structure_from_path
    models = os.path.join(os.path.dirname(os.path.dirname(iu.__file__)), "models")
    cache = _ScanCache(getattr(scan, "__wrapped__", scan), models)
    _scan_cache.append(cache)
    iu.create_import_structure_from_path = cache
    for check in DEFERRED_CHECKS:
        setattr(iu, check, _deferred_check(getattr(iu, check), check))


_DYNAMO = "torch._dynamo"
#: modules of torch._dynamo a transformers module imports names from at module level (stand-ins
#: whose names are :class:`Deferred`)
DYNAMO_STUBS = ("torch._dynamo._trace_wrapped_higher_order_op",)
#: functions marked ``allow_in_graph`` before dynamo was imported: registered when it is
_allowed_in_graph: list[Callable] = []
_MISSING = object()


def _real_dynamo():
    """``torch._dynamo`` itself, imported now if need be; the stand-ins in its place (and in its
    modules' places, :data:`DYNAMO_STUBS`) are dropped first, so dynamo imports its own modules."""
    module = sys.modules.get(_DYNAMO)
    if isinstance(module, _DynamoStandIn):
        for name in (_DYNAMO, *DYNAMO_STUBS):
            if isinstance(sys.modules.get(name), _DynamoStandIn | _DeferredNames):
                del sys.modules[name]
        torch = sys.modules.get("torch")
        if torch is not None and vars(torch).get("_dynamo") is module:
            delattr(torch, "_dynamo")
    return importlib.import_module(_DYNAMO)


def _dynamo_imported() -> bool:
    module = sys.modules.get(_DYNAMO)
    return module is not None and not isinstance(module, _DynamoStandIn)


def _allow_in_graph(fn):
    """``torch._dynamo.allow_in_graph`` before dynamo is imported: the same function back, registered
    with dynamo when it is imported (:func:`_register_allowed`)."""
    if _dynamo_imported():
        return _real_dynamo().allow_in_graph(fn)
    if isinstance(fn, list | tuple):
        return [_allow_in_graph(f) for f in fn]
    if not callable(fn):
        raise AssertionError("allow_in_graph expects a callable")
    _allowed_in_graph.append(fn)
    return fn


def _assume_constant_result(fn):
    """``torch._dynamo.assume_constant_result``: the mark dynamo reads, set as torch sets it."""
    fn._dynamo_marked_constant = True
    return fn


def _disable(fn=None, recursive=True, **kwargs):
    """``torch._dynamo.disable`` (and ``torch.compiler.disable``) before dynamo is imported: ``fn``
    wrapped so that a call runs it as it is while dynamo is not imported (nothing can be compiling
    then), and through ``torch._dynamo.disable(fn, recursive, **kwargs)`` once it is."""
    if _dynamo_imported():
        return _real_dynamo().disable(fn, recursive, **kwargs)
    if fn is None:
        return functools.partial(_disable, recursive=recursive, **kwargs)
    real: list[Callable] = []

    @functools.wraps(fn)
    def disabled(*args, **kw):
        if not _dynamo_imported():
            return fn(*args, **kw)
        if not real:
            real.append(_real_dynamo().disable(fn, recursive, **kwargs))
        return real[0](*args, **kw)

    return disabled


class _DynamoStandIn(types.ModuleType):
    """``torch._dynamo`` before it is imported, within :class:`_CompilerStandIns`: the decorators
    transformers applies at module level and the ``disable`` torch's own lazily-disabled functions
    (``torch._compile._disable_dynamo``: the meta-device references a model built on the meta device
    runs) ask for; any other name imports the real module (and drops the stand-in)."""

    allow_in_graph = staticmethod(_allow_in_graph)
    assume_constant_result = staticmethod(_assume_constant_result)
    disable = staticmethod(_disable)

    def __getattr__(self, name: str):
        if name.startswith("__") and name != "__path__":  # __file__, … (inspect walks sys.modules)
            raise AttributeError(name)
        return getattr(_real_dynamo(), name)  # __path__: a module of dynamo is being imported


class _DeferredNames(types.ModuleType):
    """A module of ``torch._dynamo`` (:data:`DYNAMO_STUBS`) within :class:`_CompilerStandIns`:
    ``from <it> import X`` binds a :class:`Deferred`."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return Deferred(self.__name__, name)


def _register_allowed(dynamo) -> None:
    """Dynamo was imported: register what ``allow_in_graph`` kept (as it would have done then)."""
    while _allowed_in_graph:
        dynamo.allow_in_graph(_allowed_in_graph.pop(0))


class _CompilerStandIns:
    """While dynamo is not imported: ``torch._dynamo`` (in ``sys.modules`` and on ``torch``),
    ``torch.compiler.allow_in_graph``/``disable`` and the :data:`DYNAMO_STUBS` are stand-ins; on exit
    what was there is put back, only where the stand-in is still in place (nested uses, and a real
    import of dynamo meanwhile, are left alone). Re-entrant; meant for the thread that loads."""

    def __enter__(self):
        self.undo: list[tuple[Any, str, Any, Any]] = []
        torch = sys.modules.get("torch")
        compiler = sys.modules.get("torch.compiler")
        if torch is None or compiler is None or _dynamo_imported():
            return self
        standin = sys.modules.get(_DYNAMO)
        if not isinstance(standin, _DynamoStandIn):
            standin = _DynamoStandIn(_DYNAMO)
        self._swap(sys.modules, _DYNAMO, standin)
        self._swap(torch, "_dynamo", standin)
        self._swap(compiler, "allow_in_graph", _allow_in_graph)
        self._swap(compiler, "disable", _disable)
        for name in DYNAMO_STUBS:
            if name not in sys.modules:
                self._swap(sys.modules, name, _DeferredNames(name))
        return self

    def _swap(self, owner, name: str, new) -> None:
        where = owner if isinstance(owner, dict) else vars(owner)
        old = where.get(name, _MISSING)
        if isinstance(owner, dict):
            owner[name] = new
        else:
            setattr(owner, name, new)
        self.undo.append((owner, name, new, old))

    def __exit__(self, *exc) -> None:
        for owner, name, new, old in reversed(self.undo):
            where = owner if isinstance(owner, dict) else vars(owner)
            if where.get(name) is not new:
                continue
            if isinstance(owner, dict):
                if old is _MISSING:
                    del owner[name]
                else:
                    owner[name] = old
            elif old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)


def compiler_deferred() -> _CompilerStandIns:
    """A context within which torch's compiler is not imported by what only marks functions for it
    (the module's docstring): :func:`attnscope.core.backends.torch_load.load_torch` builds the model
    within it (torch's meta-device references ask dynamo to leave them alone)."""
    return _CompilerStandIns()


class _Then(importlib.abc.Loader):
    """A loader that runs ``then(module)`` after the real loader executed the module."""

    def __init__(self, loader, then) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        if module.__name__.startswith("transformers."):
            with _CompilerStandIns():
                self._loader.exec_module(module)
        else:
            self._loader.exec_module(module)
        self._then(module)

    def __getattr__(self, name):  # get_source, get_resource_reader, … of the real loader
        return getattr(self._loader, name)


class _Hooks(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        then: Callable[[Any], None]
        if fullname == _IMPORT_UTILS:
            then = _patch_import_utils
        elif fullname == _DYNAMO:
            then = _register_allowed
        elif fullname.startswith("transformers."):
            then = _fill_deferred
        else:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Then(spec.loader, then)
        return spec


def prepare() -> bool:
    """Make transformers' first import skip the second model-zoo scan and import torchao and
    accelerate only when used (the module's docstring). Idempotent, thread-safe; returns True when
    the hooks are in place, False when transformers was already imported (nothing changed)."""
    with _lock:
        if _prepared:
            return _prepared[0]
        if "transformers" in sys.modules:
            _prepared.append(False)
            return False
        sys.meta_path.insert(0, _Hooks())
        _prepared.append(True)
        return True
