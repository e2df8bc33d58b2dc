"""Keep torchao off the start-up path: transformers imports it with its quantiser registry.

``transformers.modeling_utils`` imports ``transformers.quantizers``, whose ``quantizer_torchao`` module
imports torchao at import time whenever torchao is installed (the ``quant`` extra), and torchao's
own import pulls in its kernels and ``torch._dynamo``: about a tenth of loading any model, on every
start, though AttnScope calls torchao directly (``--quantize``: :mod:`attnscope.core.loading.quantize`)
and transformers' torchao quantiser is needed only for a checkpoint saved torchao-quantised
(config.json ``quantization_config.quant_method == "torchao"``).

:func:`defer` installs a one-shot import hook: when transformers imports ``quantizer_torchao``, the
module runs with transformers' ``is_torchao_available`` answering False, so it skips the torchao
import (its class is still registered). :func:`restore` re-runs that module with the real answer,
which imports torchao; :func:`attnscope.core.loading.resolve.load_torch` calls it before loading a
torchao-quantised checkpoint. ``tests/test_torchao_defer.py`` checks both.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

#: the transformers module whose import pulls in torchao
TARGET = "transformers.quantizers.quantizer_torchao"
_state = {"deferred": False}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        import transformers.utils as tu

        real = tu.is_torchao_available
        tu.is_torchao_available = lambda *_a, **_k: False
        try:
            self.inner.exec_module(module)
        finally:
            tu.is_torchao_available = real
        _state["deferred"] = True


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot: restore() re-imports through the normal finders
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def defer() -> bool:
    """Install the hook unless transformers' quantiser module is already imported (or the hook is
    in place); True when torchao will not be imported by it."""
    if TARGET in sys.modules:
        return _state["deferred"]
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    return True


def restore() -> None:
    """Give transformers its torchao quantiser back (imports torchao when installed): re-runs the
    deferred module in place, so the registered class sees torchao's functions. No-op when nothing
    was deferred."""
    for f in [f for f in sys.meta_path if isinstance(f, _Finder)]:
        sys.meta_path.remove(f)
    if _state["deferred"] and TARGET in sys.modules:
        importlib.reload(sys.modules[TARGET])
    _state["deferred"] = False


def needs_torchao(config) -> bool:
    """True when a transformers config (or its dict) says the checkpoint is torchao-quantised."""
    q = (
        config.get("quantization_config")
        if isinstance(config, dict)
        else getattr(config, "quantization_config", None)
    )
    method = q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)
    return str(getattr(method, "value", method) or "").lower() == "torchao"
