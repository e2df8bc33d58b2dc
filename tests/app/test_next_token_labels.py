"""The next-token panel tells apart candidates that differ only by a space (" is" and "is" were both
drawn "is"): a space at either end of a candidate is drawn ␣, and the legend says so."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pytestqt")


def _table(texts):
    from attnscope.core.analysis.timeline import NextTokenRow, NextTokenTable
    from attnscope.core.sampling import Sampling

    p = np.linspace(0.5, 0.05, len(texts))
    rows = tuple(
        NextTokenRow(id=i, text=t, raw=t, p_model=float(q), p_sampled=float(i == 0))
        for i, (t, q) in enumerate(zip(texts, p, strict=True))
    )
    return NextTokenTable(step=0, position=3, rows=rows, chosen_id=None, sampling=Sampling(), entropy=1.0)


def test_candidate_labels_keep_edge_spaces_visible():
    from attnscope.app.views.next_token import candidate_label

    assert candidate_label(" is") == "␣is" and candidate_label("is") == "is"
    assert candidate_label("is ") == "is␣" and candidate_label("  ") == "␣␣"
    assert candidate_label("New York") == "New York"  # inner spaces stay spaces
    assert candidate_label("↵") == "↵" and candidate_label("") == "∅"
    assert candidate_label(" internationalisation") == "␣internati…"
    labels = [candidate_label(t) for t in (" is", "is", " Is", "is ")]
    assert len(set(labels)) == 4


def test_panel_draws_the_space_legend_only_when_a_space_is_marked(qtbot):
    from attnscope.app.views.next_token import SPACE_MARK, TopTokenBars

    bars = TopTokenBars()
    qtbot.addWidget(bars)
    bars.resize(300, 360)
    bars.set_table(_table([" is", "is", "↵", " was"]))
    legend = bars._legend(bars.table)
    assert any(line.startswith(SPACE_MARK) for line in legend)
    img = bars.grab().toImage()
    assert img.width() == 300 and not img.isNull()
    bars.set_table(_table(["is", "was", "↵"]))
    assert not any(SPACE_MARK in line for line in bars._legend(bars.table))
