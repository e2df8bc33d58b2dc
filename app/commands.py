"""The window's commands: load a model, Run (prefill), Step, Back, switch backend, open a session.

:class:`Commands` queues each command on the engine (:mod:`attnscope.app.jobs`), in order, and
turns what comes back, a :class:`attnscope.core.session.Snapshot`, into the
:class:`attnscope.app.state.ViewState` (``snapshot``, ``step``, the model fields) and the controls
around the prompt. It is the one place that knows what "loaded", "ran" and "failed" do to the
window; :class:`attnscope.app.session_files.SessionFiles` reaches it through :meth:`loaded`,
:meth:`ran` and :meth:`command_failed`.
"""

from __future__ import annotations

from pathlib import Path

from attnscope.app import jobs
from attnscope.app.engine import CancelledMessage, EngineLostMessage
from attnscope.core import backend_registry as registry


def window_wording(message: str) -> str:
    """A core message in the window's words: command-line advice (``use --backend torch``) becomes
    the menu that does it."""
    for flag, menu in (
        ("use --backend torch", "choose Backend → torch"),
        ("use --backend mlx", "choose Backend → MLX"),
        ("--no-chat-template", "the Chat template box"),
    ):
        message = message.replace(flag, menu)
    return message


def counted_step_job(n: int):
    """:func:`attnscope.app.jobs.step_job` that also says how many tokens it made: ``(snapshot,
    made)``, counted on the engine thread on the sequence it decoded, so a "cancelled after k of n"
    line always agrees with the counters (the window's snapshot of when Step was pressed may be of an
    older sequence)."""
    step = jobs.step_job(n)

    def job(ctx):
        from attnscope.app.engine import lost_engine

        before = ctx.require().n_generated
        try:
            snap = step(ctx)
        except Exception as e:
            # a remote engine stopped part-way (SIGTERM): the tokens it made stay (the client's own
            # copy of the sequence), with why it stopped
            s = ctx.session
            if not lost_engine(e) or not hasattr(s, "local_snapshot"):
                raise
            snap = s.local_snapshot()
            return snap, snap.n_generated - before, str(e).strip().splitlines()[0]
        return snap, snap.n_generated - before

    return job


class Commands:
    """Commands of a :class:`attnscope.app.main_window.MainWindow` ``win`` (its prompt box, chat check,
    decode panel, status line, map panel and timeline)."""

    #: what Step, Step ×N or Back say when pressed while a prefill runs (they are off then)
    PREFILL_REFUSAL = (
        "The prompt is still running (prefill): Step and Back come back when it ends; nothing was queued."
    )

    def __init__(self, win):
        self.win, self.state, self.engine = win, win.state, win.engine
        self.prefills = 0  # prefills queued and not yet ended (Step and Back are off meanwhile)

    # -- loading ----------------------------------------------------------------------------------
    def load_model(self, model: str | None) -> None:
        """Load ``model`` (None = embedded default) on the engine thread; the old one stays on failure.

        ``state.model`` changes only once the model is loaded (:meth:`loaded`), from the path the
        loaded model records (:func:`attnscope.core.loading.resolve.model_source`), so a failed or
        cancelled load leaves every control on the model that runs."""
        s = self.state
        name = "the default model" if model is None or str(model) == "default" else Path(str(model)).name
        self.state.say(f"Loading {name}…")
        # --device-map is torch's (accelerate); "none" is one device
        device_map = (
            s.device_map
            if registry.get(s.backend).takes_device_map and s.device_map not in ("", "none")
            else None
        )
        job = jobs.load_job(
            model, s.backend, s.device, s.dtype, self.win.decode_panel.sampling(), s.quantize, device_map
        )
        self.engine.enqueue(job, self.loaded, self.load_failed, label="loading model")

    def loaded(self, snap) -> None:
        """A model was loaded (or a session reopened on another one): the clear empty state on it."""
        from attnscope.core.loading.resolve import is_default_source

        win, info = self.win, snap.info
        win.status.last_error = None
        self.loaded_dtype_choice = self.state.dtype  # "auto" stays "auto" (never the dtype it resolved to)
        dm = getattr(info, "device_map", "")  # a reopened session's map becomes the next load's
        self.state.update(
            model=None if is_default_source(info.source) else info.source,
            backend=snap.backend,
            device_map=dm if dm in ("auto", "balanced", "sequential") else "none",
        )
        self.apply(snap)  # the new model's snapshot first: what reacts to the new ranges sees it
        win.controls.set_ranges(info)
        win.status.show_model(snap)
        self.show_empty(snap)
        self.state.events.loaded.emit(snap)

    def load_failed(self, message: str, what: str = "Could not load the model") -> None:
        """A failed load (or connection: ``what`` says which): the previous model's choices back in
        the controls, the message in the status bar and a dialog."""
        s = self.state
        if s.snapshot is not None:  # the previous model (its backend, device and dtype choice) stays
            # the dtype the user chose for it ("auto" stays "auto"): its resolved dtype in the box
            # would read as chosen (the picker: "float32: asked for (--dtype float32)")
            dtype = getattr(self, "loaded_dtype_choice", s.dtype)
            s.update(backend=s.snapshot.backend, device=s.snapshot.device, dtype=dtype)
        if isinstance(message, CancelledMessage):
            self.win.status.show_error(message)  # "loading cancelled; the previous model is still loaded"
        else:
            self.win.status.show_error(f"{what}: {window_wording(message)}")
        self.win.set_running(s.snapshot is not None)

    def show_empty(self, snap, why: str = "") -> None:
        """The clear empty state (a new model, or a cancelled prefill): no map, no tokens, no next-token
        table, the timeline at 0 / 0, Step and Back off, the panels covered until Run."""
        self.state.query_row = None
        self.win.maps.clear(why)
        self.state.next_table = None
        self.apply(snap)
        self.win.set_running(True)

    # -- running ----------------------------------------------------------------------------------
    def run_prompt(self) -> None:
        win = self.win
        if self.engine_lost():
            return
        prompt = win.prompt_edit.toPlainText()
        if not prompt.strip():
            win.status.show_error("The prompt is empty: type some text first.")
            return
        self.engine.cancel_views()  # the old prompt's maps are stale: stop computing them now, not after
        self.state.mark_stale("stale: previous prompt (running the new one…)")
        chat = win.chat_check.isChecked() and win.chat_check.isEnabled()
        self._prefill_started()

        def done(snap) -> None:  # the run ended: the map shown is the previous prompt's until the new one
            self._prefill_ended()
            self.state.mark_stale("stale: previous prompt (computing the new map…)", table=False)
            self.state.mark_stale("stale: previous prompt (computing the new table…)", heatmap=False)
            self.ran(snap)

        def failed(message: str) -> None:  # ... and says so when it ended without a new sequence
            self._prefill_ended()
            ended = "was cancelled" if isinstance(message, CancelledMessage) else "failed"
            self.state.mark_stale(f"stale: previous prompt (the new run {ended})")
            self.command_failed(message)

        self.engine.enqueue(jobs.prefill_job(prompt, chat), done, failed, label="prefill")

    def _prefill_started(self) -> None:
        """A prefill was queued: decoding controls off, and every view with nothing to show says that
        the prompt runs (never "Cancelled: no sequence now…" or "Run a prompt" of the state before)."""
        self.prefills += 1
        self.state.prefilling = True

    def _prefill_ended(self) -> None:
        """The last queued prefill ended (done, failed or cancelled): the words of the state it left."""
        self.prefills = max(0, self.prefills - 1)
        if not self.prefills:
            self.state.prefilling = False

    def engine_lost(self) -> bool:
        """True (and a status line saying so) when the remote engine is lost: a command there cannot
        run; nothing is queued, no dialog (the status bar's lasting label says it)."""
        conn = getattr(self.win, "engine_connector", None)
        engine = conn.lost() if conn is not None else None
        if engine is None:
            return False
        self.state.say("Engine lost: File → Reconnect to engine to go on.", 8000)
        return True

    def step(self, n: int = 1) -> None:
        """Decode ``n`` tokens. Refused with a status line (nothing queued) while a prefill runs or the
        remote engine is lost."""
        if self.engine_lost():
            return
        if self.prefills:
            self.state.say(self.PREFILL_REFUSAL, 8000)
            return
        snap = self.state.snapshot
        if snap is None or snap.seq_len == 0:
            self.win.status.show_error("Run a prompt before stepping.")
            return
        if not self.state.at_latest:  # new tokens go after the newest: show them, never off-screen
            back = self.state.step
            self.state.step = snap.n_generated  # the timeline follows (bound), and new steps after it
            self.state.say(
                f"The timeline was at step {back} of {snap.n_generated}: moved to the newest step, "
                f"where the {n} new token{'s' if n != 1 else ''} go.",
                10000,
            )

        self.state.mark_stale(f"stale: decoding {n} token{'s' if n != 1 else ''}…", heatmap=False)

        def done(result) -> None:
            snap, made, *lost = result
            self.ran(snap)
            if lost:  # the engine went away part-way: its tokens stay, the status line says it
                from attnscope.app.engine import EngineLostMessage

                kept = (
                    f"the {made} token{'s' if made != 1 else ''} made stay" if made else "no token was added"
                )
                self.win.status.show_error(
                    EngineLostMessage(f"Step stopped after {made} of {n}: {kept}; {lost[0]}")
                )
                self.win.engine_connector.show_link()
                return
            if made < n and snap.seq_len:  # cancelled part-way: the tokens made so far stay
                self.win.status.show_error(
                    CancelledMessage(
                        f"decode cancelled after {made} of {n} tokens; "
                        + ("the tokens made so far stay" if made else "no token was added")
                    )
                )

        self.engine.enqueue(counted_step_job(n), done, self.command_failed, label="decode")

    def step_back(self, n: int = 1) -> None:
        if self.engine_lost():
            return
        if self.prefills:
            self.state.say(self.PREFILL_REFUSAL, 8000)
            return
        snap = self.state.snapshot
        if snap is None or snap.n_generated < n:
            self.state.say("Nothing to step back: no generated token.", 4000)
            return
        self.engine.enqueue(jobs.back_job(n), self.ran, self.command_failed, label="step back")

    def command_failed(self, message: str) -> None:
        """A prefill, decode or replay failed or was cancelled: say so, then show what the engine holds
        now (a cancelled prefill leaves the session empty: the clear empty state, never the old map
        with controls that no longer match it)."""
        self.win.status.show_error(message)
        if isinstance(message, EngineLostMessage):  # nothing to ask a lost engine: the run shown stays
            return
        self.engine.enqueue(jobs.sync_job, lambda snap: self._synced(snap, message), label="sync")

    def _synced(self, snap, why: str = "") -> None:
        if snap is None:
            return
        if snap.seq_len == 0:
            cancelled = isinstance(why, CancelledMessage)
            self.show_empty(
                snap,
                "Cancelled: no sequence now. Press Run (Ctrl+Enter) to start again."
                if cancelled
                else "No sequence now: press Run (Ctrl+Enter).",
            )
            if why:
                self.state.say(f"{why[:1].upper()}{why[1:]}: no sequence now; press Run (Ctrl+Enter).", 15000)
        else:
            self.ran(snap)

    def ran(self, snap) -> None:
        """A prefill, step or replay finished: show ``snap`` and ask every shown panel for its data."""
        self.state.query_row = None
        self.apply(snap)
        self.win.set_running(True)
        self.after_step()

    def after_step(self) -> None:
        """The sequence or the timeline's step changed: the map, the next-token table, the open tab."""
        self.win.maps.request_weights()
        self.request_next_tokens()
        self.win.refresh_current_view()

    def apply(self, snap) -> None:
        """Put ``snap`` in the state (with the timeline's step) and the status bar."""
        win = self.win
        win.status.show_snapshot(snap)
        win.timeline.set_range(snap.n_prompt, snap.n_generated)
        self.state.update(snapshot=snap, step=win.timeline.step)

    # -- next token and sampling -----------------------------------------------------------------
    def set_sampling(self, sampling) -> None:
        self.engine.enqueue(
            jobs.sampling_job(sampling), lambda _s: self.request_next_tokens(), label="sampling"
        )

    def request_next_tokens(self) -> None:
        from attnscope.app.engine import Request

        step = self.state.step
        self.engine.submit(
            "next",
            Request(
                jobs.next_job(step),
                lambda table: setattr(self.state, "next_table", table),
                "next token",
                key=lambda: self.state.step,
            ),
        )

    # -- backend ----------------------------------------------------------------------------------
    def set_backend(self, name: str) -> None:
        """Switch the compute backend ("torch" or "mlx") and reload the current model on it."""
        import importlib.util

        s = self.state
        if name == s.backend:
            return
        spec = registry.get(name)
        if spec.framework and importlib.util.find_spec(spec.framework) is None:
            self.win.status.show_error(f"{spec.title} is not installed: {spec.install}.")
            s.events.backend.emit(s.backend)  # the menu goes back to the backend that runs
            return
        s.backend = name
        if not s.has_sequence:
            self.load_model(s.model)
            return
        # keep the run: reload the model on the new backend and replay the prompt and every generated
        # token there (the old backend and run stay if that fails or is cancelled)
        snap = s.snapshot
        s.say(
            f"Switching to {name}: reloading the model and replaying "
            f"{snap.n_prompt} prompt + {snap.n_generated} generated tokens…"
        )
        self.engine.enqueue(
            jobs.switch_backend_job(name, s.device, s.dtype, s.to_view_dict()),
            self._backend_switched,
            self.load_failed,
            label="switch backend",
        )

    def _backend_switched(self, result) -> None:
        snap, warnings = result
        win = self.win
        view = self.state.to_view_dict()
        sampling = win.decode_panel.sampling()
        # the box keeps what the user typed: replaced only when it held the prompt that was replayed
        typed = win.prompt_edit.toPlainText()
        edited = win.controls.prompt_edited
        self.loaded(snap)
        if not edited and snap.prompt:
            win.prompt_edit.setPlainText(snap.prompt)
        elif win.prompt_edit.toPlainText() != typed:
            win.prompt_edit.setPlainText(typed)
        win.chat_check.setChecked(snap.chat_template)
        win.decode_panel.set_sampling(sampling)  # the replayed session kept these settings
        self.ran(snap)
        win.sessions.restore_view(view, as_choice=False)  # the window's own view: no new choice made
        msg = f"Now on {snap.backend}: replayed {snap.n_prompt} prompt + {snap.n_generated} generated tokens."
        s = " · ".join(warnings)
        self.state.say(msg + (" · " + s if warnings else ""), 12000)
