"""File → Save/Open session and the Export menu of the main window, with their two dialogs.

* :class:`ExportController`: sessions (save, open and replay), "Export view" (a tab rendered by
  :func:`attnscope.app.paint.render_widget`) and "Export data".
* :class:`BatchExportDialog`: scope, format, folder, progress and cancel for batch exports (an engine
  job, :func:`attnscope.core.io.batch_export.export_batch` / :func:`attnscope.core.io.animation.export_animation`
  with the figure renderers of :mod:`attnscope.app.figure`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from attnscope.app.figure import FIGURE_DPI, figure_frame, save_heatmap_figure
from attnscope.app.paint import SCREEN_DPI, export_target, render_widget
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

# -- the window's export and session commands ---------------------------------------------------------------
SESSION_FILTER = "AttnScope session (*.attnscope)"
IMAGE_FILTERS = formats.file_filter("image")  # "PNG image (*.png);;SVG vector image (*.svg);;..."
DATA_FILTERS = formats.file_filter("data")
ANIMATION_SUFFIXES = tuple(f".{s}" for s in formats.ANIMATION_FORMATS)

#: the folder of the last file saved, exported or opened in this run of the app (each file dialog
#: starts there; the home folder until then)
_last_dir: list[Path] = []


def last_dir() -> Path:
    """Where the next file dialog starts: the folder of the last file chosen, else the home folder."""
    return _last_dir[-1] if _last_dir and _last_dir[-1].is_dir() else Path.home()


def remember_dir(path) -> None:
    """Remember ``path``'s folder for the next file dialog (a folder is remembered as itself)."""
    p = Path(path).expanduser()
    folder = p if p.is_dir() else p.parent
    if folder.is_dir():
        _last_dir[:] = [folder]


def _suffix_from_filter(path: str, chosen_filter: str) -> str:
    """Add the chosen filter's suffix when the typed name has none."""
    if Path(path).suffix or "*." not in chosen_filter:
        return path
    return path + chosen_filter.split("*", 1)[1].split(")")[0]


class ExportController:
    """File → Save/Open session and the Export menu of a :class:`attnscope.app.main_window.MainWindow`.

    GUI thread: dialogs, rendering widgets. Engine thread (jobs): weights, hashes, files.
    """

    def __init__(self, window):
        self.win = window
        self.last_written: list[Path] = []
        self.last_warnings: list[str] = []
        self.batch_dialog: BatchExportDialog | None = None

    # -- view state --------------------------------------------------------------------------------------
    def current_view_key(self) -> str:
        return self.win.state.tab

    def view_state(self) -> dict:
        """What is on screen, from the :class:`attnscope.app.state.ViewState`: layer, head, tab, colour
        map, heatmap options, query row, timeline step, and each tab's settings under ``"views"``
        (:meth:`attnscope.app.state.ViewState.to_view_dict`)."""
        return self.win.state.to_view_dict()

    def restore_view(self, view: dict, as_choice: bool = True) -> None:
        """Apply a session's ``view`` dict (any version) to the state, in one batch; unknown, mistyped
        or out-of-range entries are skipped (:meth:`attnscope.app.state.ViewState.parse_view_dict`).
        ``as_choice``: its values count as the user's (a reopened session: no length default replaces
        its scale); False for the window's own view put back (a backend switch keeps whether the
        scale was chosen or follows the length)."""
        st = self.win.state
        chosen = self.win.heatmap.scale_chosen
        values = st.parse_view_dict(view, st.colour)
        snap = st.snapshot
        info = None if snap is None else snap.info
        layer, head = values.pop("layer", st.layer), values.pop("head", st.head)
        if info is not None and 0 <= layer < info.n_layers and 0 <= head < info.n_heads:
            values.update(layer=layer, head=head)
        if not (snap is not None and 0 <= values.get("step", 0) <= snap.n_generated):
            values.pop("step", None)
        if values.get("tab") not in self.win.views:
            values.pop("tab", None)
        if not (snap is not None and 0 <= values.get("query_row", -1) < snap.seq_len):
            values.pop("query_row", None)
        settings = {**st.settings}
        for key, entry in values.pop("settings").items():
            settings[key] = {**settings.get(key, {}), **entry}
        st.update(settings=settings, **values)
        colour = values.get("colour")
        if not as_choice:
            self.win.heatmap.scale_chosen = chosen
        elif colour is not None and isinstance(view, dict) and view.get("scale") == colour.scale:
            # the session's scale is the user's choice, also when the window already showed it: the
            # reopened map's length default (log from 2,048 tokens) must not replace it
            self.win.heatmap.set_scale(colour.scale, colour.gamma)

    def _visible_n(self) -> int | None:
        st = self.win.state
        return None if st.at_latest else st.visible_len

    def _need_run(self) -> bool:
        if self.win.snapshot is None or self.win.snapshot.seq_len == 0:
            self.win.show_error("Nothing to export yet: run a prompt first.")
            return False
        return True

    def _done(self, paths) -> None:
        self.last_written = [Path(p) for p in paths]
        if self.last_written:
            self.win.statusBar().showMessage(f"Saved {self.last_written[0]}", 6000)

    # -- sessions ------------------------------------------------------------------------------------------
    def save_session(self, path) -> int | None:
        """Save model reference, prompt, sampling, tokens and view to ``path`` (engine job; returns its id)."""
        if not self._need_run():
            return None
        view = self.view_state()

        def job(ctx):
            from attnscope.core.io import sessionfile

            s = ctx.require()
            return [sessionfile.save(sessionfile.SessionFile.from_session(s, view=view), path)]

        return self.win.engine.enqueue(job, self._done, self.win.show_error, label="save session")

    def open_session(self, path) -> int | None:
        """Open a saved session: load its model if needed, prefill, replay its tokens, restore the view."""
        from attnscope.core.io import sessionfile

        try:
            sf = sessionfile.load(path)
        except (OSError, ValueError, sessionfile.SessionFileError) as e:
            self.win.show_error(f"Could not open the session: {e}")
            return None

        # the run the reopen replaces, when it replays into the running model: a cancelled or failed
        # replay has overwritten it part-way, so it is run again (README: a cancelled load keeps the
        # previous model and run)
        previous: dict = {}

        def job(ctx):
            from attnscope.core.errors import Cancelled

            old = ctx.session
            reused = old is not None and sessionfile.same_model(old, sf)
            if reused:  # refused before the running sequence is touched (replay checks a new model)
                sessionfile.check_view(sf.view, old.info)
            if reused and old.seq_len:
                previous.update(
                    prompt=old.prompt,
                    chat_template=old.chat_template,
                    generated=list(old.ids[old.n_prompt :]),
                    sampling=old.sampling,
                )

            def progress(message, fraction):
                if ctx.cancelled():
                    raise Cancelled("opening the session cancelled")
                ctx.progress(message, fraction)

            try:
                s, warnings = sessionfile.replay(
                    sf,
                    session=old,
                    device=self.win.device,
                    progress=progress,
                    cancelled=ctx.cancelled,
                    dtype_reason=sessionfile.SAVED_DTYPE_REASON,  # the file's dtype, not an asked one
                )
            except Exception:
                if reused and old.seq_len:  # replayed part-way into the running session: never half a replay
                    old.clear()
                raise
            ctx.session = s
            return s.snapshot(), warnings, s is not old

        def done(result):
            snap, warnings, reloaded = result
            win = self.win
            if reloaded:
                win.commands.loaded(snap)
            win.prompt_edit.setPlainText(sf.prompt)
            win.chat_check.setChecked(sf.chat_template)
            win.decode_panel.set_sampling(sf.sampling)  # what the replayed session samples with
            win.commands.ran(snap)
            self.restore_view(sf.view)
            self.last_warnings = list(warnings)
            msg = f"Opened {Path(path).name}: {snap.n_prompt} prompt + {snap.n_generated} replayed tokens"
            win.statusBar().showMessage(msg + (" · " + " · ".join(warnings) if warnings else ""), 15000)
            if warnings:
                win.show_error("; ".join(warnings))

        def failed(message):
            from attnscope.app.engine import CancelledMessage

            # the engine keeps the previous run (another model was to be loaded), or the replay into
            # the running model stopped part-way: the previous run is run again
            if isinstance(message, CancelledMessage):
                message = CancelledMessage(f"Opening {Path(path).name} cancelled ({message})")
            else:
                message = f"Could not open the session: {message}"
            if previous:
                self._restore_run(dict(previous), message)
            else:
                self.win.commands.command_failed(message)

        return self.win.engine.enqueue(job, done, failed, label="open session")

    def _restore_run(self, run: dict, why: str) -> None:
        """Run ``run`` (prompt, chat template, generated ids, sampling: the run a reopen overwrote)
        again on the engine, as it was, the timeline at the step it showed; ``why`` (the reopen's
        failure) is said first. Esc cancels this too (then: the empty state)."""
        from attnscope.app.engine import CancelledMessage

        win = self.win
        step = win.timeline.step
        win.status.show_error(why)
        win.statusBar().showMessage(f"{why} · restoring the previous run…")

        def job(ctx):
            s = ctx.require()
            s.set_sampling(run["sampling"])
            s.prefill(
                run["prompt"],
                chat_template=run["chat_template"],
                progress=lambda d, t: ctx.progress(
                    f"Restoring the previous run: prefill {d}/{t} tokens", d / max(1, t)
                ),
                cancelled=ctx.cancelled,
            )
            if run["generated"]:
                s.feed(run["generated"], cancelled=ctx.cancelled)
            return s.snapshot()

        def done(snap):
            win.commands.ran(snap)
            win.timeline.set_step(min(step, snap.n_generated))
            win.statusBar().showMessage(f"{why} · the previous run is restored", 15000)

        def failed(message):
            if isinstance(message, CancelledMessage):
                message = CancelledMessage(f"{why}; restoring the previous run cancelled too")
            win.commands.command_failed(message)

        win.engine.enqueue(job, done, failed, label="restore run")

    def save_session_dialog(self) -> None:
        if not self._need_run():
            return
        from PySide6.QtWidgets import QFileDialog

        path, _ = QFileDialog.getSaveFileName(
            self.win, "Save session", str(last_dir() / "session.attnscope"), SESSION_FILTER
        )
        if path:
            remember_dir(path)
            self.save_session(_suffix_from_filter(path, SESSION_FILTER))

    def open_session_dialog(self) -> None:
        from PySide6.QtWidgets import QFileDialog

        path, _ = QFileDialog.getOpenFileName(self.win, "Open session", str(last_dir()), SESSION_FILTER)
        if path:
            remember_dir(path)
            self.open_session(path)

    # -- exports -------------------------------------------------------------------------------------------
    def export_view(self, path, size: tuple[int, int] | None = None, dpi: float = SCREEN_DPI) -> list[Path]:
        """Render the current tab as shown to PNG/SVG/PDF; a sidecar ``<file>.json`` with the session's
        provenance follows from the engine thread. Returns ``[image]`` (the sidecar is added to
        :attr:`last_written` when written)."""
        key = self.current_view_key()
        widget = self.win.views[key]
        view = self.view_state()
        title = f"AttnScope · {self.win.tabs.tabText(self.win.tabs.currentIndex())}"
        out = render_widget(widget, path, size=size, dpi=dpi, title=title)
        self._done([out])
        if self.win.snapshot is not None and self.win.snapshot.seq_len:
            n = self._visible_n()

            def job(ctx):
                from attnscope.core.io import provenance

                s = ctx.require()
                meta = provenance.session_metadata(s)
                if n is not None and n < s.seq_len:
                    meta = provenance.head_metadata(s, view["layer"], view["head"], n=n, base=meta)
                meta.update(
                    {
                        "kind": "view",
                        "view": key,
                        "view_state": view,
                        "image": out.name,
                        "dpi": dpi if out.suffix.lower() == ".png" else None,
                    }
                )
                provenance.embed_metadata(out, meta)  # PNG text chunk / SVG <desc>, as the CLI's images
                return [out, provenance.write_json(provenance.sidecar_path(out), meta)]

            self.win.engine.enqueue(job, self._done, self.win.show_error, label="export view")
        return [out]

    def export_data(self, path) -> int | None:
        """The current map (head or aggregate, at the timeline's step) as .npy/.csv/.safetensors + sidecar."""
        if not self._need_run():
            return None
        st = self.win.state
        layer, head, n = st.layer, st.head, self._visible_n()
        shown = st.settings.get("heatmap", {})  # the heatmap's options (app.maps.MapPanel keeps them)
        mode = shown.get("aggregate") or "head"
        from attnscope.core.analysis.aggregate import LONG_PROMPT

        # the scale shown is the one written (and recorded): long overviews are shown as attention
        shown_n = n or st.snapshot.seq_len
        weighting = shown.get("weighting", "attention") if shown_n <= LONG_PROMPT else "attention"

        def job(ctx):
            from attnscope.core.io import head_export

            return head_export.export_head(
                ctx.require(), layer, head, path, n=n, mode=mode, weighting=weighting
            )

        return self.win.engine.enqueue(job, self._done, self.win.show_error, label="export data")

    def export_view_dialog(self) -> None:
        key = self.current_view_key()
        dlg = ExportViewDialog(self.win, key, export_target(self.win.views[key]).size())
        if dlg.exec():
            remember_dir(dlg.path())
            try:
                self.export_view(dlg.path(), size=dlg.chosen_size(), dpi=dlg.chosen_dpi())
            except (OSError, ValueError) as e:
                self.win.show_error(f"Could not export: {e}")

    def export_data_dialog(self) -> None:
        if not self._need_run():
            return
        from attnscope.core.io.long_png import FULL_SIZE_LIMIT
        from PySide6.QtWidgets import QFileDialog

        n = self._visible_n() or self.win.snapshot.seq_len
        if n > FULL_SIZE_LIMIT:  # a full-size long map: say what it costs and ask first
            from attnscope.core.units import format_bytes
            from PySide6.QtWidgets import QMessageBox

            answer = QMessageBox.question(
                self.win,
                "Export a long map",
                f"This map is {n:,} × {n:,} cells: the file holds {format_bytes(n * n * 4)} of float32 weights "
                "(held once in memory while written; CSV is about three times larger). Export it anyway?",
            )
            if answer != QMessageBox.StandardButton.Yes:
                return
        name = f"attn_L{self.win.layer}_H{self.win.head}.npy"
        path, chosen = QFileDialog.getSaveFileName(
            self.win, "Export data", str(last_dir() / name), DATA_FILTERS
        )
        if path:
            remember_dir(path)
            self.export_data(_suffix_from_filter(path, chosen))

    def batch_export_dialog(self) -> None:
        if not self._need_run():
            return
        if self.batch_dialog is None:
            self.batch_dialog = BatchExportDialog(self.win)
        self.batch_dialog.refresh_scopes()
        self.batch_dialog.show()
        self.batch_dialog.raise_()


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
            self.path_edit.setText(_suffix_from_filter(p, chosen))

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
