"""The Head grid on every trace kind (a new user's report: the tab said "internal error:
AttributeError: 'LayerBlocks' object has no attribute 'rec'" for every bfloat16 model and on MLX)."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from gui_helpers import run_in  # noqa: E402
from tiny_models import save_tiny  # noqa: E402


def _ran(qtbot, folder, family, seed, backend, dtype, prompt):
    """A window that loaded a tiny ``family`` model on ``backend`` at ``dtype`` and ran ``prompt``."""
    from attnscope.app.main_window import MainWindow

    if backend == "mlx":
        pytest.importorskip("mlx.core")
    save_tiny(family, folder, seed=seed)
    win = MainWindow(autoload=False)
    qtbot.addWidget(win)
    win.state.update(backend=backend, dtype=dtype)
    win.load_model(str(folder))
    assert win.engine.wait_idle(120) and win.last_error is None
    assert win.engine.session.info.dtype == dtype and win.engine.session.backend.name == backend
    return run_in(win, prompt)


@pytest.mark.parametrize(
    "backend, dtype", [("torch", "bfloat16"), ("torch", "float32"), ("mlx", "float32")], ids=str
)
def test_head_grid_tab_draws_for_each_backend_and_dtype(qtbot, tmp_path, backend, dtype):
    win = _ran(
        qtbot,
        tmp_path / "llama",
        "llama",
        5,
        backend,
        dtype,
        "the cat sat on the mat and the dog sat on the log",
    )
    win.show_view("grid")
    assert win.engine.wait_idle(60)
    assert win.last_error is None, win.last_error
    canvas = win.grid.canvas
    assert canvas.thumbs is not None and canvas.thumbs.shape[:2] == (2, 4)  # 2 layers × 4 query heads
    assert float(canvas.thumbs.max()) > 0.1  # drawn from real weights (the first key's column)


@pytest.mark.slow
@pytest.mark.parametrize("backend, dtype", [("torch", "bfloat16"), ("mlx", "bfloat16")], ids=str)
def test_every_tab_opens_without_an_error_for_each_backend_and_dtype(qtbot, tmp_path, backend, dtype):
    """The same kind of fault in any view: open every tab after a run and a decode step."""
    prompt = "attention is all you need, they said, and said it again"
    win = _ran(qtbot, tmp_path / "qwen3", "qwen3", 3, backend, dtype, prompt)
    win.step(1)
    assert win.engine.wait_idle(60) and win.last_error is None
    seen = []
    for key in win.views:
        win.show_view(key)
        assert win.engine.wait_idle(60)
        seen.append(key)
        assert win.last_error is None, (key, win.last_error)
    assert {"grid", "mask", "sinks", "kv"} <= set(seen)
