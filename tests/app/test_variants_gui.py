"""The Sinks, Mask and heatmap views on a model with learned sinks (tiny gpt_oss) and on a soft-capped
one (tiny gemma2): the learned sink beside token 0, the row readout's sink share, raw and capped
scores (pytest-qt, offscreen). ``ATTNSCOPE_SHOTS=<folder>`` also saves the rendered tabs there."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from attnscope.core.analysis.sinks import session_sink_report
from gui_helpers import ran_window
from tiny_models import save_tiny

PROMPT = "Hi. The cat sat, then the dog sat.\nIt ran home"


def _shot(widget, name: str) -> None:
    folder = os.environ.get("ATTNSCOPE_SHOTS")
    if folder:
        from PySide6.QtWidgets import QApplication

        QApplication.processEvents()  # let the plot's layout settle after a label change
        Path(folder).mkdir(parents=True, exist_ok=True)
        widget.grab().save(str(Path(folder) / f"sinks_{name}.png"))


def _show(win, key):
    win.show_view(key)
    assert win.engine.wait_idle(120)
    assert win.last_error is None, win.last_error
    return win.views[key]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for fam in ("gpt_oss", "gemma2"):
        out[fam] = tmp_path_factory.mktemp(fam)
        save_tiny(fam, out[fam])
    return out


def test_sinks_tab_shows_the_learned_sink_beside_token_0(qtbot, folders):
    w = ran_window(qtbot, folders["gpt_oss"], PROMPT, steps=3)
    view = _show(w, "sinks")
    s = w.engine.session
    rep = session_sink_report(s)
    keys = [view.metric_combo.itemData(i) for i in range(view.metric_combo.count())]
    assert "learned" in keys and "sink_total" in keys
    w.state.select(1, 2)
    view.metric_combo.setCurrentIndex(keys.index("sink"))
    assert "learned sink" in view.summary.text()
    x, y = view.learned_curve.getData()
    np.testing.assert_allclose(y, rep.per_row_learned[1, 2, 1:], atol=1e-6)  # beside token 0's curve
    _shot(view, "gpt_oss_token0")
    view.metric_combo.setCurrentIndex(keys.index("learned"))
    np.testing.assert_allclose(view.table_values(), rep.learned, atol=1e-6)
    view.metric_combo.setCurrentIndex(keys.index("sink_total"))
    np.testing.assert_allclose(view.table_values(), rep.sink_total, atol=1e-6)
    flags = [
        (la, h)
        for la in range(rep.n_layers)
        for h in range(rep.n_heads)
        if "●" in view.table.item(la, h).text()
    ]
    assert flags == rep.sink_heads(view.threshold)
    _shot(view, "gpt_oss_total")
    # the heatmap's readout says the learned sink's share of the hovered row
    _show(w, "heatmap")
    hm = w.heatmap
    assert hm.learned_share is not None
    np.testing.assert_allclose(hm.learned_share, s.trace.learned_sink_share(1)[2], atol=1e-7)
    text = hm.cell_text(10, 3)
    assert "learned sink:" in text and "of this row" in text
    # the Mask tab names it too
    mask = _show(w, "mask")
    assert "Learned sink" in mask.header.text() and not mask.cap_row.isVisibleTo(mask)
    _shot(mask, "gpt_oss_mask")
    w.close()


def test_mask_tab_shows_raw_and_capped_scores(qtbot, folders):
    w = ran_window(qtbot, folders["gemma2"], PROMPT, steps=2)
    w.state.select(1, 1)
    mask = _show(w, "mask")
    r = mask.report
    assert r.softcap is not None and mask.cap_row.isVisibleTo(mask)
    assert "Soft-capped" in mask.header.text()
    assert mask.shown_scores() is r.scores
    _shot(mask, "gemma2_mask_capped")
    mask.cap_combo.setCurrentIndex(1)
    assert mask.shown_scores() is r.raw_scores
    assert "raw" in mask.plots[1].titleLabel.text
    _shot(mask, "gemma2_mask_raw")
    # a plain-softmax sink table: no learned-sink scores offered
    view = _show(w, "sinks")
    keys = [view.metric_combo.itemData(i) for i in range(view.metric_combo.count())]
    assert "learned" not in keys
    _shot(view, "gemma2_sinks")
    w.close()
