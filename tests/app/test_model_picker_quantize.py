"""The picker's Quantise box changes each model's fit and its *Loads at* cell."""

from __future__ import annotations

import pytest
from attnscope.app.model_picker import ModelPickerDialog
from attnscope.app.model_table import FIT_COLUMN, LOADS_AT_COLUMN
from attnscope.core.loading.fit import estimate_entry, human_bytes
from demo_catalog import demo_entries

FREE = 21_800_000_000


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTNSCOPE_CONFIG_DIR", str(tmp_path / "config"))


def test_quantise_choice_changes_fit_and_loads_at(qtbot):
    dlg = ModelPickerDialog(
        None, scanner=demo_entries, free_memory_fn=lambda b, d: (FREE, "RAM"), scan_now=False, context=4096
    )
    qtbot.addWidget(dlg)
    with qtbot.waitSignal(dlg.scanFinished, timeout=20000):
        dlg.rescan()
    e = next(e for e in demo_entries() if e.name == "llama3.3:70b")
    r = next(r for r in range(dlg.proxy.rowCount()) if dlg.proxy.index(r, 0).data() == e.name)

    def cells():
        return dlg.proxy.index(r, LOADS_AT_COLUMN).data(), dlg.proxy.index(r, FIT_COLUMN).data()

    plain = estimate_entry(e, 4096, free_bytes=FREE)
    assert cells() == ("bfloat16", f"does not fit · {human_bytes(plain.total_bytes)}")
    for mode in ("int8", "int4"):
        dlg.quantize.setCurrentText(mode)
        f = estimate_entry(e, 4096, free_bytes=FREE, quantize=mode)
        assert f.weights_bytes < plain.weights_bytes
        assert cells() == (f"bfloat16 + {mode}", f"{f.verdict} · {human_bytes(f.total_bytes)}")
    dlg.table.selectRow(r)
    assert "linear layers int4" in dlg.details.text() and "runtime" in dlg.details.text()
    dlg.quantize.setCurrentText("none")
    assert cells()[0] == "bfloat16"
