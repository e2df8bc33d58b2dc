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


class BadArgument(SessionError, ValueError):
    """An argument the call does not take: a negative temperature, a strided slice, an unknown file
    suffix, more steps than the context holds. Also a ``ValueError`` (callers that catch that keep
    working) and a ``SessionError`` (so do those that catch that, e.g. for a bad step count)."""


class WrongType(BadArgument, TypeError):
    """An argument of the wrong type (a float or a bool where a whole number goes, an int where a
    slice goes). Also a ``TypeError`` and a :class:`BadArgument`."""


class OutOfRange(SessionError, IndexError):
    """A layer, head, position, step or count outside the model's or the sequence's range. Also an
    ``IndexError``, so callers that catch that keep working."""


class NoAttentionMap(BadArgument):
    """A layer that computes no softmax attention (a hybrid model's linear-attention, Mamba or
    short-convolution layer) was asked for attention weights: ``layer 2: linear attention, no map``."""


class BadPath(BadArgument, FileNotFoundError):
    """An output path whose folder does not exist. Also a ``FileNotFoundError`` (an ``OSError``)
    and a :class:`BadArgument`."""


def first_line(e: BaseException) -> str:
    """The first line of ``e``'s message (at most 300 characters; the class name when empty): how a
    library's multi-line error becomes the one line a :class:`ModelLoadError` says."""
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]
