"""The Device map choice, from the picker's Fit column to the load, the status bar, the
export sidecar and the saved session (reopening restores it and loads with it).

On this CPU-only machine a device map can only use the CPU and disk: the tests make accelerate see
a small amount of free RAM (``psutil.virtual_memory().available``, what it and the load measure), so
that ``auto`` keeps the embedding and layer 0 in RAM and sends layer 1, the norm and ``lm_head`` to
disk: 0.9 × 420 kB = 378 kB of budget holds the embedding (69.6 kB) + layer 0 (148 kB) + the room
accelerate keeps for one offloaded layer (148 kB), not a second layer (the whole model, 435 kB,
would fit in 500 kB without offloading at all).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_models import save_tiny

GB = 10**9
ROOM = 420_000  # bytes of RAM left for layers after the run's room (one of the tiny model's two)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dmgui") / "llama"
    save_tiny("llama", folder)
    return folder


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTNSCOPE_CONFIG_DIR", str(tmp_path / "config"))


@pytest.fixture
def low_ram(monkeypatch, tiny):
    import psutil
    import torch

    if torch.cuda.is_available():
        pytest.skip("with a GPU accelerate places the tiny model there: the disk placement is CPU-only")

    from test_fit_devices import available_leaving

    available = available_leaving(tiny, ROOM)
    real = psutil.virtual_memory
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real()._replace(available=available))


def _eight_b_entry(tmp_path: Path):
    """A catalog entry for a Llama-3.1-8B-shaped folder holding only its published config.json."""
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from attnscope.core.loading.catalog_entry import CatalogEntry
    from make_synthetic import CONFIGS
    from test_fit_devices import PARAMS_8B

    folder = tmp_path / "Llama-3.1-8B"
    folder.mkdir()
    cfg = {k: v for k, v in CONFIGS["llama-3.1-8b"].items() if not k.startswith("_")}
    (folder / "config.json").write_text(json.dumps({**cfg, "torch_dtype": "bfloat16"}))
    return CatalogEntry(
        "user",
        "Llama-3.1-8B",
        folder,
        "hf",
        "llama",
        PARAMS_8B,
        32,
        32,
        8,
        128,
        131072,
        "bfloat16",
        2 * PARAMS_8B,
        True,
        model_ref=str(folder),
        checkpoint_dtype="bfloat16",
    )


def _fit_cell(dlg, name):
    from attnscope.app.model_table import FIT_COLUMN

    r = next(r for r in range(dlg.proxy.rowCount()) if dlg.proxy.index(r, 0).data() == name)
    return dlg.proxy.index(r, FIT_COLUMN)


def test_device_map_choice_changes_the_fit_column(qtbot, tmp_path):
    from attnscope.app.model_picker import ModelPickerDialog
    from attnscope.core.loading.fit_devices import device_fit_entry

    e = _eight_b_entry(tmp_path)
    free = {"cpu": 10 * GB, "disk": 100 * GB}
    dlg = ModelPickerDialog(
        None,
        scanner=lambda: [e],
        free_memory_fn=lambda b, d: (10 * GB, "RAM"),
        device_free_fn=lambda: free,
        scan_now=False,
        context=2048,
        device="cpu",
    )
    qtbot.addWidget(dlg)
    with qtbot.waitSignal(dlg.scanFinished, timeout=20000):
        dlg.rescan()
    one_device = _fit_cell(dlg, e.name).data()
    assert one_device.startswith("does not fit · ") and "disk" not in one_device
    with qtbot.waitSignal(dlg.deviceFitsFinished, timeout=60000):
        dlg.device_map.setCurrentText("auto")
    want = device_fit_entry(e, "auto", 2048, "auto", free=free)
    cell = _fit_cell(dlg, e.name)
    # the embedding and 18 layers in 10 GB of RAM, 14 layers + lm_head on disk (test_fit_devices)
    assert [d.n_layers for d in want.devices] == [18, 14]
    assert cell.data() == f"does not fit · {want.label()}" and " · disk 7.16 GB" in cell.data()
    assert "cpu: does not fit" in cell.data(0x03)  # tooltip (Qt.ToolTipRole): one line per device
    dlg.table.selectRow(0)
    assert "Device map <b>auto</b>" in dlg.details.text() and "14 layers" in dlg.details.text()
    assert "device map auto" in dlg.status.text()
    with qtbot.waitSignal(dlg.deviceFitsFinished, timeout=60000):
        dlg.device_map.setCurrentText("sequential")  # one CPU: the same map, still per device
    assert _fit_cell(dlg, e.name).data() == cell.data()
    with qtbot.waitSignal(dlg.deviceFitsFinished, timeout=60000):
        dlg.quantize.setCurrentText("int8")  # RAM + disk: the load refuses to quantise across them
    assert _fit_cell(dlg, e.name).data() == "refused · Quantise int8 needs one device"
    assert "multi-device --device-map is not supported" in _fit_cell(dlg, e.name).data(0x03)
    dlg.quantize.setCurrentText("none")
    dlg.device_map.setCurrentText("none")
    assert _fit_cell(dlg, e.name).data() == one_device
    dlg.backend.setCurrentText("mlx")
    assert not dlg.device_map.isEnabled() and dlg.device_map_choice() == "none"
    qtbot.waitUntil(
        lambda: not any(t.isRunning() for t in [dlg._dm_thread, *dlg._dm_stale] if t), timeout=20000
    )


@pytest.mark.slow
def test_device_map_load_session_round_trip(qtbot, tiny, tmp_path, monkeypatch, low_ram):
    """Choose the tiny model with Device map auto in the picker, open it (layer 1 on disk), run,
    export, save the session; a new window reopening it loads with the same map and the same numbers."""
    from attnscope.app import model_picker
    from attnscope.app.main_window import MainWindow
    from attnscope.core.loading import catalog, describe_model

    entry = describe_model.describe_hf_folder(tiny)
    monkeypatch.setattr(catalog, "scan", lambda: [entry])
    seen = {}

    def choose(dlg):  # what a user does in the dialog: wait for the list, pick a map, pick the model
        with qtbot.waitSignal(dlg.scanFinished, timeout=20000):
            pass
        with qtbot.waitSignal(dlg.deviceFitsFinished, timeout=60000):
            dlg.device_map.setCurrentText("auto")
        assert dlg.select(str(tiny))
        seen["fit"] = _fit_cell(dlg, entry.name).data()
        return 1

    monkeypatch.setattr(model_picker.ModelPickerDialog, "exec", choose)
    win = MainWindow(autoload=False)
    qtbot.addWidget(win)
    win.open_model_dialog()
    assert win.engine.wait_idle(120) and win.last_error is None
    assert " · disk " in seen["fit"] and seen["fit"].split(" · ", 1)[1].startswith("cpu ")
    s = win.engine.session
    assert s.info.device_map == "auto" and win.state.device_map == "auto"
    assert s.backend.model.hf_device_map["model.layers.1"] == "disk"
    assert s.backend.model.hf_device_map["model.layers.0"] == "cpu"
    assert dict(s.info.device_placement) == {
        "cpu": 4 * (272 * 64 + 36992),
        "disk": 4 * (36992 + 64 + 272 * 64),
    }
    assert "device map auto: cpu (218 kB), disk (218 kB)" in win.model_label.text()  # 217,600 and 217,856 B

    win.prompt_edit.setPlainText("the cat sat on the mat")
    win.chat_check.setChecked(False)
    win.run_prompt()
    assert win.engine.wait_idle(60) and win.last_error is None
    w_before = s.weights(1, 2)
    win.exports.export_data(tmp_path / "m.safetensors")
    assert win.engine.wait_idle(60) and win.last_error is None
    side = json.loads((tmp_path / "m.safetensors.json").read_text())
    assert side["device_map"]["strategy"] == "auto" and set(side["device_map"]["placement"]) == {
        "cpu",
        "disk",
    }
    win.sessions.save_session(tmp_path / "dm.attnscope")
    assert win.engine.wait_idle(60) and win.last_error is None
    saved = json.loads((tmp_path / "dm.attnscope").read_text())
    assert saved["device_map"] == side["device_map"]

    win2 = MainWindow(autoload=False)
    qtbot.addWidget(win2)
    assert win2.state.device_map == "none"
    win2.sessions.open_session(tmp_path / "dm.attnscope")
    assert win2.engine.wait_idle(120) and win2.last_error is None
    s2 = win2.engine.session
    assert s2 is not s and s2.info.device_map == "auto" and win2.state.device_map == "auto"
    assert s2.backend.model.hf_device_map["model.layers.1"] == "disk"
    np.testing.assert_array_equal(s2.weights(1, 2), w_before)
    assert "device map auto" in win2.model_label.text()


def test_old_session_files_open_without_a_device_map():
    from attnscope.core.io.sessionfile import SessionFile, SessionFileError

    base = {
        "format": "attnscope.session",
        "version": 1,
        "model": {"ref": "default"},
        "prompt": "hi",
        "chat_template": False,
        "n_prompt": 1,
        "token_ids": [5],
    }
    sf = SessionFile.from_dict(base)
    assert sf.device_map == {} and sf.device_map_strategy is None and "device_map" not in sf.to_dict()
    dm = {"strategy": "balanced", "placement": {"cuda:0": 10, "cuda:1": 12}}
    sf = SessionFile.from_dict({**base, "device_map": dm})
    assert sf.device_map_strategy == "balanced" and SessionFile.from_dict(sf.to_dict()).device_map == dm
    custom = SessionFile.from_dict({**base, "device_map": {"strategy": "custom", "placement": {"cpu": 1}}})
    assert custom.device_map_strategy is None  # an explicit map cannot be asked for by name
    line = 'bad session file: device_map.placement.cpu is "1 GB", expected a non-negative integer'
    with pytest.raises(SessionFileError, match=f"^{re.escape(line)}$"):
        SessionFile.from_dict({**base, "device_map": {"strategy": "auto", "placement": {"cpu": "1 GB"}}})
