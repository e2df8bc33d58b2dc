"""The analyses as Session methods (:mod:`attnscope.core.analysis.methods`): ``attnscope.Session``'s
``s.head_effects(...)``, ``s.explain(...)``, ... give the numbers of the functions they call, on a local
session and on a served engine (``RemoteSession`` has the same methods); the docs/python-api.md example
of them prints what it says.

Reference: the module-level functions (each tested against plain transformers in
tests/core/test_head_effects.py, tests/core/test_explain.py and tests/core/test_qk_sources.py) on the same session.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_models import save_tiny

ROOT = Path(__file__).resolve().parents[2]
IDS = [5, 9, 14, 20, 9, 14, 33, 41, 7, 14, 20, 9]  # 12 tokens, with repeats
CORRUPT = [5, 9, 14, 20, 9, 14, 33, 41, 7, 20, 14, 9]  # same length, two tokens swapped


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def _js(x) -> str:
    """A result as canonical JSON (its ``to_json``/``to_dict``; arrays as lists)."""
    d = x.to_json() if hasattr(x, "to_json") else x.to_dict()
    return json.dumps(d, sort_keys=True, default=lambda a: np.asarray(a).tolist())


def _calls(s):
    """``name -> (method call, function call)`` of every analysis method on session ``s``."""
    from attnscope.core.analysis import explain as E
    from attnscope.core.analysis import head_effects as H
    from attnscope.core.analysis import logit_lens as LL
    from attnscope.core.analysis import qk_sources as Q

    t = H.make_target(s, "logit_diff", token=9, other=14)
    return {
        "make_target": (lambda: s.make_target("logit_diff", token=9, other=14), lambda: t),
        "head_effects": (lambda: s.head_effects(t, "mean"), lambda: H.head_effects(s, t, "mean")),
        "patch_heads": (
            lambda: s.patch_heads(CORRUPT, t, layers=[1]),
            lambda: H.patch_heads(s, CORRUPT, t, layers=[1]),
        ),
        "attribution_patching": (
            lambda: s.attribution_patching(CORRUPT, t),
            lambda: H.attribution_patching(s, CORRUPT, t),
        ),
        "logit_attribution": (lambda: s.logit_attribution(t), lambda: H.logit_attribution(s, t)),
        "logit_lens": (lambda: s.logit_lens([3, -1], k=3), lambda: LL.logit_lens(s, [3, -1], k=3)),
        "explain": (
            lambda: s.explain(1, 2, 10, 4, sources=True, top=5),
            lambda: E.explain(s, 1, 2, 10, 4, sources=True, top=5),
        ),
        "cell_bands": (lambda: s.cell_bands(1, 2, 10, 4), lambda: E.cell_bands(s, 1, 2, 10, 4)),
        "row_bands": (lambda: s.row_bands(0, 3, 11), lambda: E.row_bands(s, 0, 3, 11)),
        "positional_share": (
            lambda: s.positional_share(1, 3, short_tokens=16),
            lambda: E.head_positional_share(s, 1, 3, short_tokens=16),
        ),
        "positional_share_grid": (
            lambda: s.positional_share_grid(max_rows=8),
            lambda: E.positional_share_grid(s, max_rows=8),
        ),
        "source_split": (
            lambda: s.source_split(1, 2, 10, 4, top=4),
            lambda: Q.source_split(s, 1, 2, 10, 4, top=4),
        ),
    }


def _assert_same(name, got, want):
    if isinstance(want, np.ndarray):
        np.testing.assert_array_equal(got, want, err_msg=name)
    elif isinstance(want, float):
        assert got == want, name
    elif hasattr(want, "to_json") or hasattr(want, "to_dict"):
        assert _js(got) == _js(want), name
    else:
        assert got == want, name


def test_public_session_is_the_core_session_with_the_methods(tmp_path):
    import attnscope
    from attnscope.core.analysis.methods import AnalysisMethods
    from attnscope.core.session import Session as Core

    save_tiny("llama", tmp_path / "m")
    s = attnscope.Session.load(str(tmp_path / "m"))
    assert type(s) is attnscope.Session and isinstance(s, Core) and isinstance(s, AnalysisMethods)
    assert type(Core.load(str(tmp_path / "m"))) is Core  # the engine's own Session stays as it was
    s.prefill(IDS)
    e = s.explain(1, 2, 10, 4)
    assert e.score == pytest.approx(
        float(s.trace.scores(1, 2, slice(10, 11), slice(4, 5), raw=True)[0, 0]), rel=1e-6
    )
    assert sum(e.bands.parts) == pytest.approx(e.score, rel=1e-6)


def test_methods_give_the_functions_numbers(tmp_path):
    """Every method against its function on the same local session (qwen3: QK-norm, GQA)."""
    import attnscope
    from attnscope.core.analysis.methods import AnalysisMethods

    save_tiny("qwen3", tmp_path / "m")
    s = attnscope.Session.load(str(tmp_path / "m"))
    s.prefill(IDS)
    calls = _calls(s)
    assert set(calls) == {n for n in vars(AnalysisMethods) if not n.startswith("_")}  # every method
    for name, (method, function) in calls.items():
        _assert_same(name, method(), function())
    eff = s.head_effects(s.make_target("logit_diff", token=9, other=14), "mean")
    assert eff.query.shape == (2, 4) and np.abs(eff.query).max() > 0  # real effects, not zeros


def test_methods_over_a_served_engine_give_the_local_numbers(tmp_path):
    """``RemoteSession`` has the same methods; each runs on the engine and returns the local result."""
    pytest.importorskip("zmq")
    import attnscope
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session as Core
    from test_remote import TOKEN, serving

    save_tiny("qwen3", tmp_path / "m")
    local = attnscope.Session.load(str(tmp_path / "m"))
    local.prefill(IDS)
    want = {name: function() for name, (_m, function) in _calls(local).items()}
    engine = Core.load(str(tmp_path / "m"))
    with serving(engine) as server:
        r = RemoteSession.connect(f"127.0.0.1:{server.port}", token=TOKEN)
        try:
            r.prefill(IDS)
            calls = _calls_remote(r)
            assert set(calls) == set(want)
            for name, method in calls.items():
                _assert_same(name, method(), want[name])
        finally:
            r.close()


def _calls_remote(r):
    """The method half of :func:`_calls` on a RemoteSession (the functions need the model here)."""
    t = r.make_target("logit_diff", token=9, other=14)
    return {
        "make_target": lambda: t,
        "head_effects": lambda: r.head_effects(t, "mean"),
        "patch_heads": lambda: r.patch_heads(CORRUPT, t, layers=[1]),
        "attribution_patching": lambda: r.attribution_patching(CORRUPT, t),
        "logit_attribution": lambda: r.logit_attribution(t),
        "logit_lens": lambda: r.logit_lens([3, -1], k=3),
        "explain": lambda: r.explain(1, 2, 10, 4, sources=True, top=5),
        "cell_bands": lambda: r.cell_bands(1, 2, 10, 4),
        "row_bands": lambda: r.row_bands(0, 3, 11),
        "positional_share": lambda: r.positional_share(1, 3, short_tokens=16),
        "positional_share_grid": lambda: r.positional_share_grid(max_rows=8),
        "source_split": lambda: r.source_split(1, 2, 10, 4, top=4),
    }


def methods_example() -> str:
    text = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- api-methods-example -->\n```python\n(.*?)```", text, re.S)
    assert m, "docs/python-api.md has no api-methods-example block"
    return m.group(1)


@pytest.mark.slow  # SmolLM2's load and 270 ablations of a 15-token prompt
def test_docs_methods_example_prints_what_it_says(tmp_path):
    """The docs/python-api.md methods block, run as written: each printed number is the one its comment
    gives, and the same as the module functions on the same prompt."""
    r = subprocess.run(
        [sys.executable, "-c", methods_example()], cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stderr[-3000:]
    code = methods_example().split("\n")
    printed = [line for line in code if line.startswith("print(")]
    lines = r.stdout.strip().split("\n")
    assert len(lines) == len(printed)
    for out, src in zip(lines, printed, strict=True):
        said = src.split("#", 1)[1].strip()
        assert said == out or said.startswith(out + ":"), (src, out)
