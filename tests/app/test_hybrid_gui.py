"""A hybrid model in the window (docs/how-it-works.md "Hybrid models"), on a tiny LFM2 with attention in layers 1 and 3
and short convolutions in 0 and 2: the layer spin box steps through the attention layers by their real
index, the head grid, Sinks, Head roles, KV tab, status bar and batch export mark the others
("layer 2: short convolution, no map") and nothing asks a convolution layer for a map (pytest-qt,
offscreen)."""

from __future__ import annotations

import numpy as np
import pytest
from gui_helpers import ran_window
from PySide6.QtCore import QPoint, Qt

PROMPT = "The cat sat on the mat, then it slept."


@pytest.fixture(scope="module")
def lfm2_folder(tmp_path_factory):
    import torch
    from tiny_models import tiny_config, tiny_tokenizer
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("lfm2_two_attention")
    cfg = tiny_config("lfm2")
    cfg.layer_types = ["conv", "full_attention", "conv", "full_attention"]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture()
def win(qtbot, lfm2_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    w = ran_window(qtbot, lfm2_folder, PROMPT, steps=2)
    yield w
    w.close()


def _show(win, key):
    win.show_view(key)
    assert win.engine.wait_idle(120)
    assert win.last_error is None, win.last_error
    return win.views[key]


def test_the_window_shows_the_attention_layers(win):
    arch = win.snapshot.info.arch
    assert arch.attention_layers == (1, 3)
    # the first layer is a convolution: the selection starts on the first attention layer
    assert win.state.layer == 1 and win.layer_spin.value() == 1
    assert "attention layers 1, 3 of 4" in win.group_label.text()
    assert "layer 0: short convolution, no map" in win.group_label.toolTip()
    assert "2 of 4 layers attention (2 short convolution)" in win.status.model_label.text()
    # Page Down / the arrows step over the convolution layer; a typed one moves on to an attention layer
    win.layer_spin.stepBy(1)
    assert (win.layer_spin.value(), win.state.layer) == (3, 3)
    win.layer_spin.stepBy(1)
    assert win.state.layer == 3  # the last attention layer
    win.layer_spin.stepBy(-1)
    assert (win.layer_spin.value(), win.state.layer) == (1, 1)
    win.layer_spin.setValue(2)
    assert (win.layer_spin.value(), win.state.layer) == (3, 3)
    win.layer_spin.setValue(0)
    assert (win.layer_spin.value(), win.state.layer) == (1, 1)
    _show(win, "heatmap")
    assert win.last_error is None
    _grid_marks_the_convolution_layers(win)
    _sinks_roles_kv_and_export_mark_the_other_layers(win)


def _grid_marks_the_convolution_layers(win):
    _show(win, "grid")
    canvas = win.maps.grid.canvas
    assert canvas.no_map == {0: "layer 0: short convolution, no map", 2: "layer 2: short convolution, no map"}
    assert canvas.thumbs.shape[:2] == (4, 4)
    assert np.isnan(canvas.thumbs[[0, 2]]).all() and np.isfinite(canvas.thumbs[[1, 3]]).all()
    x = canvas.head_x(0) + 5
    assert canvas.cell_at(QPoint(x, canvas.layer_y(0) + 5)) is None  # nothing to open
    assert canvas.cell_at(QPoint(x, canvas.layer_y(1) + 5)) == (1, 0)
    # the band says what the layer is, whole (the canvas is wide enough for the line)
    from PySide6.QtGui import QFontMetrics

    need = QFontMetrics(canvas.font()).horizontalAdvance("short convolution, no map")
    assert canvas.width() >= canvas.head_x(0) + need


def _sinks_roles_kv_and_export_mark_the_other_layers(win):
    sinks = _show(win, "sinks")
    t = sinks.table
    assert t.rowCount() == 4 and t.verticalHeaderItem(0).text() == "L0 · no map"
    assert t.item(0, 0).text() == "short convolution, no map" and t.item(0, 0).flags() == Qt.NoItemFlags
    assert t.item(0, 0).toolTip() == "layer 0: short convolution, no map"
    assert t.item(1, 0).text() and t.item(1, 0).flags() & Qt.ItemIsEnabled
    assert (
        "of 8 heads are sink heads" in sinks.summary.text() and "2 layers have no map" in sinks.summary.text()
    )

    roles = _show(win, "roles")
    layers = {roles.head_at(r)[0] for r in range(roles.table.rowCount())}
    assert layers == {1, 3} and "layers 0, 2: no attention map" in roles.summary.text()

    kv = _show(win, "kv")
    live = kv.live
    assert live.kv_layers == (1, 3) and live.total_bytes == live.formula_bytes
    heights = kv.state_bars.opts["height"]
    assert heights[0] > 0 and heights[2] > 0 and heights[1] == 0 and heights[3] == 0
    assert "recurrent/conv states in 2 layers" in kv.live_label.text()
    assert "+ states" in win.kv_label.text()
    assert "the other layers' recurrent/conv states" in win.kv_label.toolTip()

    from attnscope.app.export_dialogs import BatchExportDialog

    dlg = BatchExportDialog(win)
    texts = [dlg.scope_combo.itemText(i) for i in range(dlg.scope_combo.count())]
    assert any("Every attention layer × head (2 of 4 layers × 4 = 8 files)" in x for x in texts), texts
    dlg.close()
