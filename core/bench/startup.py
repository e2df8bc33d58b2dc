"""Start-up bench: ``attnscope bench --startup``.

How long a user waits after typing ``attnscope``, against the floor of a bare ``python -c "import
torch"`` measured in the same run (so a busy or slow machine moves both alike):

* ``shown``: the window's first paint (the prompt box, the tabs, the status bar);
* ``ready``: the model loaded and Run enabled (its name in the status bar).

Each repeat starts fresh Python processes: the floor, then ``attnscope`` (the embedded default
model, or ``--model``) with ``ATTNSCOPE_STARTUP_PROBE=1``, which prints when the window was painted
and when the model was ready, then quits (:func:`attnscope.app.launch.run_gui`). Times are wall
seconds from the process's start; the medians of the repeats are reported, with the seconds over
the floor and the ratio to it. Where there is no display, the window is drawn offscreen
(``QT_QPA_PLATFORM=offscreen``). This module runs the processes only: it never imports Qt.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

#: the probe's environment variable and output line (:mod:`attnscope.app.launch`)
PROBE_ENV = "ATTNSCOPE_STARTUP_PROBE"
PROBE_LINE = "attnscope-startup"
SCHEMA = "attnscope-bench-startup/1"
#: seconds over the ``import torch`` floor the window should take (docs/benchmarks.md)
TARGETS = {"shown": 1.0, "ready": 2.0}


def _floor(python: str) -> float:
    t0 = time.time()
    subprocess.run([python, "-c", "import torch"], check=True, capture_output=True)
    return time.time() - t0


def _window(python: str, model: str | None, timeout: float) -> dict:
    env = dict(os.environ, **{PROBE_ENV: "1"})
    if not env.get("DISPLAY") and not env.get("WAYLAND_DISPLAY") and sys.platform.startswith("linux"):
        env["QT_QPA_PLATFORM"] = "offscreen"
    cmd = [python, "-m", "attnscope.app.cli"] + (["--model", model] if model else [])
    t0 = time.time()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(PROBE_LINE + " ")]
    if not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the window did not report its start-up (exit {out.returncode}): {tail}")
    marks = json.loads(lines[-1].split(" ", 1)[1])
    if marks.get("error"):
        raise RuntimeError(f"the window did not load the model: {marks['error']}")
    return {"shown": marks["shown"] - t0, "ready": marks["ready"] - t0}


def run_startup_bench(
    model: str | None = None,
    repeats: int = 3,
    timeout: float = 600.0,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Measure the window's start-up ``repeats`` times (fresh processes each time).

    Returns a JSON-ready dict: ``floor_s``, ``shown_s``, ``ready_s`` (medians, wall seconds),
    ``shown_over_floor_s``/``ready_over_floor_s`` (seconds over the floor), ``shown_ratio``/
    ``ready_ratio`` (to the floor), ``targets`` (seconds over the floor) and ``met``, and every
    repeat's figures under ``runs``.

    Raises:
        ValueError: ``repeats`` < 1. RuntimeError: the window did not report (no model, a crash).
    """
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    say = log or (lambda _m: None)
    python = sys.executable
    runs = []
    for i in range(repeats):
        floor = _floor(python)
        w = _window(python, model, timeout)
        runs.append({"floor_s": floor, "shown_s": w["shown"], "ready_s": w["ready"]})
        say(
            f"start-up {i + 1}/{repeats}: floor {floor:.2f} s, shown {w['shown']:.2f} s, ready {w['ready']:.2f} s"
        )
    med = {k: statistics.median(r[k] for r in runs) for k in ("floor_s", "shown_s", "ready_s")}
    out: dict = {"schema": SCHEMA, "model": model or "default", "repeats": repeats, **med}
    for k in ("shown", "ready"):
        # per repeat, then the median: the floor and the window of one repeat share the machine's state
        over = statistics.median(r[f"{k}_s"] - r["floor_s"] for r in runs)
        out[f"{k}_over_floor_s"] = over
        out[f"{k}_ratio"] = statistics.median(r[f"{k}_s"] / r["floor_s"] for r in runs)
    out["targets"] = {f"{k}_over_floor_s": v for k, v in TARGETS.items()}
    out["met"] = {k: out[f"{k}_over_floor_s"] <= v for k, v in TARGETS.items()}
    out["runs"] = runs
    return out


def format_startup_table(r: dict) -> str:
    """The start-up figures as a small table (one line per phase)."""
    lines = [
        f"start-up ({r['model']} model, median of {r['repeats']})",
        f"  python -c 'import torch'   {r['floor_s']:6.2f} s   (the floor)",
    ]
    for k, what in (("shown", "window drawn"), ("ready", "ready to Run")):
        target = TARGETS[k]
        ok = "met" if r["met"][k] else "NOT met"
        lines.append(
            f"  {what:<26} {r[f'{k}_s']:6.2f} s   floor + {r[f'{k}_over_floor_s']:.2f} s "
            f"(× {r[f'{k}_ratio']:.2f}; target floor + {target:g} s: {ok})"
        )
    return "\n".join(lines)
