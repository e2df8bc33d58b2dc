"""The Backend menu reloads the model on MLX and back; a failed or cancelled load keeps the old model."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

PROMPT = "The cat sat on the mat."


@pytest.fixture()
def window(make_window):
    return make_window(size=None, show=False)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mlx") is None, reason="mlx not installed")
def test_switch_to_mlx_and_back(window):
    win = window
    win.prompt_edit.setPlainText(PROMPT)
    win.run_prompt()
    assert win.engine.wait_idle(120)
    torch_w = win.weights.copy()
    win.backend_actions["mlx"].trigger()
    assert win.engine.wait_idle(600)
    assert win.last_error is None
    assert win.snapshot.backend == "mlx" and win.backend_actions["mlx"].isChecked()
    win.run_prompt()
    assert win.engine.wait_idle(600)
    np.testing.assert_allclose(win.weights, torch_w, atol=1e-4)
    win.backend_actions["torch"].trigger()
    assert win.engine.wait_idle(120)
    assert win.snapshot.backend == "torch"


def test_failed_load_keeps_backend_and_model(window, tmp_path):
    win = window
    win.load_model(str(tmp_path))  # empty folder: not a model
    assert win.engine.wait_idle(60)
    assert "not a model folder" in win.last_error
    assert win.state.backend == "torch" and win.backend_actions["torch"].isChecked()
    assert win.snapshot.info.name == "SmolLM2-135M-Instruct"


def test_cancelled_load_keeps_model(window):
    win = window
    before = win.snapshot.info
    win.load_model(None)
    win.engine.cancel()  # set before the job's first stage: it stops at its first checkpoint
    assert win.engine.wait_idle(120)
    assert win.snapshot.info == before
    assert "cancelled" in win.last_error  # the load really stopped at its first checkpoint
    from attnscope.app.engine import CancelledMessage

    assert isinstance(win.last_error, CancelledMessage)  # a status line, not a warning dialog


def test_a_cancel_is_a_status_line_an_error_a_dialog(window, monkeypatch):
    import attnscope.app.status as MW  # the status line says errors (it was the window's job)
    from attnscope.app.engine import CancelledMessage

    shown = []
    monkeypatch.setattr(MW.QMessageBox, "warning", lambda *a: shown.append(a[-1]))
    monkeypatch.setattr(MW.QApplication, "platformName", staticmethod(lambda: "xcb"))
    window.show()
    window.show_error(CancelledMessage("prefill cancelled"))
    assert shown == [] and window.statusBar().currentMessage() == "prefill cancelled"
    window.show_error("the prompt has 9000 tokens, more than the model's context of 8192")
    assert shown == ["the prompt has 9000 tokens, more than the model's context of 8192"]


def test_after_a_reload_the_first_map_is_whole_and_old_panels_are_covered(window, qtbot):
    """Reloading the model (same prompt, so the same map size as before) shows the whole new map,
    not the placeholder's zoom; until the next Run every panel that needs a sequence is covered
    instead of showing the previous model's results."""
    win = window
    win.resize(1300, 850)
    win.show()
    win.prompt_edit.setPlainText(PROMPT)
    win.chat_check.setChecked(False)
    win.run_prompt()
    assert win.engine.wait_idle(120)
    win.show_view("sinks")
    assert win.engine.wait_idle(120) and win.views["sinks"].report is not None
    overlays = win._empty_overlays
    assert set(overlays) == {"grid", "gqa", "mask", "sinks", "roles", "heads", "experiments", "compare"}
    assert not any(o.isVisible() for o in overlays.values())
    win.load_model(None)  # the same model again: a fresh session, nothing run
    assert win.engine.wait_idle(300) and win.snapshot.seq_len == 0
    assert (
        overlays["sinks"].isVisible()
        and overlays["sinks"].geometry() == win.tabs.page_of(win.views["sinks"]).rect()
    )
    win.show_view("heatmap")
    win.run_prompt()
    assert win.engine.wait_idle(120)
    n = win.snapshot.seq_len
    (x0, x1), (y0, y1) = win.heatmap.plot.getViewBox().viewRange()
    assert x0 <= 0 and x1 >= n and y0 <= 0 and y1 >= n  # the whole map, not cell (0, 0)
    assert not overlays["sinks"].isVisible()
