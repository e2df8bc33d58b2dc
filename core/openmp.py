"""OpenMP's busy-wait, bounded for every ``attnscope`` process (the window, the CLI, ``serve``).

After each parallel region (a matmul, an ``exp_``), libgomp's worker threads spin before they
sleep: ``GOMP_SPINCOUNT`` iterations, 300,000 by default (milliseconds of spinning). torch's CPU
build on Linux uses libgomp, and its workers then spin on the cores the rest of the process needs:

* the window: its GUI thread draws the views after each decode step while the engine thread's
  worker spins on. Twelve steps of the default model from Run, the views drawn after each, on this
  project's 2-core machine (load average ~3): 6.6-8.5 s and 6.7-8.2 s of CPU with the default,
  3.8-4.1 s and 3.6 s of CPU with 30,000 (two interleaved runs each);
* ``attnscope serve``: the worker spins through each reply while libzmq's thread sends it (14-16 ms
  of CPU per 2048² map request with the default, 8-9.5 ms with 30,000);
* a decode step alone measured the same either way (62-68 ms); ``OMP_WAIT_POLICY=PASSIVE`` (no spin
  at all) made steps 10-20 % slower.

A value the user set is kept. Nothing is done for a process that imported torch before (OpenMP reads
the variable once, when torch loads it), nor for the Python API (``import attnscope`` leaves the
environment alone: a notebook sets ``GOMP_SPINCOUNT`` itself). LLVM's OpenMP (macOS torch builds)
has its own knob, ``KMP_BLOCKTIME``, not set here (not measured).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

#: the environment every attnscope process starts torch with (where the user set nothing)
OPENMP_ENV = {"GOMP_SPINCOUNT": "30000"}


def quiet_openmp(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set :data:`OPENMP_ENV` in ``environ`` (default ``os.environ``) where unset.

    Returns:
        True when it can take effect; False (and nothing set) once torch is imported.
    """
    env = os.environ if environ is None else environ
    if "torch" in sys.modules:
        return False
    for k, v in OPENMP_ENV.items():
        env.setdefault(k, v)
    return True
