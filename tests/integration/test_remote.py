"""Remote engine: ``attnscope serve`` + ``RemoteSession`` on localhost.

Servers run in a thread of this process (``EngineServer`` on a random free port) or, where the test
kills one, as an ``attnscope serve`` subprocess; each is stopped when its test ends.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest

zmq = pytest.importorskip("zmq", reason="the remote engine needs pyzmq (pip install -e '.[remote]')")

from attnscope.core.analysis import aggregate as agg  # noqa: E402
from attnscope.core.analysis.sinks import session_sink_report  # noqa: E402
from attnscope.core.analysis.timeline import next_tokens  # noqa: E402
from attnscope.core.errors import SessionError  # noqa: E402
from attnscope.core.openmp import OPENMP_ENV  # noqa: E402
from attnscope.core.remote import wire  # noqa: E402
from attnscope.core.remote.client import (  # noqa: E402
    EngineLost,
    Refused,
    RemoteSession,
    TooLarge,
    engine_where,
    parse_address,
    read_token,
)
from attnscope.core.remote.server import EngineServer  # noqa: E402
from attnscope.core.sampling import Sampling  # noqa: E402
from tiny_models import save_tiny  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-token-for-tests"


@contextlib.contextmanager
def serving(session, token: str | None = TOKEN, port: int = 0, **kw):
    """An EngineServer for ``session`` on a free localhost port (or ``port``), served from a thread."""
    server = EngineServer(session, host="127.0.0.1", port=port, token=token, **kw)
    th = threading.Thread(target=server.serve_forever, kwargs={"poll_ms": 20}, daemon=True)
    th.start()
    try:
        yield server
    finally:
        server.stop()
        th.join(10)
        if th.is_alive():
            import traceback

            stack = "".join(traceback.format_stack(sys._current_frames()[th.ident]))
            raise AssertionError(f"the server thread did not stop:\n{stack}")
        server.close()


def _same_run(remote, local, layers_heads):
    assert remote.ids == local.ids and remote.n_prompt == local.n_prompt
    assert [t.text for t in remote.tokens] == [t.text for t in local.tokens]
    for layer, head in layers_heads:
        a, b = local.weights(layer, head), remote.weights(layer, head)
        assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
        assert np.array_equal(a, b), (layer, head)  # bit-identical, not close
    assert np.array_equal(local.logits, remote.logits)
    for step in range(local.n_generated + 1):
        assert np.array_equal(local.logits_at(step), remote.logits_at(step))
    assert np.array_equal(local.sink_scores(), remote.sink_scores())
    rl, rr = session_sink_report(local), session_sink_report(remote)
    assert np.array_equal(rl.sink, rr.sink) and np.array_equal(rl.sink_set, rr.sink_set)
    assert np.array_equal(rl.running, rr.running, equal_nan=True)
    assert remote.kv_cache_bytes() == local.kv_cache_bytes() > 0


# -- the wire, no server ----------------------------------------------------------------------------
def test_wire_roundtrip_keeps_arrays_bit_exact_and_types():
    rng = np.random.default_rng(0)
    value = {
        "f32": rng.random((3, 5), dtype=np.float32),
        "f64": rng.random(4),
        "i64": np.arange(6, dtype=np.int64).reshape(2, 3),
        "big_endian": np.arange(4, dtype=">i4"),
        "bool": np.array([True, False]),
        "empty": np.zeros((0, 7), np.float32),
        "t": (1, "two", None, 3.5),
        "s": slice(2, None, None),
        "nested": [{"k": slice(0, 4)}, (np.float32(1.5),)],
        "keys": {(1, 2): "pair"},
        "sampling": Sampling(temperature=0.7, top_k=5, seed=3),
    }
    header, bufs = wire.encode(value)
    back = wire.decode(header, [bytes(b) for b in bufs], wire.core_dataclass)
    for k in ("f32", "f64", "i64", "bool", "empty"):
        assert back[k].dtype == value[k].dtype and np.array_equal(back[k], value[k])
    assert back["big_endian"].dtype == np.dtype("<i4") and back["big_endian"].tolist() == [0, 1, 2, 3]
    assert back["t"] == (1, "two", None, 3.5) and back["s"] == slice(2, None, None)
    assert back["nested"] == [{"k": slice(0, 4)}, (1.5,)] and back["keys"] == {(1, 2): "pair"}
    assert back["sampling"] == Sampling(temperature=0.7, top_k=5, seed=3)
    assert b"pickle" not in header and all(isinstance(b, memoryview) for b in bufs)


@pytest.mark.parametrize(
    "header, bufs, message",
    [
        (b"\x80\x04not json", [], "not JSON"),
        (b'{"a": {"__nd__": 3, "dtype": "<f4", "shape": [2]}}', [b"\0" * 8], "names no buffer"),
        (b'{"a": {"__nd__": 0, "dtype": "<f4", "shape": [3]}}', [b"\0" * 8], "shape needs 12"),
        (b'{"a": {"__nd__": 0, "dtype": "|O", "shape": [1]}}', [b"\0" * 8], "bad array"),
        (b'{"a": {"__dc__": "os.system", "f": {"command": "echo hi"}}}', [], "not accepted"),
        (
            b'{"a": {"__dc__": "attnscope.core.sampling.Sampling", "f": {"temperature": -1}}}',
            [],
            "bad Sampling",
        ),
        (b'{"a": {"__slice__": ["x", 1, null]}}', [], "a slice is"),
    ],
)
def test_wire_refuses_malformed_messages_in_one_line(header, bufs, message):
    with pytest.raises(wire.WireError, match=message) as e:
        wire.decode(header, bufs, wire.SERVER_DATACLASSES.__contains__)
    assert "\n" not in str(e.value)


def test_wire_compresses_big_buffers_when_asked():
    pytest.importorskip("zstandard")
    w = np.tril(np.random.default_rng(1).random((1024, 1024), dtype=np.float32))
    header, bufs = wire.encode({"w": w}, compress=True)
    assert len(bufs[0]) < w.nbytes * 0.8
    assert np.array_equal(wire.decode(header, bufs, None)["w"], w)


@contextlib.contextmanager
def _no_cyclic_collector():
    """Automatic collection off for the block, then as it was: a GUI test's worker keeps it off for good
    (attnscope.app.engine collects on the GUI thread only), and switching it on there lets a
    collection on the engine thread free a Qt object: the deadlock that guard exists for."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def test_wire_frees_a_message_buffers_without_the_cyclic_collector():
    """encode/decode leave no reference cycle holding the message's arrays: an engine kept ~8 sent
    2048² maps (16.8 MB each) alive until Python's collector ran, so each new map was computed into
    fresh pages (the map bench)."""
    with _no_cyclic_collector():
        a = np.arange(4096, dtype=np.float32).reshape(64, 64)
        alive = weakref.ref(a)
        header, bufs = wire.encode({"w": a, "nested": [(a[:2], {1: a[3]})]})
        assert len(bufs) == 3
        del a, bufs
        assert alive() is None  # freed by reference counting alone
        frame = np.frombuffer(np.arange(4096, dtype=np.float32).tobytes(), dtype=np.uint8).copy()
        frame_alive = weakref.ref(frame)
        header, _ = wire.encode({"w": np.zeros((64, 64), np.float32)})
        got = wire.decode(header, [frame])
        assert got["w"][1, 1] == 65.0
        del frame, got
        assert frame_alive() is None


def test_addresses_and_tokens(tmp_path, monkeypatch):
    assert parse_address("gpu-box:9000") == ("gpu-box", 9000)
    assert parse_address("127.0.0.1") == ("127.0.0.1", 8765)
    assert parse_address("[::1]:8766") == ("::1", 8766)
    assert parse_address("tcp://h:1") == ("h", 1)
    for bad, msg in ((":80", "give HOST:PORT"), ("h:x", "must be a number"), ("h:70000", "not in 1..65535")):
        with pytest.raises(ValueError, match=msg):
            parse_address(bad)
    f = tmp_path / "tok"
    f.write_text("abc\n")
    monkeypatch.setenv("ATTNSCOPE_TOKEN", "from-env")
    assert read_token(f) == "abc" and read_token(None) == "from-env"
    with pytest.raises(FileNotFoundError, match="no such token file"):
        read_token(tmp_path / "missing")


def test_no_token_only_on_loopback():
    with pytest.raises(SessionError, match="without a token"):
        EngineServer(None, host="0.0.0.0", port=0, token=None)


# -- a tiny Qwen3 (QK-norm, explicit head_dim) served from a thread ----------------------------------
@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("remote_qwen3")
    save_tiny("qwen3", folder, seed=5)
    return folder


@pytest.fixture(scope="module")
def qwen3_pair(qwen3_folder):
    """(local session, serving server, engine session) on the same tiny Qwen3 folder."""
    from attnscope.core.session import Session

    local = Session.load(str(qwen3_folder), device="cpu")
    engine = Session.load(str(qwen3_folder), device="cpu")
    with serving(engine) as server:
        yield local, server


@pytest.fixture()
def remote_qwen3(qwen3_pair):
    local, server = qwen3_pair
    r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN, timeout=30)
    yield local, r, server
    r.close()


def test_qwen3_remote_is_bit_identical_to_in_process(remote_qwen3):
    local, r, _ = remote_qwen3
    assert r.info == local.info and r.backend.name == "torch"
    assert engine_where(r) == f"torch cpu on {r.backend.host}" and engine_where(local) is None
    prompt = "attention is all you need, they said"
    progress = []
    local.prefill(prompt, chat_template=False)
    r.prefill(prompt, chat_template=False, progress=lambda d, t: progress.append((d, t)))
    assert progress and progress[-1][0] == progress[-1][1] == len(local.ids)
    local.step(3)
    assert [t.id for t in r.step(3)] == local.ids[-3:]
    pairs = [(lyr, h) for lyr in range(local.info.n_layers) for h in range(local.info.n_heads)]
    _same_run(r, local, pairs)
    # sampled steps draw the same tokens (counter-based draws: seed and position)
    s = Sampling(temperature=0.9, top_k=20, seed=11)
    local.step(2, s)
    r.step(2, s)
    _same_run(r, local, [(0, 1), (1, 3)])
    # step back, feed, tiles, means and the analysis functions that run on the engine
    local.step_back(2)
    r.step_back(2)
    _same_run(r, local, [(1, 2)])
    local.feed([5, 6, 7])
    r.feed([5, 6, 7])
    _same_run(r, local, [(0, 0), (1, 1)])
    rows, cols = slice(3, 9), slice(0, 5)
    assert np.array_equal(r.weights(1, 2, rows, cols), local.weights(1, 2, rows, cols))
    for mode in ("head", "group", "layer", "all"):
        assert np.array_equal(agg.map_at(r, 1, 2, mode), agg.map_at(local, 1, 2, mode)), mode
    assert np.array_equal(
        agg.map_tile(r, 0, 3, "group", rows, cols), agg.map_tile(local, 0, 3, "group", rows, cols)
    )
    pm_r, pm_l = agg.pooled_map(r, 1, 0, "head", out=4), agg.pooled_map(local, 1, 0, "head", out=4)
    assert np.array_equal(pm_r.image, pm_l.image) and pm_r.n == pm_l.n
    assert np.array_equal(agg.thumbnails(r, size=8), agg.thumbnails(local, size=8))
    assert agg.layer_robust_max(r, 1) == agg.layer_robust_max(local, 1)
    assert next_tokens(r, 1) == next_tokens(local, 1)
    assert r.snapshot() == local.snapshot()
    assert r.text() == local.text() and r.next_token_probs(5) == local.next_token_probs(5)


def test_remote_calls_leave_no_cyclic_garbage_on_either_side(remote_qwen3):
    """Engine and client (one process here: the engine serves from a thread) free every reply as
    soon as it is used; before, each message's buffers sat in a reference cycle until a collection."""
    local, r, _server = remote_qwen3
    r.prefill("The cat sat on the mat.", chat_template=False)
    with _no_cyclic_collector():
        for _ in range(3):
            r.weights(1, 2)
            r.sink_scores()
            r.step()
            r.snapshot()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            found = gc.collect()
            kinds = sorted({type(o).__name__ for o in gc.garbage})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert found == 0, f"{found} objects in reference cycles: {kinds}"


def test_a_refused_token_is_logged_once_per_ten_seconds_with_the_peer():
    """The engine's operator sees refused tokens (one log line naming the peer's address; a flood
    of them is one line per 10 s); the client gets its one refusal line each time."""
    said: list[str] = []
    with serving(None, log=said.append) as server:
        for _ in range(3):
            with pytest.raises(Refused, match="refused: wrong or missing token"):
                RemoteSession.connect(f"127.0.0.1:{server.port}", token="wrong", timeout=10)
        assert said == ["refused a request with a wrong or missing token (from 127.0.0.1)"]
        server._refusal_logged -= 10.0
        with pytest.raises(Refused):
            RemoteSession.connect(f"127.0.0.1:{server.port}", token=None, timeout=10)
        assert len(said) == 2


def test_qwen3_refusals_leave_the_server_serving(remote_qwen3):
    local, r, server = remote_qwen3
    r.prefill("a short prompt", chat_template=False)
    n = r.seq_len
    with pytest.raises(IndexError, match="layer 2 out of range 0..1"):
        r.weights(2, 0)
    with pytest.raises(IndexError, match="head 9 out of range"):
        r.weights(0, 9)
    with pytest.raises(SessionError, match="steps must be >= 1"):
        r.step(0)
    # a huge tile: refused by the engine's limit, in one line
    old = server.max_tile_cells
    server.max_tile_cells = 16
    try:
        with pytest.raises(
            TooLarge, match=f"a {n} × {n} tile is {n * n:,} cells, over the engine's limit of 16"
        ):
            r.weights(0, 0)
        with pytest.raises(TooLarge, match="over the engine's limit"):
            agg.map_at(r, 0, 0)
    finally:
        server.max_tile_cells = old
    # a huge request: refused here before it is sent
    with pytest.raises(TooLarge, match="over the engine's limit"):
        r.feed([12345] * 5_000_000)
    # wrong token: one refusal line, nothing else
    with pytest.raises(Refused) as e:
        RemoteSession.connect(f"127.0.0.1:{server.port}", token="wrong", timeout=10)
    assert str(e.value) == "refused: wrong or missing token"
    with pytest.raises(Refused):
        RemoteSession.connect(f"127.0.0.1:{server.port}", token=None, timeout=10)
    # and the engine still answers, with the same state
    assert r.weights(0, 0).shape == (n, n) and r.seq_len == n


def _raw(server, frames, timeout_ms=10_000):
    """Send raw frames on a fresh DEALER socket; the reply header as a dict."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://127.0.0.1:{server.port}")
    try:
        s.send_multipart(frames)
        assert s.poll(timeout_ms), "the engine did not answer"
        return json.loads(s.recv_multipart()[0])
    finally:
        s.close(0)


@pytest.mark.parametrize(
    "frames, kind, message",
    [
        ([b"\xff\xfe garbage"], "ValueError", "not JSON"),
        ([b"[1, 2, 3]"], "ValueError", "not an object"),
        (
            [json.dumps({"v": 1, "id": 1, "op": "weights"}).encode()],
            "Refused",
            "refused: wrong or missing token",
        ),
        (
            [json.dumps({"v": 1, "id": 2, "token": TOKEN, "op": "__class__"}).encode()],
            "ValueError",
            "unknown operation",
        ),
        (
            [json.dumps({"v": 1, "id": 3, "token": TOKEN, "op": "exec", "args": {"code": "1"}}).encode()],
            "ValueError",
            "unknown operation",
        ),
        (
            [json.dumps({"v": 1, "id": 4, "token": TOKEN, "op": "weights", "args": {"lyr": 1}}).encode()],
            "ValueError",
            "malformed request: weights",
        ),
        (
            [
                json.dumps(
                    {
                        "v": 1,
                        "id": 5,
                        "token": TOKEN,
                        "op": "call",
                        "args": {"name": "os.system", "args": ["ls"]},
                    }
                ).encode()
            ],
            "ValueError",
            "not a function this engine offers",
        ),
        (
            [
                json.dumps(
                    {"v": 1, "id": 6, "token": TOKEN, "op": "weights", "args": {"layer": "0", "head": 0}}
                ).encode()
            ],
            None,
            "",
        ),
        (
            [json.dumps({"v": 9, "id": 7, "token": TOKEN, "op": "hello"}).encode()],
            "ValueError",
            "protocol version 9",
        ),
    ],
)
def test_malformed_messages_get_one_error_each(qwen3_pair, frames, kind, message):
    _, server = qwen3_pair
    reply = _raw(server, frames)
    if kind is None:  # a bad argument type is an error reply too (whatever the session says)
        assert reply["kind"] == "error"
    else:
        assert reply["kind"] == "error" and reply["type"] == kind and message in reply["error"]
    assert "\n" not in reply.get("error", "")
    ok = _raw(server, [json.dumps({"v": 1, "id": 9, "token": TOKEN, "op": "ping"}).encode()])
    assert ok["kind"] == "result"  # still serving


def test_stale_state_is_refused_and_reconnect_replays(remote_qwen3):
    """Another client changes the engine's sequence: this one is told, and reconnect brings it back."""
    local, r, server = remote_qwen3
    r.prefill("the first client's prompt", chat_template=False)
    r.step(2)
    before = r.weights(1, 3).copy()
    other = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN, timeout=30)
    other.prefill("something else entirely", chat_template=False)
    other.close()
    with pytest.raises(SessionError, match="driven by another client.*reconnect"):
        r.weights(1, 3)
    assert r.reconnect() == []
    assert np.array_equal(r.weights(1, 3), before) and r.n_generated == 2


def test_connecting_to_nothing_says_so():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(
        EngineLost, match=f"cannot reach the engine at 127.0.0.1:{port}: nothing answers there within 1 s"
    ):
        RemoteSession.connect(f"127.0.0.1:{port}", connect_timeout=1.0)
    assert time.monotonic() - t0 < 10


# -- the embedded SmolLM2 ---------------------------------------------------------------------------
@pytest.mark.slow
def test_smollm2_remote_is_bit_identical(smol_session):
    from attnscope.core.session import Session

    engine = Session.load()
    with serving(engine) as server:
        r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN)
        try:
            prompt = "The cat sat on the mat."
            smol_session.prefill(prompt)
            smol_session.step(4)
            r.prefill(prompt)
            r.step(4)
            _same_run(r, smol_session, [(0, 0), (3, 4), (18, 8), (29, 8)])
            assert r.sink_scores().shape == (30, 9)
            # cancel a long prefill from here: the engine stops at its next chunk, both sides empty
            from attnscope.core.errors import Cancelled

            seen = []
            long_prompt = " ".join(f"word{i}" for i in range(700))  # > 2 prefill chunks of 512
            with pytest.raises(Cancelled):
                r.prefill(
                    long_prompt,
                    chat_template=False,
                    progress=lambda d, t: seen.append(d),
                    cancelled=lambda: bool(seen),
                )
            assert seen[0] == 512 and r.seq_len == 0 and engine.seq_len == 0
            r.prefill(prompt)  # and it goes on
            assert r.ids == smol_session.ids[: r.seq_len]
        finally:
            r.close()


def _start_serve(args, ready: Path, env=None):
    ready.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "attnscope.core.cli.main",
        "serve",
        "--device",
        "cpu",
        "--ready-file",
        str(ready),
        *args,
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    end = time.monotonic() + 180
    while time.monotonic() < end:
        if ready.exists() and ready.read_text().strip():
            return proc, int(ready.read_text())
        if proc.poll() is not None:
            raise AssertionError(f"attnscope serve exited: {proc.stderr.read()}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("attnscope serve did not start")


def _stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.mark.slow
def test_killed_server_mid_prefill_then_restart_and_reconnect(tmp_path, smol_session):
    """Kill the engine while it prefills: one clear error, the client keeps its run; a restarted engine
    on the same port and reconnect() replay it to bit-identical weights and logits."""
    token_file = tmp_path / "token"
    proc, port = _start_serve(["--port", "0", "--token-file", str(token_file)], tmp_path / "ready")
    try:
        r = RemoteSession.connect(f"127.0.0.1:{port}", token=read_token(token_file), timeout=60)
        prompt = "The cat sat on the mat."
        r.prefill(prompt, chat_template=False)
        r.step(2)
        ids = r.ids
        killed = []

        def kill_on_progress(done, total):
            if not killed:
                proc.kill()
                killed.append(done)

        long_prompt = " ".join(f"word{i}" for i in range(700))  # > 2 prefill chunks of 512
        with pytest.raises(
            EngineLost, match=f"lost the connection to the engine at 127.0.0.1:{port}.*reconnect"
        ):
            r.prefill(long_prompt, chat_template=False, progress=kill_on_progress)
        assert killed and killed[0] == 512  # after the first of three prefill chunks
        proc.wait(10)
        # the client is usable: it kept its run and says it is not connected
        assert r.ids == ids and r.n_generated == 2 and not r.connected
        with pytest.raises(EngineLost, match="not connected.*reconnect first"):
            r.weights(0, 0)
        with pytest.raises(EngineLost, match="nothing answers there"):
            r.reconnect(connect_timeout=1.0)
        proc, port2 = _start_serve(["--port", str(port), "--token-file", str(token_file)], tmp_path / "ready")
        assert port2 == port
        assert r.reconnect() == []
        smol_session.prefill(prompt, chat_template=False)
        smol_session.step(2)
        _same_run(r, smol_session, [(0, 0), (3, 4), (29, 8)])
        r.close()
    finally:
        _stop(proc)


# attnscope serve bounds OpenMP's spin before torch loads: tests/integration/test_openmp.py


def test_cli_says_an_unreachable_engine_in_one_line_without_window_advice(tmp_path, monkeypatch, capsys):
    """``attnscope export --engine`` to a port where nothing listens: exit 1 and one line that says
    nothing answers there (it said "lost the connection …: reconnect to go on", as if a session
    had been connected and were kept); a connection lost mid-command prints the brief line too."""
    import socket

    from attnscope.core.cli.main import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    connect = RemoteSession.connect.__func__

    monkeypatch.setattr(
        RemoteSession,
        "connect",
        classmethod(lambda cls, a, token=None, **kw: connect(cls, a, token=token, connect_timeout=1.0)),
    )
    out = tmp_path / "map.npy"
    argv = ["export", "--engine", f"127.0.0.1:{port}", "--prompt", "x", "--layer", "0", "--head", "0"]
    assert main([*argv, "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"attnscope: error: cannot reach the engine at 127.0.0.1:{port}: nothing answers there within 1 s "
        "(is `attnscope serve` running there, or an SSH tunnel open to it?)"
    ]
    assert not out.exists()
    lost = EngineLost(
        "lost the connection to the engine at h:1 (x); this session is kept here: reconnect", "brief"
    )
    monkeypatch.setattr(
        RemoteSession, "connect", classmethod(lambda cls, *a, **k: (_ for _ in ()).throw(lost))
    )
    assert main([*argv, "--out", str(out)]) == 1
    assert capsys.readouterr().err.strip() == "attnscope: error: brief"


@pytest.mark.slow
def test_cli_export_through_the_engine(tmp_path):
    """attnscope export --engine writes the same map as in-process, and the sidecar names the engine."""
    proc, port = _start_serve(["--port", "0", "--no-token"], tmp_path / "ready")
    try:
        common = ["export", "--prompt", "The cat sat.", "--steps", "1", "--layer", "3", "--head", "4"]
        env = dict(os.environ, ATTNSCOPE_TOKEN="")
        for name, extra in (("remote", ["--engine", f"127.0.0.1:{port}"]), ("local", ["--device", "cpu"])):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "attnscope.core.cli.main",
                    *common,
                    *extra,
                    "--out",
                    str(tmp_path / f"{name}.npy"),
                ],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert out.returncode == 0, out.stderr
        assert np.array_equal(np.load(tmp_path / "remote.npy"), np.load(tmp_path / "local.npy"))
        meta = json.loads(next(tmp_path.glob("remote*.json")).read_text())
        assert meta["engine"]["address"] == f"127.0.0.1:{port}"
        local_meta = json.loads(next(tmp_path.glob("local*.json")).read_text())
        assert meta["model"]["sha256"] == local_meta["model"]["sha256"] is not None
    finally:
        _stop(proc)


@pytest.mark.slow
def test_ray_engine_actor(tmp_path):
    """``attnscope serve --ray``: a local Ray instance runs the engine as an actor; a client connects to
    it as to any engine and gets the in-process numbers (skipped without Ray)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    from attnscope.core.remote import ray_engine
    from attnscope.core.session import Session

    folder = tmp_path / "qwen3"
    save_tiny("qwen3", folder, seed=2)
    local = Session.load(str(folder), device="cpu")
    local.prefill("ray holds the engine", chat_template=False)
    local.step(2)
    import torch

    threads = torch.get_num_threads()  # the actor computes with as many: the same float sums
    ray.init(num_cpus=threads, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        load = dict(model=str(folder), device="cpu")
        actor, where = ray_engine.start(
            token=TOKEN, load=load, load_kwargs={"device": "cpu"}, num_cpus=threads
        )
        try:
            assert where["model"] == local.info.name and where["device"] == "torch cpu"
            # the actor's process got attnscope serve's OpenMP settings (GOMP_SPINCOUNT)
            assert where["openmp_env"] == {k: os.environ.get(k, v) for k, v in OPENMP_ENV.items()}
            with RemoteSession.connect(f"127.0.0.1:{where['port']}", token=TOKEN) as r:
                r.prefill("ray holds the engine", chat_template=False)
                r.step(2)
                _same_run(r, local, [(0, 0), (1, 3)])
        finally:
            assert ray_engine.stop(actor) >= 5
        with pytest.raises(SessionError, match="the engine actor did not start: .*no-such-model"):
            ray_engine.start(token=TOKEN, load=dict(model=str(tmp_path / "no-such-model")))
    finally:
        ray.shutdown()


def test_session_file_records_the_engine_and_model_hash(remote_qwen3, tmp_path):
    from attnscope.core.io import sessionfile
    from attnscope.core.io.provenance import session_metadata
    from attnscope.core.loading.model_hash import model_sha256

    local, r, server = remote_qwen3
    r.prefill("save me", chat_template=False)
    r.step(1)
    sf = sessionfile.SessionFile.from_session(r, view={"layer": 1})
    assert sf.engine == {"address": f"127.0.0.1:{server.port}", "host": r.backend.host}
    assert sf.model_sha256 == model_sha256(local.info.source) is not None
    assert sf.model == r.model_ref == local.info.source
    back = sessionfile.load(sessionfile.save(sf, tmp_path / "s.attnscope"))
    assert back.engine == sf.engine and back.token_ids == tuple(r.ids)
    meta = session_metadata(r)
    assert meta["engine"]["address"] == r.engine and meta["model"]["sha256"] == sf.model_sha256
    assert "engine" not in session_metadata(local) if local.seq_len else True


def test_views_that_need_local_tensors_say_so_in_one_line(remote_qwen3):
    from attnscope.core.analysis.kv_live import kv_live

    local, r, _ = remote_qwen3
    r.prefill("one line please", chat_template=False)
    local.prefill("one line please", chat_template=False)
    with pytest.raises(SessionError, match="stay on the engine at 127.0.0.1"):
        _ = r.trace.layers[0].keys
    with pytest.raises(SessionError, match="the model runs on the engine"):
        _ = r.backend.model
    with pytest.raises(SessionError, match="not available over a remote engine"):
        _ = r.trace.weights_block
    a, b = kv_live(r), kv_live(local)  # runs on the engine
    assert a.seq_len == b.seq_len == r.seq_len and a.total_bytes == b.total_bytes > 0
    assert np.array_equal(a.layer_bytes, b.layer_bytes)


def test_a_saved_session_reopens_on_the_engine_with_the_same_numbers(remote_qwen3, tmp_path):
    from attnscope.core.io import sessionfile

    local, r, server = remote_qwen3
    r.prefill("reopen me", chat_template=False)
    r.step(2)
    want = r.weights(1, 2).copy()
    sf = sessionfile.SessionFile.from_session(r)
    r.prefill("something else", chat_template=False)
    s, warnings = sessionfile.replay(sf, session=r)  # same model on the engine: no reload, replay there
    assert s is r and warnings == [] and r.ids == list(sf.token_ids)
    assert np.array_equal(r.weights(1, 2), want)
    s2, _ = sessionfile.replay(sf)  # and in-process: the same numbers
    assert np.array_equal(s2.weights(1, 2), want)
