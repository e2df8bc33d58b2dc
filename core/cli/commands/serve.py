"""``attnscope serve``: a headless engine that owns one Session and answers remote windows and CLIs.

    attnscope serve --model /data/llama-8b --device cuda --token-file ~/.attnscope-token
    ssh -L 8765:localhost:8765 gpu-box        # on the laptop, then:
    ATTNSCOPE_TOKEN=$(cat token) attnscope --engine 127.0.0.1:8765

A token is required unless the server binds to a loopback address and is started with
``--no-token``. ``--token-file FILE`` reads the token from FILE, or writes a new random one there
(mode 0600) when FILE does not exist; without it a new token is printed once. ``--ray [ADDRESS]``
runs the engine as a Ray actor on that cluster instead (:mod:`attnscope.core.remote.ray_engine`). See
:mod:`attnscope.core.remote` for the protocol and why ZeroMQ.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from attnscope.core.cli.options import add_model_arguments

NAME = "serve"
HELP = "run a headless engine (one model, one session) for attnscope --engine HOST:PORT"


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=8765, help="TCP port (default 8765; 0 picks a free one)")
    p.add_argument(
        "--token-file", metavar="FILE", default=None, help="the token clients must send (created if missing)"
    )
    p.add_argument(
        "--no-token", action="store_true", help="accept clients without a token (only on 127.0.0.1)"
    )
    p.add_argument("--no-load", action="store_true", help="start without a model (a client loads one)")
    p.add_argument(
        "--ready-file",
        metavar="FILE",
        default=None,
        help="write the port there once listening (for scripts and tests)",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        default=None,
        metavar="ADDRESS",
        help="run the engine as a Ray actor on the Ray cluster at ADDRESS (default: auto, the "
        "cluster this machine belongs to); needs pip install ray",
    )
    p.add_argument(
        "--ray-gpus",
        type=float,
        default=None,
        metavar="N",
        help="GPUs Ray reserves for the engine actor (default: 1 with --device cuda, else 0)",
    )
    p.add_argument(
        "--ray-cpus",
        type=int,
        default=1,
        metavar="N",
        help="CPUs Ray reserves for the engine actor; torch runs that many threads (default 1)",
    )


def _token(args) -> str | None:
    from attnscope.core.remote.server import is_loopback, make_token

    if args.no_token:
        if args.token_file:
            raise ValueError("give --token-file or --no-token, not both")
        if not is_loopback(args.host):
            raise ValueError(f"--no-token is only for a loopback address (127.0.0.1), not {args.host}")
        return None
    if args.token_file:
        p = Path(args.token_file).expanduser()
        if p.is_file():
            lines = p.read_text(encoding="utf-8").strip().splitlines()
            if not lines or not lines[0].strip():
                raise ValueError(f"token file {p} is empty")
            return lines[0].strip()
        if not p.parent.exists():
            raise FileNotFoundError(f"folder {p.parent} does not exist")
        tok = make_token()
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(tok + "\n")
        print(f"attnscope serve: wrote a new token to {p}", file=sys.stderr)
        return tok
    env = os.environ.get("ATTNSCOPE_TOKEN")
    if env:
        return env
    tok = make_token()
    print(f"attnscope serve: token {tok} (clients: ATTNSCOPE_TOKEN={tok} or --token-file)", file=sys.stderr)
    return tok


def _load_options(args) -> tuple[dict | None, dict]:
    """``(Session.load keyword arguments for the model to serve, or None with --no-load; the load
    options a client's load inherits: device, device map)``."""
    load = None
    if not args.no_load:
        load = dict(
            model=args.model,
            backend=args.backend,
            device=args.device,
            dtype=args.dtype,
            quantize=args.quantize,
            device_map=args.device_map,
        )
    load_kwargs = {
        k: v for k, v in dict(device=args.device, device_map=args.device_map).items() if v is not None
    }
    return load, load_kwargs


def run(args) -> int:
    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    token = _token(args)
    if args.ray is not None:
        return _run_ray(args, token)
    from attnscope.core.openmp import quiet_openmp
    from attnscope.core.remote.server import EngineServer

    quiet_openmp()  # before torch loads: OpenMP reads its spin count once

    session = None
    load, load_kwargs = _load_options(args)
    if load is not None:
        from attnscope.core.session import Session

        print("attnscope serve: loading the model…", file=sys.stderr, flush=True)
        session = Session.load(**load)
    server = EngineServer(session, host=args.host, port=args.port, token=token, load_kwargs=load_kwargs)
    where = (
        f"{session.info.name} · {session.backend.name} {session.backend.device}" if session else "no model"
    )
    print(f"attnscope serve: {where}; listening on {args.host}:{server.port}", file=sys.stderr, flush=True)
    if args.ready_file:
        Path(args.ready_file).write_text(f"{server.port}\n", encoding="utf-8")
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    print(f"attnscope serve: stopped after {server.served} request(s)", file=sys.stderr)
    return 0


def _run_ray(args, token: str | None) -> int:
    """``--ray``: the engine as a Ray actor (:mod:`attnscope.core.remote.ray_engine`) until Ctrl+C."""
    import threading

    from attnscope.core.remote import ray_engine

    ray = ray_engine._ray()
    gpus = (
        args.ray_gpus
        if args.ray_gpus is not None
        else (1 if str(args.device or "").startswith("cuda") else 0)
    )
    try:
        ray.init(address=args.ray, logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ValueError(
            f"--ray {args.ray}: no Ray cluster there ({str(e).strip().splitlines()[0]})"
        ) from None
    load, load_kwargs = _load_options(args)
    print(f"attnscope serve: starting the engine as a Ray actor ({gpus:g} GPU)…", file=sys.stderr, flush=True)
    actor, where = ray_engine.start(
        host=args.host,
        port=args.port,
        token=token,
        load=load,
        load_kwargs=load_kwargs,
        num_gpus=gpus,
        num_cpus=args.ray_cpus,
    )
    what = f"{where['model']} · {where['device']}" if where["model"] else "no model"
    from attnscope.core.remote.server import is_loopback

    ip, port = where["ip"], where["port"]
    reach = (
        f"that node only: ssh -L {port}:localhost:{port} {ip}, then attnscope --engine 127.0.0.1:{port}"
        if is_loopback(args.host)
        else f"attnscope --engine {ip}:{port}"
    )
    print(
        f"attnscope serve: {what}; Ray actor on {where['host']} ({ip}) listening on {args.host}:{port} ({reach})",
        file=sys.stderr,
        flush=True,
    )
    if args.ready_file:
        Path(args.ready_file).write_text(f"{where['port']}\n", encoding="utf-8")
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        served = ray_engine.stop(actor)
        ray.shutdown()
        print(f"attnscope serve: stopped after {served} requests", file=sys.stderr)
    return 0
