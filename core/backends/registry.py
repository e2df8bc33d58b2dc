"""Which backends exist: a name -> :class:`BackendSpec` table, read without importing any framework.

:meth:`attnscope.core.session.Session.load` asks :func:`get` for the spec of ``--backend NAME`` and
calls :meth:`BackendSpec.load`; nothing else in the engine branches on a backend's name. The class
behind a spec is imported only when a model is loaded (torch and MLX are heavy, and MLX is absent
on most machines).

A new backend: a class implementing :class:`attnscope.core.backends.base.Backend` with a ``load``
classmethod, and one :func:`register` call below.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from attnscope.core.backends.support import MLX_FAMILIES
from attnscope.core.errors import SessionError


@dataclass(frozen=True)
class BackendSpec:
    """One backend: its name, where its class lives, and what :meth:`load` passes on to it.

    Attributes:
        name: what ``--backend`` and the Backend menu say (``"torch"``).
        target: ``"module:Class"`` of the backend class (its ``load`` classmethod loads a model).
        options: the keywords of :meth:`attnscope.core.session.Session.load` the class's ``load`` takes
            besides the model (others given are not passed: e.g. ``device`` on MLX, which picks its
            own device).
        refused: keyword -> one line, for options this backend refuses when they are set.
        families: the transformers ``model_type`` values it runs; None = every family the catalog
            supports.
        label: how messages name it (``"MLX"``); the name when empty.
    """

    name: str
    target: str
    options: frozenset[str]
    refused: Mapping[str, str] = field(default_factory=dict)
    families: tuple[str, ...] | None = None
    label: str = ""

    def backend_class(self) -> Any:
        """The backend class (imports its module, and with it the framework)."""
        module, _, cls = self.target.partition(":")
        return getattr(importlib.import_module(module), cls)

    def load(self, model=None, **options):
        """``backend_class().load(model, **accepted options)``; options set to None count as not given.

        Raises:
            SessionError: an option this backend refuses (:attr:`refused`) is set.
            ModelLoadError / UnsupportedModelError: from the backend's own load.
        """
        for key, why in self.refused.items():
            if options.get(key) is not None:
                raise SessionError(why)
        kwargs = {k: v for k, v in options.items() if k in self.options}
        return self.backend_class().load(model, **kwargs)

    def problem(self, architecture: str) -> str | None:
        """Why this backend cannot run a model of family ``architecture`` (one line), or None when it
        can or when the family is unknown (``""``: the load itself says what is wrong)."""
        if self.families is not None and architecture and architecture not in self.families:
            runs = ", ".join(self.families)
            return (
                f"the {self.label or self.name} backend does not run {architecture} models (it runs {runs})"
            )
        return None


_SPECS: dict[str, BackendSpec] = {}
SPECS: Mapping[str, BackendSpec] = MappingProxyType(_SPECS)  # read-only view, in registration order


def register(spec: BackendSpec) -> None:
    """Add ``spec`` (a later spec of the same name replaces the earlier one)."""
    _SPECS[spec.name] = spec


def names() -> tuple[str, ...]:
    """The registered backend names, in registration order."""
    return tuple(_SPECS)


def get(name: str) -> BackendSpec:
    """The spec registered as ``name``.

    Raises:
        SessionError: no backend of that name (the message lists the known ones).
    """
    spec = _SPECS.get(name)
    if spec is None:
        raise SessionError(f"unknown backend {name!r}: choose {' or '.join(_SPECS)}")
    return spec


register(
    BackendSpec(
        "torch",
        "attnscope.core.backends.torch_backend:TorchBackend",
        frozenset({"device", "dtype", "progress", "quantize", "device_map"}),
    )
)
register(
    BackendSpec(
        "mlx",
        "attnscope.core.backends.mlx_backend:MlxBackend",
        frozenset({"dtype", "progress", "quantize"}),
        refused=MappingProxyType(
            {"device_map": "--device-map is for the torch backend (MLX uses one unified memory)"}
        ),
        families=MLX_FAMILIES,
        label="MLX",
    )
)
