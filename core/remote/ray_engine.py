"""``attnscope serve --ray [ADDRESS]``: the engine as a Ray actor on an existing Ray cluster.

Ray places the actor (with the GPUs asked for) on a node that has them; the actor loads the model
there and runs the same :class:`attnscope.core.remote.server.EngineServer` as ``attnscope serve``
on a thread of its own, so the window and the CLI connect to it the same way (``--engine
NODE_IP:PORT``, the same token). Ray only schedules and keeps the process alive: no request goes
through Ray's object store and nothing is pickled on the engine's wire (the constructor's plain
arguments, strings and numbers, are Ray's own business).

``ray`` is an optional, large dependency (``pip install ray``, the ``ray`` extra; CI installs it to
run the actor test); this module imports it only when called. Not done: a Ray Serve deployment, autoscaling, more than one engine.
"""

from __future__ import annotations

from typing import Any


def _ray():
    try:
        import ray
    except ImportError:
        raise ValueError("--ray needs Ray on this machine and the cluster: pip install ray") from None
    return ray


class _EngineActor:
    """The actor: one loaded Session and one EngineServer served from a thread in the actor's process."""

    def __init__(
        self, host: str, port: int, token: str | None, load: dict | None, load_kwargs: dict, threads: int
    ):
        import threading

        import torch
        from attnscope.core.remote.server import EngineServer

        torch.set_num_threads(threads)  # Ray's OMP_NUM_THREADS, said explicitly: the CPUs reserved

        session = None
        if load is not None:
            from attnscope.core.session import Session

            session = Session.load(**load)
        self.server = EngineServer(session, host=host, port=port, token=token, load_kwargs=load_kwargs)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="attnscope-engine")
        self.thread.start()

    def where(self) -> dict:
        """``{"ip", "port", "host", "model", "device", "openmp_env"}``: where clients connect (the
        node's IP), and the actor's :data:`attnscope.core.openmp.OPENMP_ENV` variables."""
        import os
        import socket

        import ray
        from attnscope.core.openmp import OPENMP_ENV

        s = self.server.session
        return {
            "ip": ray.util.get_node_ip_address(),
            "port": self.server.port,
            "host": socket.gethostname(),
            "model": None if s is None else s.info.name,
            "device": None if s is None else f"{s.backend.name} {s.backend.device}",
            "openmp_env": {k: os.environ.get(k) for k in OPENMP_ENV},
        }

    def stop(self) -> int:
        """Stop serving and close the socket; returns the number of requests served."""
        self.server.stop()
        self.thread.join(10)
        self.server.close()
        return self.server.served


def start(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    load: dict | None = None,
    load_kwargs: dict | None = None,
    num_gpus: float = 0,
    num_cpus: float = 1,
) -> tuple[Any, dict]:
    """Start the engine actor on the Ray cluster this process is connected to (``ray.init`` first).

    Args:
        host, port, token: as ``EngineServer`` (the address is on the actor's node; ``port=0`` picks
            a free one there).
        load: ``Session.load`` keyword arguments (``model``, ``backend``, ``device``, ...), or None
            for an engine without a model.
        num_gpus, num_cpus: the resources Ray reserves for the actor (``num_gpus=1`` puts it on a
            node with a free GPU). torch runs ``num_cpus`` threads there: CPU results are
            bit-identical to an in-process run with the same thread count (a float sum's order
            depends on it), GPU results to one on the same device.

    Returns:
        ``(actor handle, where)``: ``where`` as :meth:`_EngineActor.where`; stop with :func:`stop`.

    Raises:
        ValueError: Ray is not installed. SessionError: the actor did not start (its load failed:
        the last line of its error).
    """
    import os

    from attnscope.core.openmp import OPENMP_ENV

    ray = _ray()
    # the actor's process starts with attnscope serve's OpenMP settings (this machine's own values
    # where set): a fresh worker, so they are read when torch loads there
    env = {k: os.environ.get(k, v) for k, v in OPENMP_ENV.items()}
    cls = ray.remote(num_gpus=num_gpus, num_cpus=num_cpus, runtime_env={"env_vars": env})(_EngineActor)
    actor = cls.remote(host, port, token, load, dict(load_kwargs or {}), max(1, int(num_cpus)))
    try:
        where = ray.get(actor.where.remote())
    except ray.exceptions.RayError as e:
        from attnscope.core.errors import SessionError

        ray.kill(actor)
        cause = getattr(e, "cause", None) or e
        text = (str(cause).strip().splitlines() or [type(cause).__name__])[-1]
        raise SessionError(f"the engine actor did not start: {text}") from None
    return actor, where


def stop(actor) -> int:
    """Stop the actor's engine and end the actor; returns the requests it served."""
    ray = _ray()
    try:
        served = ray.get(actor.stop.remote(), timeout=30)
    finally:
        ray.kill(actor)
    return served
