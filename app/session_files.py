"""File → Save session and Open session of the main window: a session file
(:mod:`attnscope.core.io.sessionfile`) saves the model reference, prompt, sampling, tokens and the view;
opening one loads its model if needed, prefills, replays its tokens on the engine thread and restores
the view (a cancelled or failed replay into the running model runs the previous run again).
"""

from __future__ import annotations

from pathlib import Path

from attnscope.app.file_choice import last_dir, remember_dir, suffix_from_filter
from PySide6.QtWidgets import (
    QFileDialog,
)

SESSION_FILTER = "AttnScope session (*.attnscope)"


class SessionFiles:
    """File → Save/Open session of a :class:`attnscope.app.main_window.MainWindow`.

    GUI thread: dialogs, the restored controls. Engine thread (jobs): saving, loading and replaying.
    """

    def __init__(self, window):
        self.win = window
        self.last_written: list[Path] = []
        self.last_warnings: list[str] = []

    # -- view state --------------------------------------------------------------------------------------
    def view_state(self) -> dict:
        """What a saved session records as its view: layer, head, tab, colour map, heatmap options,
        query row, timeline step, and each tab's settings under ``"views"``
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
            why = getattr(win, "why_panel", None)
            if why is not None:  # the old run's cell goes; the session's own (if it has one) comes back
                why.forget_cell()  # with its view (restore_view)
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

        path, _ = QFileDialog.getSaveFileName(
            self.win, "Save session", str(last_dir() / "session.attnscope"), SESSION_FILTER
        )
        if path:
            remember_dir(path)
            self.save_session(suffix_from_filter(path, SESSION_FILTER))

    def open_session_dialog(self) -> None:

        path, _ = QFileDialog.getOpenFileName(self.win, "Open session", str(last_dir()), SESSION_FILTER)
        if path:
            remember_dir(path)
            self.open_session(path)
