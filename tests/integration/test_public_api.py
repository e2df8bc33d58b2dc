"""The public Python API: `from attnscope import Session`, and the README's notebook example.

The docs/python-api.md block is executed as written (in a temporary folder) and the numbers its
comments promise are checked against what it prints, so the documentation cannot drift.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- api-example -->\n```python\n(.*?)```", text, re.S)
    assert m, "README has no api-example block"
    return m.group(1)


def test_import_attnscope_is_cheap_and_lazy():
    """`import attnscope` must not drag in torch (a notebook imports it to read __version__ too)."""
    code = (
        "import sys, attnscope; print(attnscope.__version__, 'torch' in sys.modules); print(dir(attnscope))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    version, torch_loaded = r.stdout.split("\n")[0].split()
    from attnscope.core import __version__

    assert version == __version__ and torch_loaded == "False"
    assert "Session" in r.stdout and "export_head" in r.stdout


def test_unknown_public_name_is_an_attribute_error():
    import attnscope

    with pytest.raises(AttributeError, match="no attribute 'Sesion'"):
        attnscope.Sesion  # noqa: B018


def test_public_names_are_the_engine_objects():
    import attnscope
    from attnscope.core.analysis.methods import AnalysisMethods
    from attnscope.core.analysis.methods import Session as PublicSession
    from attnscope.core.errors import AttnScopeError
    from attnscope.core.io.head_export import export_head
    from attnscope.core.session import Session

    # the engine's Session with the analyses as methods (tests/integration/test_session_methods.py)
    assert attnscope.Session is PublicSession and attnscope.Session.__mro__[1:] == (
        AnalysisMethods,
        Session,
        object,
    )
    assert attnscope.AttnScopeError is AttnScopeError
    assert attnscope.export_head is export_head


@pytest.mark.slow
def test_readme_example_runs_and_prints_what_it_says(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", readme_example()], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().split("\n")
    assert lines[0] == "5"
    assert lines[1] == repr(" Paris.\n")
    shape, row_min = lines[2].rsplit(" ", 1)
    assert shape == "(8, 8)" and abs(float(row_min) - 1.0) < 1e-6
    assert lines[3] == "(30, 9)"
    assert int(lines[4]) == 2 * 30 * 3 * 64 * 8 * 4
    w = np.load(tmp_path / "head.npy")
    assert w.shape == (8, 8) and np.allclose(w.sum(axis=1), 1.0, atol=1e-6)
    assert np.all(np.triu(w, 1) == 0)  # causal: nothing above the diagonal
    import json

    meta = json.loads((tmp_path / "head.npy.json").read_text())
    assert meta["layer"] == 0 and meta["head"] == 3
