"""``RemoteSession``: the :class:`attnscope.core.session.Session` API over the network.

    s = RemoteSession.connect("127.0.0.1:8765", token=...)   # an ``attnscope serve`` process
    s.load_model()                                           # the server's embedded default
    s.prefill("The cat sat on the mat."); s.step(3)
    w = s.weights(3, 4)                                      # bit-identical to in-process

It has the public methods and attributes the window's engine thread and the CLI use (``prefill``,
``step``, ``feed``, ``step_back``, ``weights``, ``sink_scores``, ``logits_at``, ``snapshot``,
``info``, ``tokens``, ``ids``, ...); the ``@remotable`` analysis functions
(:mod:`attnscope.core.analysis.remotable`) run on the server. What needs the model's tensors on this
side (``session.trace`` internals, ``session.backend.model``; Compare's run B lives on the
engine, :mod:`attnscope.core.analysis.compare_run_b`) raises
one :class:`~attnscope.core.errors.SessionError` line.

Reliability: every request has an inactivity timeout (progress messages from a long prefill reset
it); the socket's monitor reports a dropped connection at once (a killed server) and ZeroMQ
heartbeats catch a silent network drop within ``HEARTBEAT_TIMEOUT``. Either raises
:class:`EngineLost` (one line) and leaves this object usable: what it knows of the run (model,
prompt, token ids, sampling) stays, and :meth:`reconnect` opens a new connection and, when the
engine lost or changed that state (a restart, another client), reloads the model and replays
the prompt and the generated ids one by one, as a reopened session file does, to the same state.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from attnscope.core import backend_registry as registry
from attnscope.core.analysis.methods import AnalysisMethods
from attnscope.core.analysis.remotable import CALLBACKS, REGISTRY
from attnscope.core.errors import BadArgument, Cancelled, ModelLoadError, OutOfRange, SessionError
from attnscope.core.remote import wire
from attnscope.core.session import Snapshot, TopToken  # noqa: F401  (re-exported for callers)

if TYPE_CHECKING:
    from attnscope.core.session import Session

DEFAULT_PORT = 8765
#: seconds without any message from the engine before a request counts as lost
TIMEOUT_S = 120.0
#: loading (first conversion of a GGUF, a big checkpoint) sends progress only between stages
LOAD_TIMEOUT_S = 1800.0
CONNECT_TIMEOUT_S = 10.0
#: zstd on a 2048² float32 map: ~55 ms to compress + ~40 ms to decompress, ratio ~2.2 (measured
#: here, :mod:`attnscope.core.remote`): worth it only on links slower than this
COMPRESS_BELOW_BYTES_PER_S = 80e6


class RemoteError(SessionError):
    """The engine refused or failed a request (its one line)."""


#: why a connection ended when the engine's end closed it
_CLOSED = "the engine closed the connection: it stopped or the network dropped"


class EngineLost(RemoteError):
    """No connection to the engine (it stopped, or the network dropped): reconnect to go on.

    ``brief``: the message without what a window or a kept session would do next (the CLI, which
    exits, prints that)."""

    def __init__(self, message: str, brief: str | None = None):
        super().__init__(message)
        self.brief = brief or message


class Refused(RemoteError):
    """Wrong or missing token."""


class Stale(RemoteError):
    """The engine's state is not this session's any more (restart, another client): reconnect."""


class Busy(RemoteError):
    """The engine is running another request."""


class TooLarge(RemoteError):
    """A tile or reply over the engine's limits."""


_ERRORS = {
    "Refused": Refused,
    "Stale": Stale,
    "Busy": Busy,
    "TooLarge": TooLarge,
    "Cancelled": Cancelled,
    "IndexError": OutOfRange,  # an IndexError and a SessionError, as the engine's Session raised it
    "ValueError": BadArgument,  # a ValueError and a SessionError
    "ModelLoadError": ModelLoadError,
    "SessionError": RemoteError,
    "OSError": RemoteError,
    "Internal": RemoteError,
}


def parse_address(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (or ``"HOST"``, ``"[::1]:PORT"``) as ``(host, port)``.

    Raises:
        ValueError: empty host or a port that is not 1..65535.
    """
    text = (text or "").strip()
    if text.startswith("tcp://"):
        text = text[len("tcp://") :]
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.lstrip(":")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if not host:
        raise ValueError(f"engine address {text!r}: give HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}")
    try:
        port = int(port_text) if port_text else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"engine address {text!r}: the port must be a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"engine address {text!r}: port {port} is not in 1..65535")
    return host, port


def read_token(token_file: str | os.PathLike | None = None) -> str | None:
    """The client's token: the first line of ``token_file``, else ``$ATTNSCOPE_TOKEN``, else None.

    Raises:
        FileNotFoundError: ``token_file`` does not exist. ValueError: it is empty.
    """
    if token_file:
        p = Path(token_file).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"no such token file: {p}")
        tok = p.read_text(encoding="utf-8").strip().splitlines()
        if not tok or not tok[0].strip():
            raise ValueError(f"token file {p} is empty")
        return tok[0].strip()
    return os.environ.get("ATTNSCOPE_TOKEN") or None


@dataclass(frozen=True)
class RemoteBackend:
    """What ``session.backend`` tells callers about a remote engine: its backend name and device,
    and where it runs. The model's tensors stay on the server."""

    name: str
    device: str
    host: str
    engine: str  # "HOST:PORT" as connected

    @property
    def model(self):
        raise SessionError(
            "this needs the model in this process: the model runs on the engine at " + self.engine
        )

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise SessionError(
            f"this needs the backend in this process ({name}): the model runs on the engine at {self.engine}"
        )

    @property
    def where(self) -> str:
        """``"torch cpu on HOST"``, as the status bar says it."""
        return f"{self.name} {self.device} on {self.host}"


class RemoteTokenizer:
    """The little of a tokenizer callers read on this side: special ids, size, decode (remote)."""

    def __init__(self, session: RemoteSession, special_ids, vocab_size: int, chat_template: bool):
        self._s = session
        self.all_special_ids = list(special_ids)
        self._n = vocab_size
        self.chat_template = "remote" if chat_template else None

    def __len__(self) -> int:
        return self._n

    def decode(self, ids) -> str:
        return self._s._request("decode", {"ids": [int(i) for i in ids]})


class _LayerWindow:
    def __init__(self, w, engine: str):
        self.sliding_window = w
        self._engine = engine

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise SessionError(
            f"this view needs the layer's tensors ({name}), which stay on the engine at {self._engine}"
        )


class RemoteFinite:
    """``session.trace.finite`` of a remote session: the engine's
    :meth:`attnscope.core.trace.finite.FiniteWatch.records`, as its last state sent them."""

    def __init__(self, session: RemoteSession):
        self._s = session

    def records(self) -> list[dict] | None:
        """The engine's non-finite tensors (``[]``: all finite), None when the engine's backend
        does not check or the engine is older than this field."""
        recs = self._s._nonfinite
        return None if recs is None else [dict(r) for r in recs]


class RemoteTrace:
    """``session.trace`` of a remote session: per-layer sliding windows (``layers[i].sliding_window``),
    ``weights``/``sink_scores`` through the session, the engine's non-finite records (``finite``);
    anything else needs the local tensors."""

    def __init__(self, session: RemoteSession, windows):
        self._s = session
        self.layers = [_LayerWindow(w, session.engine) for w in windows]
        self.finite = RemoteFinite(session)

    def weights(self, layer, head, rows=None, cols=None):
        return self._s.weights(layer, head, rows, cols)

    def sink_scores(self, key: int = 0):
        return self._s.sink_scores(key)

    def __getattr__(self, name):
        raise SessionError(
            f"this view needs the trace's tensors ({name}), which stay on the engine at {self._s.engine}: "
            "not available over a remote engine yet"
        )


class RemoteSession(AnalysisMethods):
    """A session whose model runs in an ``attnscope serve`` process. Single-threaded, like Session.

    Raises (every method): :class:`EngineLost` (no answer within the timeout, or the connection
    dropped), :class:`Refused` (token), :class:`Stale` (the engine's state changed: call
    :meth:`reconnect`), and what the local Session method raises (SessionError, IndexError,
    ValueError, Cancelled), each as one line.

    The analyses are its methods as they are ``attnscope.Session``'s
    (:class:`~attnscope.core.analysis.methods.AnalysisMethods`: ``r.explain(...)``, ``r.head_effects(...)``),
    each run on the engine.
    """

    notice: str | None = None

    def __init__(self, address: str, token: str | None = None, timeout: float = TIMEOUT_S):
        self.host, self.port = parse_address(address)
        self.engine = f"{self.host}:{self.port}"
        self.token = token
        self.timeout = float(timeout)
        self._ids_counter = itertools.count(1)
        self._sock: Any = None
        self._monitor: Any = None
        self._instance: str | None = None
        self._gen = -1
        self._link_bps: float | None = None
        self.last_compute_s = 0.0  # the last request: seconds the engine computed (its reply says)
        self.last_wall_s = 0.0  # ... and seconds it took here, send to decoded reply
        self.desc: dict = {}
        self._load_args: dict | None = None
        self._clear_local()
        self.model_sha256: str | None = None
        self.model_ref: str | None = None

    # -- connecting -------------------------------------------------------------------------------
    @classmethod
    def connect(
        cls,
        address: str,
        token: str | None = None,
        timeout: float = TIMEOUT_S,
        connect_timeout: float = CONNECT_TIMEOUT_S,
    ) -> RemoteSession:
        """Connect to the engine at ``address`` and take over its state (model, sequence).

        Raises:
            EngineLost: nothing answers there within ``connect_timeout`` s. Refused: wrong token.
        """
        s = cls(address, token, timeout)
        try:
            s._open()
            s._hello(connect_timeout)
        except BaseException:
            s.close()
            raise
        return s

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def _open(self) -> None:
        import zmq

        self._close()
        # the process-wide context: never terminated by a garbage collection on some other thread
        # (a Context's __del__ blocks in term() while any of its sockets is open)
        sock: Any = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 6000)
        sock.setsockopt(zmq.RECONNECT_IVL, 200)
        if ":" in self.host:
            sock.setsockopt(zmq.IPV6, 1)
        self._monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        host = f"[{self.host}]" if ":" in self.host else self.host
        sock.connect(f"tcp://{host}:{self.port}")
        self._sock = sock
        self._up = False

    def _close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.disable_monitor()
            except Exception:
                pass
            self._monitor.close(0)
            self._sock.close(0)
        self._sock = self._monitor = None

    def close(self) -> None:
        """Close the connection (the engine keeps running and keeps its state)."""
        self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _hello(self, timeout: float) -> dict:
        reply = self._call("hello", {"tokens_from": 0}, timeout=timeout, connecting=True)
        self._describe(reply["result"])
        self._apply(reply.get("state") or {})
        return reply["result"]

    def reconnect(
        self,
        progress: Callable[[str, float], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_S,
    ) -> list[str]:
        """Connect again and bring the engine back to this session's state. Returns warnings.

        When the engine still holds this state (same instance and generation) nothing is re-run.
        Otherwise the model is loaded again where needed (the same reference, backend, dtype) and
        the prompt prefilled and the generated ids fed one by one (:meth:`feed`), which repeats the
        forwards that made them: weights, logits and sinks come out bit-identical on the same
        engine and device. A different weights hash is a warning.

        Raises:
            EngineLost: still nothing answers. SessionError: the prompt tokenizes differently now.
        """
        want: dict[str, Any] = dict(
            instance=self._instance,
            gen=self._gen,
            prompt=self.prompt,
            chat=self.chat_template,
            ids=list(self._ids),
            n_prompt=self._n_prompt,
            sampling=self.sampling,
            sha=self.model_sha256,
            info=self.info,
            load=self._load_args,
        )
        self._open()
        desc = self._hello(connect_timeout)
        if desc["instance"] == want["instance"] and self._gen == want["gen"]:
            return []
        warnings: list[str] = []
        say = progress or (lambda *_: None)
        info = want["info"]
        if info is not None:
            same = (
                desc.get("has_model")
                and self.model_sha256 == want["sha"]
                and self.info.dtype == info.dtype
                and self.backend.name == (want["load"] or {}).get("backend", self.backend.name)
            )
            if not same:
                load = dict(want["load"] or {"model": desc.get("model_ref") or None})
                say("Reloading the model on the engine…", 0.0)
                self.load_model(progress=progress, **load)
            if self.model_sha256 != want["sha"]:
                warnings.append(
                    f"the engine's model weights differ from this session's (sha256 {str(self.model_sha256)[:12]}… ≠ "
                    f"{str(want['sha'])[:12]}…): numbers may differ"
                )
        if want["prompt"] is not None and want["ids"]:
            say("Replaying the prompt…", 0.0)
            self.set_sampling(want["sampling"])
            self.prefill(want["prompt"], chat_template=want["chat"], cancelled=cancelled)
            if self._ids != want["ids"][: want["n_prompt"]]:
                raise SessionError(
                    "the engine tokenizes the prompt differently now: cannot replay this session"
                )
            gen = want["ids"][want["n_prompt"] :]
            if gen:
                self.feed(
                    gen,
                    progress=lambda d, t: say(f"Replaying {d}/{t} tokens", d / max(t, 1)),
                    cancelled=cancelled,
                )
        elif want["sampling"] is not None and self.info is not None:
            self.set_sampling(want["sampling"])
        return warnings

    # -- the wire ---------------------------------------------------------------------------------
    def check_link(self) -> str | None:
        """A look at the connection that sends nothing and never waits: None while it holds (or is
        still being made), else the one line saying it was lost (the sockets are then closed, as a
        failed request closes them, and :attr:`connected` turns False). The engine going away
        (stopped, killed, restarted: its end closes the TCP connection) or the network dropping
        (ZeroMQ's heartbeats, 6 s) is an event on the socket's monitor, read here. Call it on the
        thread that makes the requests (a ZeroMQ socket is not thread-safe): the window does, from
        an engine-thread job every few seconds while it is idle."""
        if self._sock is None:
            return str(self._not_connected())
        while self._monitor.poll(0):
            if self._monitor_event() == "disconnected":
                return str(self._lost(_CLOSED))
        return None

    def _monitor_event(self) -> str | None:
        """Read one event of the socket's monitor: "connected" (then :attr:`_up`), "disconnected"
        or None (another event)."""
        import zmq
        from zmq.utils.monitor import recv_monitor_message

        ev = recv_monitor_message(self._monitor)["event"]
        if ev == zmq.EVENT_CONNECTED:
            self._up = True
            return "connected"
        return "disconnected" if ev == zmq.EVENT_DISCONNECTED else None

    def _not_connected(self) -> EngineLost:
        return EngineLost(
            f"not connected to the engine at {self.engine} (the connection was lost): reconnect first"
        )

    def _lost(self, why: str) -> EngineLost:
        self._close()
        brief = f"lost the connection to the engine at {self.engine} ({why})"
        return EngineLost(f"{brief}; this session is kept here: reconnect to go on", brief)

    def _unreachable(self, timeout: float) -> EngineLost:
        """Connecting (or reconnecting) found no engine: no connection was lost, none was ever made."""
        self._close()
        return EngineLost(
            f"cannot reach the engine at {self.engine}: nothing answers there within {timeout:g} s "
            "(is `attnscope serve` running there, or an SSH tunnel open to it?)"
        )

    def _call(
        self,
        op: str,
        args: dict | None = None,
        *,
        progress: Callable | None = None,
        cancelled: Callable[[], bool] | None = None,
        timeout: float | None = None,
        connecting: bool = False,
        sequence: bool = False,
    ) -> dict:
        import zmq

        if self._sock is None:
            raise self._not_connected()
        rid = next(self._ids_counter)
        msg = {
            "v": wire.VERSION,
            "id": rid,
            "token": self.token,
            "op": op,
            "args": args or {},
            "session": [self._instance, self._gen] if sequence and self._instance else None,
            "compress": self._link_bps is not None
            and self._link_bps < COMPRESS_BELOW_BYTES_PER_S
            and wire.have_compression(),
        }
        frames = wire.pack(msg)
        from attnscope.core.remote.server import MAX_REQUEST_BYTES

        size = sum(len(memoryview(f).cast("B")) for f in frames)
        if size > MAX_REQUEST_BYTES:
            raise TooLarge(
                f"this request is {size / 1e6:.1f} MB, over the engine's limit of {MAX_REQUEST_BYTES / 1e6:.0f} MB"
            )
        timeout = self.timeout if timeout is None else timeout
        t_send = time.perf_counter()
        self._sock.send_multipart(frames, copy=False)
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        cancel_sent = False
        closed = False  # the engine's end closed: read what it sent first, then say so
        while True:
            now = time.monotonic()
            if now >= deadline:
                if connecting and not self._up:
                    raise self._unreachable(timeout)
                raise self._lost(f"no answer within {timeout:g} s")
            wait = min(deadline - now, 0.05 if cancelled is not None else deadline - now)
            if closed and not self._sock.poll(0, zmq.POLLIN):
                raise self._lost(_CLOSED)
            events = dict(poller.poll(0 if closed else max(1, int(wait * 1000))))
            if self._monitor in events and self._monitor_event() == "disconnected":
                if connecting and not self._up:
                    continue  # never connected (a host that refuses or drops it): ZeroMQ retries
                closed = True  # lost, once what the engine sent before closing is read (its last answer)
                continue
            if self._sock in events:
                got = self._sock.recv_multipart(copy=False)
                t_recv = time.perf_counter()
                try:
                    reply = wire.unpack(got, allow_dataclass=wire.core_dataclass)
                except wire.WireError as e:
                    raise RemoteError(f"the engine sent a message this client cannot read: {e}") from None
                if reply.get("id") not in (rid, None):
                    continue  # a late answer to a request that timed out or was abandoned, a keepalive
                deadline = time.monotonic() + timeout
                kind = reply.get("kind")
                if kind == "progress":
                    if progress is not None:
                        progress(*reply.get("args", []))
                    continue
                if kind == "error":
                    if reply.get("type") == "Stopping":  # SIGTERM on the engine: it goes away now
                        if isinstance(reply.get("state"), dict):  # the tokens a stopped step made stay
                            self._apply(reply["state"])
                        raise self._lost(str(reply.get("error") or "the engine is shutting down"))
                    exc = _ERRORS.get(str(reply.get("type")), RemoteError)
                    raise exc(str(reply.get("error") or "the engine refused the request"))
                self.last_compute_s = float(reply.get("compute_s") or 0.0)  # the engine's own time
                self.last_wall_s = time.perf_counter() - t_send
                self._measure(got, t_recv - t_send - self.last_compute_s)
                return reply
            if cancelled is not None and not cancel_sent and cancelled():
                self._sock.send_multipart(
                    wire.pack({"v": wire.VERSION, "id": rid, "token": self.token, "op": "cancel"})
                )
                cancel_sent = True

    def _measure(self, frames, seconds: float) -> None:
        """Keep an estimate of the link's throughput from big replies (decides compression)."""
        n = sum(len(f.buffer) for f in frames[1:])
        if n >= 4 << 20 and seconds > 0:
            bps = n / seconds
            self._link_bps = bps if self._link_bps is None else 0.5 * (self._link_bps + bps)

    def _request(self, op: str, args: dict | None = None, **kw):
        return self._call(
            op, args, sequence=op not in ("hello", "load", "models", "free_memory", "decode", "probe"), **kw
        )["result"]

    def _mutate(self, op: str, args: dict, tokens_from: int, **kw):
        args = dict(args, tokens_from=tokens_from)
        try:
            reply = self._call(op, args, sequence=op != "load", **kw)
        except (Cancelled, SessionError, IndexError, ValueError) as e:
            if not isinstance(e, EngineLost | Refused | Stale | Busy):
                self._resync()  # a failed/cancelled prefill or step changed the engine's sequence
            raise
        self._apply(reply.get("state") or {})
        return reply["result"]

    def _resync(self) -> None:
        try:
            reply = self._call("hello", {"tokens_from": 0})
        except SessionError:
            return
        self._describe(reply["result"])
        self._apply(reply.get("state") or {})

    # -- local copy of the engine's state ----------------------------------------------------------
    def _clear_local(self) -> None:
        self.info: Any = None  # attnscope.core.loading.model_info.ModelInfo once a model is loaded
        self.backend: Any = None  # RemoteBackend
        self.tokenizer: Any = None  # RemoteTokenizer
        self.trace: Any = None  # RemoteTrace
        self.prompt: str | None = None
        self.chat_template = False
        from attnscope.core.sampling import GREEDY

        self.sampling = GREEDY
        self._ids: list[int] = []
        self._tokens: list = []
        self._n_prompt = 0
        self._logits: Any = None
        self._notices: list[str] = []
        self._nonfinite: list[dict] | None = None  # the engine's FiniteWatch.records()

    def _describe(self, desc: dict) -> None:
        self.desc = desc
        if not desc.get("has_model"):
            self.info = None
            return
        self.info = desc["info"]
        self.model_sha256 = desc.get("model_sha256")
        self.model_ref = desc.get("model_ref")  # "default" or the path on the engine's machine
        self.backend = RemoteBackend(desc["backend"], desc["device"], desc["host"], self.engine)
        self.tokenizer = RemoteTokenizer(
            self, desc.get("special_ids", ()), self.info.vocab_size, self.info.has_chat_template
        )
        self.trace = RemoteTrace(
            self, desc.get("layer_windows") or [self.info.sliding_window] * self.info.n_layers
        )

    def _apply(self, st: dict) -> None:
        if "instance" in st:
            self._instance, self._gen = st["instance"], st["gen"]
        if "ids" not in st:
            return
        self._ids = list(st["ids"])
        self._n_prompt = st["n_prompt"]
        self.prompt = st["prompt"]
        self.chat_template = st["chat_template"]
        self.sampling = st["sampling"]
        self.notice = st.get("notice")
        self._notices = list(st.get("notices") or [])
        nf = st.get("nonfinite")
        self._nonfinite = [dict(r) for r in nf if isinstance(r, dict)] if isinstance(nf, list) else None
        self._logits = None if st.get("logits") is None else np.array(st["logits"])
        self._tokens = self._tokens[: st.get("tokens_from", 0)] + list(st.get("tokens") or [])

    # -- the Session API ---------------------------------------------------------------------------
    def load_model(
        self,
        model: str | os.PathLike | None = None,
        backend: str = registry.DEFAULT,
        device: str | None = None,
        dtype: str = "auto",
        progress: Callable[[str, float], None] | None = None,
        quantize: str = "none",
        device_map: str | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> RemoteSession:
        """Load ``model`` (a path on the *engine's* machine; None = its embedded default) there, as
        :meth:`attnscope.core.session.Session.load` does; the sequence is cleared. Returns self.

        Raises:
            ModelLoadError, SessionError: as Session.load (the engine keeps its previous model).
        """
        args = dict(
            model=None if model is None else str(model),
            backend=backend,
            device=device,
            dtype=dtype,
            quantize=quantize,
            device_map=device_map,
        )
        desc = self._mutate("load", args, 0, progress=progress, cancelled=cancelled, timeout=LOAD_TIMEOUT_S)
        self._describe(desc)
        self._load_args = args
        return self

    def models(self) -> list:
        """The engine machine's local models (:func:`attnscope.core.loading.catalog.scan` run there)."""
        return self._request("models")

    def free_memory(self, backend: str = registry.DEFAULT, device: str = "cpu") -> tuple[int | None, str]:
        """``(free bytes | None, what was measured)`` on the engine's machine
        (:func:`attnscope.core.loading.free_memory.free_memory` run there)."""
        free, label = self._request("free_memory", {"backend": backend, "device": device})
        return free, label

    def probe(self, nbytes: int) -> float:
        """Wall seconds for the engine to send back ``nbytes`` it already holds (no compute): the
        link's floor for a reply that size (:meth:`EngineServer.op_probe`).

        Raises:
            TooLarge: over the engine's reply limit. EngineLost: as every request."""
        t0 = time.perf_counter()
        got = self._request("probe", {"nbytes": int(nbytes)})
        wall = time.perf_counter() - t0
        if got.nbytes != nbytes // 4 * 4:
            raise RemoteError(f"the engine's probe sent {got.nbytes} bytes, not {nbytes}")
        return wall

    def encode(self, prompt: str, chat_template: bool = True) -> list[int]:
        return list(self._request("encode", {"prompt": prompt, "chat_template": chat_template}))

    def prefill(self, prompt, chat_template=True, progress=None, cancelled=None, all_logits=False):
        """As :meth:`attnscope.core.session.Session.prefill`, on the engine (progress relayed)."""
        self._require_model()
        self._mutate(
            "prefill",
            {"prompt": prompt, "chat_template": chat_template, "all_logits": all_logits},
            0,
            progress=progress,
            cancelled=cancelled,
        )
        return self.tokens

    def clear(self) -> None:
        self._require_model()
        self._mutate("clear", {}, 0)

    def step(self, n: int = 1, sampling=None, progress=None, cancelled=None):
        """As :meth:`attnscope.core.session.Session.step`, on the engine (progress relayed, cancel sent)."""
        self._require_model()
        before = len(self._ids)
        self._mutate("step", {"n": n, "sampling": sampling}, before, progress=progress, cancelled=cancelled)
        return self.tokens[before:]

    def feed(self, token_ids, progress=None, cancelled=None):
        self._require_model()
        before = len(self._ids)
        self._mutate(
            "feed", {"token_ids": [int(i) for i in token_ids]}, before, progress=progress, cancelled=cancelled
        )
        return self.tokens[before:]

    def step_back(self, n: int = 1) -> None:
        self._require_model()
        self._mutate("step_back", {"n": n}, max(0, len(self._ids) - n) if isinstance(n, int) else 0)

    def set_sampling(self, sampling) -> None:
        from attnscope.core.sampling import Sampling

        if not isinstance(sampling, Sampling):
            raise ValueError(f"expected a attnscope.core.sampling.Sampling, got {type(sampling).__name__}")
        self._require_model()
        self._mutate("set_sampling", {"sampling": sampling}, len(self._ids))

    @property
    def seq_len(self) -> int:
        return len(self._ids)

    @property
    def n_prompt(self) -> int:
        return self._n_prompt

    @property
    def n_generated(self) -> int:
        return len(self._ids) - self._n_prompt

    @property
    def ids(self) -> list[int]:
        return list(self._ids)

    @property
    def tokens(self) -> list:
        return list(self._tokens)

    @property
    def notices(self) -> list:
        return list(self._notices)

    def text(self, generated_only: bool = True) -> str:
        return self._request("text", {"generated_only": generated_only})

    def weights(
        self, layer: int, head: int, rows: slice | None = None, cols: slice | None = None
    ) -> np.ndarray:
        """Exact weights of one head from the engine, ``(n_query, n_key)`` float32, bit-identical to
        in-process. Raises IndexError (range), TooLarge (over the engine's tile limit)."""
        return self._request("weights", {"layer": layer, "head": head, "rows": rows, "cols": cols})

    def sink_scores(self, key: int = 0) -> np.ndarray:
        return self._request("sink_scores", {"key": key})

    def kv_cache_bytes(self, seq_len: int | None = None, dtype: str | None = None) -> int:
        from attnscope.core.kv_formula import kv_cache_bytes as kv_formula

        self._require_model()
        i = self.info
        return kv_formula(
            i.n_layers,
            i.n_kv_heads,
            i.head_dim,
            self.seq_len if seq_len is None else seq_len,
            dtype or i.dtype,
        )

    def logits_at(self, step: int | None = None) -> np.ndarray:
        if step is None:
            self._require_run()
            return self._logits
        return self._request("logits_at", {"step": step})

    def position_logits(self) -> np.ndarray:
        return self._request("position_logits")

    def next_token_probs(self, k: int = 10) -> list:
        return self._request("next_token_probs", {"k": k})

    @property
    def logits(self) -> np.ndarray:
        self._require_run()
        return self._logits

    def snapshot(self):
        """The engine's :class:`~attnscope.core.session.Snapshot` (one round trip)."""
        return self._request("snapshot")

    def local_snapshot(self):
        """A :class:`~attnscope.core.session.Snapshot` of this client's own copy of the engine's
        sequence (no round trip): what a window keeps showing once the engine is gone, e.g. the
        tokens a Step ×N made before the engine stopped. ``kv_cache_bytes`` is the formula's.

        Raises:
            SessionError: no model (nothing was ever described by an engine).
        """
        self._require_model()
        return Snapshot(
            info=self.info,
            backend=self.backend.name,
            device=str(self.backend.device),
            tokens=tuple(self._tokens),
            n_prompt=self._n_prompt,
            prompt=self.prompt,
            chat_template=self.chat_template,
            kv_cache_bytes=self.kv_cache_bytes(),
            notices=tuple(str(n) for n in self._notices),
            layer_windows=tuple(layer.sliding_window for layer in self.trace.layers) if self.trace else (),
        )

    def remote_call(self, name: str, args: tuple, kwargs: dict):
        """Run the ``@remotable`` function ``name`` on the engine (:mod:`attnscope.core.analysis.remotable`)."""
        import inspect

        fn = REGISTRY[name]
        bound = inspect.signature(fn).bind(self, *args, **kwargs)
        arguments = dict(bound.arguments)
        arguments.pop(next(iter(inspect.signature(fn).parameters)))  # the session
        cbs = {k: arguments.pop(k) for k in CALLBACKS if k in arguments}
        for k, v in list(arguments.items()):
            if callable(v):
                raise ValueError(
                    f"{name.rpartition('.')[2]}: the callable argument {k} cannot go to the engine"
                )
        kind = inspect.Parameter.VAR_KEYWORD
        params = inspect.signature(fn).parameters
        extra = {}
        for k in [k for k in arguments if params[k].kind == kind]:
            extra.update(arguments.pop(k))
        return self._call(
            "call",
            {"name": name, "args": [], "kwargs": {**arguments, **extra}},
            progress=cbs.get("progress"),
            cancelled=cbs.get("cancelled"),
            sequence=True,
        )["result"]

    def _require_model(self) -> None:
        if self.info is None:
            raise SessionError(f"the engine at {self.engine} has no model loaded: load one first")

    def _require_run(self) -> None:
        if self._logits is None:
            raise SessionError("nothing has run yet: run a prompt first")


def open_remote(
    args,
    progress: Callable[[str, float], None] | None = None,
    check: Callable[[Any], None] | None = None,
) -> RemoteSession:
    """The CLI's :func:`attnscope.core.cli.main.open_session` on ``--engine HOST:PORT``: connect
    (token from ``--token-file`` or ``$ATTNSCOPE_TOKEN``), load ``--model`` (a path on the engine's
    machine) when given or when the engine has no model, call ``check(info)`` (an argument the model
    rules out raises before the engine's run is replaced), then run ``--prompt`` and ``--steps``."""
    s = RemoteSession.connect(args.engine, token=read_token(getattr(args, "token_file", None)))
    try:
        _load_for(s, args, progress)
        if check is not None:
            check(s.info)
    except BaseException:
        s.close()
        raise
    if getattr(args, "prompt", None) is not None:
        s.prefill(args.prompt, chat_template=args.chat_template)
        if getattr(args, "steps", 0):
            s.step(args.steps)
        for note in s.notices:
            print(f"attnscope: note: {note}", file=sys.stderr)
    return s


def _load_for(s: RemoteSession, args, progress) -> None:
    """Load ``--model`` on the engine when given, when it has none, or on another backend."""
    if (
        getattr(args, "model", None) is not None
        or s.info is None
        or getattr(args, "backend", registry.DEFAULT) != s.backend.name
    ):
        s.load_model(
            args.model,
            backend=getattr(args, "backend", registry.DEFAULT),
            device=getattr(args, "device", None),
            dtype=getattr(args, "dtype", "auto"),
            quantize=getattr(args, "quantize", "none"),
            device_map=getattr(args, "device_map", None),
            progress=progress,
        )


def engine_where(session: Session | RemoteSession) -> str | None:
    """``"torch cpu on HOST"`` for a remote session, None for a local one."""
    b = getattr(session, "backend", None)
    return b.where if isinstance(b, RemoteBackend) else None
