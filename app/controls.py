"""The rows above the tabs: the prompt with Run and Chat template, then Back / Step / Step ×N, the
layer and head spin boxes with the head's GQA group, and the colour map.

:class:`Controls` builds them and binds the layer, head and colour map to the
:class:`attnscope.app.state.ViewState` (:mod:`attnscope.app.bind`); the buttons are connected by
the window to :class:`attnscope.app.commands.Commands`.
"""

from __future__ import annotations

from attnscope.app.bind import bind_colour_combo, bind_spin
from attnscope.core.io.colormaps import ASSETS, COLORMAPS
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
)


class ElidedLabel(QLabel):
    """A one-line label that gives up width before the row it sits in does: it ends in "…" where
    the row is short (the whole text in :meth:`text` and the tooltip), so a longer neighbour (the
    "prompt edited — press Run" hint, an eight-head GQA group) never makes the window wider."""

    MIN_WIDTH = 60

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        hint = super().minimumSizeHint()
        return QSize(min(hint.width(), self.MIN_WIDTH), hint.height())

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        rect = self.contentsRect()
        shown = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, rect.width())
        painter.drawText(rect, int(self.alignment()), shown)

    def is_elided(self) -> bool:
        """True while the text is wider than the label (it ends in "…")."""
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()


#: the attributes a window gets from its Controls
WIDGETS = (
    "prompt_edit",
    "run_button",
    "chat_check",
    "back_button",
    "step_button",
    "steps_spin",
    "stepn_button",
    "layer_spin",
    "head_spin",
    "group_label",
    "cmap_combo",
)


def _ranges(layers) -> str:
    """``"1, 3, 5–7"``: layer indices with runs collapsed."""
    out: list[str] = []
    layers = list(layers)
    i = 0
    while i < len(layers):
        j = i
        while j + 1 < len(layers) and layers[j + 1] == layers[j] + 1:
            j += 1
        out.append(str(layers[i]) if j == i else f"{layers[i]}–{layers[j]}")
        i = j + 1
    return ", ".join(out)


def layer_kinds_tip(arch) -> str:
    """One line per layer of a hybrid model: ``layer 2: linear attention, no map``."""
    from attnscope.core.arch import kind_label

    return "\n".join(
        f"layer {i}: {kind_label(arch.layer_kind(i))}" if arch.has_map(i) else arch.no_map_line(i)
        for i in range(arch.n_layers)
    )


def sample_prompts() -> list[str]:
    """The sample prompts shipped in ``assets/prompts.txt`` (``\\n`` in a line is a newline)."""
    try:
        lines = (ASSETS / "prompts.txt").read_text(encoding="utf-8").splitlines()
    except OSError:
        return ["The quick brown fox jumps over the lazy dog."]
    return [ln.replace("\\n", "\n") for ln in lines if ln.strip()]


class LayerSpinBox(QSpinBox):
    """The layer spin box: its arrows, Page Up / Page Down and the wheel step through the layers that have
    an attention map (:meth:`set_map_layers`; a hybrid model's linear-attention, Mamba and convolution
    layers are skipped, docs/how-it-works.md "Hybrid models"); a typed layer without one moves to the next that has
    one (:class:`attnscope.app.state.ViewState`). Values are the real layer indices."""

    def __init__(self):
        super().__init__()
        self.map_layers: tuple[int, ...] = ()  # empty: every layer

    def set_map_layers(self, layers) -> None:
        self.map_layers = tuple(int(i) for i in layers)

    def stepBy(self, steps: int) -> None:  # noqa: N802 (Qt's name)
        if not self.map_layers or steps == 0:
            super().stepBy(steps)
            return
        v = self.value()
        ahead = [i for i in self.map_layers if (i > v if steps > 0 else i < v)]
        if not ahead:
            return
        n = min(abs(steps), len(ahead))
        self.setValue(ahead[n - 1] if steps > 0 else ahead[-n])


class Controls:
    """The prompt row (``prompt_row``) and the selection row (``selection_row``), as layouts."""

    def __init__(self, state):
        self.state = state
        self.prompt_row = QHBoxLayout()
        self.prompt_edit = QPlainTextEdit()
        self.prompt_edit.setPlaceholderText("Type a prompt, then Run (Ctrl+Enter)")
        self.prompt_edit.setPlainText(sample_prompts()[0])
        self.prompt_edit.setFixedHeight(58)
        self.prompt_row.addWidget(self.prompt_edit, 1)
        buttons = QVBoxLayout()
        self.run_button = QPushButton("Run")
        self.run_button.setToolTip("Prefill the prompt (Ctrl+Enter)")
        self.chat_check = QCheckBox("Chat template")
        self.chat_check.setChecked(True)
        self.chat_check.setToolTip("Wrap the prompt in the model's chat template (instruct models)")
        # the last choice made (by the user, --no-chat-template, a reopened session): a model load
        # may only turn the box off for a model without a template, never overwrite that choice
        self._chat_wanted, self._loading_ranges = True, False
        self.chat_check.toggled.connect(self._chat_toggled)
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.chat_check)
        self.prompt_row.addLayout(buttons)

        ctl = self.selection_row = QHBoxLayout()
        self.back_button = QPushButton("◀ Back")
        self.back_button.setToolTip("Undo one decode step: the KV cache is truncated (Shift+F10)")
        self.step_button = QPushButton("Step ▶")
        self.step_button.setToolTip("Decode one token (F10)")
        self.steps_spin = QSpinBox()
        self.steps_spin.setRange(1, 4096)
        self.steps_spin.setValue(8)
        self.steps_spin.setToolTip("Tokens for Step ×N")
        self.stepn_button = QPushButton("Step ×N")
        self.stepn_button.setToolTip("Decode N tokens (Ctrl+F10)")
        for w in (self.back_button, self.step_button, QLabel("N"), self.steps_spin, self.stepn_button):
            ctl.addWidget(w)
        # the prompt box differs from the prompt that ran: Step decodes the run shown, not the text
        self.edited_label = QLabel(self.EDITED_TEXT)
        self.edited_label.setStyleSheet("color:#b35900; font-weight: bold;")
        self.edited_label.setToolTip(self.EDITED_TIP)
        # takes no room while hidden: kept, its width would raise the window's minimum past 1000 px
        self.edited_label.hide()
        ctl.addWidget(self.edited_label)
        ctl.addSpacing(18)
        ctl.addWidget(QLabel("Layer"))
        self.layer_spin = LayerSpinBox()
        self.layer_spin.setToolTip("Layer, 0-based (Page Up / Page Down)")
        ctl.addWidget(self.layer_spin)
        ctl.addWidget(QLabel("Head"))
        self.head_spin = QSpinBox()
        self.head_spin.setToolTip("Query head, 0-based ([ and ])")
        ctl.addWidget(self.head_spin)
        self.group_label = ElidedLabel("")
        self.group_label.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.group_label.setStyleSheet("color:#335;")
        ctl.addWidget(self.group_label)
        ctl.addStretch(1)
        ctl.addWidget(QLabel("Colours"))
        self.cmap_combo = QComboBox()
        self.cmap_combo.addItems(COLORMAPS)
        ctl.addWidget(self.cmap_combo)

        bind_spin(state, "layer", self.layer_spin)
        bind_spin(state, "head", self.head_spin)
        bind_colour_combo(state, self.cmap_combo)
        state.events.selection.connect(lambda _sel: self.update_group_label())
        state.events.snapshot.connect(lambda _snap: self.update_group_label())
        state.events.snapshot.connect(lambda _snap: self.update_edited())
        self.prompt_edit.textChanged.connect(self.update_edited)

    #: shown beside Step ×N while the prompt box holds text that has not run
    EDITED_TEXT = "prompt edited — press Run"
    EDITED_TIP = (
        "The prompt box differs from the prompt that ran: Step and Step ×N continue the run shown "
        "(its prompt is in the token strip below); Run starts the edited prompt."
    )

    @property
    def prompt_edited(self) -> bool:
        """True when a prompt ran and the prompt box now holds other text (Step would continue the
        run shown, not the text in the box)."""
        snap = self.state.snapshot
        if snap is None or snap.seq_len == 0 or snap.prompt is None:
            return False
        return self.prompt_edit.toPlainText() != snap.prompt

    def update_edited(self) -> None:
        """Show or hide the "prompt edited — press Run" hint."""
        self.edited_label.setVisible(self.prompt_edited)

    def set_ranges(self, info) -> None:
        """Layer and head spin boxes for a model with ``info.n_layers`` and ``info.n_heads``; the chat
        template box usable when the model has a template, and ticked then if the last choice was."""
        self.layer_spin.setRange(0, info.n_layers - 1)
        arch = info.arch
        self.layer_spin.set_map_layers(arch.attention_layers if arch.is_hybrid else ())
        tip = "Layer, 0-based (Page Up / Page Down)"
        if arch.is_hybrid:
            tip += (
                f". Attention maps in layers {_ranges(arch.attention_layers)} only: " + arch.describe_layers()
            )
        self.layer_spin.setToolTip(tip)
        self.head_spin.setRange(0, info.n_heads - 1)
        if not arch.has_map(min(self.state.layer, info.n_layers - 1)):
            self.state.layer = arch.map_layer_near(self.state.layer)
        self._loading_ranges = True
        try:
            self.chat_check.setEnabled(info.has_chat_template)
            self.chat_check.setChecked(info.has_chat_template and self._chat_wanted)
        finally:
            self._loading_ranges = False

    def _chat_toggled(self, checked: bool) -> None:
        if not self._loading_ranges:
            self._chat_wanted = checked

    def update_group_label(self) -> None:
        """ "reads KV head k (GQA group: q…)" for the selected head."""
        snap = self.state.snapshot
        if snap is None:
            return
        info = snap.info
        kv = info.kv_head(self.state.head)
        members = ", ".join(f"q{h}" for h in info.group(kv))
        text = f"reads KV head {kv}  (GQA group: {members})"
        arch = info.arch
        if arch.is_hybrid:  # which layers have maps, by real index (docs/how-it-works.md "Hybrid models")
            text += f"  ·  attention layers {_ranges(arch.attention_layers)} of {arch.n_layers}"
        self.group_label.setText(text)
        # the whole text where the row is short and it ends in "…"; a hybrid's layer kinds after it
        self.group_label.setToolTip(text + ("\n" + layer_kinds_tip(arch) if arch.is_hybrid else ""))

    #: why Step, Step ×N and Back are off while a prompt runs (their tooltip then)
    PREFILL_TIP = "Off while the prompt runs (prefill): the sequence it would decode is being replaced"

    def set_running(self, has_model: bool) -> None:
        """Enable Run once a model is loaded; Step once a prompt ran; Back once a token was generated;
        Step, Step ×N and Back stay off while a prefill runs (:meth:`set_prefilling`)."""
        self._has_model = has_model
        has_model = has_model and not self.engine_lost
        snap = self.state.snapshot
        ran = snap is not None and snap.seq_len > 0 and not getattr(self, "prefilling", False)
        self.run_button.setEnabled(has_model)
        for w in (self.step_button, self.stepn_button):
            w.setEnabled(has_model and ran)
        self.back_button.setEnabled(has_model and ran and snap.n_generated > 0)

    #: True while the remote engine is lost: Run, Step, Step ×N and Back off (their tooltip says why)
    engine_lost = False
    LOST_TIP = "Off while the engine is lost: File → Reconnect to engine"

    def set_engine_lost(self, lost: bool) -> None:
        """The remote engine was lost (``lost``) or is back: the commands that need it off or on."""
        if lost == self.engine_lost:
            return
        self.engine_lost = lost
        for w in (self.run_button, self.step_button, self.stepn_button, self.back_button):
            if lost:
                w.setProperty("tip_before_lost", w.toolTip())
                w.setToolTip(self.LOST_TIP)
            else:
                w.setToolTip(w.property("tip_before_lost") or w.toolTip())
        self.set_running(getattr(self, "_has_model", True))

    def set_prefilling(self, on: bool) -> None:
        """A prefill was queued (``on``) or ended: decoding controls off until it ends, their tooltips
        saying why, so a click never decodes a token on a sequence the user has not seen yet."""
        self.prefilling = on
        tips = {
            self.step_button: "Decode one token (F10)",
            self.stepn_button: "Decode N tokens (Ctrl+F10)",
            self.back_button: "Undo one decode step: the KV cache is truncated (Shift+F10)",
        }
        for w, tip in tips.items():
            w.setToolTip(self.PREFILL_TIP if on else tip)
        self.set_running(getattr(self, "_has_model", True))
