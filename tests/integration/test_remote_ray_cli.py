"""``attnscope serve --ray local``: the CLI starts a Ray instance, the engine runs in an actor, a
client connects with the token and the same numbers come back; SIGTERM stops the actor and Ray
(skipped without Ray; CI installs the ``ray`` extra)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("zmq", reason="the remote engine needs pyzmq (pip install -e '.[remote]')")

from test_remote import ROOT  # noqa: E402
from tiny_models import save_tiny  # noqa: E402


@pytest.mark.slow
def test_serve_ray_local_runs_the_engine_in_an_actor(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

    folder = tmp_path / "qwen3"
    save_tiny("qwen3", folder, seed=4)
    ready, token_file = tmp_path / "ready", tmp_path / "token"
    cmd = [sys.executable, "-m", "attnscope.app.cli", "serve", "--ray", "local", "--model", str(folder)]
    cmd += ["--device", "cpu", "--port", "0", "--ready-file", str(ready), "--token-file", str(token_file)]
    import torch

    cmd += ["--ray-cpus", str(torch.get_num_threads())]  # the same float sums as in-process
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 180
        while not (ready.is_file() and ready.read_text().strip()) and proc.poll() is None:
            assert time.monotonic() < deadline, "the Ray engine did not start"
            time.sleep(0.5)
        assert proc.poll() is None, proc.stderr.read()
        port = int(ready.read_text())
        local = Session.load(str(folder), device="cpu")
        local.prefill("an actor holds the model", chat_template=False)
        with RemoteSession.connect(f"127.0.0.1:{port}", token=token_file.read_text().strip()) as r:
            r.prefill("an actor holds the model", chat_template=False)
            assert r.backend.where.startswith("torch cpu on ")
            assert np.array_equal(r.weights(1, 2), local.weights(1, 2))
            assert np.array_equal(r.logits, local.logits)
    finally:
        proc.terminate()
        try:
            err = proc.communicate(timeout=60)[1]
        except subprocess.TimeoutExpired:
            proc.kill()
            err = proc.communicate(timeout=10)[1]
    assert proc.returncode == 0, err
    assert "Ray actor on " in err and f"listening on 127.0.0.1:{port}" in err and "ssh -L" in err
    assert "stopped after" in err
