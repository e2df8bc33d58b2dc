"""A session saved before the Sinks tab had a report keeps its "Table at seq_len" as "now": reopened, the box
shows the sequence's length, not the clamped minimum of 2 (pytest-qt, offscreen, a tiny random llama)."""

from __future__ import annotations

import json

PROMPT = "The cat sat on the mat. The dog sat on the log."


def test_a_session_saved_without_a_sinks_report_reopens_at_the_sequence_length(qtbot, tmp_path, monkeypatch):
    from gui_helpers import ran_window
    from tiny_models import save_tiny

    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny("llama", tmp_path / "m")
    win = ran_window(qtbot, tmp_path / "m", PROMPT)
    path = tmp_path / "s.attnscope"
    win.sessions.save_session(path)  # the Sinks tab never shown: its box holds no step
    assert win.engine.wait_idle(60)
    saved = json.loads(path.read_text())["view"]["views"]["sinks"]["step_spin"]
    assert saved < 2  # "now"
    win.show_view("sinks")
    assert win.engine.wait_idle(60)
    view = win.views["sinks"]
    qtbot.waitUntil(lambda: view.report is not None, timeout=30_000)
    n = view.report.seq_len
    assert view.step_spin.value() == n > 2
    view.step_spin.setValue(3)
    win.sessions.open_session(path)
    assert win.engine.wait_idle(300) and win.last_error is None
    qtbot.waitUntil(lambda: view.report is not None, timeout=30_000)
    assert view.step_spin.value() == view.report.seq_len == n
    win.close()
