"""The model picker shows what the catalog says: a note on what is incomplete beside a listed model,
and, for an mlx-lm quantised folder, that torch cannot open it and MLX can (with the Open button
following the chosen backend)."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

from attnscope.app.model_picker import ModelPickerDialog  # noqa: E402
from attnscope.app.model_table import FIT_COLUMN  # noqa: E402
from attnscope.core.loading import catalog  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from test_catalog_counts import _blob_repo, _folder_files, _mlx_quantised  # noqa: E402
from tiny_models import save_tiny  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTNSCOPE_CONFIG_DIR", str(tmp_path / "config"))


def _row(dlg, name):
    for r in range(dlg.proxy.rowCount()):
        if dlg.proxy.index(r, 0).data() == name:
            return r
    raise KeyError(name)


def test_picker_shows_notes_and_the_backend_that_runs_it(qtbot, tmp_path):
    src = tmp_path / "src" / "llama"
    save_tiny("llama", src, seed=1)
    mlx, _ = _mlx_quantised(src, tmp_path / "mlx-community" / "tiny-8bit", 8)
    hub = tmp_path / "hub"
    _blob_repo(hub, "org/tiny-llama", {**_folder_files(src), "README.md": None})

    def scanner():
        return catalog.scan(
            hf_cache=hub, lmstudio=[], ollama=tmp_path / "none", user=[mlx], include_embedded=False
        )

    dlg = ModelPickerDialog(
        None, scanner=scanner, free_memory_fn=lambda b, d: (8 << 30, "RAM"), scan_now=False
    )
    qtbot.addWidget(dlg)
    dlg.resize(1200, 600)
    with qtbot.waitSignal(dlg.scanFinished, timeout=30000):
        dlg.rescan()
    r = _row(dlg, "org/tiny-llama")
    assert "README.md" in dlg.proxy.index(r, 0).data(Qt.ToolTipRole)
    dlg.table.selectRow(r)
    assert "Note: incomplete in the cache (blob missing): README.md" in dlg.details.text()
    assert dlg.open_btn.isEnabled()
    dlg.show()
    qtbot.waitExposed(dlg)
    dlg.grab().save("/work/notes/shots/catalog_picker_note.png")

    r = _row(dlg, "tiny-8bit")
    assert dlg.proxy.index(r, 3).data() == "108.9K"  # the float model's parameters, not its packed words
    assert dlg.proxy.index(r, 8).data() == "MLX 8-bit (group 64)"
    assert dlg.proxy.index(r, FIT_COLUMN).data() == "not on torch"
    assert dlg.proxy.index(r, FIT_COLUMN).data(Qt.BackgroundRole) is None  # no verdict colour
    tip = dlg.proxy.index(r, FIT_COLUMN).data(Qt.ToolTipRole)
    assert "MLX-quantised weights (8-bit)" in tip and "Choose MLX under Backend above" in tip
    dlg.table.selectRow(r)
    assert not dlg.open_btn.isEnabled() and "Cannot open here" in dlg.details.text()
    dlg.grab().save("/work/notes/shots/catalog_picker_mlx_on_torch.png")
    dlg.backend.setCurrentText("mlx")
    qtbot.waitUntil(lambda: dlg.proxy.index(_row(dlg, "tiny-8bit"), FIT_COLUMN).data() != "not on torch")
    r = _row(dlg, "tiny-8bit")
    assert "not on" not in dlg.proxy.index(r, FIT_COLUMN).data()
    dlg.table.selectRow(r)
    assert dlg.open_btn.isEnabled()
