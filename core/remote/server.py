"""The engine server: one process, one :class:`attnscope.core.session.Session`, one ZeroMQ socket.

``attnscope serve`` runs :meth:`EngineServer.serve_forever`. Requests are served one at a time on
the thread that owns the session (MLX streams belong to the thread that made them; the session is
single-threaded). While a long request runs (load, prefill, replay), its progress callback and its
``cancelled()`` check poll the socket: a cancel from the same client stops it at the next chunk, a
``ping`` is answered, any other request gets one "busy" line. The answered operations are the
methods ``op_*`` below, plus the ``@remotable`` analysis functions of
:mod:`attnscope.core.analysis.remotable` by name; nothing else runs, no message is unpickled or
evaluated (:mod:`attnscope.core.remote.wire`).

Every refusal is one reply with one line and the server goes on serving: a wrong or missing token
(``Refused``, nothing else is said), a malformed message, an unknown operation or bad arguments
(``ValueError``), a layer or head out of range (``IndexError``), a tile over ``max_tile_cells`` or a
reply over ``max_reply_bytes`` (``TooLarge``), a request that names another session state than the
engine holds (``Stale``: the engine restarted or another client drove it), a request while another
runs (``Busy``). A message over ``max_request_bytes`` is dropped by ZeroMQ itself (``MAXMSGSIZE``)
before Python sees it; the client refuses to send one.
"""

from __future__ import annotations

import hmac
import inspect
import os
import secrets
import socket as pysocket
import sys
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from attnscope.core import backend_registry as registry
from attnscope.core.analysis.remotable import CALLBACKS, REGISTRY, served
from attnscope.core.errors import AttnScopeError, Cancelled, SessionError
from attnscope.core.io.provenance import nonfinite_records
from attnscope.core.remote import wire

if TYPE_CHECKING:
    from attnscope.core.session import Session

#: one tile (or map) at most this many cells: 2^26 float32 = 256 MiB (an 8192² map)
MAX_TILE_CELLS = 1 << 26
#: a reply's array bytes at most (a dict of maps, the logits of every position...)
MAX_REPLY_BYTES = 1 << 30
#: a request message at most (prompts and replayed token ids are far smaller)
MAX_REQUEST_BYTES = 16 << 20

LOOPBACK = ("127.0.0.1", "localhost", "::1")

#: error types a reply may carry (the client turns each into an exception)
ERROR_TYPES = (
    "Refused",
    "ValueError",
    "IndexError",
    "TooLarge",
    "Stale",
    "Busy",
    "Cancelled",
    "Stopping",
    "SessionError",
    "ModelLoadError",
    "OSError",
    "Internal",
)

#: operations that read or change the running sequence: they must name the state they expect
_SEQUENCE_OPS = frozenset(
    {
        "prefill",
        "clear",
        "step",
        "feed",
        "step_back",
        "set_sampling",
        "weights",
        "sink_scores",
        "logits_at",
        "position_logits",
        "next_token_probs",
        "text",
        "kv_cache_bytes",
        "snapshot",
        "call",
    }
)
_MUTATING = frozenset({"load", "prefill", "clear", "step", "feed", "step_back", "set_sampling"})


class _Refusal(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


#: a running request's client is sent a keepalive after this many seconds without a message, at the
#: request's next cancel check (a client that went away is noticed then)
ALIVE_EVERY_S = 0.5


def _peer(frames) -> str:
    """The sending peer's address of a received message (ZeroMQ's ``Peer-Address``), or "unknown"."""
    try:
        return str(frames[0].get("Peer-Address"))
    except Exception:
        return "unknown"


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    return host in LOOPBACK or host.startswith("127.")


def make_token() -> str:
    """A fresh random token (32 URL-safe characters, 192 bits)."""
    return secrets.token_urlsafe(24)


class EngineServer:
    """Serves one session over a ZeroMQ ROUTER socket bound to ``tcp://host:port``.

    Args:
        session: a loaded :class:`~attnscope.core.session.Session`, or None (a client loads one).
        host, port: where to listen; ``port=0`` picks a free port (see :attr:`port`).
        token: the token clients must send; None only on a loopback ``host`` (``--no-token``).
        load_kwargs: ``Session.load`` options the server was started with (``device``, ``device_map``),
            used when a client's load leaves them out.

    Raises:
        SessionError: no token on a non-loopback address. OSError/zmq.ZMQError: cannot bind.
    """

    def __init__(
        self,
        session: Session | None = None,
        host: str = "127.0.0.1",
        port: int = 8765,
        token: str | None = None,
        load_kwargs: dict | None = None,
        max_tile_cells: int = MAX_TILE_CELLS,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        log: Callable[[str], None] | None = None,
    ):
        import zmq

        if token is None and not is_loopback(host):
            raise SessionError(
                f"refusing to serve on {host} without a token: give --token-file FILE "
                "(--no-token is only for 127.0.0.1)"
            )
        self.session = session
        self.token = token
        self.host = host
        self.load_kwargs = dict(load_kwargs or {})
        self.max_tile_cells = max_tile_cells
        self.max_reply_bytes = max_reply_bytes
        self.instance = secrets.token_hex(8)  # a restart is a new instance: clients replay
        self.gen = 0  # bumped by every change of the sequence or model
        self.model_sha256: str | None = None
        self.log = log or (lambda msg: print(f"attnscope serve: {msg}", file=sys.stderr, flush=True))
        self._ctx = zmq.Context()
        self.sock = self._ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, max_request_bytes)
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, 2000)  # libzmq's own thread answers: works while busy
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 10000)
        # a send to a client whose connection is gone raises EHOSTUNREACH instead of vanishing:
        # the request it was running for is cancelled at its next chunk (see _send)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if ":" in host:
            self.sock.setsockopt(zmq.IPV6, 1)
        addr = f"tcp://[{host}]" if ":" in host else f"tcp://{host}"
        if port == 0:
            self.port = self.sock.bind_to_random_port(addr)
        else:
            self.sock.bind(f"{addr}:{port}")
            self.port = port
        self._stop = False
        self._clients: set[bytes] = set()  # identities that sent a request (told when the engine stops)
        self._probe: Any = None  # op_probe's float32 buffer, kept between probes
        self._busy: Any = None  # (identity, request id, op) while a request runs
        self._cancel = False
        self._last_sent = 0.0  # monotonic time of the last message sent (keepalives: _cancelled)
        self._refusal_logged = -1e9  # monotonic time a refused token was last logged
        self.served = 0
        served()  # every @remotable function of attnscope.core.analysis, imported
        if session is not None:
            self._loaded()

    # -- the loop ---------------------------------------------------------------------------------
    def serve_forever(self, poll_ms: int = 200) -> None:
        """Answer requests until :meth:`stop` (or SIGINT in the CLI)."""
        while not self._stop:
            if not self.sock.poll(poll_ms):
                continue
            frames = self.sock.recv_multipart(copy=False)
            self._clients.add(frames[0].bytes)
            self._serve_one(frames[0].bytes, frames[1:])
        # stopped between requests (SIGTERM): each client's next request reads this first, so it
        # says the engine is shutting down, not only that the connection closed (docs/remote.md)
        for ident in self._clients:
            try:
                self._error(ident, None, "Stopping", "the engine is shutting down")
            except Exception:  # noqa: BLE001 (a client already gone: nothing to tell)
                pass

    def stop(self) -> None:
        """Make :meth:`serve_forever` return, stopping the request it runs at its next cancel check
        (its client is told the engine is shutting down). Thread-safe flags: SIGTERM calls this."""
        self._stop = True
        if self._busy is not None:
            self._cancel = True

    def close(self) -> None:
        # after a stop, up to 0.5 s to send the last answers ("the engine is shutting down")
        self.sock.close(500 if self._stop else 0)
        self._ctx.term()

    # -- one request ------------------------------------------------------------------------------
    def _send(self, ident: bytes, obj: dict, compress: bool = False) -> None:
        self._send_frames(ident, wire.pack(obj, compress))

    def _send_frames(self, ident: bytes, frames: list) -> None:
        """Send to one client; a client that went away (killed, its network dropped) costs one log
        line, and the request running for it is cancelled at its next progress or cancel check."""
        import errno

        import zmq

        self._last_sent = time.monotonic()
        try:
            # never block the engine on one client: a full queue (1,000 messages unread) drops it
            self.sock.send_multipart([ident, *frames], copy=False, flags=zmq.NOBLOCK)
        except zmq.ZMQError as e:
            if e.errno == errno.EAGAIN:
                self.log("a client is not reading its replies: one dropped")
                return
            if e.errno != errno.EHOSTUNREACH:
                raise
            if self._busy is not None and self._busy[0] == ident and not self._cancel:
                self._cancel = True
                self.log(f"the client of {self._busy[2]} went away: its request stops here")

    def _error(self, ident: bytes, rid, kind: str, message: str) -> None:
        self._send(ident, {"id": rid, "kind": "error", "type": kind, "error": message})

    def _parse(self, ident: bytes, frames) -> dict | None:
        """The request, or None after replying with its refusal."""
        try:
            req = wire.unpack(frames, allow_dataclass=wire.SERVER_DATACLASSES.__contains__)
        except wire.WireError as e:
            self._error(ident, None, "ValueError", str(e))
            return None
        rid = req.get("id")
        if self.token is not None:
            given = req.get("token")
            if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self.token.encode()):
                self._error(ident, rid, "Refused", "refused: wrong or missing token")
                now = time.monotonic()
                if now - self._refusal_logged >= 10.0:  # a flood of bad tokens is one line per 10 s
                    self._refusal_logged = now
                    self.log(f"refused a request with a wrong or missing token (from {_peer(frames)})")
                return None
        if req.get("v") != wire.VERSION:
            self._error(
                ident,
                rid,
                "ValueError",
                f"protocol version {req.get('v')!r}, this engine speaks {wire.VERSION}",
            )
            return None
        return req

    def _serve_one(self, ident: bytes, frames) -> None:
        req = self._parse(ident, frames)
        if req is None:
            return
        rid, op = req.get("id"), req.get("op")
        if op in ("ping", "cancel"):
            self._send(ident, {"id": rid, "kind": "result", "result": "idle"})
            return
        fn = getattr(self, f"op_{op}", None) if isinstance(op, str) and op.isidentifier() else None
        args = req.get("args") or {}
        if fn is None or not isinstance(args, dict):
            self._error(ident, rid, "ValueError", f"malformed request: unknown operation {op!r}")
            return
        try:
            inspect.signature(fn).bind(**args)
        except TypeError as e:
            self._error(ident, rid, "ValueError", f"malformed request: {op}: {e}")
            return
        self._busy, self._cancel = (ident, rid, op), False
        t0 = time.perf_counter()
        try:
            if op in _SEQUENCE_OPS:
                self._check_state(req.get("session"))
            result = fn(**args)
            reply = {"id": rid, "kind": "result", "result": result}
            if op in _MUTATING or op == "hello":
                reply["state"] = self._state(args)
            reply["compute_s"] = time.perf_counter() - t0
            frames_out = wire.pack(reply, compress=bool(req.get("compress")))
            size = sum(len(memoryview(f).cast("B")) for f in frames_out[1:])
            if size > self.max_reply_bytes:
                raise _Refusal(
                    "TooLarge",
                    f"the reply would be {size / 1e6:.0f} MB, over the engine's limit of {self.max_reply_bytes / 1e6:.0f} MB: ask for a smaller tile",
                )
            self._send_frames(ident, frames_out)
        except _Refusal as e:
            self._error(ident, rid, e.kind, str(e))
        except Cancelled as e:
            if self._stop:
                # the tokens a stopped step or feed made stay the client's (docs/remote.md)
                reply = {"id": rid, "kind": "error", "type": "Stopping"}
                reply["error"] = f"the engine is shutting down ({op} stopped: {e})"
                if op in ("step", "feed") and self.session is not None:
                    reply["state"] = self._state(args)
                self._send(ident, reply)
            else:
                self._error(ident, rid, "Cancelled", str(e) or "cancelled")
        except IndexError as e:
            self._error(ident, rid, "IndexError", _line(e))
        except ValueError as e:
            self._error(ident, rid, "ValueError", _line(e))
        except AttnScopeError as e:
            kind = (
                "ModelLoadError"
                if type(e).__name__ in ("ModelLoadError", "UnsupportedModelError")
                else "SessionError"
            )
            self._error(ident, rid, kind, _line(e))
        except OSError as e:
            self._error(ident, rid, "OSError", _line(e))
        except Exception as e:  # a bug: say it in one line, keep serving
            traceback.print_exc()
            self._error(ident, rid, "Internal", f"internal error in the engine: {type(e).__name__}: {e}")
        finally:
            self._busy = None
            self.served += 1

    def _check_state(self, expected) -> None:
        if expected is None:
            return
        if not (isinstance(expected, list | tuple) and len(expected) == 2):
            raise _Refusal("ValueError", "malformed request: session must be [instance, generation]")
        if expected[0] != self.instance or expected[1] != self.gen:
            why = "restarted" if expected[0] != self.instance else "was driven by another client"
            raise _Refusal(
                "Stale", f"the engine {why} since this session last saw it: reconnect to replay it"
            )

    # -- while busy -------------------------------------------------------------------------------
    def _poll_while_busy(self) -> None:
        """Handle what arrived while a request runs: its cancel, pings, a busy line for the rest."""
        import zmq

        while self.sock.poll(0, zmq.POLLIN):
            frames = self.sock.recv_multipart(copy=False)
            ident = frames[0].bytes
            req = self._parse(ident, frames[1:])
            if req is None:
                continue
            busy_ident, busy_id, busy_op = self._busy
            if req.get("op") == "cancel" and ident == busy_ident and req.get("id") == busy_id:
                self._cancel = True
            elif req.get("op") in ("ping", "cancel"):
                self._send(ident, {"id": req.get("id"), "kind": "result", "result": f"busy: {busy_op}"})
            else:
                self._error(
                    ident,
                    req.get("id"),
                    "Busy",
                    f"the engine is busy ({busy_op}): try again when it finishes",
                )

    def _cancelled(self) -> bool:
        """The running request's cancel check: also answers what arrived meanwhile and, every
        :data:`ALIVE_EVERY_S`, sends its client a keepalive (``{"id": -1, "kind": "alive"}``, which
        every client skips as an answer to no request of its own), so a client that went away is
        noticed (``ROUTER_MANDATORY``: the send fails) by a request that reports no progress."""
        now = time.monotonic()
        if self._busy is not None and now - self._last_sent >= ALIVE_EVERY_S:
            self._send(self._busy[0], {"id": -1, "kind": "alive"})
        self._poll_while_busy()
        return self._cancel

    def _progress(self, *args) -> None:
        ident, rid, _ = self._busy
        self._send(ident, {"id": rid, "kind": "progress", "args": list(args)})
        self._poll_while_busy()

    # -- state ------------------------------------------------------------------------------------
    def _loaded(self) -> None:
        from attnscope.core.loading.model_hash import model_sha256

        self.model_sha256 = model_sha256(self._require().info.source)
        self.gen += 1

    def _require(self) -> Session:
        if self.session is None:
            raise SessionError("the engine has no model loaded: load one first")
        return self.session

    def describe(self) -> dict:
        """What the engine runs: model info, backend, device, host, weights hash, per-layer windows."""
        s = self.session
        out = {
            "host": pysocket.gethostname(),
            "instance": self.instance,
            "pid": os.getpid(),
            "has_model": s is not None,
        }
        if s is not None:
            from attnscope.core.analysis.kv_live import layer_windows

            try:
                windows = list(layer_windows(s.backend))
            except Exception:
                windows = [s.info.sliding_window] * s.info.n_layers
            from attnscope.core.io.sessionfile import model_reference

            out.update(
                info=s.info,
                model_ref=model_reference(s.info.source),
                backend=s.backend.name,
                device=str(s.backend.device),
                model_sha256=self.model_sha256,
                layer_windows=windows,
                special_ids=list(getattr(s.tokenizer, "all_special_ids", ()) or ()),
            )
        return out

    def _state(self, args: dict) -> dict:
        st = {"instance": self.instance, "gen": self.gen}
        s = self.session
        if s is None:
            return st
        ids = s.ids
        start = args.get("tokens_from", 0) if isinstance(args.get("tokens_from", 0), int) else 0
        st.update(
            ids=ids,
            n_prompt=s.n_prompt,
            prompt=s.prompt,
            chat_template=s.chat_template,
            sampling=s.sampling,
            notice=s.notice,
            notices=[str(n) for n in s.notices],
            # the forward's non-finite tensors, for the client's sidecars (attnscope.core.trace.finite)
            nonfinite=nonfinite_records(s),
            logits=s._logits,
            tokens_from=start,
            tokens=[s._token(i) for i in range(min(max(start, 0), len(ids)), len(ids))],
        )
        return st

    # -- operations (the only things a client can ask for) ------------------------------------------
    def op_hello(self, tokens_from: int = 0):
        return self.describe()

    def op_load(
        self,
        model=None,
        backend=registry.DEFAULT,
        device=None,
        dtype="auto",
        quantize="none",
        device_map=None,
        tokens_from: int = 0,
    ):
        from attnscope.core.session import Session

        def progress(message, fraction):
            self._progress(message, fraction)
            if self._cancel:
                raise Cancelled("loading cancelled; the engine keeps its previous model")

        kw = dict(self.load_kwargs)
        kw.update({k: v for k, v in dict(device=device, device_map=device_map).items() if v is not None})
        if self.session is not None:  # the Compare tab's run B goes first: never old A + B + new A
            from attnscope.core.analysis.compare_run_b import drop

            drop(self.session)
        s = Session.load(model, backend=backend, dtype=dtype, progress=progress, quantize=quantize, **kw)
        self.session = s  # a failed or cancelled load keeps the previous one
        self._loaded()
        return self.describe()

    def op_models(self):
        from attnscope.core.loading import catalog

        return catalog.scan()

    def op_probe(self, nbytes):
        """``nbytes`` (rounded down to whole float32 cells) of a buffer the engine keeps, sent back
        at once: the link's own cost of a reply that size, with no compute (``attnscope bench
        --engine``'s transport floor). The buffer is ones, never uninitialised memory; at most the
        reply limit.

        Raises:
            ValueError: ``nbytes`` is not a non-negative int. _Refusal TooLarge: over the reply limit.
        """
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise ValueError("malformed request: probe takes a byte count")
        if nbytes > self.max_reply_bytes:
            raise _Refusal(
                "TooLarge",
                f"a {nbytes / 1e6:.0f} MB probe is over the engine's reply limit of {self.max_reply_bytes / 1e6:.0f} MB",
            )
        import numpy as np

        n = nbytes // 4
        if self._probe is None or self._probe.size != n:
            self._probe = np.ones(n, np.float32)
        return self._probe

    def op_free_memory(self, backend=registry.DEFAULT, device="cpu"):
        """``[free bytes | None, what was measured]`` on the engine's machine
        (:func:`attnscope.core.loading.free_memory.free_memory`): the model picker's Fit column."""
        from attnscope.core.loading.free_memory import free_memory

        if not (isinstance(backend, str) and isinstance(device, str)):
            raise ValueError("malformed request: free_memory takes a backend and a device name")
        free, label = free_memory(backend, device)
        return [free, label]

    def op_prefill(self, prompt, chat_template=True, all_logits=False, tokens_from: int = 0):
        s = self._require()
        self.gen += 1  # even a failed prefill changes the sequence (it is cleared first)
        s.prefill(
            prompt,
            chat_template=chat_template,
            progress=self._progress,
            cancelled=self._cancelled,
            all_logits=all_logits,
        )
        return None

    def op_clear(self, tokens_from: int = 0):
        self._require().clear()
        self.gen += 1

    def op_step(self, n=1, sampling=None, tokens_from: int = 0):
        s = self._require()
        before = s.seq_len
        try:
            s.step(n, sampling, progress=self._progress, cancelled=self._cancelled)
        finally:
            if s.seq_len != before or sampling is not None:
                self.gen += 1

    def op_feed(self, token_ids, tokens_from: int = 0):
        s = self._require()
        before = s.seq_len
        try:
            s.feed(list(token_ids), progress=self._progress, cancelled=self._cancelled)
        finally:
            if s.seq_len != before:
                self.gen += 1

    def op_step_back(self, n=1, tokens_from: int = 0):
        self._require().step_back(n)
        self.gen += 1

    def op_set_sampling(self, sampling, tokens_from: int = 0):
        self._require().set_sampling(sampling)
        self.gen += 1

    def op_weights(self, layer, head, rows=None, cols=None):
        s = self._require()
        self._check_cells(s, rows, cols)
        return s.weights(layer, head, rows, cols)

    def op_sink_scores(self, key=0):
        return self._require().sink_scores(key)

    def op_logits_at(self, step=None):
        return self._require().logits_at(step)

    def op_position_logits(self):
        return self._require().position_logits()

    def op_next_token_probs(self, k=10):
        return self._require().next_token_probs(k)

    def op_text(self, generated_only=True):
        return self._require().text(generated_only)

    def op_decode(self, ids):
        from attnscope.core.tokens import decode_text

        return decode_text(self._require().tokenizer, ids)  # an unknown id reads <id N>

    def op_encode(self, prompt, chat_template=True):
        return self._require().encode(prompt, chat_template)

    def op_kv_cache_bytes(self, seq_len=None, dtype=None):
        return self._require().kv_cache_bytes(seq_len, dtype)

    def op_snapshot(self):
        return self._require().snapshot()

    def op_call(self, name, args=(), kwargs=None):
        """Run the ``@remotable`` function ``name`` on this session (``args``/``kwargs`` without
        the session; callbacks are this server's own)."""
        fn = REGISTRY.get(name) if isinstance(name, str) else None
        if fn is None:
            raise ValueError(f"malformed request: {name!r} is not a function this engine offers")
        kwargs = dict(kwargs or {})
        params = inspect.signature(fn).parameters
        for cb in CALLBACKS:
            kwargs.pop(cb, None)
        if "cancelled" in params:
            kwargs["cancelled"] = self._cancelled
        if "progress" in params:
            kwargs["progress"] = self._progress
        s = self._require()
        try:
            bound = inspect.signature(fn).bind(s, *list(args), **kwargs)
        except TypeError as e:
            raise ValueError(f"malformed request: {name.rpartition('.')[2]}: {e}") from None
        self._check_call_cells(s, name, bound.arguments)
        return fn(*bound.args, **bound.kwargs)

    # -- limits -----------------------------------------------------------------------------------
    def _check_cells(self, s, rows, cols) -> None:
        n = s.seq_len
        for part in (rows, cols):
            if part is not None and not isinstance(part, slice | int):
                raise ValueError(f"rows/cols must be slices, got {type(part).__name__}")
        nr = len(range(*rows.indices(n))) if isinstance(rows, slice) else (1 if isinstance(rows, int) else n)
        nc = len(range(*cols.indices(n))) if isinstance(cols, slice) else (1 if isinstance(cols, int) else n)
        if nr * nc > self.max_tile_cells:
            raise _Refusal(
                "TooLarge",
                f"a {nr} × {nc} tile is {nr * nc:,} cells, over the engine's limit of {self.max_tile_cells:,}: ask for a smaller tile",
            )

    def _check_call_cells(self, s, name: str, a: dict) -> None:
        short = name.rpartition(".")[2]
        if short in ("map_tile", "b_maps"):
            self._check_cells(s, a.get("rows"), a.get("cols"))
        elif short == "map_at":
            n = a.get("n") if isinstance(a.get("n"), int) else s.seq_len
            self._check_cells(s, slice(0, n), slice(0, n))
        for key in ("out", "out_cols", "size"):
            v = a.get(key)
            if isinstance(v, int) and v * v > self.max_tile_cells:
                raise _Refusal("TooLarge", f"{key}={v} asks for {v * v:,} cells, over the engine's limit")


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
