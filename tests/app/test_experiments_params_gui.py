"""The Experiments tab runs what its boxes show: Run all (and the run the tab starts by itself) uses
the k, window and decode-from on screen, which follow each new sequence (fitted to it) unless the
user typed a value that still fits; running the same experiments again replaces their rows, new
parameters or a new sequence add rows (pytest-qt, offscreen, a tiny random llama)."""

from __future__ import annotations

import pytest
from attnscope.core.analysis.experiments import default_params
from gui_helpers import run_in
from PySide6.QtWidgets import QApplication

SHORT_PROMPT = "The cat sat on"  # ~14 tiny-tokenizer tokens: fitted k and window below the boxes' 4 and 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tiny_models import save_tiny

    out = tmp_path_factory.mktemp("llama_exp_params")
    save_tiny("llama", out)
    return out


def _idle(w):
    for _ in range(4):
        assert w.engine.wait_idle(120)
        QApplication.processEvents()
    assert w.last_error is None, w.last_error


def _params_shown(view, rows) -> dict[str, str]:
    """The Parameters column of ``rows``, by experiment kind."""
    return {view.results[r].experiment.kind: view.table.item(r, 1).text() for r in rows}


def _boxes(view) -> tuple[int, int]:
    return view.k_spin.value(), view.window_spin.value()


def test_run_all_runs_the_parameters_the_boxes_show(make_window, folder):
    w = make_window(model=folder, size=(1400, 900))
    run_in(w, SHORT_PROMPT)
    T = w.snapshot.seq_len
    assert 4 <= T < 32, T  # short enough that the fitted k and window differ from 4 and 16
    w.show_view("experiments")  # runs all five by itself
    _idle(w)
    v = w.views["experiments"]
    assert v.table.rowCount() == 5
    k, window = _boxes(v)
    assert (k, window) == default_params(T) and window < 16  # the boxes show what fits the sequence
    start = f"decode from {T - 1}"
    automatic = {
        "evict_first": f"k={k}, {start}",
        "sinks_window": f"sinks={k}, window={window}, {start}",
        "no_causal_prefill": start,
        "decode_top_left": start,
        "no_scale": start,
    }
    assert _params_shown(v, range(5)) == automatic

    # Run all again on the same sequence and boxes: the same five rows, replaced in place, not doubled
    before = [[v.table.item(r, c).text() for c in range(v.table.columnCount())] for r in range(5)]
    v.run_all_button.click()
    _idle(w)
    assert v.table.rowCount() == 5 and len(v.results) == 5
    assert [[v.table.item(r, c).text() for c in range(v.table.columnCount())] for r in range(5)] == before

    # the user's k: Run all runs it, and adds rows only for the experiments whose parameters changed
    # (evict first k, sinks + window); the three without k or window are the same rows, replaced
    v.k_spin.setValue(2)
    v.run_all_button.click()
    _idle(w)
    assert v.table.rowCount() == 7 and len(v.results) == 7
    assert _params_shown(v, range(5)) == automatic
    shown = _params_shown(v, range(5, 7))
    assert shown == {"evict_first": f"k=2, {start}", "sinks_window": f"sinks=2, window={window}, {start}"}
    assert [r.experiment.k for r in v.results[5:7]] == [2, 2]
    # one experiment run again with the boxes' parameters (Run): its row is replaced, not repeated
    v.kind_combo.setCurrentIndex(v.kind_combo.findData("evict_first"))
    v.run_button.click()
    _idle(w)
    assert v.table.rowCount() == 7 and v.table.currentRow() == 5
    # a decode step: a new sequence (T + 1 tokens) adds its own rows
    w.step(1)
    _idle(w)
    v.run_all_button.click()
    _idle(w)
    assert v.table.rowCount() == 12 and {r.seq_len for r in v.results[7:]} == {T + 1}

    # a new, longer prompt: the user's k still fits and stays; the window follows the sequence
    run_in(w, SHORT_PROMPT + " the mat. The dog sat on the log.")
    _idle(w)
    T2 = w.snapshot.seq_len
    assert T2 >= 32 and v.table.rowCount() == 5  # cleared, and run again by itself
    assert _boxes(v) == (2, default_params(T2)[1]) == (2, 16)
    assert _params_shown(v, range(2))["sinks_window"].startswith("sinks=2, window=16,")

    # a k the next sequence cannot hold (evicting all of it) goes back to the fitted one
    v.k_spin.setValue(T2 + 5)
    run_in(w, SHORT_PROMPT)
    _idle(w)
    assert _boxes(v) == default_params(w.snapshot.seq_len)
    assert _params_shown(v, range(1))["evict_first"].startswith(f"k={default_params(w.snapshot.seq_len)[0]},")
