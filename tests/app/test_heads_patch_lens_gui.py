"""The "Which heads matter" tab's activation patching, logit lens and direct logit attribution bars
(pytest-qt, offscreen, tiny llama): the tab's numbers are the core's (patch_heads,
attribution_patching, logit_lens, logit_attribution); Swap builds the corrupted prompt and a swap that
changes the length is refused in one line; Cancel mid-sweep leaves the tab usable; a saved session
keeps the controls and the results; Colour by sends the patching fractions to the Head grid."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gui_helpers import ran_window
from tiny_models import save_tiny

PROMPT = "a and b saw t, b gave t to"
SWAPPED = "b and a saw t, a gave t to"


@pytest.fixture()
def win(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    save_tiny("llama", tmp_path / "m")
    w = ran_window(qtbot, tmp_path / "m", PROMPT)
    w.show_view("heads")
    view = w.views["heads"]
    view.target_edit.setText("a")
    view.other_edit.setText("b")  # the metric becomes the logit difference
    yield w
    w.close()


def test_swap_builds_the_corrupted_prompt_and_refuses_other_lengths(win):
    from attnscope.app.views.heads_patch import swap_words

    assert (
        swap_words("When Mary and John went, John gave", " Mary", "John")
        == "When John and Mary went, Mary gave"
    )
    assert swap_words("Marya Mary John", "Mary", "John") == "Marya John Mary"  # whole words only
    with pytest.raises(ValueError, match="no word 'Bob'"):
        swap_words("Mary and John", "Bob", "John")
    view = win.views["heads"]
    view.swap_a.setText("a")
    view.swap_b.setText("b")
    view.swap()
    assert win.engine.wait_idle(60)
    assert view.corrupt_edit.text() == SWAPPED and "Could not" not in view.note.text()
    view.swap_a.setText("b")
    view.swap_b.setText("saw")  # " saw" is four tokens of the tiny tokenizer, " b" two: the length changes
    view.swap()
    assert win.engine.wait_idle(60)
    assert view.corrupt_edit.text() == "a and saw b t, saw gave t to"
    line = view.note.text()
    assert "same length" in line and "\n" not in line
    view.run_patch()  # patching with it: one line too, and the tab keeps working
    assert win.engine.wait_idle(60)
    assert "same length" in view.note.text() and "\n" not in view.note.text()
    assert view.patch_button.isEnabled() and view.patch is None


def test_patching_numbers_are_patch_heads_and_colour_the_head_grid(win, tmp_path):
    from attnscope.core.analysis.head_effects import attribution_patching, make_target, patch_heads

    view = win.views["heads"]
    view.corrupt_edit.setText(SWAPPED)
    view.patch_method_combo.setCurrentIndex(view.patch_method_combo.findData("both"))
    view.run_patch()
    assert win.engine.wait_idle(120) and win.last_error is None
    s = win.engine.session
    t = make_target(s, "logit_diff", token="a", other="b")
    want = patch_heads(s, SWAPPED, t, scope="readout")
    est = attribution_patching(s, SWAPPED, t, scope="readout")
    got = view.patch
    for name in ("denoise", "noise", "denoise_kv", "noise_kv"):
        np.testing.assert_allclose(getattr(got["exact"], name), getattr(want, name), atol=1e-6)
        np.testing.assert_allclose(getattr(got["attribution"], name), getattr(est, name), atol=1e-6)
    assert got["agreement"]["denoise"]["spearman"] == pytest.approx(
        est.agreement(want)["denoise"]["spearman"]
    )
    assert "ρ" in view.patch_summary.text() and "largest error" in view.patch_summary.text()
    # Colour by switched to denoise: the tab's grid and the Head grid's frames show the exact fractions
    assert view.show_combo.currentData() == "denoise"
    np.testing.assert_allclose(view.image.image, np.nan_to_num(want.denoise), atol=1e-6)
    np.testing.assert_allclose(win.grid.canvas.effects, want.denoise, atol=1e-6)
    view.show_combo.setCurrentIndex(view.show_combo.findData("noise"))
    np.testing.assert_allclose(win.grid.canvas.effects, want.noise, atol=1e-6)
    assert "patching noise" in win.grid.canvas.effects_label
    # the table's Denoise column holds the exact fractions
    L, H = want.denoise.shape
    rows = {
        view.head_at(r): r for r in range(view.table.rowCount()) if view.table.item(r, 1).text() != "group"
    }
    r = rows[(1, 2)]
    assert float(view.table.item(r, 5).data(0x0100)) == pytest.approx(want.denoise[1, 2], abs=1e-6)
    # export with provenance: both prompts, target, scope, site, method
    view.export(str(tmp_path / "p.json"))
    data = json.loads((tmp_path / "p.json").read_text())["patching"]
    assert data["prompt"] == PROMPT and data["corrupt_prompt"] == SWAPPED
    assert data["corrupt_ids"] == list(s.encode(SWAPPED, s.chat_template))
    assert data["target_text"] == "a" and data["other_text"] == "b" and data["site"] == "output"
    assert data["method"] == "both" and data["scope"] == "readout"
    np.testing.assert_allclose(data["exact"]["denoise"], want.denoise, atol=1e-6)
    view.export(str(tmp_path / "p.csv"))
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert f"# patching corrupt_prompt: {json.dumps(SWAPPED)}" in lines
    rows_csv = [x for x in lines if not x.startswith("#")]
    assert rows_csv[0].split(",")[3:] == [
        "patch_denoise",
        "patch_noise",
        "attribution_denoise",
        "attribution_noise",
    ]
    assert len(rows_csv) == 1 + L * (H + s.info.n_kv_heads)
    # the KV site: each KV head's keys and values, spread on its query heads for the Head grid
    view.site_combo.setCurrentIndex(view.site_combo.findData("kv"))
    view.patch_method_combo.setCurrentIndex(view.patch_method_combo.findData("exact"))
    view.run_patch()
    assert win.engine.wait_idle(120) and win.last_error is None
    kv = patch_heads(s, SWAPPED, t, scope="readout", site="kv")
    g = H // s.info.n_kv_heads
    np.testing.assert_allclose(win.grid.canvas.effects, np.repeat(kv.noise_kv, g, axis=1), atol=1e-6)


def test_lens_grid_cells_are_logit_lens_and_dla_bars_sum_to_the_logit(win):
    from attnscope.app.views.heads_lens import shown
    from attnscope.core.analysis.head_effects import logit_attribution, make_target
    from attnscope.core.analysis.logit_lens import logit_lens

    view = win.views["heads"]
    view.positions_edit.setText("2-5")
    view.k_spin.setValue(3)
    view.run_lens()
    assert win.engine.wait_idle(60) and win.last_error is None
    s = win.engine.session
    want = logit_lens(s, [2, 3, 4, 5], 3)
    tab = view.lens_table
    assert (tab.rowCount(), tab.columnCount()) == (s.info.n_layers, 4)
    for i in range(s.info.n_layers):
        for j in range(4):
            it = tab.item(i, j)
            assert it.data(0x0100) == int(want.top_ids[i, j, 0])
            assert it.text() == shown(s.tokenizer.decode([int(want.top_ids[i, j, 0])]))
            assert f"rank {int(want.final_rank[i, j]) + 1}," in it.toolTip()
    # the default: the last 16 positions (all of a shorter sequence)
    view.positions_edit.setText("")
    view.run_lens()
    assert win.engine.wait_idle(60)
    assert tab.columnCount() == min(16, s.seq_len)
    np.testing.assert_array_equal(view.lens[0].positions, logit_lens(s).positions)
    view.positions_edit.setText("3-999")
    view.run_lens()
    assert "outside the sequence" in view.note.text() and view.lens_button.isEnabled()
    win.last_error = None  # (that one line was the point)
    # the DLA bars: attention per layer, MLP per layer, the embedding: together the target logit
    view.run()
    assert win.engine.wait_idle(120) and win.last_error is None
    b = view.plots.bar_values
    dla = logit_attribution(s, make_target(s, "logit_diff", token="a", other="b"))
    total = b["attention"].sum() + b["mlp"].sum() + b["embedding"] + b["constant"]
    assert total == pytest.approx(dla.logit, abs=1e-4)
    np.testing.assert_allclose(b["mlp"], dla.mlp, atol=1e-9)


def test_cancel_mid_patch_leaves_the_tab_usable(win):
    view = win.views["heads"]
    view.corrupt_edit.setText(SWAPPED)
    view.scope_combo.setCurrentIndex(view.scope_combo.findData("everywhere"))
    view.run_patch()
    view.cancel()
    assert win.engine.wait_idle(120)
    assert (
        view.patch_button.isEnabled() and view.run_button.isEnabled() and not view.cancel_button.isEnabled()
    )
    view.run_lens()
    assert win.engine.wait_idle(60) and view.lens is not None
    view.run_patch()
    assert win.engine.wait_idle(120) and view.patch is not None and win.last_error is None


def test_resample_ablation_uses_the_corrupted_prompt(win):
    from attnscope.core.analysis.head_effects import head_effects, make_target

    view = win.views["heads"]
    view.method_combo.setCurrentIndex(view.method_combo.findData("resample"))
    view.run()  # no second prompt: one line
    assert "second prompt" in view.note.text()
    win.last_error = None
    view.corrupt_edit.setText(SWAPPED)
    view.run()
    assert win.engine.wait_idle(120) and win.last_error is None
    s = win.engine.session
    want = head_effects(s, make_target(s, "logit_diff", token="a", other="b"), "resample", source=SWAPPED)
    np.testing.assert_allclose(view.result[0].query, want.query, atol=1e-6)
    assert view.result[5]["source_prompt"] == SWAPPED


def test_session_keeps_the_controls_and_results(win, tmp_path):
    view = win.views["heads"]
    view.corrupt_edit.setText(SWAPPED)
    view.swap_a.setText("a")
    view.swap_b.setText("b")
    view.site_combo.setCurrentIndex(view.site_combo.findData("query"))
    view.patch_method_combo.setCurrentIndex(view.patch_method_combo.findData("attribution"))
    view.positions_edit.setText("1-4")
    view.k_spin.setValue(7)
    view.run_patch()
    assert win.engine.wait_idle(60)
    view.run_lens()
    assert win.engine.wait_idle(60) and win.last_error is None
    patch, lens = view.patch, view.lens
    win.sessions.save_session(tmp_path / "h.attnscope")
    assert win.engine.wait_idle(60)
    saved = json.loads((tmp_path / "h.attnscope").read_text())["view"]["views"]["heads"]
    assert saved["corrupt_edit"] == SWAPPED and saved["k_spin"] == 7 and saved["positions_edit"] == "1-4"
    view.corrupt_edit.setText("")
    view.site_combo.setCurrentIndex(0)
    view.patch_method_combo.setCurrentIndex(0)
    view.positions_edit.setText("")
    view.k_spin.setValue(2)
    view.patch = view.lens = None
    win.sessions.open_session(tmp_path / "h.attnscope")
    assert win.engine.wait_idle(300) and win.last_error is None
    assert view.corrupt_edit.text() == SWAPPED and (view.swap_a.text(), view.swap_b.text()) == ("a", "b")
    assert view.site_combo.currentData() == "query" and view.patch_method_combo.currentData() == "attribution"
    assert view.positions_edit.text() == "1-4" and view.k_spin.value() == 7
    assert view.patch is not None and view.lens is not None
    np.testing.assert_allclose(view.patch["attribution"].denoise, patch["attribution"].denoise, atol=1e-6)
    np.testing.assert_array_equal(view.lens[0].top_ids, lens[0].top_ids)
    assert view.lens_table.columnCount() == 4
