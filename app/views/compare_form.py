"""The Compare tab's run-B form (:mod:`attnscope.app.views.compare`): what run B is (another model sharing
the tokenizer, another precision, the other backend, an edited prompt), B's prompt, what is compared
(weights or value-weighted maps), and the Run and Export buttons; the boxes that do not apply to the
chosen kind are disabled and follow run A (docs/tabs/compare.md).
"""

from __future__ import annotations

from typing import Any

from attnscope.app.views.compare_jobs import RunBSpec
from attnscope.core import backend_registry as registry
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
)

KINDS = {
    "model": "Another model (same tokenizer)",
    "dtype": "Same model, another precision",
    "backend": "Same model, other backend",
    "prompt": "Same model, edited prompt",
}
DTYPES = ("float32", "bfloat16", "float16")


class RunBFormMixin:
    """The run-B rows of :class:`attnscope.app.views.compare.CompareView` and what they say run B is."""

    state: Any  # attnscope.app.state.ViewState (set by CompareView)
    engine: Any  # attnscope.app.engine.Engine

    def _build_form(self) -> tuple[QHBoxLayout, QHBoxLayout]:
        """The two rows: run B's kind, model, precision and backend; B's prompt, what is compared, Run
        and Export."""
        top = QHBoxLayout()
        top.addWidget(QLabel("Run B"))
        self.kind_combo = QComboBox()
        for k, text in KINDS.items():
            self.kind_combo.addItem(text, k)
        top.addWidget(self.kind_combo)
        self.model_edit = QLineEdit()
        self.model_edit.setPlaceholderText("model folder or .gguf sharing A's tokenizer")
        top.addWidget(self.model_edit, 2)
        self.browse_button = QPushButton("Browse…")
        self.browse_button.setToolTip("Pick run B's model from the local models")
        top.addWidget(self.browse_button)
        self.dtype_combo = QComboBox()
        self.dtype_combo.addItems(DTYPES)
        self.dtype_combo.setToolTip("Run B's precision")
        top.addWidget(self.dtype_combo)
        self.backend_combo = QComboBox()
        self.backend_combo.addItems(registry.names())
        self.backend_combo.setToolTip("Run B's backend")
        top.addWidget(self.backend_combo)
        # what is compared and the Run button end the prompt row: one row of all of it is wider than
        # the tab in a 1000 px window (the page scrolled sideways, cutting the alignment line)
        prow = QHBoxLayout()
        prow.addWidget(QLabel("B's prompt"))
        self.prompt_edit = QLineEdit()
        self.prompt_edit.setPlaceholderText("run B's prompt (defaults to A's)")
        prow.addWidget(self.prompt_edit, 1)
        prow.addWidget(QLabel("Compare"))
        self.weighting_combo = QComboBox()
        self.weighting_combo.addItem("attention weights", "attention")
        self.weighting_combo.addItem("value-weighted", "value-weighted")
        self.weighting_combo.setToolTip(
            "Weights α, or the row-normalised value-weighted maps α_ij‖v_j W_O^h‖ (Kobayashi et al. 2020)"
        )
        prow.addWidget(self.weighting_combo)
        self.run_button = QPushButton("Run B && compare")
        self.run_button.setToolTip(
            "Load and run B on the engine thread, then compare every head (Esc cancels)"
        )
        prow.addWidget(self.run_button)
        self.export_table_button = QPushButton("Export table…")
        self.export_table_button.setToolTip(
            "The ranked heads table and the logits as CSV or JSON, naming both runs"
        )
        self.export_maps_button = QPushButton("Export maps…")
        self.export_maps_button.setToolTip(
            "A, B and A − B of the selected head as PNG/SVG/PDF + a JSON sidecar"
        )
        prow.addWidget(self.export_table_button)
        prow.addWidget(self.export_maps_button)
        return top, prow

    # -- run B --------------------------------------------------------------------------------------
    def _on_kind(self, *_):
        kind = self.kind_combo.currentData()
        snap = self.state.snapshot
        self.model_edit.setEnabled(kind == "model")
        self.browse_button.setEnabled(kind == "model")
        self.dtype_combo.setEnabled(kind in ("model", "dtype"))
        self.backend_combo.setEnabled(kind in ("model", "backend"))
        self.prompt_edit.setEnabled(kind == "prompt")
        if snap is not None:
            a_backend = snap.backend
            if kind != "backend" and kind != "model":
                self.backend_combo.setCurrentText(a_backend)
            elif kind == "backend":
                self.backend_combo.setCurrentText(
                    next((n for n in registry.names() if n != a_backend), a_backend)
                )
            if kind in ("backend", "prompt"):
                self.dtype_combo.setCurrentText(snap.info.dtype if snap.info.dtype in DTYPES else "float32")
            if kind != "prompt":
                self.prompt_edit.setText(snap.prompt or "")

    def _browse(self) -> None:
        from attnscope.app import remote_picker
        from attnscope.app.model_picker import ModelPickerDialog

        session = self.engine.session
        remote = remote_picker.is_remote(session)  # B loads on the engine: list the engine's models
        dlg = ModelPickerDialog(self, **(remote_picker.picker_options(session) if remote else {}))
        if remote:
            remote_picker.adapt(dlg, session)
        dlg.modelChosen.connect(self.model_edit.setText)
        dlg.exec()

    def spec(self) -> RunBSpec:
        """Run B as the controls say (defaults from A)."""
        snap = self.state.snapshot
        kind = self.kind_combo.currentData()
        prompt = self.prompt_edit.text() if kind == "prompt" else (snap.prompt if snap is not None else "")
        return RunBSpec(
            kind=kind,
            model=self.model_edit.text().strip() or None,
            backend=self.backend_combo.currentText(),
            dtype=self.dtype_combo.currentText(),
            prompt=prompt or "",
            weighting=self.weighting_combo.currentData(),
        )
