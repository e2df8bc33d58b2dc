"""How a load reports progress: ``progress(message, fraction)`` (fraction in [0, 1], or -1 when
unknown), called by the resolver, the GGUF conversion and the loaders; it may raise
:class:`attnscope.core.errors.Cancelled` to stop the load. A leaf of ``core/loading``."""

from __future__ import annotations

from collections.abc import Callable

ProgressFn = Callable[[str, float], None]  # (message, fraction in [0, 1] or -1 for unknown)


def no_progress(_msg: str, _frac: float) -> None:
    """A :data:`ProgressFn` that reports nothing (the default where no one listens)."""
