"""Errors the engine raises with messages meant for the user (one readable line each)."""


class AttnScopeError(Exception):
    """Base class: the message is shown to the user as is."""


class ModelLoadError(AttnScopeError):
    """A model reference could not be turned into a runnable model (missing, broken, unsupported)."""


class UnsupportedModelError(ModelLoadError):
    """The model loads, but its attention needs something AttnScope's path does not do."""


class SessionError(AttnScopeError):
    """A session call was made in the wrong state or with bad arguments (empty prompt, ...)."""


class Cancelled(AttnScopeError):
    """Long work was cancelled by the user between chunks."""
