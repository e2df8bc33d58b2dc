"""The converted-cache dialog lists and removes quantised-weights entries (core/loading/quant_cache.py)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from attnscope.app.cache_dialog import ConvertedCacheDialog
from attnscope.core.loading import quant_cache
from attnscope.core.loading.fit import human_bytes
from PySide6.QtCore import Qt


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(root))
    monkeypatch.delenv("ATTNSCOPE_QUANT_CACHE_DIR", raising=False)  # conftest's: here, under the cache
    conv = root / "converted" / "tiny-Q8_0-0123456789abcdef-float32"
    conv.mkdir(parents=True)
    (conv / "config.json").write_text("{}")
    (conv / "tokenizer.json").write_text("{}")
    from safetensors.numpy import save_file  # a sound entry (a damaged one is listed "incomplete")

    save_file({"w": np.zeros(1250, np.float32)}, str(conv / "model.safetensors"))
    (conv / "attnscope_source.json").write_text(json.dumps({"gguf": "/models/tiny-Q8_0.gguf", "sha256": "x"}))
    entry = root / quant_cache.SUBDIR / "Llama-3.2-1B-fedcba9876543210-bfloat16-int8"
    entry.mkdir(parents=True)
    (entry / quant_cache.WEIGHTS).write_bytes(bytes(3000))
    (entry / quant_cache.SOURCE).write_text(
        json.dumps({"folder": "/models/Llama-3.2-1B", "mode": "int8", "torchao": "0.18.0"})
    )
    half = root / quant_cache.SUBDIR / "Llama-3.2-1B-0000000000000000-bfloat16-int4.partial-123"
    half.mkdir()
    (half / quant_cache.WEIGHTS).write_bytes(bytes(100))
    return root, conv, entry, half


def test_quantised_entries_are_listed_with_kind_and_size_and_removed(qtbot, cache):
    root, conv, entry, half = cache
    dlg = ConvertedCacheDialog()
    qtbot.addWidget(dlg)
    rows = {dlg.table.item(r, 0).text(): [dlg.table.item(r, c).text() for c in range(1, 4)] for r in range(3)}
    size = sum(f.stat().st_size for f in entry.iterdir())
    assert rows[entry.name] == [human_bytes(size), "/models/Llama-3.2-1B", "int8 weights (torchao 0.18.0)"]
    assert rows[f"{half.name} (incomplete)"][2] == "int4 weights"
    assert rows[conv.name][1:] == ["/models/tiny-Q8_0.gguf", "GGUF conversion"]
    assert str(root / "quantised") in dlg.where.text()
    os.makedirs("/work/notes/shots", exist_ok=True)
    dlg.grab().save("/work/notes/shots/quantcache_dialog.png")
    r = [dlg.table.item(i, 0).text() for i in range(3)].index(entry.name)
    dlg.table.selectRow(r)
    dlg.clear_one.click()  # the button as a click gives it (a stray popup of another test cannot take it)
    assert dlg.table.rowCount() == 2 and not entry.exists() and conv.exists()
    qtbot.mouseClick(dlg.clear_all, Qt.LeftButton)
    assert dlg.table.rowCount() == 0 and not half.exists() and not conv.exists()


def test_the_status_bar_says_the_cache_was_not_written(qtbot):
    import dataclasses
    from types import SimpleNamespace

    from attnscope.app.status import StatusLine
    from attnscope.core.loading.model_info import ModelInfo
    from PySide6.QtCore import QObject, Signal
    from PySide6.QtWidgets import QMainWindow

    class Events(QObject):
        message = Signal(object)
        error = Signal(str)

    class Engine(QObject):
        progress = Signal(str, float)
        busy = Signal(bool, str)
        error = Signal(str)

        def cancel(self):
            pass

    win = QMainWindow()
    qtbot.addWidget(win)
    events, engine = Events(), Engine()
    status = StatusLine(win, SimpleNamespace(events=events), engine)
    note = "quantised weights not cached ([Errno 28] No space left on device): the next load quantises again"
    info = ModelInfo(
        "tiny", "/m", "llama", 2, 4, 2, 16, 64, 256, 10000.0, None, 272, "float32", load_note=note
    )
    status.show_model(SimpleNamespace(info=info, backend="torch", device="cpu"))
    assert f"tiny ready. Note: {note}. Type a prompt" in status.bar.currentMessage()
    plain = dataclasses.replace(info, load_note="")
    status.show_model(SimpleNamespace(info=plain, backend="torch", device="cpu"))
    assert "Note:" not in status.bar.currentMessage()
