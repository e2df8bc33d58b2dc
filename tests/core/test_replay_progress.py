"""A replay (reopened session, backend switch) says which stage its progress bar is in: the prompt's
prefill fills the first half when tokens were generated (it read "Prefill 42/42" at half way)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    from attnscope.core.session import Session
    from tiny_models import save_tiny

    folder = tmp_path_factory.mktemp("llama_replay")
    save_tiny("llama", folder)
    s = Session.load(str(folder), device="cpu")
    s.prefill("The cat sat on the mat.", chat_template=False)
    return s


@pytest.mark.parametrize("steps", [0, 3])
def test_replay_progress_names_its_stage_and_never_says_done_early(ran, steps):
    from attnscope.core.io import sessionfile

    ran.prefill("The cat sat on the mat.", chat_template=False)
    if steps:
        ran.step(steps)
    sf = sessionfile.SessionFile.from_session(ran)
    seen: list[tuple[str, float]] = []
    sessionfile.replay(sf, session=ran, progress=lambda m, f: seen.append((m, f)))
    prefill = [(m, f) for m, f in seen if "prefill" in m and "/" in m]
    n = ran.n_prompt
    last_m, last_f = prefill[-1]
    assert f"prefill {n}/{n} prompt tokens" in last_m
    if steps:
        assert last_f == pytest.approx(0.5) and f"then {steps} generated tokens" in last_m
        fed = [(m, f) for m, f in seen if "generated token" in m and "prompt done" in m]
        assert fed[-1] == (f"Replaying the run: generated token {steps}/{steps} (prompt done)", 1.0)
    else:
        assert last_f == pytest.approx(1.0) and "then" not in last_m
