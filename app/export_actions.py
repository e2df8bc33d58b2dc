"""The Export menu of the main window: "Export view" (a tab rendered by
:func:`attnscope.app.paint.render_widget`, with a sidecar of the session's provenance), "Export data"
(the map on screen) and "Batch export" (:class:`attnscope.app.export_dialogs.BatchExportDialog`). File →
Save/Open session is :mod:`attnscope.app.session_files`.
"""

from __future__ import annotations

from pathlib import Path

from attnscope.app.export_dialogs import BatchExportDialog, ExportViewDialog
from attnscope.app.file_choice import last_dir, remember_dir, suffix_from_filter
from attnscope.app.paint import SCREEN_DPI, export_target, render_widget
from attnscope.core.io import formats
from PySide6.QtWidgets import (
    QFileDialog,
)

DATA_FILTERS = formats.file_filter("data")


class ExportController:
    """The Export menu of a :class:`attnscope.app.main_window.MainWindow`.

    GUI thread: dialogs, rendering widgets. Engine thread (jobs): weights, hashes, files.
    """

    def __init__(self, window):
        self.win = window
        self.last_written: list[Path] = []
        self.batch_dialog: BatchExportDialog | None = None

    # -- view state --------------------------------------------------------------------------------------
    def current_view_key(self) -> str:
        return self.win.state.tab

    def view_state(self) -> dict:
        """What is on screen, from the :class:`attnscope.app.state.ViewState`: layer, head, tab, colour
        map, heatmap options, query row, timeline step, and each tab's settings under ``"views"``
        (:meth:`attnscope.app.state.ViewState.to_view_dict`)."""
        return self.win.state.to_view_dict()

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
            self.export_data(suffix_from_filter(path, chosen))

    def batch_export_dialog(self) -> None:
        if not self._need_run():
            return
        if self.batch_dialog is None:
            self.batch_dialog = BatchExportDialog(self.win)
        self.batch_dialog.refresh_scopes()
        self.batch_dialog.show()
        self.batch_dialog.raise_()
