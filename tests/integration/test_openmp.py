"""Every ``attnscope`` process (the window, a CLI command) starts torch with libgomp's spin count
bounded (:mod:`attnscope.core.openmp`), keeping a value the user set; the Python API leaves the
environment alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from attnscope.core.openmp import OPENMP_ENV, quiet_openmp

# Stop the process when it first imports torch and say what OpenMP would read then.
_HOOK = """
import importlib.abc, os, sys

class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print("GOMP_SPINCOUNT at torch import:", os.environ.get("GOMP_SPINCOUNT"), flush=True)
            os._exit(0)
        return None

sys.meta_path.insert(0, Hook())
"""

ENTRIES = {
    "window": "from attnscope.app.cli import main\nmain([])",
    "cli command": "from attnscope.app.cli import main\nmain(['export', '--prompt', 'The cat', '--out', 'map.npy'])",  # never written: the hook exits
    "python api": "from attnscope.core.session import Session\nSession.load()",
    "serve": "from attnscope.core.cli.main import main\nmain(['serve', '--no-token', '--port', '0'])",
}


def _seen(entry: str, user_value: str | None, cwd) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    env["QT_QPA_PLATFORM"] = "offscreen"
    if user_value:
        env["GOMP_SPINCOUNT"] = user_value
    out = subprocess.run(
        [sys.executable, "-c", _HOOK + ENTRIES[entry]],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("GOMP_SPINCOUNT at torch import:")]
    assert line, f"{entry}: torch was never imported\n{out.stdout}\n{out.stderr}"
    return line[0].rpartition(":")[2].strip()


@pytest.mark.parametrize("entry", ["window", "cli command", "serve"])
def test_attnscope_processes_bound_the_spin_before_torch_loads(entry, tmp_path):
    if entry == "serve":
        pytest.importorskip("zmq", reason="the remote engine needs pyzmq (pip install -e '.[remote]')")
    assert _seen(entry, None, tmp_path) == OPENMP_ENV["GOMP_SPINCOUNT"] == "30000"
    assert _seen(entry, "123", tmp_path) == "123"  # the user's own value is kept


def test_the_python_api_leaves_the_environment_alone(tmp_path):
    assert _seen("python api", None, tmp_path) == "None"


def test_too_late_once_torch_is_imported():
    import torch  # noqa: F401  (this test process has it)

    env: dict = {}
    assert quiet_openmp(env) is False and env == {}
