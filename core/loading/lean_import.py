"""Import transformers without the work a local load never needs (docs/benchmarks.md, "Start-up").

:func:`prepare` must run before transformers is first imported (``Session.load`` calls it). It
changes these things of that import, none of what transformers does when a feature is used:

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

* **torch's distributed tensors when used.** transformers' loading code imports
  ``torch.distributed.tensor`` (``DTensor``, the placements), FSDP and functional collectives at
  module level (``distributed.sharding_utils``, ``tensor_parallel``, ``expert_parallel``, ``fsdp``):
  about 0.3 s, and sympy with them. While a transformers module executes, its imports of those
  modules not imported give stand-ins (:func:`lazy_name`): a call or an attribute read imports the
  module and uses the real object, ``isinstance`` is False until it is imported (no ``DTensor`` can
  exist before), and once it is, the stand-ins in transformers' globals are replaced by the real
  names. The blocks that register the tensor- and expert-parallel styles (their values are built from
  torch's placements) run when the registry is first used (:class:`_RegistersWhenUsed`), and
  ``is_dtensor`` answers False while ``torch.distributed.tensor`` is not imported.
* **sympy when used.** Building the model on the meta device runs torch's Python references, which
  import torch's symbolic shapes (and sympy, about 0.4 s) for ``torch._check``, broadcasting and
  ``isinstance(x, sympy.Basic)``. Within :func:`build_deferred` those imports, by those torch modules,
  give stand-ins that answer plain values as torch's functions do (:data:`SYMBOLIC_SHAPES_NAMES`),
  and anything else asks the real module (imported then). Nothing else sees a stand-in: they are
  answered by ``builtins.__import__`` to the named callers only (:func:`_lean_import`).

The default model loaded this way has the weights and logits of a plain transformers load, bit for
bit (tests/integration/test_startup_imports.py). A transformers already imported is left as it is
(:func:`prepare` returns False).
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import marshal
import operator
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

#: the availability checks whose module-level answer is deferred -> the blocks they answer False to:
#: ``"imports"`` (only ``from … import …``: each name a :class:`Deferred`) or ``"registers"`` (only
#: ``<registry>.register(…)`` calls: run when that registry is first used, :class:`_RegistersWhenUsed`)
DEFERRED_CHECKS = {
    "is_torchao_available": "imports",
    "is_accelerate_available": "imports",
    "is_torch_distributed_available": "registers",
}
_IMPORT_UTILS = "transformers.utils.import_utils"
_lock = threading.Lock()
_prepared: list[bool] = []
#: module name -> the (module, name, bound_as) its guarded block did not import
_pending: dict[str, list[tuple[str, str, str]]] = {}
#: module name -> the (registry name, block source, first line) of its guarded blocks not run yet
_pending_registers: dict[str, list[tuple[str, str, int]]] = {}


#: a module-level ``if <check>(…):``'s imports: ``(level, module, ((name, as_name or None), …))`` per
#: ``from … import …``, or None when the block holds anything else (or has an ``else``)
Imports = tuple[tuple[int, str, tuple[tuple[str, str | None], ...]], ...] | None
#: a module-level ``if <check>(…):`` that only calls ``<registry>.register(…)`` (one registry, no
#: ``else``): ``(registry name, the block's statements as source, the block's first line)``; else None
Registers = tuple[str, str, int] | None


def _registers(node: ast.If) -> Registers:
    names = set()
    for stmt in node.body:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        func = call.func if isinstance(call, ast.Call) else None
        if not (
            isinstance(func, ast.Attribute) and func.attr == "register" and isinstance(func.value, ast.Name)
        ):
            return None
        names.add(func.value.id)
    if node.orelse or len(names) != 1:
        return None
    source = ast.unparse(ast.Module(body=node.body, type_ignores=[]))
    return names.pop(), source, node.body[0].lineno


def block_table(tree: ast.Module) -> dict[int, tuple[str, Imports, Registers]]:
    """Each line of the test of a module-level ``if name(…):`` of ``tree`` -> ``(name, its imports,
    its registrations)`` (:data:`Imports`: None unless the block is only ``from … import …`` with no
    ``else``; :data:`Registers`: None unless it only calls one registry's ``register``)."""
    table: dict[int, tuple[str, Imports, Registers]] = {}
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
        registers = _registers(node)
        for line in range(node.test.lineno, (node.test.end_lineno or node.test.lineno) + 1):
            table.setdefault(line, (name, imports, registers))
    return table


def deferrable_block(tree: ast.Module, line: int, check: str) -> Imports:
    """The imports (:data:`Imports`) of the module-level ``if <check>(…):`` of ``tree`` whose test is
    on ``line``, when that block holds nothing but ``from … import …`` and has no ``else``; None
    otherwise (the check then answers as it would)."""
    name, imports, _ = block_table(tree).get(line, ("", None, None))
    return imports if name == check else None


def registering_block(tree: ast.Module, line: int, check: str) -> Registers:
    """The registrations (:data:`Registers`) of the module-level ``if <check>(…):`` of ``tree`` whose
    test is on ``line``, when that block only calls one registry's ``register`` (no ``else``)."""
    name, _, registers = block_table(tree).get(line, ("", None, None))
    return registers if name == check else None


BLOCKS_FILE = "transformers_deferrable_blocks.marshal"
#: what the file's tables were made by: Python (marshal) and the table's layout
_BLOCKS_VERSION = f"{sys.version} blocks/2"


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
            if version == _BLOCKS_VERSION and isinstance(tables, dict):
                self.tables = tables
        except (OSError, ValueError, EOFError, TypeError):
            pass

    def get(self, path: str) -> dict[int, tuple[str, Imports, Registers]]:
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
                marshal.dump((_BLOCKS_VERSION, self.tables), f)
            os.replace(tmp, target)
        except (OSError, ValueError):
            pass


_blocks = _BlockCache()


def _deferred_check(real, name: str):
    """``real`` (an ``is_*_available``), answering False to a transformers module's module-level
    ``if`` whose block is of the kind :data:`DEFERRED_CHECKS` names for it: an import-only block's
    names become :class:`Deferred`; a registering block runs when its registry is first used."""
    kind = DEFERRED_CHECKS[name]

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
            found, imports, registers = _blocks.get(path).get(caller.f_lineno, ("", None, None))
        except (OSError, SyntaxError, ValueError):
            return True
        if found != name:
            return True
        if kind == "registers":
            if registers is None:
                return True
            _pending_registers.setdefault(module, []).append(registers)
            return False
        if imports is None:
            return True
        package = caller.f_globals.get("__package__") or module.rpartition(".")[0]
        names = _pending.setdefault(module, [])
        for level, from_module, imported in imports:
            source = importlib.util.resolve_name("." * level + from_module, package)
            names += [(source, attr, as_name or attr) for attr, as_name in imported]
        return False

    check.deferred = True  # type: ignore[attr-defined]  # marks the wrapper: prepare() runs once
    return check


class _RegistersWhenUsed(dict):
    """A transformers registry's class-wide mapping (``GeneralInterface._global_mapping``, e.g. the
    tensor-parallel styles) with registering blocks not run yet: any use of the mapping (a read, a
    write, ``in``, iteration) first runs them, in the order their modules were imported, in their
    modules' globals, so the mapping then holds what transformers' import would have put there.
    Their values (``ColwiseParallel(output_layouts=Shard(-1))``, …) are built from torch's
    distributed tensors, which a local load never uses (:func:`_distributed_standins`)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        #: (module globals, code) per block not run yet
        self.blocks: list[tuple[dict, types.CodeType]] = []
        self.running = False

    def run_blocks(self) -> None:
        """Run the registering blocks not run yet, each once, one after the other (a block's own
        registrations go straight in)."""
        if self.running:
            return
        self.running = True
        try:
            while self.blocks:
                where, code = self.blocks.pop(0)
                exec(code, where)
        finally:
            self.running = False


def _when_used(method: str):
    real = getattr(dict, method)

    def use(self, *args, **kwargs):
        if self.blocks and not self.running:
            self.run_blocks()
        return real(self, *args, **kwargs)

    use.__name__ = method
    return use


for _method in (
    "__getitem__", "__contains__", "__iter__", "__len__", "__repr__", "__eq__", "__ne__", "__or__",
    "__ior__", "__reversed__", "__setitem__", "__delitem__", "keys", "values", "items", "get", "pop",
    "popitem", "setdefault", "update", "clear", "copy",
):  # fmt: skip
    setattr(_RegistersWhenUsed, _method, _when_used(_method))


def _defer_registers(module, registry_name: str, source: str, line: int) -> None:
    """Keep a registering block of ``module`` (:data:`Registers`) until its registry is used; a
    registry that is not a ``GeneralInterface`` (or anything unexpected) runs it now."""
    code = compile("\n" * (line - 1) + source, module.__file__ or module.__name__, "exec")
    where = vars(module)
    registry = where.get(registry_name)
    general = getattr(sys.modules.get("transformers.utils.generic"), "GeneralInterface", None)
    mapping, owner = None, None
    if general is not None and isinstance(registry, general):
        owner = next((c for c in type(registry).__mro__ if "_global_mapping" in vars(c)), None)
        mapping = vars(owner).get("_global_mapping") if owner is not None else None
    if owner is None or not isinstance(mapping, dict):
        exec(code, where)
        return
    if not isinstance(mapping, _RegistersWhenUsed):
        mapping = _RegistersWhenUsed(mapping)
        type.__setattr__(owner, "_global_mapping", mapping)
    mapping.blocks.append((where, code))


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
    for registry_name, source, line in _pending_registers.pop(module.__name__, ()):
        _defer_registers(module, registry_name, source, line)
    _wrap_dtensor_checks(module)


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


class _Swaps:
    """Names put in place (``sys.modules`` entries, module attributes) and put back on exit, only
    where what was put is still there (nested uses, and a real import meanwhile, are left alone)."""

    undo: list[tuple[Any, str, Any, Any]]

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


class _CompilerStandIns(_Swaps):
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


_DISTRIBUTED = "torch.distributed"
#: torch's distributed-tensor and FSDP modules that transformers modules import names from at module
#: level (``distributed.sharding_utils``, ``distributed.tensor_parallel``, ``distributed.fsdp``, …):
#: stand-ins while a transformers module executes and they are not imported (:func:`_distributed_standins`)
DISTRIBUTED_STUBS = (
    "torch.distributed.tensor",
    "torch.distributed.tensor._utils",
    "torch.distributed.tensor.placement_types",
    "torch.distributed._composable.fsdp",
    "torch.distributed.fsdp",
    "torch.distributed._functional_collectives",
)
_SYMPY = "sympy"
_SYMBOLIC_SHAPES = "torch.fx.experimental.symbolic_shapes"


def _plain(value) -> bool:
    """A plain Python bool, int or float, or a tuple/list (``torch.Size``) of them: no symbolic value."""
    if isinstance(value, tuple | list):
        return all(_plain(v) for v in value)
    return type(value) in (bool, int, float)


def _plain_first(name: str, plain: Callable) -> Callable:
    """``symbolic_shapes.<name>`` while that module is not imported: ``plain`` (what torch's function
    does with plain values, :func:`_plain`) when every argument is plain; torch's own otherwise."""

    def standin(*args, **kwargs):
        if _plain(args) and _plain(tuple(kwargs.values())):
            return plain(*args, **kwargs)
        return getattr(_real_module(_SYMBOLIC_SHAPES), name)(*args, **kwargs)

    standin.__name__ = standin.__qualname__ = name
    return standin


def _bool(a, *_skip):
    """``expect_true``/``guard_or_false``/``guard_or_true``/``statically_known_true`` of a plain value:
    a bool is its own answer; anything else is refused as torch refuses it (its own function)."""
    if type(a) is not bool:
        raise _Refused
    return a


def _sym_eq(x, y):
    """``sym_eq`` of plain values: torch's recursion over tuples/lists, ``==`` of ints."""
    if isinstance(x, tuple | list) and isinstance(y, tuple | list):
        if len(x) != len(y):
            return False
        return functools.reduce(operator.and_, map(_sym_eq, x, y), True)
    if type(x) in (int, bool) and type(y) in (int, bool):
        return x == y
    raise _Refused


def _reduce(op):
    """``sym_and``/``sym_or`` of plain values: ``op`` over the arguments, left to right, as torch's."""

    def reduce(x, *others):
        for y in others:
            x = op(x, y)
        return x

    return reduce


class _Refused(Exception):
    """A plain value torch's function would refuse: its own function is asked (and raises)."""


def _or_real(name: str, plain: Callable) -> Callable:
    def answer(*args, **kwargs):
        try:
            return plain(*args, **kwargs)
        except _Refused:
            return getattr(_real_module(_SYMBOLIC_SHAPES), name)(*args, **kwargs)

    return _plain_first(name, answer)


#: the functions of torch's symbolic shapes that building a model on the meta device asks (torch's
#: Python references: ``torch._check``, broadcasting, contiguity, ``sym_eq`` of shapes), for plain values
SYMBOLIC_SHAPES_NAMES: dict[str, Callable] = {
    "expect_true": _or_real("expect_true", _bool),
    "guard_or_false": _or_real("guard_or_false", _bool),
    "guard_or_true": _or_real("guard_or_true", _bool),
    "statically_known_true": _or_real("statically_known_true", _bool),
    "is_nested_int": _plain_first("is_nested_int", lambda s: False),
    "sym_eq": _or_real("sym_eq", _sym_eq),
    "sym_and": _plain_first("sym_and", _reduce(operator.and_)),
    "sym_or": _plain_first("sym_or", _reduce(operator.or_)),
}


#: modules stood in for while a model is built (:class:`_BuildStandIns`) -> (the callers that get
#: stand-ins: a name ending in "." is a prefix, else that module; the names they get, others being
#: :func:`lazy_name`). Building on the meta device runs torch's Python references, which import
#: torch's symbolic shapes (and sympy with it, about 0.4 s of a start) for ``torch._check``'s
#: ``expect_true``, broadcasting and contiguity, and sympy for an ``isinstance(x, sympy.Basic)`` in type
#: promotion; with no symbolic value in play (none can exist before they are imported) plain values
#: answer alone (:data:`SYMBOLIC_SHAPES_NAMES`).
BUILD_STUBS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    _SYMPY: (("torch._prims_common",), {}),
    _SYMBOLIC_SHAPES: (
        ("torch", "torch._prims_common", "torch._refs", "torch._prims"),
        SYMBOLIC_SHAPES_NAMES,
    ),
}
#: (module, name) -> its stand-in (:class:`_LazyName`), one per name, while not bound to the real one
_lazy_names: dict[tuple[str, str], type] = {}


def _real_module(name: str):
    """The module a :class:`_StandInModule` stands for, imported now if need be."""
    return importlib.import_module(name)


def _imported_name(where: tuple[str, str]):
    """``module.name`` when that module is really imported (None otherwise: nothing of it can exist)."""
    module = sys.modules.get(where[0])
    return None if module is None else getattr(module, where[1], None)


class _LazyName(type):
    """The type of a stand-in for a class or function of a module not imported (torch's distributed
    tensors, sympy), bound by ``from torch.distributed.tensor import DTensor`` in a transformers module
    (and the like). A call or an attribute read (``DTensor.from_local``, ``Shard(0)``,
    ``fully_shard(model)``) imports the module and uses the real object; ``isinstance``/``issubclass``
    ask the real class once its module is imported and are False before: no ``DTensor`` (nor any other
    instance of these classes) can exist while their module is not imported. When the module is
    imported, transformers modules' globals that hold a stand-in get the real object
    (:func:`_bind_real_names`), so ``type(x) is DTensor`` holds as well."""

    _where: tuple[str, str]

    def resolve(cls):
        """The real object (imports its module)."""
        return getattr(_real_module(cls._where[0]), cls._where[1])

    def __call__(cls, *args, **kwargs):
        return cls.resolve()(*args, **kwargs)

    def __getattr__(cls, name: str):
        # __wrapped__: inspect.signature (and unwrap) see the real object; __match_args__: ``case Shard(d)``
        if name.startswith("__") and name not in ("__match_args__", "__wrapped__"):
            raise AttributeError(name)
        if name == "__wrapped__":
            return cls.resolve()
        return getattr(cls.resolve(), name)

    def __instancecheck__(cls, obj) -> bool:
        real = _imported_name(cls._where)
        return real is not None and isinstance(obj, real)

    def __subclasscheck__(cls, sub) -> bool:
        real = _imported_name(cls._where)
        return real is not None and issubclass(sub, real)

    def __repr__(cls) -> str:
        return f"<deferred {cls._where[0]}.{cls._where[1]}>"


def lazy_name(module: str, name: str) -> type:
    """The one stand-in (:class:`_LazyName`) for ``module.name``."""
    key = (module, name)
    standin = _lazy_names.get(key)
    if standin is None:
        standin = _lazy_names[key] = _LazyName(name, (), {"_where": key, "__module__": __name__})
    return standin


#: transformers functions that import ``torch.distributed.tensor`` to answer ``isinstance(obj,
#: DTensor)``: they answer False while it is not imported (no DTensor can exist then), as they would
DTENSOR_CHECKS = {"transformers.distributed.utils": ("is_dtensor",)}


def _dtensor_check(real):
    """``real`` (``is_dtensor``): False while ``torch.distributed.tensor`` is not imported, else ``real``."""

    @functools.wraps(real)
    def check(obj):
        if DISTRIBUTED_STUBS[0] not in sys.modules:
            return False
        return real(obj)

    return check


def _wrap_dtensor_checks(module) -> None:
    for name in DTENSOR_CHECKS.get(module.__name__, ()):
        real = vars(module).get(name)
        if callable(real):
            setattr(module, name, _dtensor_check(real))


def _bind_real_names(_module=None) -> None:
    """A module of :data:`DISTRIBUTED_STUBS` (or sympy) was imported: every stand-in whose module is
    now imported is replaced by the real object in the globals of the transformers modules that hold it."""
    real = {}
    for key, standin in list(_lazy_names.items()):
        obj = _imported_name(key)
        if obj is not None:
            real[id(standin)] = obj
            del _lazy_names[key]
    if not real:
        return
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("transformers"):
            continue
        where = vars(module)
        for attr, value in list(where.items()):
            if isinstance(value, _LazyName) and id(value) in real:
                where[attr] = real[id(value)]


def _calls_from(caller: str, callers: tuple[str, ...]) -> bool:
    return any(caller.startswith(c) if c.endswith(".") else caller == c for c in callers)


class _StandInModule(types.ModuleType):
    """What ``from <module> import X`` (or ``import <module>``) gives a caller of :func:`_lean_import`
    while the module is not imported: ``X`` is ``names[X]``, or else :func:`lazy_name`. It is never
    in ``sys.modules``: nothing else sees it."""

    def __init__(self, name: str, names: dict[str, Any]) -> None:
        super().__init__(name)
        self.__names = names

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.__names.get(name) or lazy_name(self.__name__, name)


#: module -> (callers, names, how many contexts stand it in): what :func:`_lean_import` answers now
_standing: dict[str, tuple[tuple[str, ...], dict[str, Any], int]] = {}
_standins: dict[str, _StandInModule] = {}
_real_import: list[Callable] = []


def _lean_import(name, globals=None, locals=None, fromlist=(), level=0):
    """``builtins.__import__`` while a stand-in context is open: an absolute import of a module of
    :data:`_standing` that is not imported, by one of its callers (the importing module's name), gets
    its :class:`_StandInModule`; every other import is Python's own."""
    entry = _standing.get(name) if not level and (fromlist or "." not in name) else None
    if entry is not None and name not in sys.modules:
        if _calls_from((globals or {}).get("__name__") or "", entry[0]):
            module = _standins.get(name)
            if module is None:
                module = _standins[name] = _StandInModule(name, entry[1])
            return module
    return _real_import[0](name, globals, locals, fromlist, level)


class _ImportStandIns:
    """Within it, :func:`_lean_import` answers the modules of ``table`` (module -> (callers, names))
    for their callers. Re-entrant; ``builtins.__import__`` is Python's own again when the last one
    closes."""

    def __init__(self, table: dict[str, tuple[tuple[str, ...], dict[str, Any]]]) -> None:
        self.table = table

    def __enter__(self):
        with _lock:
            for name, (callers, names) in self.table.items():
                depth = _standing[name][2] if name in _standing else 0
                _standing[name] = (callers, names, depth + 1)
            if builtins.__import__ is not _lean_import:
                _real_import[:] = [builtins.__import__]
                builtins.__import__ = _lean_import
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            for name in self.table:
                callers, names, depth = _standing[name]
                if depth > 1:
                    _standing[name] = (callers, names, depth - 1)
                else:
                    del _standing[name]
            if not _standing and builtins.__import__ is _lean_import:
                builtins.__import__ = _real_import[0]


#: transformers' modules get stand-ins for torch's distributed modules (:data:`DISTRIBUTED_STUBS`)
_DISTRIBUTED_TABLE: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    name: (("transformers.",), {}) for name in DISTRIBUTED_STUBS
}


def _distributed_standins() -> _ImportStandIns:
    """While a transformers module executes: its imports of torch's distributed-tensor and FSDP modules
    not imported (:data:`DISTRIBUTED_STUBS`) give :func:`lazy_name` stand-ins. ``torch.distributed.tensor``
    takes about 0.3 s of a start (and imports sympy, about 0.35 s more) and a local load never makes
    a ``DTensor``."""
    return _ImportStandIns(_DISTRIBUTED_TABLE)


class _BuildStandIns:
    """:class:`_CompilerStandIns`, and :data:`BUILD_STUBS` answered by :func:`_lean_import`."""

    def __enter__(self):
        self.parts = [_CompilerStandIns().__enter__(), _ImportStandIns(BUILD_STUBS).__enter__()]
        return self

    def __exit__(self, *exc) -> None:
        for part in reversed(self.parts):
            part.__exit__(*exc)


def build_deferred() -> _BuildStandIns:
    """A context within which building a model (on the meta device) imports neither torch's compiler
    (:func:`compiler_deferred`) nor sympy and torch's symbolic shapes (:data:`BUILD_STUBS`):
    :func:`attnscope.core.backends.torch_load.load_torch` loads the model within it."""
    return _BuildStandIns()


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
            with _CompilerStandIns(), _distributed_standins():
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
        elif fullname in DISTRIBUTED_STUBS or fullname in BUILD_STUBS:
            then = _bind_real_names
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
