"""The window's status bar: the model line, seq_len and KV-cache bytes, progress, Cancel and messages.

:class:`StatusLine` builds its widgets into a ``QStatusBar``, follows the engine's progress and busy
signals, says the :class:`attnscope.app.state.ViewState`'s ``message`` and ``error`` events, and
writes the labels of each new snapshot.
"""

from __future__ import annotations

from attnscope.app.engine import CancelledMessage, EngineLostMessage
from attnscope.core.units import count, format_bytes
from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import (
    QApplication,
    QLabel,
    QMessageBox,
    QProgressBar,
    QSizeGrip,
    QSizePolicy,
    QStatusBar,
    QStyle,
    QStyleOption,
    QToolButton,
    QWidget,
)
from superqt import QElidingLabel

APP_NAME = "AttnScope"

#: the label of the engine-thread job that looks at the remote link while the window is idle
#: (:class:`attnscope.app.connect.EngineConnector`, every 2 s)
LINK_CHECK = "link check"
#: engine-thread jobs the status bar shows no progress for
QUIET_JOBS = frozenset({LINK_CHECK})

#: job labels that get Cancel and a status text while they run
LONG_JOBS = (
    "loading model",
    "prefill",
    "decode",
    "open session",
    "batch export",
    "switch backend",
    "compare",
    "experiments",
)


def backend_device(backend: str, device: str) -> str:
    """``"torch cpu"``, ``"mlx cpu"`` (MLX names its devices ``mlx:cpu`` / ``mlx:gpu``: the backend
    is said once), ``"torch cuda:0"``."""
    device = str(device)
    return f"{backend} {device.removeprefix(f'{backend}:')}"


class ElidingStatusBar(QStatusBar):
    """A ``QStatusBar`` whose message ends in "…" before the permanent fields (seq_len, KV cache),
    where Qt's own draws it clipped mid-letter against them; the whole message is the tooltip."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.messageChanged.connect(self.setToolTip)

    def message_rect(self) -> QRect:
        """Where the message is drawn: from the left edge to 2 px before the leftmost field shown
        (while a message shows, Qt hides the normal widgets: every one still visible is permanent)."""
        right = self.width() - 12
        for w in self.findChildren(QWidget, options=Qt.FindChildOption.FindDirectChildrenOnly):
            if w.isVisible() and not w.isWindow() and not isinstance(w, QSizeGrip):
                right = min(right, w.x() - 2)
        return QRect(6, 0, max(0, right - 6), self.height())

    def shown_message(self) -> str:
        """The message as drawn: elided at the right to fit :meth:`message_rect`."""
        msg = self.currentMessage()
        return self.fontMetrics().elidedText(msg, Qt.TextElideMode.ElideRight, self.message_rect().width())

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if not self.currentMessage():
            super().paintEvent(event)
            return
        p = QPainter(self)
        opt = QStyleOption()
        opt.initFrom(self)
        self.style().drawPrimitive(QStyle.PrimitiveElement.PE_PanelStatusBar, opt, p, self)
        for w in self.findChildren(QWidget, options=Qt.FindChildOption.FindDirectChildrenOnly):
            if w.isVisible() and not w.isWindow() and not isinstance(w, QSizeGrip):
                item = QStyleOption()
                item.rect = w.geometry().adjusted(-2, -1, 2, 1)
                item.palette = self.palette()
                self.style().drawPrimitive(QStyle.PrimitiveElement.PE_FrameStatusBarItem, item, p, w)
        p.setPen(self.palette().windowText().color())
        align = Qt.AlignmentFlag.AlignLeading | Qt.AlignmentFlag.AlignVCenter | Qt.TextFlag.TextSingleLine
        p.drawText(self.message_rect(), align, self.shown_message())
        p.end()


class StatusLine:
    """The status bar's widgets (``model_label``, ``seq_label``, ``kv_label``, ``progress``,
    ``cancel_button``) and what they say."""

    def __init__(self, window, state, engine):
        self.window, self.state = window, state
        window.setStatusBar(ElidingStatusBar(window))
        self.bar = sb = window.statusBar()
        self.last_error: str | None = None
        self._busy_message: str | None = None
        self._notices_shown: tuple[str, ...] = ()  # Snapshot.notices already said
        self.model_label = QElidingLabel("No model")  # a long model line ends in "…", never clipped mid-word
        self.model_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.seq_label = QLabel("seq_len 0")
        self.kv_label = QLabel("KV cache 0 B")
        # a forward that overflowed (attnscope.core.trace.finite): said as long as its sequence is shown
        self.nonfinite_label = QLabel("")
        self.nonfinite_label.setStyleSheet("color:#b00020; font-weight:bold;")
        self.nonfinite_label.hide()
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(180)
        self.progress.setTextVisible(False)
        self.progress.hide()
        self.cancel_button = QToolButton()
        self.cancel_button.setText("Cancel")
        self.cancel_button.setToolTip("Stop the running job: prefill, decode, load, experiments… (Esc)")
        self.cancel_button.hide()
        sb.addWidget(self.model_label, 1)
        for w in (self.nonfinite_label, self.progress, self.cancel_button, self.seq_label, self.kv_label):
            sb.addPermanentWidget(w)
        self.cancel_button.clicked.connect(engine.cancel)
        engine.progress.connect(self.on_progress)
        engine.busy.connect(self.on_busy)
        engine.error.connect(self.show_error)
        state.events.message.connect(lambda m: self.say(*m))
        state.events.error.connect(self.show_error)

    def show_nonfinite(self, notes: list[str]) -> None:
        """Keep a red "⚠ hidden states of layer 8 reach inf at float16" in the status bar while the
        sequence's forward held non-finite values (the full notice in its tooltip); hidden otherwise."""
        if not notes:
            self.nonfinite_label.hide()
            return
        first = notes[0].removeprefix("non-finite forward: ").split(" (", 1)[0]
        self.nonfinite_label.setText(f"⚠ {first}")
        self.nonfinite_label.setToolTip(notes[0])
        self.nonfinite_label.show()

    def say(self, text: str, timeout_ms: int = 0) -> None:
        self.bar.showMessage(text, timeout_ms)

    def show_error(self, message: str) -> None:
        """Show ``message`` in the status bar and, when the window is visible, a dialog (never for a
        cancelled job or a lost engine: a status line)."""
        if getattr(message, "from_view", False) and isinstance(self.last_error, EngineLostMessage):
            if self._engine_lost():  # the loss was said: a view's request to the lost engine adds nothing
                return
        self.last_error = message
        self.bar.showMessage(message, 15000)
        if isinstance(message, CancelledMessage):
            return  # the user asked for it: the status line says what stopped, no dialog
        if isinstance(message, EngineLostMessage) or self._engine_lost():
            return  # the lasting "engine … lost — File → Reconnect" label says it: never a dialog per key
        if self.window.isVisible() and QApplication.platformName() not in ("offscreen", "minimal"):
            QMessageBox.warning(self.window, APP_NAME, message)

    def _engine_lost(self) -> bool:
        conn = getattr(self.window, "engine_connector", None)
        return conn is not None and conn.lost() is not None

    def on_progress(self, message: str, fraction: float) -> None:
        self._busy_message = message
        self.bar.showMessage(message)
        if fraction < 0:
            self.progress.setRange(0, 0)
        else:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(fraction * 1000))

    def on_busy(self, on: bool, label: str) -> None:
        if label in QUIET_JOBS:
            return
        long_job = label in LONG_JOBS
        self.progress.setVisible(on)
        self.cancel_button.setVisible(on and long_job)
        if on:
            self.progress.setRange(0, 0)
            if long_job:
                self._busy_message = f"{label.capitalize()}…"
                self.bar.showMessage(self._busy_message)
        else:
            # clear our own progress text, never an error or result message shown since
            if self.bar.currentMessage() == self._busy_message:
                self.bar.clearMessage()
            self._busy_message = None

    def show_model(self, snap) -> None:
        """The model line and the "ready" message of a newly loaded model."""
        info = snap.info
        text = (
            f"{info.name} · {info.architecture} · {count(info.n_layers, 'layer')} · "
            f"{count(info.n_heads, 'query head')} / {count(info.n_kv_heads, 'KV head')} · "
            f"head_dim {info.head_dim} · {backend_device(snap.backend, snap.device)}"
        )
        arch = info.arch
        if (
            arch.is_hybrid
        ):  # "1 of 4 layers attention (3 linear attention)" (docs/how-it-works.md "Hybrid models")
            text += f" · {arch.describe_layers()}"
        kind = getattr(info, "attention_kind", "")  # attnscope.core.loading.attention_kind: MoE, MLA
        if arch.is_hybrid:  # the layer count is said above
            kind = " · ".join(p for p in kind.split(" · ") if "layers attention" not in p)
        if kind and ("experts" in kind or kind.startswith("MLA")):
            text += f" · {kind}"
        why = getattr(info, "dtype_reason", "")  # attnscope.core.loading.precision: why this dtype
        quant = "; ".join(
            q
            for q in (
                f"file {info.quantization_file}" if info.quantization_file else "",
                info.quantization_runtime,
            )
            if q
        )  # attnscope.core.loading.quantize.record
        if info.quantization_runtime:  # "int8 weight-only (torchao 0.18.0, ...)" -> "int8 weight-only"
            text += f" · {info.quantization_runtime.split(' (')[0]}"
        from attnscope.core.loading.device_map import describe_info

        placed = describe_info(info)  # "device map auto: cpu (0.4 GB), disk (0.1 GB)"; "" on one device
        if placed:
            text += f" · {placed}"
        self.model_label.setText(text)
        self.model_label.setToolTip(why or info.dtype)
        note = getattr(info, "load_note", "")  # e.g. the quantised-weights cache was not written
        self.bar.showMessage(
            f"{info.name} ready{f' at {why}' if why else ''}{f' ({quant})' if quant else ''}. "
            + (f"Note: {note}. " if note else "")
            + "Type a prompt and press Run (Ctrl+Enter).",
            8000 if not note else 20000,
        )

    def show_snapshot(self, snap) -> None:
        """seq_len and KV-cache bytes of ``snap``; the engine's notices, each said once."""
        from attnscope.core.kv_formula import dtype_bytes

        info = snap.info
        self.seq_label.setText(
            f"seq_len {snap.seq_len}  ({snap.n_prompt} prompt + {snap.n_generated} generated)"
        )
        self.kv_label.setText(f"KV cache {format_bytes(snap.kv_cache_bytes)} ({snap.kv_cache_bytes:,} bytes)")
        n_kv = len(info.arch.attention_layers)  # a hybrid model: its attention layers hold the KV cache
        self.kv_label.setToolTip(
            f"2 × {n_kv} {'attention ' if n_kv != info.n_layers else ''}layers × {info.n_kv_heads} KV heads × {info.head_dim} head_dim × "
            f"{snap.seq_len} tokens × {dtype_bytes(info.dtype)} bytes = {snap.kv_cache_bytes:,} bytes"
        )
        self.show_nonfinite([n for n in snap.notices if n.startswith("non-finite forward")])
        # what the engine did by itself (a lossy tokenization, a RoPE cache re-run): said once each
        new = [n for n in snap.notices if n not in self._notices_shown]
        self._notices_shown = tuple(snap.notices)
        if new:  # a non-finite forward (attnscope.core.trace.finite) stays until the next message
            stay = any(n.startswith("non-finite forward") for n in new)
            self.bar.showMessage("Note: " + " · ".join(new), 0 if stay else 20000)
