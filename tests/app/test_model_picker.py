"""The model picker dialog: table, live fit column, choosing, adding by drop, removing, conversion cache."""

from __future__ import annotations

import json

import pytest
from attnscope.app.cache_dialog import ConvertedCacheDialog
from attnscope.app.model_picker import ModelPickerDialog
from attnscope.app.model_table import COLUMNS, FIT_COLUMN, GREY
from attnscope.core.loading import catalog
from attnscope.core.loading.fit import estimate_entry, human_bytes
from demo_catalog import demo_entries
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

FREE = 21_800_000_000


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTNSCOPE_CONFIG_DIR", str(tmp_path / "config"))


def _open(qtbot, **kw):
    calls = []

    def free(backend, device):
        calls.append((backend, device))
        return FREE, "RAM"

    kw.setdefault("scanner", demo_entries)
    dlg = ModelPickerDialog(None, free_memory_fn=free, scan_now=False, **kw)
    qtbot.addWidget(dlg)
    with qtbot.waitSignal(dlg.scanFinished, timeout=20000):
        dlg.rescan()
    return dlg, calls


def _row(dlg, name):
    for r in range(dlg.proxy.rowCount()):
        if dlg.proxy.index(r, 0).data() == name:
            return r
    raise KeyError(name)


def test_table_shows_every_entry_with_its_columns(qtbot):
    dlg, _ = _open(qtbot, context=8192)
    assert dlg.proxy.rowCount() == len(demo_entries()) == 8
    assert [dlg.proxy.headerData(c, Qt.Horizontal) for c in range(len(COLUMNS))] == COLUMNS
    r = _row(dlg, "llama3.3:70b")
    cells = [dlg.proxy.index(r, c).data() for c in range(len(COLUMNS))]
    assert cells[:FIT_COLUMN] == [
        "llama3.3:70b",
        "Ollama",
        "llama",
        "70.6B",
        "80",
        "64 / 8 (8)",
        "128",
        "131,072",
        "Q4_K_M",
        "bfloat16",
        "42.5 GB",
    ]  # 70B at float32 would never fit FREE
    e = next(e for e in demo_entries() if e.name == "llama3.3:70b")
    f = estimate_entry(e, 8192, free_bytes=FREE)
    assert cells[FIT_COLUMN] == f"does not fit · {human_bytes(f.total_bytes)}"
    assert dlg.status.text().startswith("8 model(s) (2 not supported")


def test_unsupported_rows_are_grey_with_the_reason(qtbot):
    dlg, _ = _open(qtbot)
    r = _row(dlg, "google-bert/bert-base-uncased")
    idx = dlg.proxy.index(r, 2)
    assert idx.data(Qt.ForegroundRole).color() == GREY
    assert "not a decoder" in idx.data(Qt.ToolTipRole)
    assert dlg.proxy.index(r, FIT_COLUMN).data() == "unsupported"
    dlg.table.selectRow(r)
    assert not dlg.open_btn.isEnabled() and dlg.selected_path() is None
    assert "Not supported: architecture 'bert' is not supported" in dlg.details.text()
    ok = _row(dlg, "qwen2.5:1.5b")
    assert dlg.proxy.index(ok, 2).data(Qt.ForegroundRole) is None


def test_fit_column_follows_context_backend_device_dtype(qtbot):
    dlg, calls = _open(qtbot, context=1024)
    e = next(e for e in demo_entries() if e.name == "Qwen/Qwen3-0.6B")
    r = _row(dlg, e.name)

    def fit_text():
        return dlg.proxy.index(r, FIT_COLUMN).data()

    assert fit_text() == f"fits · {human_bytes(estimate_entry(e, 1024, free_bytes=FREE).total_bytes)}"
    dlg.context.setValue(40960)
    f = estimate_entry(e, 40960, free_bytes=FREE)
    assert fit_text() == f"{f.verdict} · {human_bytes(f.total_bytes)}"
    assert (
        f.dtype == estimate_entry(e, 40960, dtype="auto", free_bytes=FREE).dtype
    )  # auto: the picker's default
    dlg.dtype.setCurrentText("float32")
    f2 = estimate_entry(e, 40960, dtype="float32", free_bytes=FREE)
    assert f2.total_bytes >= f.total_bytes and fit_text() == f"{f2.verdict} · {human_bytes(f2.total_bytes)}"
    dlg.backend.setCurrentText("mlx")
    assert ("mlx", "cpu") in calls
    assert "mlx on cpu" in dlg.status.text()


def test_sorting_by_a_numeric_column(qtbot):
    dlg, _ = _open(qtbot)
    dlg.table.sortByColumn(COLUMNS.index("Params"), Qt.DescendingOrder)
    names = [dlg.proxy.index(r, 0).data() for r in range(3)]
    assert names == [
        "llama3.3:70b",
        "mistralai/Mistral-7B-Instruct-v0.1",
        "lmstudio-community/Llama-3.2-3B-Instruct-GGUF/Llama-3.2-3B-Instruct-Q4_K_M",
    ]
    dlg.table.sortByColumn(COLUMNS.index("Attention"), Qt.DescendingOrder)
    assert dlg.proxy.index(0, 0).data() == "llama3.3:70b"  # group of 8


def test_filter(qtbot):
    dlg, _ = _open(qtbot)
    dlg.filter.setText("ollama")
    assert sorted(dlg.proxy.index(r, 0).data() for r in range(dlg.proxy.rowCount())) == [
        "llama3.3:70b",
        "qwen2.5:1.5b",
    ]


def test_open_emits_the_model_ref(qtbot):
    dlg, _ = _open(qtbot)
    assert dlg.selected_path() == "default"  # the first supported entry is preselected
    with qtbot.waitSignal(dlg.modelChosen) as sig:
        qtbot.mouseClick(dlg.open_btn, Qt.LeftButton)
    assert sig.args == ["default"] and dlg.result() == ModelPickerDialog.Accepted


def test_double_click_opens(qtbot):
    dlg, _ = _open(qtbot)
    r = _row(dlg, "qwen2.5:1.5b")
    with qtbot.waitSignal(dlg.modelChosen) as sig:
        dlg.table.doubleClicked.emit(dlg.proxy.index(r, 3))
    assert sig.args == ["qwen25"]


def _tiny_scanner(tmp_path):
    return lambda: catalog.scan(
        hf_cache=tmp_path / "none", lmstudio=[], ollama=tmp_path / "none", include_embedded=False
    )


def _drop(dlg, path):
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    ev = QDropEvent(QPointF(10, 10), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    dlg.dropEvent(ev)
    return ev


def test_drop_adds_remembers_and_remove_forgets(qtbot, tmp_path):
    from tiny_models import save_tiny

    folder = tmp_path / "my-qwen3"
    save_tiny("qwen3", folder)
    dlg, _ = _open(qtbot, scanner=_tiny_scanner(tmp_path))
    assert dlg.proxy.rowCount() == 0
    with qtbot.waitSignal(dlg.scanFinished, timeout=20000):
        _drop(dlg, folder)
    assert json.loads((tmp_path / "config" / "models.json").read_text())["paths"] == [str(folder)]
    assert dlg.proxy.rowCount() == 1 and dlg.selected_path() == str(folder)
    assert dlg.proxy.index(0, 2).data() == "qwen3" and dlg.remove_btn.isEnabled()
    # a second dialog (a later run) finds it again
    dlg2, _ = _open(qtbot, scanner=_tiny_scanner(tmp_path))
    assert dlg2.proxy.rowCount() == 1
    with qtbot.waitSignal(dlg.scanFinished, timeout=20000):
        qtbot.mouseClick(dlg.remove_btn, Qt.LeftButton)
    assert dlg.proxy.rowCount() == 0 and catalog.user_paths() == []
    assert folder.is_dir()  # files are never deleted


def test_drop_of_a_non_model_file_is_ignored(qtbot, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    dlg, _ = _open(qtbot, scanner=_tiny_scanner(tmp_path))
    _drop(dlg, tmp_path / "notes.txt")
    assert catalog.user_paths() == []


def test_scan_failure_is_shown(qtbot):
    def boom():
        raise OSError("disk on fire")

    dlg, _ = _open(qtbot, scanner=boom)
    assert dlg.status.text() == "Scanning failed: disk on fire" and dlg.proxy.rowCount() == 0


def test_closing_during_a_slow_scan_does_not_wait_for_it(qtbot):
    import threading

    release, started = threading.Event(), threading.Event()

    def slow():
        started.set()
        release.wait(30)
        return demo_entries()

    dlg = ModelPickerDialog(None, scanner=slow, free_memory_fn=lambda b, d: (FREE, "RAM"), scan_now=False)
    dlg.rescan()
    assert started.wait(10)
    thread = dlg._thread
    dlg.reject()  # had it waited for the scan, the scan (blocked on `release`) could not still run
    assert not dlg.isVisible() and thread.isRunning() and thread.parent() is not dlg
    dlg.deleteLater()
    qtbot.wait(50)  # the dialog is gone; the scan still runs, owned by the application
    release.set()
    assert thread.wait(10_000)


def _safetensors(path, nbytes: int) -> None:
    """A valid safetensors file of about ``nbytes`` (one float32 tensor)."""
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"w": np.zeros(max(1, nbytes // 4), np.float32)}, str(path))


def test_converted_cache_lists_and_clears(qtbot, tmp_path):
    conv = tmp_path / "cache" / "converted"
    for name, size in (("a-0123456789abcdef", 3000), ("b-fedcba9876543210", 1000)):
        d = conv / name
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
        (d / "tokenizer.json").write_text("{}")
        _safetensors(d / "model.safetensors", size)  # a sound entry (a damaged one is listed "incomplete")
        (d / "attnscope_source.json").write_text(json.dumps({"gguf": f"/models/{name}.gguf", "sha256": "x"}))
    dlg = ConvertedCacheDialog()
    qtbot.addWidget(dlg)
    assert dlg.table.rowCount() == 2
    from attnscope.core.loading.fit import human_bytes

    size_a = sum(f.stat().st_size for f in (conv / "a-0123456789abcdef").iterdir())
    assert dlg.table.item(0, 0).text() == "a-0123456789abcdef" and dlg.table.item(0, 1).text() == human_bytes(
        size_a
    )
    assert dlg.table.item(0, 2).text() == "/models/a-0123456789abcdef.gguf"
    dlg.table.selectRow(1)
    qtbot.mouseClick(dlg.clear_one, Qt.LeftButton)
    assert dlg.table.rowCount() == 1 and not (conv / "b-fedcba9876543210").exists()
    qtbot.mouseClick(dlg.clear_all, Qt.LeftButton)
    assert dlg.table.rowCount() == 0 and not any(conv.iterdir())
    assert "0 converted model(s)" in dlg.total.text()


def test_loads_at_column_shows_the_load_precision_and_why(qtbot):
    from attnscope.app.model_table import LOADS_AT_COLUMN

    dlg, _ = _open(qtbot)
    assert dlg.dtype.currentText() == "auto"
    emb = _row(dlg, "SmolLM2-135M-Instruct (embedded)")
    big = _row(dlg, "llama3.3:70b")
    # the embedded Q4_1 is small: float32 keeps its dequantised weights exact
    assert dlg.proxy.index(emb, LOADS_AT_COLUMN).data() == "float32"
    assert "small quantised model" in dlg.proxy.index(emb, LOADS_AT_COLUMN).data(Qt.ToolTipRole)
    assert dlg.proxy.index(big, LOADS_AT_COLUMN).data() == "bfloat16"
    assert dlg.proxy.index(big, LOADS_AT_COLUMN).data(Qt.ToolTipRole).startswith("bfloat16: ")
    dlg.dtype.setCurrentText("float16")
    assert (
        dlg.proxy.index(emb, LOADS_AT_COLUMN).data()
        == dlg.proxy.index(big, LOADS_AT_COLUMN).data()
        == "float16"
    )
