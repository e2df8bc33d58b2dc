"""The KV calculator's labels say what the numbers are: an edited preset says "Custom (edited)",
1.37 TB is not "1374 GB", one unit per table, and at batch B the per-token figure says it covers
the batch (pytest-qt, offscreen; the panel alone, no model)."""

from __future__ import annotations

import pytest


@pytest.fixture()
def view(qtbot):
    from attnscope.app.engine import Engine
    from attnscope.app.state import ViewState
    from attnscope.app.views.kv import KVView
    from PySide6.QtWidgets import QWidget

    host = QWidget()
    qtbot.addWidget(host)
    state = ViewState()
    engine = Engine(host, state=state)
    v = KVView(state, engine)
    qtbot.addWidget(v)
    v.preset_combo.setCurrentText("Llama-2-70B, 8192 tokens")
    yield v
    engine.shutdown()


def _sizes(table):
    return [table.item(r, 2).text() for r in range(table.rowCount())]


def test_an_edited_preset_says_custom(view):
    assert view.preset_combo.currentText() == "Llama-2-70B, 8192 tokens"
    view.calc_tokens.setValue(4096)
    assert view.preset_combo.currentText() == "Custom (edited)"
    assert view.calc_tokens.value() == 4096  # the edit stays
    view.preset_combo.setCurrentText("Llama-2-70B, 8192 tokens")
    assert view.calc_tokens.value() == 8192 and view.preset_combo.currentText() == "Llama-2-70B, 8192 tokens"


def test_terabytes_and_one_unit_per_table(view):
    view.calc_batch.setValue(64)  # MHA: 21.47 GB × 64 = 1.374 TB
    sizes = _sizes(view.calc_table)
    assert sizes[0] == "1.37 TB", sizes
    assert {s.split()[-1] for s in sizes} == {"TB"}  # GQA-8 and MQA in the same unit
    assert "1374" not in view.calc_result.text()


def test_per_token_at_batch_says_the_batch(view):
    view.calc_batch.setValue(4)
    text = view.calc_result.text()
    # Llama-2-70B GQA-8, bf16: 2 × 80 × 8 × 128 × 2 B = 327,680 B per token per sequence
    assert "328 kB per token per sequence (1.31 MB per token × batch 4)" in text, text
    view.calc_batch.setValue(1)
    assert "per sequence" not in view.calc_result.text()
