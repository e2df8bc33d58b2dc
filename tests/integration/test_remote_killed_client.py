"""A client killed in the middle of its request : the engine notices when it
next reports progress, stops that request at its next chunk, says so in one log line, and goes on
serving the next client with the same numbers as in-process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("zmq", reason="the remote engine needs pyzmq (pip install -e '.[remote]')")

from conftest import SMOL_PROMPT  # noqa: E402
from test_remote import TOKEN, serving  # noqa: E402

CLIENT = """
import sys
from attnscope.core.remote.client import RemoteSession
r = RemoteSession.connect(sys.argv[1], token=sys.argv[2], timeout=120)
words = " ".join(f"w{i % 97} token{i}" for i in range(500))
def progress(msg, frac):
    print("progress", frac, flush=True)
r.prefill(words, chat_template=False, progress=progress)
print("finished", flush=True)
"""


def _start_client(code: str, server, tmp_path) -> subprocess.Popen:
    """A client process running ``code`` against ``server`` (address and token as argv), stdout piped."""
    script = tmp_path / "client.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    return subprocess.Popen(
        [sys.executable, str(script), f"127.0.0.1:{server.port}", TOKEN],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.slow
def test_a_client_killed_mid_prefill_stops_its_request_and_the_engine_serves_on(smol_session, tmp_path):
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

    said: list[str] = []
    engine = Session.load()
    with serving(engine, log=said.append) as server:
        child = _start_client(CLIENT, server, tmp_path)
        try:
            line = child.stdout.readline()  # the engine is prefilling for it: its first chunk is done
            assert line.startswith("progress"), line
            assert server._busy is not None and server._busy[2] == "prefill"
            child.send_signal(signal.SIGKILL)
            child.wait(10)
        finally:
            if child.poll() is None:
                child.kill()
        deadline = time.monotonic() + 60
        while server._busy is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server._busy is None  # the request ended ...
        assert said == ["the client of prefill went away: its request stops here"]
        n = len(engine.encode(" ".join(f"w{i % 97} token{i}" for i in range(500)), False))
        assert n > 3000 and engine.seq_len < n  # ... before its last chunk: the prompt was not run whole
        # the next client: served, with the in-process numbers
        r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN, timeout=60)
        try:
            r.prefill(SMOL_PROMPT, chat_template=False)
            smol_session.prefill(SMOL_PROMPT, chat_template=False)
            assert r.ids == smol_session.ids
            assert np.array_equal(r.weights(3, 4), smol_session.weights(3, 4))
        finally:
            r.close()


STEPPER = """
import sys
from attnscope.core.remote.client import RemoteSession
r = RemoteSession.connect(sys.argv[1], token=sys.argv[2], timeout=120)
r.prefill("The cat sat on the mat.", chat_template=False)
print("stepping", flush=True)
r.step(400)  # what `attnscope export --engine ... --steps 400` asks: one request, no progress shown
print("finished", flush=True)
"""


@pytest.mark.slow
def test_a_client_killed_mid_step_n_stops_its_request_and_others_are_answered_busy(tmp_path):
    """A long ``step(n)`` (the CLI's ``--steps N``) reports no progress the client asked for; the
    engine still notices its client went away (a keepalive at its next cancel check, every step)
    and stops within a second or two, not after the remaining steps (~25 s here); a second client
    asking meanwhile gets a "busy" answer at once, not a timeout."""
    from attnscope.core.remote.client import Busy, RemoteSession
    from attnscope.core.session import Session

    said: list[str] = []
    engine = Session.load()
    with serving(engine, log=said.append) as server:
        child = _start_client(STEPPER, server, tmp_path)
        try:
            assert child.stdout.readline().startswith("stepping")
            deadline = time.monotonic() + 30
            while not (server._busy and server._busy[2] == "step") and time.monotonic() < deadline:
                time.sleep(0.01)
            start = engine.seq_len
            while engine.seq_len < start + 3 and time.monotonic() < deadline:
                time.sleep(0.01)  # a few steps in
            t0 = time.monotonic()
            with pytest.raises(Busy, match="busy \\(step\\)"):
                RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN, timeout=60)
            assert time.monotonic() - t0 < 5
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            killed_at = engine.seq_len
        finally:
            if child.poll() is None:
                child.kill()
        deadline = time.monotonic() + 60
        while server._busy is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server._busy is None
        assert said == ["the client of step went away: its request stops here"]
        assert engine.seq_len - killed_at <= 5  # stopped within a few steps of the kill, not 400
        assert engine.seq_len < start + 100
        r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN, timeout=60)
        try:  # the next client: served
            assert r.seq_len == engine.seq_len and r.step(1)
        finally:
            r.close()


def test_a_cancel_check_notices_a_client_that_is_gone_without_progress_messages():
    """A request that only checks ``cancelled()`` (an analysis with no progress) still notices its
    client went away: the check sends a keepalive every ALIVE_EVERY_S, and its failure cancels."""
    from attnscope.core.remote.server import ALIVE_EVERY_S, EngineServer

    said: list[str] = []
    server = EngineServer(None, port=0, token=TOKEN, log=said.append)
    try:
        server._busy = (b"a-client-that-left", 7, "call")
        server._last_sent = time.monotonic()
        assert server._cancelled() is False  # just sent something: no keepalive yet
        server._last_sent = time.monotonic() - ALIVE_EVERY_S
        assert server._cancelled() is True
        assert said == ["the client of call went away: its request stops here"]
    finally:
        server._busy = None
        server.close()


@pytest.mark.slow
def test_sigterm_on_the_engine_stops_its_running_request_at_once(tmp_path):
    """``kill`` (SIGTERM) of an engine in the middle of a long ``step(n)`` stops that request at its
    next step and the engine exits; the client is told the engine is shutting down (its session
    kept, to reconnect), within seconds, not after the remaining steps."""
    from attnscope.core.remote.client import EngineLost, RemoteSession
    from test_remote import _start_serve

    proc, port = _start_serve(["--no-token", "--port", "0"], tmp_path / "ready")
    try:
        r = RemoteSession.connect(f"127.0.0.1:{port}", timeout=60)
        r.prefill("The cat sat on the mat.", chat_template=False)
        n0 = r.seq_len
        done: list[int] = []

        def progress(d, _total):
            done.append(d)
            if d == 3:
                proc.send_signal(signal.SIGTERM)

        t0 = time.monotonic()
        with pytest.raises(EngineLost, match="the engine is shutting down \\(step stopped"):
            r.step(400, progress=progress)
        assert time.monotonic() - t0 < 20 and max(done) < 20
        # the client's copy keeps the tokens the engine made before it stopped
        assert not r.connected and n0 + 3 <= r.seq_len < n0 + 20
        assert [t.id for t in r.local_snapshot().tokens] == r.ids
        assert proc.wait(15) == 0
        assert "stopped after" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
