"""User journeys through the real window, done as a user does them: the model picker,
Run, the sampling panel, Ctrl+S / Ctrl+Shift+O, Esc mid-prefill, PgDn, F10.

After each journey every visible control is compared with the state the engine runs, and the window
is rendered offscreen to ``/work/notes/shots/journeys_*.png`` (looked at by hand).

Cancels are deterministic: the cancel is requested from the engine thread at a progress report
(or inside a step), never after a sleep.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from attnscope.app.engine import CancelledMessage
from attnscope.app.main_window import MainWindow
from attnscope.core.loading.cache_folder import file_sha256
from attnscope.core.loading.resolve import default_gguf_path
from attnscope.core.sampling import Sampling
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

SHOTS = Path("/work/notes/shots")
PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"
LONG_PROMPT = " ".join(
    ["Attention lets every token look back at the tokens before it."] * 110
)  # ~1300 tokens


def _shot(win, name: str) -> None:
    """Render the window offscreen to ``journeys_<name>.png`` (skipped where the folder cannot be made)."""
    try:
        SHOTS.mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    from PySide6.QtWidgets import QApplication

    for _ in range(3):
        QApplication.processEvents()
    win.grab().save(str(SHOTS / f"journeys_{name}.png"), "PNG")


def _trigger(win, shortcut: str) -> None:
    """Press ``shortcut`` as the user does: the window action bound to it is triggered."""
    for a in win.actions():
        if a.shortcut().toString() == shortcut:
            a.trigger()
            return
    raise KeyError(f"no action on {shortcut}")


def _idle(win, timeout=300):
    assert win.engine.wait_idle(timeout), "the engine did not finish"


def _new_window(qtbot) -> MainWindow:
    win = MainWindow()
    qtbot.addWidget(win)
    win.resize(1400, 900)
    win.show()
    _idle(win)
    assert win.last_error is None
    return win


def _pick_embedded(qtbot, monkeypatch, win) -> None:
    """Ctrl+O → wait for the scan → select the embedded SmolLM2 → Open."""
    from attnscope.app.model_picker import ModelPickerDialog

    def exec_(dlg):
        with qtbot.waitSignal(dlg.scanFinished, timeout=120_000):
            pass
        assert dlg.select("default"), "the picker lists no embedded model"
        assert dlg.open_btn.isEnabled()
        dlg.open_btn.click()
        return dlg.result()

    monkeypatch.setattr(ModelPickerDialog, "exec", exec_)
    _trigger(win, "Ctrl+O")
    _idle(win)
    assert win.last_error is None


def _file_dialogs(monkeypatch, save_to=None, open_from=None):
    if save_to is not None:
        monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(save_to), ""))
    if open_from is not None:
        monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(open_from), ""))


def visible_state(win) -> dict:
    """Every restored control as the user sees it."""
    ex = win.exports
    return {
        "prompt": win.prompt_edit.toPlainText(),
        "chat": win.chat_check.isChecked(),
        "sampling": win.decode_panel.sampling(),
        "layer": win.layer_spin.value(),
        "head": win.head_spin.value(),
        "tab": ex.current_view_key(),
        "cmap": win.cmap_combo.currentText(),
        "aggregate": win.heatmap.aggregate,
        "scale": win.heatmap.scale_combo.currentText(),
        "gamma": win.heatmap.gamma_spin.value(),
        "range": win.heatmap.range_mode,
        "views": {k: v.view_state() for k, v in win.views.items() if hasattr(v, "view_state")},
        "timeline": (win.timeline.step, win.timeline.n_generated),
        "query_row": win.query_row,
        "seq_label": win.seq_label.text(),
        "kv_label": win.kv_label.text(),
    }


def assert_controls_match_engine(win) -> None:
    """What the controls show is what runs: prompt, chat template, sampling, sequence, selection."""
    s = win.engine.session
    snap = win.snapshot
    assert win.prompt_edit.toPlainText() == s.prompt
    assert win.chat_check.isChecked() == s.chat_template
    assert win.decode_panel.sampling() == s.sampling
    assert [t.id for t in snap.tokens] == s.ids
    assert (win.timeline.n_prompt, win.timeline.n_generated) == (s.n_prompt, s.n_generated)
    assert f"seq_len {s.seq_len}" in win.seq_label.text()
    assert win.map_key is not None and win.map_key[:2] == (win.layer_spin.value(), win.head_spin.value())
    assert win.map_key[3] == win.timeline.visible_len
    assert win.step_button.isEnabled() and win.back_button.isEnabled() == (s.n_generated > 0)


# -- journey 1: picker → run → sample → save → reopen ------------------------------------------------------
@pytest.mark.slow
def test_picker_embedded_run_sample_save_reopen(qtbot, monkeypatch, tmp_path):
    win = _new_window(qtbot)
    gguf_sha = file_sha256(default_gguf_path())
    assert win.engine.session.info.source == str(default_gguf_path().resolve())  # startup default: absolute

    _pick_embedded(qtbot, monkeypatch, win)
    s = win.engine.session
    assert Path(s.info.source).is_absolute() and Path(s.info.source).exists()
    assert win.state.model is None  # the embedded model, whichever way it was chosen

    win.prompt_edit.setPlainText(PROMPT)
    win.chat_check.setChecked(False)
    win.run_button.click()
    _idle(win)
    # Sample, T = 1.2, seed 42, as typed into the panel
    c = win.decode_panel.controls
    c.mode_combo.setCurrentIndex(1)
    c.temperature.setValue(1.2)
    c.seed.setValue(42)
    _idle(win)
    assert win.engine.session.sampling == Sampling(temperature=1.2, seed=42)
    win.steps_spin.setValue(3)
    win.stepn_button.click()
    _idle(win)
    # what the next sampled step draws (step, note, step back)
    win.step_button.click()
    _idle(win)
    next_id = win.snapshot.tokens[-1].id
    win.back_button.click()
    _idle(win)
    # a view worth restoring: layer 3, head 4, magma, power scale, Mask tab, a clicked row
    win.select(3, 4)
    win.cmap_combo.setCurrentText("magma")
    win.heatmap.set_scale("power", 0.7)
    _idle(win)
    win.query_row = 5
    win._show_token_strip()
    for key in win.views:  # the user looks at every tab (each computes its panel)
        win.show_view(key)
        _idle(win)
    win.views["sinks"].step_spin.setValue(10)  # the sinks table as it was after 10 tokens
    win.views["sinks"].threshold_spin.setValue(0.5)
    win.show_view("mask")
    _idle(win)
    before = visible_state(win)
    ids_before = list(win.engine.session.ids)
    w_before = np.array(win.engine.session.weights(3, 4))

    # a data export in this state keeps the model's hash (sidecar)
    win.exports.export_data(tmp_path / "map.npy")
    _idle(win)
    side = json.loads((tmp_path / "map.npy.json").read_text())
    assert side["model"]["sha256"] == gguf_sha and Path(side["model"]["source"]).is_absolute()

    sess_file = tmp_path / "fox.attnscope"
    _file_dialogs(monkeypatch, save_to=sess_file, open_from=sess_file)
    _trigger(win, "Ctrl+S")
    _idle(win)
    saved = json.loads(sess_file.read_text())
    assert saved["model"]["ref"] == "default" and saved["model"]["sha256"] == gguf_sha
    assert saved["sampling"] == {"temperature": 1.2, "top_k": 0, "top_p": 1.0, "seed": 42}
    win.close()

    # a fresh window (startup default), the user changes everything, then reopens the file
    win2 = _new_window(qtbot)
    win2.prompt_edit.setPlainText("Something else entirely.")
    win2.run_button.click()
    _idle(win2)
    win2.select(7, 1)
    win2.cmap_combo.setCurrentText("viridis")
    win2.show_view("sinks")
    _idle(win2)
    win2.last_error = None
    _trigger(win2, "Ctrl+Shift+O")
    _idle(win2)
    assert win2.last_error is None, win2.last_error
    after = visible_state(win2)
    for key in before:  # every restored control, as seen
        if key == "views":
            for view, vs in before["views"].items():
                assert after["views"][view] == vs, view
        assert after[key] == before[key], key
    assert after["sampling"] == Sampling(temperature=1.2, seed=42)
    assert_controls_match_engine(win2)
    assert win2.engine.session.ids == ids_before
    np.testing.assert_array_equal(win2.engine.session.weights(3, 4), w_before)  # the same numbers
    assert win2.map_key == (3, 4, "head", len(ids_before))
    assert win2.heatmap.colorbar.colorMap().name.endswith("magma")
    assert win2.grid.canvas.cmap == "magma"
    _shot(win2, "reopened")
    # the reopened session samples what the original would have drawn next
    _trigger(win2, "F10")
    _idle(win2)
    assert win2.snapshot.tokens[-1].id == next_id
    assert_controls_match_engine(win2)
    win2.close()


def test_every_way_of_choosing_a_model_records_a_resolvable_source(tmp_path, monkeypatch, smol_folder):
    """The one place (attnscope.core.loading.resolve.model_source): default refs, relative and ~ paths all become absolute."""
    from attnscope.core.io import sessionfile
    from attnscope.core.loading.resolve import is_default_source, model_source

    gguf = str(default_gguf_path().resolve())
    for ref in (None, "", "default"):
        assert model_source(ref) == gguf and is_default_source(model_source(ref))
        assert sessionfile.model_reference(model_source(ref)) == "default"
    monkeypatch.chdir(smol_folder.parent)
    rel = smol_folder.name
    assert model_source(rel) == str(smol_folder.resolve())
    assert sessionfile.model_reference(model_source(rel)) == str(smol_folder.resolve())
    assert not is_default_source(rel)
    # a packaged app's pre-converted default is the default too
    monkeypatch.setenv("ATTNSCOPE_DEFAULT_MODEL", str(smol_folder))
    assert model_source("default") == str(smol_folder.resolve())
    assert sessionfile.model_reference(model_source(None)) == "default"


# -- journey 2: Esc mid-prefill, then PgDn / F10 / Run ------------------------------------------------------
def _cancel_at_progress(win, startswith: str):
    """Ask for cancel from the engine thread at the first progress report starting with ``startswith``."""
    seen = []

    def on_progress(message, _fraction):
        if message.startswith(startswith) and not seen:
            seen.append(message)
            win.engine.cancel()

    win.engine.worker.progress.connect(on_progress, Qt.DirectConnection)
    return seen, lambda: win.engine.worker.progress.disconnect(on_progress)


def assert_empty_state(win) -> None:
    """The clear empty state: every control says there is no sequence."""
    s = win.engine.session
    assert s.seq_len == 0 and s.n_prompt == 0
    assert win.snapshot.seq_len == 0 and win.snapshot.n_prompt == 0
    assert win.timeline.visible_len == 0 and win.timeline.n_generated == 0
    assert "no sequence" in win.timeline.label.text()
    assert win.seq_label.text().startswith("seq_len 0 ")
    assert win.weights is None and win.map_key is None and win.heatmap.weights is None
    assert win.heatmap.image.image is None
    assert (
        not win.step_button.isEnabled()
        and not win.stepn_button.isEnabled()
        and not win.back_button.isEnabled()
    )
    assert win.run_button.isEnabled()
    assert win.decode_panel.bars.table is None
    assert win.grid.canvas.thumbs is None
    assert win.token_strip.toPlainText() == ""  # the placeholder shows
    for key in ("grid", "gqa", "mask", "sinks", "roles"):  # panels needing a sequence are covered
        assert win._empty_overlays[key].isVisibleTo(win.tabs.page_of(win.views[key])), key


@pytest.mark.slow
def test_cancel_mid_prefill_then_pgdn_f10_run(qtbot):
    win = _new_window(qtbot)
    win.chat_check.setChecked(False)
    win.prompt_edit.setPlainText(PROMPT)
    win.run_button.click()
    _idle(win)
    assert win.weights is not None
    win.prompt_edit.setPlainText(LONG_PROMPT)
    seen, done = _cancel_at_progress(win, "Prefill")
    errors = []
    win.engine.error.connect(errors.append)
    _trigger(win, "Ctrl+Return")
    _trigger(win, "PgDown")  # pressed while the prefill runs: its map request waits behind the prefill
    _idle(win)
    done()
    assert seen and seen[0].startswith("Prefill 512/")
    assert isinstance(win.last_error, CancelledMessage)
    assert errors == [] and win.layer == 1  # the stale request was dropped, not "n=... out of range"
    assert_empty_state(win)
    assert "cancelled" in win.heatmap.plot.titleLabel.text.lower()
    _shot(win, "cancelled_prefill")
    # PgDn: no error, nothing drawn; F10: the window says Run first (and Step is off)
    win.last_error = None
    _trigger(win, "PgDown")
    _idle(win)
    assert win.last_error is None and win.layer == 2 and win.weights is None
    _trigger(win, "F10")
    _idle(win)
    assert win.last_error == "Run a prompt before stepping."
    assert_empty_state(win)
    # Run again, then F10 and PgDn work
    win.last_error = None
    win.prompt_edit.setPlainText(PROMPT)
    _trigger(win, "Ctrl+Return")
    _idle(win)
    n0 = win.snapshot.seq_len
    _trigger(win, "F10")
    _idle(win)
    _trigger(win, "PgDown")
    _idle(win)
    assert win.last_error is None
    assert win.snapshot.seq_len == n0 + 1 and win.weights.shape == (n0 + 1, n0 + 1)
    assert win.map_key == (3, 0, "head", n0 + 1)
    assert_controls_match_engine(win)
    _shot(win, "after_cancel_run_again")
    win.close()


@pytest.mark.slow
def test_cancel_step_n_load_and_reopen(qtbot, monkeypatch, tmp_path):
    win = _new_window(qtbot)
    win.chat_check.setChecked(False)
    win.prompt_edit.setPlainText(PROMPT)
    win.run_button.click()
    _idle(win)
    n0 = win.snapshot.seq_len

    # Step ×8, cancelled inside the second step: the two tokens made stay, everything agrees
    s = win.engine.session
    real_step, calls = s.step, []

    def step(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            win.engine.cancel()
        return real_step(*a, **k)

    monkeypatch.setattr(s, "step", step)
    win.steps_spin.setValue(8)
    _trigger(win, "Ctrl+F10")
    _idle(win)
    monkeypatch.undo()
    assert win.snapshot.n_generated == 2 and win.engine.session.n_generated == 2
    assert isinstance(win.last_error, CancelledMessage) and "after 2 of 8" in win.last_error
    assert_controls_match_engine(win)

    # save this state for the reopen below
    sess_file = tmp_path / "two.attnscope"
    _file_dialogs(monkeypatch, save_to=sess_file, open_from=sess_file)
    _trigger(win, "Ctrl+S")
    _idle(win)

    # cancel a model load: the previous model and run stay, and so do the controls
    before = visible_state(win)
    seen, done = _cancel_at_progress(win, "Loading")
    win.load_model("default")
    _idle(win)
    done()
    assert seen and isinstance(win.last_error, CancelledMessage)
    assert visible_state(win) == before and win.state.model is None
    assert_controls_match_engine(win)

    # cancel a session reopen part-way through the replay: the run it was replacing is restored (it
    # was overwritten part-way, so it is run again), the timeline at the step it showed
    win.prompt_edit.setPlainText("Another prompt, so the reopen has work to do.")
    win.run_button.click()
    _idle(win)
    _trigger(win, "F10")
    _idle(win)
    _trigger(win, "F10")
    _idle(win)
    win.timeline.set_step(1)
    _idle(win)
    before, ids = visible_state(win), list(win.engine.session.ids)
    seen, done = _cancel_at_progress(win, "Replaying the run: generated token 1/")
    _trigger(win, "Ctrl+Shift+O")
    _idle(win)
    done()
    assert seen and isinstance(win.last_error, CancelledMessage)
    assert "two.attnscope cancelled" in win.last_error
    assert list(win.engine.session.ids) == ids and visible_state(win) == before
    assert "the previous run is restored" in win.statusBar().currentMessage()
    assert_controls_match_engine(win)
    _shot(win, "cancelled_reopen")
    # Esc again while the previous run is being restored: it stops there (here after its prompt, a
    # single prefill chunk, before its generated tokens), and the window shows what the engine holds
    seen, done = _cancel_at_progress(win, "Replaying the run: generated token 1/")
    seen2, done2 = _cancel_at_progress(win, "Restoring the previous run")
    _trigger(win, "Ctrl+Shift+O")
    _idle(win)
    done(), done2()
    assert seen and seen2 and "restoring the previous run cancelled too" in win.last_error
    assert (
        list(win.engine.session.ids) == ids[: win.engine.session.n_prompt] and win.snapshot.n_generated == 0
    )
    assert_controls_match_engine(win)
    # and a full reopen afterwards works
    win.last_error = None
    _trigger(win, "Ctrl+Shift+O")
    _idle(win)
    assert win.last_error is None and win.snapshot.n_generated == 2 and win.snapshot.seq_len == n0 + 2
    assert_controls_match_engine(win)
    win.close()


# -- minors: picker and MLX, Help → About ------------------------------------------------------------------
def test_picker_says_before_open_that_mlx_cannot_run_gemma(qtbot):
    from attnscope.app.model_picker import ModelPickerDialog
    from attnscope.app.model_table import FIT_COLUMN
    from attnscope.core.loading.catalog_entry import CatalogEntry

    gemma = CatalogEntry(
        "lmstudio",
        "gemma-3-270m",
        Path("/models/gemma-3-270m.gguf"),
        "gguf",
        "gemma3",
        268_098_176,
        18,
        4,
        1,
        256,
        32768,
        "Q4_K_M",
        253_000_000,
        True,
        model_ref="/models/gemma-3-270m.gguf",
    )
    smol = CatalogEntry(
        "embedded",
        "SmolLM2",
        Path("/x.gguf"),
        "gguf",
        "llama",
        134_515_008,
        30,
        9,
        3,
        64,
        8192,
        "Q4_1",
        98_362_432,
        True,
        model_ref="default",
    )
    dlg = ModelPickerDialog(
        None,
        scanner=lambda: [gemma, smol],
        free_memory_fn=lambda b, d: (20e9, "RAM"),
        scan_now=False,
        backend="mlx",
    )
    qtbot.addWidget(dlg)
    with qtbot.waitSignal(dlg.scanFinished, timeout=20000):
        dlg.rescan()
    row = next(r for r in range(dlg.proxy.rowCount()) if dlg.proxy.index(r, 0).data() == "gemma-3-270m")
    assert dlg.proxy.index(row, FIT_COLUMN).data() == "not on MLX"
    assert "Choose torch under Backend" in dlg.proxy.index(row, FIT_COLUMN).data(Qt.ToolTipRole)
    dlg.table.selectRow(row)
    assert not dlg.open_btn.isEnabled() and dlg.selected_path() is None
    assert "MLX backend does not run gemma3" in dlg.details.text() and "--backend" not in dlg.details.text()
    dlg.resize(1320, 420)
    _shot(dlg, "picker_mlx_gemma")
    dlg.backend.setCurrentText("torch")  # the user follows the advice
    assert dlg.open_btn.isEnabled() and dlg.selected_path() == "/models/gemma-3-270m.gguf"
    assert dlg.proxy.index(row, FIT_COLUMN).data().startswith("fits")
    dlg.backend.setCurrentText("mlx")
    smol_row = next(r for r in range(dlg.proxy.rowCount()) if dlg.proxy.index(r, 0).data() == "SmolLM2")
    dlg.table.selectRow(smol_row)
    assert dlg.open_btn.isEnabled()  # llama runs on MLX


def test_load_refusal_in_window_words():
    from attnscope.app.main_window import window_wording

    msg = "the MLX backend does not implement 'gemma3' (it runs llama, mistral, qwen2, qwen3): use --backend torch"
    assert window_wording(msg).endswith("choose Backend → torch") and "--" not in window_wording(msg)


@pytest.mark.slow
def test_about_shows_version_model_backend(qtbot):
    from attnscope.core import __version__

    win = _new_window(qtbot)
    text = win.about_text()
    assert f"AttnScope {__version__}" in text
    assert "SmolLM2-135M-Instruct" in text and "torch on cpu" in text and "float32" in text
    win.close()


# -- backend switch keeps the run ----------------------------------------------------------------------------
@pytest.mark.slow
def test_backend_switch_replays_the_run(qtbot):
    pytest.importorskip("mlx.core")
    win = _new_window(qtbot)
    win.chat_check.setChecked(False)
    win.prompt_edit.setPlainText(PROMPT)
    win.run_button.click()
    _idle(win)
    win.steps_spin.setValue(2)
    win.stepn_button.click()
    _idle(win)
    win.select(3, 4)
    _idle(win)
    ids, w_torch = list(win.engine.session.ids), np.array(win.engine.session.weights(3, 4))
    win.backend_actions["mlx"].trigger()  # Backend → MLX
    _idle(win, 600)
    assert win.last_error is None, win.last_error
    s = win.engine.session
    assert win.snapshot.backend == "mlx" == s.backend.name and win.backend_actions["mlx"].isChecked()
    assert s.ids == ids and s.n_generated == 2  # the run was kept, replayed on MLX
    np.testing.assert_allclose(s.weights(3, 4), w_torch, atol=1e-5)
    assert_controls_match_engine(win)
    assert "Now on mlx" in win.statusBar().currentMessage()
    _shot(win, "backend_switched")
    win.close()


def test_backend_switch_the_new_backend_cannot_run_keeps_the_run(qtbot, tmp_path):
    """Backend → MLX on a Gemma 2 model (soft-capping: torch only): one line in the window's words;
    torch and the run stay."""
    pytest.importorskip("mlx.core")
    from tiny_models import save_tiny

    folder = tmp_path / "tiny-gemma2"
    save_tiny("gemma2", folder)
    win = MainWindow(model=str(folder))
    qtbot.addWidget(win)
    win.show()
    _idle(win)
    assert win.last_error is None and win.state.model == str(Path(folder).resolve())
    win.chat_check.setChecked(False)
    win.prompt_edit.setPlainText("a b c d e")
    win.run_button.click()
    _idle(win)
    before = visible_state(win)
    ids = list(win.engine.session.ids)
    win.backend_actions["mlx"].trigger()
    _idle(win)
    assert (
        win.last_error.startswith("Could not load the model:") and "choose Backend → torch" in win.last_error
    )
    assert "--backend" not in win.last_error
    assert win.state.backend == "torch" and win.backend_actions["torch"].isChecked()
    assert win.engine.session.ids == ids and visible_state(win) == before
    assert_controls_match_engine(win)
    win.close()


@pytest.mark.slow
def test_relative_model_path_and_drop_record_an_absolute_source_and_hash(qtbot, monkeypatch, tmp_path):
    """--model with a relative path, then a folder dropped on the window: the session file names each
    by absolute path with its hash, and reopens from another working folder."""
    from attnscope.core.loading.model_hash import model_sha256
    from PySide6.QtCore import QMimeData, QPointF, QUrl
    from PySide6.QtGui import QDropEvent
    from tiny_models import save_tiny

    a, b = tmp_path / "models" / "tiny-a", tmp_path / "models" / "tiny-b"
    save_tiny("llama", a, seed=1)
    save_tiny("llama", b, seed=2)
    monkeypatch.chdir(tmp_path / "models")
    win = MainWindow(model="tiny-a")  # as `attnscope --model tiny-a` from that folder
    qtbot.addWidget(win)
    win.show()
    _idle(win)
    assert win.last_error is None and win.engine.session.info.source == str(a.resolve())
    # drag and drop the other folder
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(b))])
    win.dropEvent(QDropEvent(QPointF(10, 10), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier))
    _idle(win)
    assert win.last_error is None and win.engine.session.info.source == str(b.resolve())
    assert win.state.model == str(b.resolve())
    win.chat_check.setChecked(False)
    win.prompt_edit.setPlainText("a b c d")
    win.run_button.click()
    _idle(win)
    win.step_button.click()
    _idle(win)
    ids = list(win.engine.session.ids)
    win.timeline.set_step(0)  # the user looks back at the map after prefill
    win.select(1, 2)
    for key in ("sinks", "gqa", "heatmap"):
        win.show_view(key)
        _idle(win)
    before = visible_state(win)
    f = tmp_path / "tiny.attnscope"
    _file_dialogs(monkeypatch, save_to=f, open_from=f)
    _trigger(win, "Ctrl+S")
    _idle(win)
    saved = json.loads(f.read_text())
    assert saved["model"]["ref"] == str(b.resolve()) and saved["model"]["sha256"] == model_sha256(b)
    win.close()
    monkeypatch.chdir(tmp_path)  # somewhere else
    win2 = MainWindow(model=str(a))
    qtbot.addWidget(win2)
    win2.show()
    _idle(win2)
    _trigger(win2, "Ctrl+Shift+O")
    _idle(win2)
    assert win2.last_error is None, win2.last_error
    assert win2.engine.session.info.source == str(b.resolve()) and win2.engine.session.ids == ids
    assert win2.state.model == str(b.resolve())  # a later backend switch reloads this one
    after = visible_state(win2)
    for key in before:
        assert after[key] == before[key], key
    assert win2.timeline.step == 0 and win2.map_key == (1, 2, "head", len(ids) - 1)
    assert_controls_match_engine(win2)
    win2.close()


def test_a_model_load_keeps_the_chat_template_choice(qtbot, tmp_path):
    """`attnscope --prompt … --no-chat-template` (and a user who unticks the box while the model
    loads): the load used to tick it again for a model with a template, so the box said "chat
    template" while the run had none. A model without a template turns it off; the next one with a
    template gets the last choice back."""
    from attnscope.app.launch import _after_load
    from attnscope.app.main_window import MainWindow
    from tiny_models import save_tiny

    win = MainWindow()  # the embedded model, which has a chat template, loading on the engine thread
    qtbot.addWidget(win)
    args = type("Args", (), {"chat_template": False, "steps": 0})()
    win.prompt_edit.setPlainText(PROMPT)
    _after_load(win, args)  # what launch does for --prompt, before the load has finished
    _idle(win)
    assert win.snapshot.info.has_chat_template
    assert win.chat_check.isEnabled() and not win.chat_check.isChecked()
    s = win.engine.session  # what ran agrees with the box: the prompt's own tokens, no template
    assert win.snapshot.chat_template is False and s.ids == s.encode(PROMPT, False)
    folder = tmp_path / "llama"
    save_tiny("llama", folder)  # a tokenizer without a chat template
    win.chat_check.setChecked(True)  # the user wants the template again
    win.load_model(str(folder))
    _idle(win)
    assert not win.chat_check.isEnabled() and not win.chat_check.isChecked()
    win.load_model(None)  # back to the embedded model: the box follows the last choice, ticked
    _idle(win)
    assert win.chat_check.isEnabled() and win.chat_check.isChecked()
