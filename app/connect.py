"""File → Connect to engine… / Reconnect to engine: the window driving an ``attnscope serve`` engine.

The engine thread's session becomes a :class:`attnscope.core.remote.client.RemoteSession`; every job
the window submits runs against it unchanged (the ``@remotable`` analysis functions run on the
engine). Connecting and reconnecting are engine-thread jobs like a model load, so the window never
waits on the network. The status bar's model line ends with where the model runs ("… · torch cpu on
gpu-box"). A lost connection is the error's status line (``EngineLost``: "lost the connection to
the engine at HOST:PORT …: reconnect to go on"), then a lasting red "engine at HOST:PORT lost — File
→ Reconnect" in the status bar until a reconnection succeeds (an engine that goes away while
the window is idle is said within seconds: :meth:`EngineConnector.check_link`); File → Reconnect to engine (enabled while the
session is remote) replays the prompt and the generated token ids to the same state. The address
is remembered with QSettings (``engine/address``); the token never goes in that (world-readable)
settings file: it is remembered in a 0600 file of its own (:mod:`attnscope.core.remote.token_store`),
only once a connection with it succeeded. A token an older version left in the settings file moves
there when the window opens.
"""

from __future__ import annotations

import os
import sys

from attnscope.app.status import LINK_CHECK
from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit


def connect_job(address: str, token: str | None, sampling=None):
    """Connect to the engine at ``address`` (loading its default model when it has none) and make
    it the session; returns its snapshot. The previous session stays when this fails."""

    def job(ctx):
        from attnscope.core.remote.client import RemoteSession

        ctx.progress(f"Connecting to the engine at {address}…", -1.0)
        r = RemoteSession.connect(address, token=token)
        try:
            if r.info is None:
                r.load_model(progress=ctx.progress, cancelled=ctx.cancelled)
            if sampling is not None:
                r.set_sampling(sampling)
        except BaseException:
            r.close()
            raise
        old, ctx.session = ctx.session, r
        released = release_session(old)
        del old
        if released:
            from attnscope.core.memory import collect

            collect()  # the local weights are back before the engine's run is shown
        return r.snapshot(), released

    return job


def release_session(old) -> str | None:
    """Let go of the session a connection replaced: a remote one is closed; a local one drops its
    model's weights, KV cache and Trace (:meth:`Backend.release_weights`, :meth:`Session.clear`), so
    this machine's memory is free while the model runs in the engine. Returns the released local
    model's name (None: nothing local was held)."""
    if old is None:
        return None
    if hasattr(old, "close"):
        old.close()
        return None
    name = getattr(getattr(old, "info", None), "name", None) or "the local model"
    old.clear()
    release = getattr(getattr(old, "backend", None), "release_weights", None)
    if release is not None:
        release()
    return name


#: how often an idle window connected to an engine looks at the connection (milliseconds)
LINK_CHECK_MS = 2000


def link_check_job(ctx):
    """None while the remote session's connection holds (or the session is local), else the line
    saying it was lost (:meth:`RemoteSession.check_link`: nothing is sent, nothing waits)."""
    s = ctx.session
    if not hasattr(s, "check_link") or not s.connected:
        return None
    return s.check_link()


def reconnect_job(ctx):
    """Reconnect the current remote session and replay its run; returns ``(snapshot, warnings)``."""
    s = ctx.require()
    if not hasattr(s, "reconnect"):
        from attnscope.core.errors import SessionError

        raise SessionError("the model runs in this process: there is no engine to reconnect to")
    warnings = s.reconnect(progress=ctx.progress, cancelled=ctx.cancelled)
    return s.snapshot(), warnings


def _settings() -> QSettings:
    """The window's settings (a function, so a test can point it at a file of its own)."""
    return QSettings()


def migrate_token(settings: QSettings | None = None) -> None:
    """Move a token an older version kept in the settings file (``engine/token``) to the 0600 token
    file, for the remembered address, and remove it from the settings file."""
    from attnscope.core.remote.token_store import save_token, saved_token

    settings = settings or _settings()
    if not settings.contains("engine/token"):
        return
    token = str(settings.value("engine/token", "") or "").strip()
    address = str(settings.value("engine/address", "127.0.0.1:8765")).strip()
    if token and saved_token(address) is None:
        try:
            save_token(address, token)
        except OSError:
            pass  # the config folder cannot be written: still drop the plaintext copy
    settings.remove("engine/token")
    settings.sync()


class ConnectDialog(QDialog):
    """``host:port`` (from QSettings) and token (the one remembered for that address in the 0600
    token file, else ``$ATTNSCOPE_TOKEN``; it follows an edited address until a token is typed)."""

    def __init__(self, parent=None, current: tuple[str, str | None] | None = None):
        """``current``: ``(address, token)`` of the engine the window is connected to (``--engine``
        or an earlier Connect), shown first; else the remembered address."""
        super().__init__(parent)
        self.setWindowTitle("Connect to engine")
        settings = _settings()
        migrate_token(settings)
        self._current = current
        address = current[0] if current else str(settings.value("engine/address", "127.0.0.1:8765"))
        self.address = QLineEdit(address)
        self.address.setPlaceholderText("host:port (an 'attnscope serve' engine; tunnel with ssh -L)")
        self.token = QLineEdit(self._remembered_token())
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        # the token follows the address (each engine's own remembered token) until the user types one
        self._token_typed = False
        self.token.textEdited.connect(lambda _t: setattr(self, "_token_typed", True))
        self.address.textChanged.connect(self._address_changed)
        self.token.setPlaceholderText("the engine's token (empty for --no-token)")
        form = QFormLayout(self)
        form.addRow("Engine:", self.address)
        form.addRow("Token:", self.token)
        form.addRow(QLabel("ssh -L 8765:localhost:8765 server, then connect to 127.0.0.1:8765"))
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def _remembered_token(self) -> str:
        from attnscope.core.remote.token_store import saved_token

        address = self.address.text().strip()
        if self._current and address == self._current[0] and self._current[1]:
            return self._current[1]  # the token the window is connected with
        return saved_token(address) or os.environ.get("ATTNSCOPE_TOKEN", "")

    def _address_changed(self, _text: str) -> None:
        if not self._token_typed:
            self.token.setText(self._remembered_token())

    def remember(self) -> None:
        """Remember the address (the token is remembered only after the connection succeeds)."""
        settings = _settings()
        settings.setValue("engine/address", self.address.text().strip())
        settings.sync()


class EngineConnector:
    """The window's remote-engine actions and status text (:func:`install` builds one)."""

    def __init__(self, win):
        from attnscope.app.menus import action

        self.win = win
        file_menu = win.menus["file"]
        self.connect_action = action(win, file_menu, "Connect to &engine…", self.connect_dialog)
        self.reconnect_action = action(win, file_menu, "&Reconnect to engine", self.reconnect)
        acts = [a for a in file_menu.actions() if a not in (self.connect_action, self.reconnect_action)]
        if len(acts) > 3:  # under Open model… / folder… / default, not after Quit
            for a in (self.connect_action, self.reconnect_action):
                file_menu.removeAction(a)
            file_menu.insertActions(acts[3], [self.connect_action, self.reconnect_action])
        self.reconnect_action.setEnabled(False)
        # lasting: the status bar's messages time out, a lost engine stays lost until Reconnect
        self.lost_label = QLabel()
        self.lost_label.setStyleSheet("color:#b02a2a; font-weight:bold;")
        self.lost_label.hide()
        self._lost_why: str | None = None  # the line a link check found, for the label's tooltip
        win.statusBar().addPermanentWidget(self.lost_label)
        win.engine.busy.connect(lambda on, _label: None if on else self.show_link())  # after every job
        # an engine that goes away while the window is idle is said within seconds, not at the
        # user's next command: an engine-thread job (the socket's thread) reads the socket's events
        self.link_timer = QTimer(win)
        self.link_timer.setInterval(LINK_CHECK_MS)
        self.link_timer.timeout.connect(self.check_link)
        self.link_timer.start()
        win.state.events.loaded.connect(lambda _snap: self.show_where())
        migrate_token()

    # -- commands ---------------------------------------------------------------------------------
    def connect_dialog(self) -> None:
        s = self.win.engine.session
        current = (str(s.engine), s.token) if self.where() is not None else None
        dlg = ConnectDialog(self.win, current=current)
        if dlg.exec() != QDialog.DialogCode.Accepted:
            return
        dlg.remember()
        self.connect(dlg.address.text().strip(), dlg.token.text().strip() or None, remember=True)

    def connect(self, address: str, token: str | None, remember: bool = False, then=None) -> None:
        """Connect on the engine thread; on success the window shows the engine's model and run
        (:meth:`_connected`), remembers ``token`` for ``address`` in the 0600 token file when
        ``remember`` (a failed connection remembers nothing), then calls ``then()`` if given."""
        from attnscope.core.remote.client import parse_address

        try:
            parse_address(address)
        except ValueError as e:
            self.win.status.show_error(str(e))
            return
        win = self.win
        win.state.say(f"Connecting to the engine at {address}…")
        job = connect_job(address, token, win.decode_panel.sampling())

        def done(result) -> None:
            snap, released = result
            self._connected(snap)
            if released:  # said: the model this machine held is gone from its memory
                win.state.say(
                    f"Connected to the engine at {address}; {released} was unloaded from this machine's memory.",
                    12000,
                )
            if remember:
                self._remember_token(address, token)
            if then is not None:
                then()

        win.engine.enqueue(job, done, lambda msg: self._connect_failed(address, msg), label="loading model")

    def _connect_failed(self, address: str, message) -> None:
        """A failed connection: the window keeps what it had, as after a failed load; the message
        says connecting failed and, with no model, the model line says what to do next."""
        import re

        from attnscope.app.engine import CancelledMessage

        if not isinstance(message, CancelledMessage):  # "… at HOST:PORT: cannot reach … at HOST:PORT" once
            message = re.sub(r"^cannot reach the engine at \S+: ", "", message)
        self.win.commands.load_failed(message, what=f"Could not connect to the engine at {address}")
        if self.win.state.snapshot is None:
            self.win.status.model_label.setText("No model: File → Connect to engine… or File → Open model…")

    def _remember_token(self, address: str, token: str | None) -> None:
        from attnscope.core.remote.token_store import save_token

        try:
            save_token(address, token)
        except OSError as e:
            self.win.state.say(f"connected, but could not remember the token: {e}", 10000)

    def _connected(self, snap) -> None:
        self.show_engine_run(snap)

    def show_engine_run(self, snap) -> None:
        """Show the engine's model and, when it holds a run (a CLI export, another window), that run
        with its own prompt text and chat-template setting in the prompt box, so the box, the text and
        the views describe the same sequence; with no run, the empty state (the box keeps its text).
        File → Connect, ``attnscope --engine`` and Reconnect all come here."""
        win, cmd = self.win, self.win.commands
        cmd.loaded(snap)  # the model line, ranges, empty state (show_where runs on state's loaded)
        if not snap.seq_len:
            return
        prompt = snap.prompt
        if prompt is None:  # a run fed token by token: its prompt tokens' text
            prompt = "".join(t.text for t in snap.tokens[: snap.n_prompt])
        win.prompt_edit.setPlainText(prompt)
        win.chat_check.setChecked(bool(snap.chat_template) and win.chat_check.isEnabled())
        cmd.ran(snap)  # the engine already held a run: show it

    def reconnect(self) -> None:
        self.win.state.say("Reconnecting to the engine…")
        self.win.engine.enqueue(
            reconnect_job, self._reconnected, self.win.status.show_error, label="open session"
        )

    def _reconnected(self, result) -> None:
        snap, warnings = result
        self.show_engine_run(snap)
        where = self.where() or "the engine"
        self.win.state.say(
            f"Reconnected to {where}: {snap.n_prompt} prompt + {snap.n_generated} generated tokens"
            + (f" ({'; '.join(warnings)})" if warnings else ""),
            10000,
        )

    def check_link(self) -> None:
        """Queue a look at the connection when connected to an engine and nothing else runs."""
        if self.where() is None or self.lost() is not None or not self.win.engine.is_idle():
            return
        self.win.engine.enqueue(link_check_job, self._link_checked, lambda _msg: None, label=LINK_CHECK)

    def _link_checked(self, why: str | None) -> None:
        # no status-bar message: next to the lasting red label it was cut mid-word; the label's
        # tooltip gives the whole line
        self._lost_why = why or self._lost_why
        self.show_link()

    # -- status -----------------------------------------------------------------------------------
    def where(self) -> str | None:
        """``"torch cpu on HOST"`` when connected to an engine, None for a local session."""
        # a remote session exists only once the client module was imported: the status bar asks
        # this after every job, and must not import the remote stack for a local one
        client = sys.modules.get("attnscope.core.remote.client")
        return None if client is None else client.engine_where(self.win.engine.session)

    def lost(self) -> str | None:
        """``"HOST:PORT"`` of a remote engine whose connection was lost (None: local, or connected)."""
        s = self.win.engine.session
        if self.where() is None or getattr(s, "connected", True):
            return None
        return str(getattr(s, "engine", "?"))

    def show_link(self) -> None:
        """Show (or hide) the lasting "engine at HOST:PORT lost — File → Reconnect" of the status bar."""
        engine = self.lost()
        self.lost_label.setVisible(engine is not None)
        self.win.controls.set_engine_lost(engine is not None)  # Run, Step, Back off meanwhile
        if engine is not None:
            # what is on screen stays (the tokens made before the loss included), said to be stale
            win = self.win
            win.state.mark_stale("stale: the engine is lost — File → Reconnect")
            snap = win.state.snapshot
            if snap is not None and win.token_strip.n_shown != win.state.visible_len:
                win.token_strip.show_tokens(list(snap.tokens)[: win.state.visible_len])
            self.lost_label.setText(f"engine at {engine} lost — File → Reconnect")
            self.lost_label.setToolTip(
                (f"{self._lost_why}\n" if self._lost_why else "")
                + "The connection to the remote engine was lost; the window keeps its run. "
                "File → Reconnect to engine replays it once the engine answers again."
            )
        else:
            self._lost_why = None

    def show_where(self) -> None:
        """End the model line with where the model runs, for a remote session."""
        where = self.where()
        self.reconnect_action.setEnabled(where is not None)
        if where is None:
            return
        label = self.win.status.model_label
        host = where.rpartition(" on ")[2]
        if not label.text().endswith(f" on {host}"):
            label.setText(f"{label.text()} on {host}")
        label.setToolTip(f"the model runs in the engine at {self.win.engine.session.engine} ({where})")


def install(win) -> EngineConnector:
    """Add the remote-engine actions to ``win`` (a MainWindow); returns the connector."""
    win.engine_connector = EngineConnector(win)
    return win.engine_connector
