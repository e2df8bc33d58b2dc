"""KV-cache panel: the live measurement against the formula and the tensors, the MHA/GQA/MQA projection,
and the calculator reproducing the handbook's 70B table (pytest-qt, offscreen)."""

from __future__ import annotations

import numpy as np
import pytest
from attnscope.core.analysis.kv_live import kv_live, live_layer_bytes
from tiny_models import save_tiny

PROMPT = "Hi. The cat sat, then the dog sat."


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    save_tiny("llama", folder)
    return folder


def test_kv_live_counts_the_tensors(tiny_folder):
    from attnscope.core.session import Session

    s = Session.load(str(tiny_folder))
    assert kv_live(s).total_bytes == 0
    s.prefill(PROMPT, chat_template=False)
    T = s.seq_len
    live = kv_live(s)
    per_layer = 2 * 2 * 16 * T * 4  # K and V × 2 KV heads × head_dim 16 × T × float32
    np.testing.assert_array_equal(live.layer_bytes, [per_layer, per_layer])
    assert (
        live.total_bytes
        == live.formula_bytes
        == s.kv_cache_bytes()
        == s.backend.kv_cache_bytes()
        == 2 * per_layer
    )
    s.step(3)
    assert kv_live(s).total_bytes == 2 * per_layer + 3 * live.bytes_per_token
    assert live.bytes_per_token == 2 * 2 * 2 * 16 * 4
    assert [(r.label, r.config.n_kv_heads, r.is_given) for r in live.schemes_now] == [
        ("MHA", 4, False),
        ("GQA-2", 2, True),
        ("MQA", 1, False),
    ]
    assert [r.total_bytes for r in live.schemes_max] == [2 * 2 * k * 16 * 256 * 4 for k in (4, 2, 1)]
    s.step_back(2)
    assert live_layer_bytes(s.backend).sum() == s.kv_cache_bytes()


@pytest.fixture()
def win(make_window, tiny_folder):
    return make_window(tiny_folder)


def _cells(table) -> list[list[str]]:
    return [[table.item(r, c).text() for c in range(table.columnCount())] for r in range(table.rowCount())]


def test_calculator_reproduces_the_handbook_70b_table(win):
    view = win.views["kv"]
    view.preset_combo.setCurrentIndex(view.preset_combo.findData("Llama-2-70B, 8192 tokens"))
    assert (
        view.calc_layers.value(),
        view.calc_heads.value(),
        view.calc_kv.value(),
        view.calc_dim.value(),
        view.calc_tokens.value(),
        view.calc_dtype.currentText(),
        view.calc_batch.value(),
    ) == (80, 64, 8, 128, 8192, "bf16", 1)
    assert view.calc_rows() == [
        ("MHA", 64, 21_474_836_480),
        ("GQA-8", 8, 2_684_354_560),
        ("MQA", 1, 335_544_320),
    ]
    rows = _cells(view.calc_table)
    # the handbook prints 21.5 GB, 2.7 GB, 0.34 GB
    assert [r[2] for r in rows] == ["21.5 GB", "2.68 GB", "0.336 GB"]
    assert [r[-1] for r in rows] == ["1×", "8× smaller", "64× smaller"]
    assert "2,684,354,560 bytes" in view.calc_result.text()
    view.calc_batch.setValue(4)
    assert "10,737,418,240 bytes" in view.calc_result.text()  # 4 sequences: 4 × 2.68 GB
    view.calc_dtype.setCurrentText("fp32")
    assert view.calc_rows()[0][2] == 2 * 21_474_836_480 * 4
    view.calc_kv.setValue(7)  # 64 query heads cannot share 7 KV heads
    assert "multiple" in view.calc_result.text() and view.calc_table.rowCount() == 0


def test_live_panel_follows_the_session(win):
    view = win.views["kv"]
    win.prompt_edit.setPlainText(PROMPT)
    win.chat_check.setChecked(False)
    win.run_prompt()
    assert win.engine.wait_idle(60)
    n0 = win.snapshot.seq_len
    for _ in range(2):
        win.step(1)
        assert win.engine.wait_idle(60)
    win.show_view("kv")
    assert win.engine.wait_idle(60)
    s = win.engine.session
    assert view.live.seq_len == s.seq_len == n0 + 2
    assert view.live.total_bytes == s.backend.kv_cache_bytes()
    per_token = view.live.bytes_per_token
    # a measured point after prefill and after each step, on the formula's line
    assert view.history == {n0 + i: (n0 + i) * per_token for i in range(3)}
    xs, ys = view.measured_points.getData()
    np.testing.assert_allclose(xs, [n0, n0 + 1, n0 + 2])
    fx, fy = view.formula_curve.getData()
    assert fy[1] / fx[1] == pytest.approx(ys[0] / xs[0])  # same units, same slope
    assert (
        f"{view.live.total_bytes:,} bytes" in view.live_label.text() and "✓ equal" in view.live_label.text()
    )
    heights = view.layer_bars.opts["height"]
    assert len(heights) == 2 and heights[0] == pytest.approx(heights[1])
    rows = _cells(view.scheme_table)
    assert [r[0] for r in rows] == ["MHA", "GQA-2  (this model)", "MQA"]
    assert [r[1] for r in rows] == ["4", "2", "1"]
    # projection: the three schemes up to the model's max context (256 tokens for the tiny model)
    x, y = view.proj_curves["MHA"].getData()
    assert x[-1] == 256
    assert view.proj_curves["MQA"].getData()[1][-1] == pytest.approx(y[-1] / 4)
    assert view.now_line.value() == s.seq_len
    # a new prompt starts a new history
    win.run_prompt()
    assert win.engine.wait_idle(60)
    assert set(view.history) == {n0}
    # "This model" preset fills the calculator from the loaded model
    view.preset_combo.setCurrentIndex(0)
    assert (
        view.calc_layers.value(),
        view.calc_heads.value(),
        view.calc_kv.value(),
        view.calc_dim.value(),
    ) == (2, 4, 2, 16)
    assert view.calc_dtype.currentText() == "fp32"
