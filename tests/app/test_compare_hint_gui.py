"""The Compare tab's summary line says what is left to do (app/views/compare.py CompareView.hint): before
any prompt, run a prompt; once run A has run, only what run B still needs (not "Run a prompt" again);
once B has run, what the view shows (pytest-qt, offscreen, a tiny random llama)."""

from __future__ import annotations

import pytest
from attnscope.app.views.compare import HINT_NO_RUN_A
from gui_helpers import run_in

PROMPT = "The cat sat on the mat. The dog"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tiny_models import save_tiny

    out = tmp_path_factory.mktemp("llama_compare_hint")
    save_tiny("llama", out)
    return out


def _kind(view, kind):
    view.kind_combo.setCurrentIndex([view.kind_combo.itemData(i) for i in range(4)].index(kind))


def test_hint_says_only_what_is_left_to_do(make_window, folder):
    w = make_window(model=folder, size=(1000, 650))
    w.show_view("compare")
    view = w.views["compare"]
    assert view.summary.text() == HINT_NO_RUN_A  # nothing has run: run A first

    run_in(w, PROMPT)
    T = w.snapshot.seq_len
    a = f"Run A: {T} tokens on {w.snapshot.info.name} · float32 · torch."
    text = view.summary.text()
    assert "Run a prompt" not in text and text.startswith(a), text
    # the default kind (another model) with no model chosen: choose it
    assert view.kind_combo.currentData() == "model" and not view.model_edit.text()
    assert (
        text
        == f"{a} Choose run B's model (a folder or .gguf sharing A's tokenizer), then press Run B & compare."
    )
    view.model_edit.setText(str(folder))
    assert view.summary.text() == f"{a} Run B: {folder} · float32 · torch: press Run B & compare."

    _kind(view, "dtype")
    view.dtype_combo.setCurrentText("float32")  # A's own precision: B would be A
    assert (
        view.summary.text()
        == f"{a} Choose run B's precision (A runs at float32), then press Run B & compare."
    )
    view.dtype_combo.setCurrentText("bfloat16")
    assert view.summary.text() == f"{a} Run B: the same model at bfloat16: press Run B & compare."

    _kind(view, "prompt")  # B's prompt starts as A's
    assert view.summary.text() == f"{a} Edit run B's prompt (it is A's now), then press Run B & compare."
    view.prompt_edit.setText("The cat sat on the mat. The cow")
    assert view.summary.text() == f"{a} Run B: the same model on the edited prompt: press Run B & compare."

    # B has run: the line says what the table, plot and maps show, not what to do
    assert view.run_b() is not None
    assert w.engine.wait_idle(180) and w.engine.wait_idle(60)
    assert view.result is not None, view.summary.text()
    text = view.summary.text()
    assert text.startswith(f"A: {view.result.run_a.label()} · B: {view.result.run_b.label()} · token-aligned")
    assert "most changed: L" in text and "top-1 agreement" in text
    assert "Run a prompt" not in text and "press Run B" not in text
    # a control changed after the comparison leaves the comparison's summary as it is
    view.weighting_combo.setCurrentIndex(1)
    view.prompt_edit.setText("The cat sat on the mat. The cat")
    assert view.summary.text() == text
