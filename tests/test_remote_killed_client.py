"""A client killed in the middle of its request (issue 13, "reliability"): the engine notices when it
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


@pytest.mark.slow
def test_a_client_killed_mid_prefill_stops_its_request_and_the_engine_serves_on(smol_session, tmp_path):
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

    said: list[str] = []
    engine = Session.load()
    with serving(engine, log=said.append) as server:
        script = tmp_path / "client.py"
        script.write_text(CLIENT)
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).parent))
        child = subprocess.Popen(
            [sys.executable, str(script), f"127.0.0.1:{server.port}", TOKEN],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
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
