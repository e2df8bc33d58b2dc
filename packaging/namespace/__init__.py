"""AttnScope: see inside a language model's attention.

The installed package is ``attnscope``; its two halves live in the source tree's top-level
folders and install under it (``pyproject.toml``'s ``package-dir``):

* ``attnscope.core`` (folder ``core/``): the Qt-free engine: attention with LSE, the trace,
  backends, loading, analyses, exports, the CLI;
* ``attnscope.app`` (folder ``app/``): the PySide6 + pyqtgraph desktop app.

This file (folder ``packaging/namespace/``) is the package's own ``__init__``: the public Python
API for notebooks and scripts, re-exported lazily so that ``import attnscope`` stays cheap
(torch and transformers load on first use)::

    from attnscope import Session
    s = Session.load()                 # the embedded SmolLM2-135M-Instruct
    s.prefill("The capital of France is")
    w = s.weights(layer=0, head=3)     # (T, T) float32, rows sum to 1
    export_head(s, 0, 3, "head.npy")   # the map plus a JSON sidecar with its provenance
    s.explain(0, 3, 4, 3).bands        # the analyses are Session methods (attnscope.core.analysis.methods)

See the docs/python-api.md section for the whole surface.
"""

from __future__ import annotations

from typing import Any

from attnscope.core import __version__

# name -> module it lives in (imported on first attribute access, PEP 562)
_PUBLIC = {
    "Session": "attnscope.core.analysis.methods",  # the core Session with the analyses as methods
    "AttnScopeError": "attnscope.core.errors",
    # its subclasses, each also the matching builtin (docs/python-api.md)
    "SessionError": "attnscope.core.errors",
    "OutOfRange": "attnscope.core.errors",
    "BadArgument": "attnscope.core.errors",
    "WrongType": "attnscope.core.errors",
    "BadPath": "attnscope.core.errors",
    "ModelLoadError": "attnscope.core.errors",
    "Cancelled": "attnscope.core.errors",
    "kv_cache_bytes": "attnscope.core.kv_formula",
    "export_head": "attnscope.core.io.head_export",
    "Sampling": "attnscope.core.sampling",
    # which heads matter (docs/heads.md)
    "make_target": "attnscope.core.analysis.head_effects",
    "head_effects": "attnscope.core.analysis.head_effects",
    "patch_heads": "attnscope.core.analysis.head_effects",
    "attribution_patching": "attnscope.core.analysis.head_effects",
    "logit_attribution": "attnscope.core.analysis.head_effects",
    "logit_lens": "attnscope.core.analysis.logit_lens",
    # why a head attends (docs "Why a head attends")
    "explain": "attnscope.core.analysis.explain",
    "head_positional_share": "attnscope.core.analysis.explain",
    "positional_share_grid": "attnscope.core.analysis.explain",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'attnscope' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
