"""Which backends exist: a name -> :class:`BackendSpec` table, read without importing any framework.

A leaf of core (it imports only :mod:`attnscope.core.errors`), below every layer of the data path
(docs/how-it-works.md): the loaders ask a spec what a backend loads and how much memory its
framework takes (:mod:`attnscope.core.loading.fit`, :mod:`attnscope.core.loading.checks`, the catalog)
before any backend class is imported, and the backends, the session, the CLI and the app ask it too.

:meth:`attnscope.core.session.Session.load` asks :func:`get` for the spec of ``--backend NAME`` and
calls :meth:`BackendSpec.load`; nothing else in the engine branches on a backend's name. The class
behind a spec is imported only when a model is loaded (torch and MLX are heavy, and MLX is absent
on most machines).

A new backend: a class implementing :class:`attnscope.core.backends.base.Backend` with a ``load``
classmethod, and one :func:`register` call below. Every other list of backends (``--backend``'s
choices, the Backend menu, the picker's and Compare tab's combos, the remote picker, the fit
estimate, the saved-session check) derives from this table: ``tests/integration/test_one_source.py`` fails when a
backend's name is typed anywhere else in core/ or app/.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from attnscope.core.errors import SessionError

# Which model families the MLX backend runs, from two sources of model code: the hand-written models of
# attnscope.core.backends.mlx_arch (MLX_OWN_FAMILIES), and mlx-lm's own ``models/<family>.py`` with
# AttnScope's attention path hooked in (attnscope.core.backends.mlx_lm_arch, MLX_LM_FAMILIES: the
# families whose exactness against the torch backend tests/core/test_mlx_lm.py proves), run when mlx-lm is
# installed. transformers model_type values.
MLX_OWN_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
MLX_LM_FAMILIES = ("mixtral", "qwen3_moe", "phi3", "gemma3_text")


def mlx_lm_installed() -> bool:
    """Whether ``mlx_lm`` can be imported (found, not imported: no MLX import here)."""
    try:
        return importlib.util.find_spec("mlx_lm") is not None
    except (ImportError, ValueError):
        return False


#: every family the MLX backend runs here (mlx-lm's only where it is installed): its spec's ``families``,
#: asked by the picker and ``attnscope models`` before a model is opened (:func:`problem`); the backend
#: refuses with the same list when loading
MLX_FAMILIES = MLX_OWN_FAMILIES + (MLX_LM_FAMILIES if mlx_lm_installed() else ())


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
        summary: where it runs, for the Backend menu (``"CUDA when available, else CPU"``).
        framework: the Python package it imports (the app checks it is installed before a switch).
        install: how to install that package, for the message when it is missing.
        runtime_bytes: memory the framework itself takes beside weights, cache and capture (bytes; the
            fit estimate, :func:`attnscope.core.loading.fit.estimate`, whose ``RUNTIME_BYTES`` comment
            says how each was measured).
        memory: what the fit estimate measures off CUDA (``"RAM"``, ``"unified memory"``).
        device_prefix: how its device strings start (``"mlx"``: ``"mlx:gpu"``); empty when it takes
            torch's device names (``"cpu"``, ``"cuda:0"``).
        checkpoint_quant: the pre-quantised checkpoints it loads: ``"transformers"``
            (``quantization_config``: AWQ, GPTQ, ...) or ``"mlx-lm"`` (``quantization``).
        packs_gguf: it keeps a GGUF file's quantised blocks packed (the fit estimate counts them at
            their packed size).
        overrides: ``fork(overrides=...)`` runs (the Experiments tab's mask and scale changes).
    """

    name: str
    target: str
    options: frozenset[str]
    refused: Mapping[str, str] = field(default_factory=dict)
    families: tuple[str, ...] | None = None
    label: str = ""
    summary: str = ""
    framework: str = ""
    install: str = ""
    runtime_bytes: int = 600_000_000
    memory: str = "RAM"
    device_prefix: str = ""
    checkpoint_quant: str = "transformers"
    packs_gguf: bool = False
    overrides: bool = False

    @property
    def title(self) -> str:
        """How messages and menus name it: :attr:`label`, else the name."""
        return self.label or self.name

    @property
    def takes_device_map(self) -> bool:
        """``--device-map`` (accelerate's layer placement) is one of its load options."""
        return "device_map" in self.options

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
            return f"the {self.title} backend does not run {architecture} models (it runs {runs})"
        return None


_SPECS: dict[str, BackendSpec] = {}
SPECS: Mapping[str, BackendSpec] = MappingProxyType(_SPECS)  # read-only view, in registration order


def register(spec: BackendSpec) -> None:
    """Add ``spec`` (a later spec of the same name replaces the earlier one)."""
    _SPECS[spec.name] = spec


def names() -> tuple[str, ...]:
    """The registered backend names, in registration order."""
    return tuple(_SPECS)


def labels() -> dict[str, str]:
    """name -> :attr:`BackendSpec.title`, in registration order (``{"torch": "torch", "mlx": "MLX"}``)."""
    return {name: spec.title for name, spec in _SPECS.items()}


def name_for(module: str, cls: str) -> str:
    """The registered name of the backend class ``module:cls`` (a backend class's ``name``).

    Raises:
        SessionError: no spec targets that class.
    """
    for spec in _SPECS.values():
        if spec.target == f"{module}:{cls}":
            return spec.name
    raise SessionError(f"no backend is registered for {module}:{cls}")


def for_device(device: str) -> BackendSpec:
    """The backend whose device strings ``device`` is one of (:attr:`BackendSpec.device_prefix`);
    :data:`DEFAULT`'s for torch's device names (``"cpu"``, ``"cuda:1"``)."""
    for spec in _SPECS.values():
        if spec.device_prefix and str(device).startswith(spec.device_prefix):
            return spec
    return _SPECS[DEFAULT]


def with_checkpoint_quant(kind: str) -> tuple[str, ...]:
    """The backends that load pre-quantised checkpoints of ``kind`` (:attr:`BackendSpec.checkpoint_quant`)."""
    return tuple(name for name, spec in _SPECS.items() if spec.checkpoint_quant == kind)


def problem(architecture: str, backend: str) -> str | None:
    """Why ``backend`` cannot run a model of family ``architecture`` (one line, :meth:`BackendSpec.problem`),
    or None when it can, when the family is unknown (``""``: the load itself says what is wrong) or when
    no backend has that name."""
    spec = _SPECS.get(backend)
    return None if spec is None else spec.problem(architecture)


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
        summary="CUDA when available, else CPU",
        framework="torch",
        install="pip install attnscope (torch comes with it)",
        runtime_bytes=600_000_000,
        overrides=True,
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
        summary="Apple silicon; slow CPU build on Linux",
        framework="mlx",
        install="pip install 'attnscope[mlx]' (mlx[cpu] on Linux)",
        runtime_bytes=400_000_000,
        memory="unified memory",
        device_prefix="mlx",
        checkpoint_quant="mlx-lm",
        packs_gguf=True,
    )
)

#: the backend a load, a saved session or a fit estimate uses when none is named: the first registered
DEFAULT = names()[0]
