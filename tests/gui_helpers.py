"""Shared GUI test steps: open the window on a model folder and run a prompt as a user would."""

from __future__ import annotations


def ran_window(qtbot, folder, prompt: str, steps: int = 0, size: tuple[int, int] = (1400, 900)):
    """A shown :class:`attnscope.app.main_window.MainWindow` on ``folder`` after Run of ``prompt`` (no chat
    template) and ``steps`` decode steps; asserts that the load, the run and the steps succeeded."""
    from attnscope.app.main_window import MainWindow

    w = MainWindow(model=str(folder))
    qtbot.addWidget(w)
    w.resize(*size)
    w.show()
    assert w.engine.wait_idle(120), "model did not load"
    return run_in(w, prompt, steps)


def run_in(w, prompt: str, steps: int = 0):
    """Type ``prompt`` (no chat template), press Run, step ``steps`` tokens, as a user would; asserts
    each finished without an error. Returns the window."""
    w.prompt_edit.setPlainText(prompt)
    w.chat_check.setChecked(False)
    w.run_prompt()
    assert w.engine.wait_idle(60)
    if steps:
        w.step(steps)
        assert w.engine.wait_idle(60)
    assert w.last_error is None, w.last_error
    return w


def choose_export_scope(dialog, scope: str) -> None:
    """Pick ``scope`` (``"layer"``, ``"all"`` or ``"steps"``) in the export dialog's scope box, as a user would."""
    dialog.scope_combo.setCurrentIndex(["layer", "all", "steps"].index(scope))


def choose_export_format(dialog, fmt: str, figure: bool = False) -> None:
    """Pick format ``fmt`` (``"svg"``, ``"npy"``, ``"gif"``...; ``figure``: the figure variant) in the
    export dialog's format box, as a user would. Raises ValueError when it is not offered or is
    greyed out (the message is the item's tooltip: why it is unavailable)."""
    from PySide6.QtCore import Qt

    combo = dialog.format_combo
    for i in range(combo.count()):
        if combo.itemData(i) == (fmt, figure):
            item = combo.model().item(i)
            if item is not None and not item.isEnabled():
                raise ValueError(combo.itemData(i, Qt.ItemDataRole.ToolTipRole) or f"{fmt} is unavailable")
            combo.setCurrentIndex(i)
            return
    raise ValueError(f"format {fmt!r} not offered for this scope")


def axis_title_rect(plot_widget, side: str):
    """The text of ``plot_widget``'s ``side`` axis title (its label item less the document margin),
    as a QRectF in the plot widget's viewport coordinates."""
    label = plot_widget.getPlotItem().getAxis(side).label
    m = label.document().documentMargin()
    scene = label.mapRectToScene(label.boundingRect()).adjusted(m, m, -m, -m)
    return plot_widget.mapFromScene(scene).boundingRect().toRectF()


def tick_label_rects(plot_widget, side: str) -> list:
    """``(text, QRectF)`` of each tick label ``plot_widget``'s ``side`` axis draws now (pyqtgraph's
    own draw specs, in the axis item's coordinates), in drawing order."""
    return axis_tick_rects(plot_widget.getPlotItem().getAxis(side))


def axis_tick_rects(axis) -> list:
    """``(text, QRectF)`` of each tick label the pyqtgraph ``axis`` item draws now (its own draw specs, in
    the axis item's coordinates), in drawing order."""
    from PySide6.QtGui import QImage, QPainter

    image = QImage(8, 8, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    try:
        _axis, _ticks, texts = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    return [(text, rect) for rect, _flags, text in texts]
