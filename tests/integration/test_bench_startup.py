"""``attnscope bench --startup``: the window's start-up against a bare ``import torch`` of the same
run (core/bench/startup.py), its arithmetic on given timings, its one-line failure, and one real run
of the window on a tiny model (slow)."""

from __future__ import annotations

import pytest
from attnscope.core.bench import startup


def test_medians_seconds_over_the_floor_and_ratios(monkeypatch):
    floors = iter([10.0, 12.0, 11.0])
    windows = iter(
        [{"shown": 10.5, "ready": 12.0}, {"shown": 13.5, "ready": 16.0}, {"shown": 11.2, "ready": 12.5}]
    )
    monkeypatch.setattr(startup, "_floor", lambda _py: next(floors))
    monkeypatch.setattr(startup, "_window", lambda _py, _m, _t: next(windows))
    r = startup.run_startup_bench(repeats=3)
    assert r["floor_s"] == 11.0 and r["shown_s"] == 11.2 and r["ready_s"] == 12.5
    # per repeat, then the median: 0.5, 1.5, 0.2 over -> 0.5; ready 2.0, 4.0, 1.5 -> 2.0
    assert r["shown_over_floor_s"] == pytest.approx(0.5) and r["ready_over_floor_s"] == pytest.approx(2.0)
    assert r["ready_ratio"] == pytest.approx(1.2)  # 12/10, 16/12, 12.5/11: the median of the ratios
    assert r["met"] == {"shown": True, "ready": True}
    table = startup.format_startup_table(r)
    assert "window drawn" in table and "floor + 0.50 s" in table and "target floor + 2 s: met" in table


def test_a_window_that_never_reports_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(startup, "_floor", lambda _py: 1.0)
    with pytest.raises(RuntimeError, match="did not load the model|did not report"):
        startup.run_startup_bench(model=str(tmp_path / "no-such-model"), repeats=1, timeout=300)
    with pytest.raises(ValueError, match="--repeats must be >= 1"):
        startup.run_startup_bench(repeats=0)


@pytest.mark.slow
def test_the_window_reports_drawn_then_ready_on_a_tiny_model(tmp_path):
    from tiny_models import save_tiny

    folder = tmp_path / "llama"
    save_tiny("llama", folder)
    r = startup.run_startup_bench(model=str(folder), repeats=1)
    run = r["runs"][0]
    assert 0 < run["shown_s"] <= run["ready_s"] < 600
    assert r["floor_s"] > 0 and set(r["met"]) == {"shown", "ready"}
