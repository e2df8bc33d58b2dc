"""Session.step(n) reports progress after each token and can be stopped between tokens (what lets an
engine stop a long remote ``step(n)`` whose client went away); the tokens decoded so far stay."""

from __future__ import annotations

import pytest
from tiny_models import save_tiny


@pytest.fixture(scope="module")
def tiny_session(tmp_path_factory):
    from attnscope.core.session import Session

    folder = tmp_path_factory.mktemp("step_cancel")
    save_tiny("llama", folder, seed=2)
    return Session.load(str(folder), device="cpu")


def test_step_reports_progress_and_stops_between_tokens(tiny_session):
    from attnscope.core.errors import Cancelled

    s = tiny_session
    s.prefill("attention is all you need", chat_template=False)
    n0 = s.seq_len
    seen: list[tuple[int, int]] = []
    new = s.step(4, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)] and len(new) == 4 and s.seq_len == n0 + 4
    ref = list(s.ids)
    s.step_back(4)
    checks: list[int] = []

    def cancelled() -> bool:
        checks.append(s.seq_len)
        return len(checks) >= 2  # the second check, before the third token

    with pytest.raises(Cancelled, match="stopped after 2 of 10 steps"):
        s.step(10, cancelled=cancelled)
    assert checks == [n0 + 1, n0 + 2]  # checked before every token after the first
    assert s.ids == ref[: n0 + 2] and s.n_generated == 2  # the two decoded tokens stay, same as before
    assert s.step(1, cancelled=lambda: True)  # one step is never refused: no check before the first
