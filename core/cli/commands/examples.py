"""``attnscope examples``: the seeds' worked numbers, recomputed by the engine and checked.

Every worked number of the three seed texts (the 3-token trace of handbook §2, the exercises, the
softmax-saturation example, seed 002's memory figures, the 70B KV-cache table, the memory wall) is
an example in :mod:`attnscope.core.analysis.worked_examples`, recomputed through the same engine
code the app uses (:mod:`attnscope.core.attention.reference`, :mod:`attnscope.core.kv_formula`).
This command prints each step's computed value next to the number the seed prints, and exits 1 when
one disagrees beyond the seed's rounding (steps marked as a known erratum of the seed are shown,
not counted)::

    attnscope examples                 # every example
    attnscope examples trace kv70b     # two of them
    attnscope examples --json          # machine-readable, with the tolerances
"""

from __future__ import annotations

import json

import numpy as np
from attnscope.core.analysis.worked_examples import EXAMPLES, Step, WorkedExample

NAME = "examples"
HELP = "recompute the seeds' worked numbers (3-token trace, exercises, KV-cache table) and check them"


def add_arguments(p) -> None:
    p.add_argument(
        "keys", nargs="*", metavar="KEY", help=f"examples to run (default all: {', '.join(EXAMPLES)})"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def _value(a: np.ndarray):
    return float(a) if a.ndim == 0 else a.tolist()


def _text(a: np.ndarray) -> str:
    return np.array2string(
        np.asarray(a), precision=6, suppress_small=True, max_line_width=100, separator=", "
    )


def _status(s: Step) -> str:
    if s.printed is None:
        return "computed"
    if s.matches():
        return "matches"
    return "seed erratum" if s.erratum else "MISMATCH"


def report(keys: list[str]) -> list[WorkedExample]:
    """The examples named by ``keys`` (all when empty), recomputed.

    Raises:
        ValueError: an unknown key (the message lists the known ones).
    """
    unknown = [k for k in keys if k not in EXAMPLES]
    if unknown:
        raise ValueError(f"unknown example {unknown[0]!r}: choose from {', '.join(EXAMPLES)}")
    return [EXAMPLES[k]() for k in (keys or list(EXAMPLES))]


def failures(examples: list[WorkedExample]) -> list[str]:
    """``"key: step"`` for every step that disagrees with the seed and is not a known erratum."""
    return [f"{ex.key}: {s.name}" for ex in examples for s in ex.steps if not s.matches() and not s.erratum]


def run(args) -> int:
    examples = report(args.keys)
    if args.json:
        out = [
            {
                "key": ex.key,
                "title": ex.title,
                "source": ex.source,
                "steps": [
                    {
                        "name": s.name,
                        "computed": _value(s.value),
                        "printed": None if s.printed is None else _value(s.printed),
                        "atol": s.atol,
                        "status": _status(s),
                        "note": s.note,
                    }
                    for s in ex.steps
                ],
            }
            for ex in examples
        ]
        print(json.dumps(out, indent=2))
    else:
        for ex in examples:
            print(f"{ex.title}  [{ex.key}; {ex.source}]")
            for s in ex.steps:
                line = f"  {s.name}: {_text(s.value)}"
                if s.printed is not None:
                    line += f"   seed: {_text(s.printed)} ({_status(s)})"
                print(line)
            print()
    bad = failures(examples)
    if bad:
        print(f"attnscope: {len(bad)} worked number(s) disagree with the seeds: {'; '.join(bad)}")
        return 1
    return 0
