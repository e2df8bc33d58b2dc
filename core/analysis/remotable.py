"""Session-level analysis functions that can run where the model runs (``@remotable``).

A function ``fn(session, ...)`` decorated with :func:`remotable` runs as usual on a local
:class:`attnscope.core.session.Session`. Handed a :class:`attnscope.core.remote.client.RemoteSession`
(anything with a ``remote_call`` method), it sends its name and arguments to the engine server,
which runs the same function on its own session and sends the result back: the window's jobs and
the CLI call ``map_at(session, ...)`` the same way whichever side holds the model.

The server only ever runs functions in :data:`REGISTRY`, which this decorator fills as each module of
:mod:`attnscope.core.analysis` is imported (:func:`served` imports them all when the server starts:
the decorator is the only list); a name it does not know is refused. Nothing sent over
the wire is executed or unpickled. Callables among the arguments (``progress``, ``cancelled``,
``partial``) cannot travel: the client keeps them, relays the server's progress messages to
``progress`` and sends a cancel message when ``cancelled()`` turns true; ``partial`` is dropped
(the final result arrives whole).

Only the standard library here: importing it costs nothing. It lives in ``analysis/`` (the layer of the
functions it marks) so that analysis never imports ``core/remote/``, which sits above it.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

#: qualified name -> the undecorated function (``"attnscope.core.analysis.aggregate.map_at"``)
REGISTRY: dict[str, Callable] = {}

#: keyword arguments that are callbacks: kept on the client side, never sent
CALLBACKS = ("progress", "cancelled", "partial")


def remotable(fn: Callable) -> Callable:
    """Register ``fn(session, *args, **kwargs)`` for remote calls and return a forwarding wrapper.

    The wrapper calls ``session.remote_call(name, args, kwargs)`` when the session has one (a
    remote engine), else ``fn`` itself. ``args``/``kwargs`` must be what
    :mod:`attnscope.core.remote.wire` encodes (numbers, strings, slices, numpy arrays, lists,
    tuples, dicts, :class:`attnscope.core.sampling.Sampling`); callables go by the names in
    :data:`CALLBACKS`.
    """
    name = f"{fn.__module__}.{fn.__qualname__}"
    REGISTRY[name] = fn

    @functools.wraps(fn)
    def wrapper(session: Session | RemoteSession, *args, **kwargs):
        call = getattr(session, "remote_call", None)
        if call is None:
            return fn(session, *args, **kwargs)
        return call(name, args, kwargs)

    setattr(wrapper, "remote_name", name)  # noqa: B010  (functools.wraps typing has no such attribute)
    return wrapper


def served() -> Mapping[str, Callable]:
    """Every ``@remotable`` function: imports each module of :mod:`attnscope.core.analysis` (their
    decorators fill :data:`REGISTRY`) and returns the registry, qualified name -> function. The engine
    server calls it when it starts (:class:`attnscope.core.remote.server.EngineServer`)."""
    import attnscope.core.analysis as analysis

    for m in pkgutil.walk_packages(analysis.__path__, analysis.__name__ + "."):
        importlib.import_module(m.name)
    return REGISTRY
