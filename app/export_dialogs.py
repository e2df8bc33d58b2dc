"""The Export menu's two dialogs: :class:`ExportViewDialog` (file, layout size and DPI for "Export
view") and :class:`BatchExportDialog` (scope, format, folder, progress and cancel for batch exports: an
engine job, :func:`attnscope.core.io.batch_export.export_batch` / :func:`attnscope.core.io.animation.export_animation`
with the figure renderers of :mod:`attnscope.app.figure`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from attnscope.app.figure import FIGURE_DPI, figure_frame, save_heatmap_figure
from attnscope.app.file_choice import last_dir, suffix_from_filter
from attnscope.core.io import formats
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
)

IMAGE_FILTERS = formats.file_filter("image")  # "PNG image (*.png);;SVG vector image (*.svg);;..."
ANIMATION_SUFFIXES = tuple(f".{s}" for s in formats.ANIMATION_FORMATS)


class ExportViewDialog(QDialog):
    """File, layout size and DPI for "Export view as PNG/SVG/PDF"."""

    def __init__(self, parent, view_key: str, current: QSize):
        super().__init__(parent)
        self.setWindowTitle("Export view")
        form = QFormLayout(self)
        self.path_edit = QLineEdit(str(last_dir() / f"attnscope_{view_key}.png"))
        self.path_edit.setMinimumWidth(self.path_edit.fontMetrics().horizontalAdvance("x" * 48))
        browse = QPushButton("Browse…")
        row = QHBoxLayout()
        row.addWidget(self.path_edit, 1)
        row.addWidget(browse)
        form.addRow(f"File ({formats.listing('image')})", row)
        self.w_spin, self.h_spin = QSpinBox(), QSpinBox()
        for spin, v in ((self.w_spin, current.width()), (self.h_spin, current.height())):
            spin.setRange(100, 10000)
            spin.setValue(max(100, v))
            spin.setSuffix(" px")
        size_row = QHBoxLayout()
        size_row.addWidget(self.w_spin)
        size_row.addWidget(QLabel("×"))
        size_row.addWidget(self.h_spin)
        form.addRow("Layout size", size_row)
        self.dpi_spin = QDoubleSpinBox()
        self.dpi_spin.setRange(48, 1200)
        self.dpi_spin.setValue(192)
        self.dpi_spin.setToolTip(
            "PNG: pixels = layout size × DPI / 96. SVG and PDF are vectors (size / 96 inches)."
        )
        form.addRow("DPI (PNG)", self.dpi_spin)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        form.addRow(buttons)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        browse.clicked.connect(self._pick)

    def _pick(self) -> None:
        p, chosen = QFileDialog.getSaveFileName(self, "Export view", self.path_edit.text(), IMAGE_FILTERS)
        if p:
            self.path_edit.setText(suffix_from_filter(p, chosen))

    def path(self) -> str:
        return self.path_edit.text()

    def chosen_size(self) -> tuple[int, int]:
        return self.w_spin.value(), self.h_spin.value()

    def chosen_dpi(self) -> float:
        return self.dpi_spin.value()


class BatchExportDialog(QDialog):
    """Batch export: every head of the current layer, every layer × head, or every decode step of the
    current head as an animation. Runs as one engine job with progress and Cancel.

    Attributes after a run: ``written`` (paths), ``elapsed`` (seconds), ``message`` (the status line).
    """

    #: (combo text, format, labelled figure), from the one table of formats (attnscope.core.io.formats)
    HEAD_FORMATS = (
        ("PNG map (one colour per cell)", "png", False),
        ("PNG figure (labels, colour bar)", "png", True),
        *((f"{f.suffix.upper()} figure", f.suffix, True) for f in formats.FORMATS if f.figure_only),
        *((f"{f.title} + JSON", f.suffix, False) for f in formats.FORMATS if f.kind == "data"),
    )

    def __init__(self, window):
        super().__init__(window)
        self.win = window
        self.setWindowTitle("Batch export")
        self.setMinimumWidth(520)
        form = QFormLayout(self)
        self.scope_combo = QComboBox()
        form.addRow("Export", self.scope_combo)
        self.format_combo = QComboBox()
        form.addRow("Format", self.format_combo)
        self.path_edit = QLineEdit(str(Path.home() / "attnscope_export"))
        self.path_edit.setMinimumWidth(self.path_edit.fontMetrics().horizontalAdvance("x" * 48))
        browse = QPushButton("Browse…")
        row = QHBoxLayout()
        row.addWidget(self.path_edit, 1)
        row.addWidget(browse)
        self.path_label = QLabel("Folder")
        form.addRow(self.path_label, row)
        self.dpi_spin = QDoubleSpinBox()
        self.dpi_spin.setRange(48, 1200)
        self.dpi_spin.setValue(FIGURE_DPI)
        self.dpi_spin.setToolTip("Figures: font size and physical size; PNG maps: recorded in the file")
        form.addRow("DPI", self.dpi_spin)
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setValue(0)
        form.addRow(self.progress_bar)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        form.addRow(self.status)
        buttons = QHBoxLayout()
        self.start_button = QPushButton("Export")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.close_button = QPushButton("Close")
        buttons.addStretch(1)
        for b in (self.start_button, self.cancel_button, self.close_button):
            buttons.addWidget(b)
        form.addRow(buttons)
        self.written: list[Path] = []
        self.elapsed = 0.0
        self.message = ""
        self.running = False
        self._t0 = 0.0
        self.scope_combo.currentIndexChanged.connect(self._on_scope)
        self.format_combo.currentIndexChanged.connect(self._on_format)
        browse.clicked.connect(self._pick)
        self.start_button.clicked.connect(self.start)
        self.cancel_button.clicked.connect(self.cancel)
        self.close_button.clicked.connect(self.close)
        window.engine.progress.connect(self._on_progress)
        self.refresh_scopes()

    def refresh_scopes(self) -> None:
        """Scope texts name the current layer/head and the file counts of the loaded model."""
        snap = self.win.snapshot
        L, H = (snap.info.n_layers, snap.info.n_heads) if snap is not None else (0, 0)
        # a hybrid model: only its attention layers have maps to export (docs/how-it-works.md "Hybrid models")
        n_att = len(snap.info.arch.attention_layers) if snap is not None else 0
        steps = snap.n_generated if snap is not None else 0
        i = max(0, self.scope_combo.currentIndex())
        self.scope_combo.blockSignals(True)
        self.scope_combo.clear()
        self.scope_combo.addItem(f"Every head of layer {self.win.layer} ({H} files)", "layer")
        if n_att != L:
            every = f"Every attention layer × head ({n_att} of {L} layers × {H} = {n_att * H} files)"
        else:
            every = f"Every layer × head ({L} × {H} = {L * H} files)"
        self.scope_combo.addItem(every, "all")
        self.scope_combo.addItem(
            f"Every decode step of layer {self.win.layer} · head {self.win.head} ({steps + 1} frames)",
            "steps",
        )
        self.scope_combo.setCurrentIndex(i)
        self.scope_combo.blockSignals(False)
        self._on_scope()

    @property
    def scope(self) -> str:
        return self.scope_combo.currentData()

    def _on_scope(self, *_):
        self.format_combo.clear()
        if self.scope == "steps":
            from attnscope.core.io.animation import mp4_unavailable

            for f in formats.FORMATS:
                if f.kind == "animation":
                    self.format_combo.addItem(f.title, (f.suffix, False))
            self.mp4_unavailable = mp4_unavailable()
            if self.mp4_unavailable:  # listed, greyed out, saying why (never silently missing)
                i = formats.ANIMATION_FORMATS.index("mp4")
                model = self.format_combo.model()  # a combo box's own model: a QStandardItemModel
                item = model.item(i) if isinstance(model, QStandardItemModel) else None
                if item is not None:
                    item.setEnabled(False)
                    item.setText("MP4 video (unavailable: see tooltip)")
                self.format_combo.setItemData(i, self.mp4_unavailable, Qt.ItemDataRole.ToolTipRole)
            self.path_label.setText("File")
            p = Path(self.path_edit.text())
            if p.suffix.lower() not in ANIMATION_SUFFIXES:
                name = f"_L{self.win.layer}_H{self.win.head}{ANIMATION_SUFFIXES[0]}"
                self.path_edit.setText(str(p.with_suffix("")) + name)
            self._on_format()
        else:
            for text, fmt, figure in self.HEAD_FORMATS:
                self.format_combo.addItem(text, (fmt, figure))
            self.path_label.setText("Folder")
            p = Path(self.path_edit.text())
            if p.suffix:
                self.path_edit.setText(str(p.with_suffix("")))

    def _on_format(self, *_) -> None:
        """An animation's file name follows the chosen format (``.gif`` ↔ ``.mp4``)."""
        data = self.format_combo.currentData()
        if self.scope != "steps" or not data:
            return
        p = Path(self.path_edit.text())
        if p.suffix.lower() in ANIMATION_SUFFIXES and p.suffix.lower() != "." + data[0]:
            self.path_edit.setText(str(p.with_suffix("." + data[0])))

    def _pick(self) -> None:
        if self.scope == "steps":
            p, _ = QFileDialog.getSaveFileName(
                self, "Animation file", self.path_edit.text(), "GIF (*.gif);;MP4 (*.mp4)"
            )
        else:
            p = QFileDialog.getExistingDirectory(
                self, "Export into folder", str(Path(self.path_edit.text()).parent)
            )
        if p:
            self.path_edit.setText(p)

    def start(self) -> int | None:
        """Queue the export job. Returns its id, or None when the request is not possible."""
        if self.running:
            return None
        if self.win.snapshot is None or self.win.snapshot.seq_len == 0:
            self._finish("Nothing to export yet: run a prompt first.")
            return None
        fmt, figure = self.format_combo.currentData()
        scope, out = self.scope, Path(self.path_edit.text()).expanduser()
        if scope == "steps" and out.suffix.lower() != "." + fmt:  # the Format decides what is written
            out = out.with_suffix("." + fmt)
            self.path_edit.setText(str(out))
        layer, head = self.win.state.layer, self.win.state.head
        colour = self.win.state.colour  # as on screen: the heatmap's scale, gamma and range, the colour map
        if scope != "steps" and not self.win.heatmap.scale_chosen:  # a scale the user did not choose:
            colour = dataclasses.replace(colour, scale=None)  # each map's own (colour_scale.scale_for_map)
        dpi = self.dpi_spin.value()

        def job(ctx):
            from attnscope.core.io import animation, batch_export

            s = ctx.require()

            def progress(done, total, name):
                ctx.progress(f"Batch export {done}/{total}: {name}", done / total)

            if scope == "steps":
                ctx.progress("Rendering frames…", -1.0)
                return animation.export_animation(
                    s,
                    layer,
                    head,
                    out,
                    colour=colour,
                    cancelled=ctx.cancelled,
                    frame_renderer=figure_frame,
                )
            pairs = batch_export.heads_in_scope(
                s.info.n_layers, s.info.n_heads, layer if scope == "layer" else None, s.info.arch
            )
            renderer = save_heatmap_figure if figure or fmt in formats.FIGURE_ONLY_FORMATS else None
            return batch_export.export_batch(
                s,
                out,
                fmt,
                pairs,
                colour=colour,
                dpi=dpi,
                figure=figure,
                renderer=renderer,
                progress=progress,
                cancelled=ctx.cancelled,
            )

        self.running = True
        self.written = []
        self.start_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress_bar.setValue(0)
        self.status.setText(f"Exporting to {out}…")
        self._t0 = time.monotonic()
        return self.win.engine.enqueue(job, self._on_done, self._on_error, label="batch export")

    def cancel(self) -> None:
        if self.running:
            self.win.engine.cancel()
            self.status.setText("Cancelling…")

    def _on_progress(self, message: str, fraction: float) -> None:
        if self.running:
            if fraction >= 0:
                self.progress_bar.setValue(int(fraction * 1000))
            self.status.setText(message)

    def _on_done(self, paths) -> None:
        self.written = [Path(p) for p in paths]
        self.progress_bar.setValue(1000)
        n_files = sum(1 for p in self.written if not p.name.endswith(".json"))
        where = self.written[0].parent if self.written else ""
        self._finish(f"Wrote {n_files} file(s) to {where} in {time.monotonic() - self._t0:.1f} s.")

    def _on_error(self, message: str) -> None:
        self._finish(f"Stopped: {message}")

    def _finish(self, message: str) -> None:
        self.running = False
        self.elapsed = time.monotonic() - self._t0 if self._t0 else 0.0
        self.message = message
        self.status.setText(message)
        self.start_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.win.statusBar().showMessage(message, 10000)
