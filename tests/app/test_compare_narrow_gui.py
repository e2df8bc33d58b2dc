"""The Compare tab in a narrow window: the three maps' titles (A − B's too) and the hover line are shown
whole, and the KL and row plots' y tick labels are apart, at 1000 × 650 as at 1400 × 900 (pytest-qt,
offscreen)."""

from __future__ import annotations

import os

import numpy as np
from gui_helpers import ran_window
from PySide6.QtCore import QPointF, QRect, Qt
from tiny_models import save_tiny

PROMPT = "The cat sat on the mat. The dog"


def _cut_map_items(view) -> list[str]:
    """The map titles, maps and colour bar that do not lie whole inside the maps' view (the graphics
    layout wider than the view cuts them off on the right), or whose title is wider than its map."""
    room = view.maps_widget.viewport().width()
    cut = []
    for p in view.plots:
        text = p.titleLabel.text
        if p.sceneBoundingRect().right() > room + 0.5:
            cut.append(f"map {text!r} ends at {p.sceneBoundingRect().right():.0f} px of {room}")
        if p.titleLabel.item.boundingRect().width() > p.sceneBoundingRect().width() + 0.5:
            cut.append(f"title {text!r} is wider than its map")
    if view.bar.sceneBoundingRect().right() > room + 0.5:
        cut.append(f"the colour bar ends at {view.bar.sceneBoundingRect().right():.0f} px of {room}")
    return cut


def _hover_cut(view) -> bool:
    """True when the hover line's text needs more room than the label shows (wrapped at its width)."""
    label = view.hover
    r = label.contentsRect()
    need = label.fontMetrics().boundingRect(
        QRect(0, 0, r.width(), 10_000), int(Qt.TextFlag.TextWordWrap), label.text()
    )
    return need.width() > r.width() or need.height() > r.height()


def _crowded_ticks(plot_widget) -> list[str]:
    """The left axis's tick labels closer than half a label's height to the next one (or fewer than
    two labels: an axis without a scale)."""
    from gui_helpers import tick_label_rects

    ticks = sorted(tick_label_rects(plot_widget, "left"), key=lambda t: t[1].top())
    if len(ticks) < 2:
        return [f"only {[t for t, _r in ticks]}"]
    return [
        f"{a!r} {ra.top():.1f}..{ra.bottom():.1f} and {b!r} {rb.top():.1f}..{rb.bottom():.1f}"
        for (a, ra), (b, rb) in zip(ticks, ticks[1:], strict=False)
        if rb.top() - ra.bottom() < 0.5 * ra.height()
    ]


def test_compare_titles_and_hover_are_not_cut_at_1000_px(qtbot, tmp_path):
    save_tiny("llama", tmp_path)
    win = ran_window(qtbot, tmp_path, PROMPT, size=(1400, 900))
    win.show_view("compare")
    view = win.views["compare"]
    view.kind_combo.setCurrentIndex([view.kind_combo.itemData(i) for i in range(4)].index("prompt"))
    view.prompt_edit.setText("The dog sat on the mat. The dog")
    assert view.run_b() is not None
    assert win.engine.wait_idle(180) and view.result is not None, view.summary.text()
    assert win.engine.wait_idle(60)
    layer, head = view.map_key
    full = view._titles
    assert full[2].startswith("A − B (±") and full[0] == f"A · L{layer} H{head}"
    # a plotted row (an empty row plot shows a placeholder line, no axes: its ticks are checked with data)
    view.set_rows((9, np.linspace(0.0, 0.3, 12), np.linspace(0.3, 0.0, 12)))
    shots = os.environ.get("ATTNSCOPE_SHOTS")
    for w, h in ((1400, 900), (1000, 650), (1400, 900)):
        win.resize(w, h)
        qtbot.wait(100)
        view._on_hover(view.plots[2].vb.mapViewToScene(QPointF(3.5, 9.5)))
        qtbot.wait(100)
        if shots:
            win.grab().save(os.path.join(shots, f"appsplit_compare_{w}x{h}.png"))
        assert view.hover.text().startswith("query 9") and "A − B" in view.hover.text()
        assert not _hover_cut(view), (w, view.hover.text(), view.hover.contentsRect())
        assert not _cut_map_items(view), (w, _cut_map_items(view))
        titles = [p.titleLabel.text for p in view.plots]
        assert titles[2].startswith("A − B")
        # the row plot's hint is whole too (a longer title widens the plot item past its view, cut off)
        rp = view.row_plot.getPlotItem()
        assert rp.sceneBoundingRect().width() <= view.row_plot.viewport().width() + 0.5, (
            w,
            rp.titleLabel.text,
        )
        # the KL and row plots' y tick labels apart, not on top of each other (~40 px tall plots)
        for pw in (view.logit_plot, view.row_plot):
            assert _crowded_ticks(pw) == [], (w, _crowded_ticks(pw))
        if w == 1400:  # room for the whole titles
            assert tuple(titles) == full
        else:  # shortened; the whole title is the tooltip
            assert all(
                p.titleLabel.toolTip() == t
                for p, t in zip(view.plots, full, strict=True)
                if p.titleLabel.text != t
            )
    win.close()


def test_compare_plots_show_a_placeholder_until_there_is_data(qtbot, tmp_path):
    """Before Run B the KL and row plots show a centred grey line, not bare 0..1 axes; after the
    comparison the KL plot's axes come back, and the row plot's once a row is plotted."""
    save_tiny("llama", tmp_path)
    win = ran_window(qtbot, tmp_path, PROMPT, size=(1400, 900))
    win.show_view("compare")
    view = win.views["compare"]
    qtbot.wait(50)
    pairs = ((view.logit_plot, view.kl_placeholder), (view.row_plot, view.row_placeholder))
    for pw, ph in pairs:
        pi = pw.getPlotItem()
        assert not pi.getAxis("left").isVisible() and not pi.getAxis("bottom").isVisible()
        assert ph.isVisible() and ph.toPlainText()
        assert pi.vb.sceneBoundingRect().contains(ph.sceneBoundingRect()), ph.toPlainText()
    view.kind_combo.setCurrentIndex([view.kind_combo.itemData(i) for i in range(4)].index("prompt"))
    view.prompt_edit.setText("The dog sat on the mat. The dog")
    assert view.run_b() is not None
    assert win.engine.wait_idle(180) and view.result is not None, view.summary.text()
    assert win.engine.wait_idle(60)
    qtbot.wait(50)
    lp = view.logit_plot.getPlotItem()
    assert lp.getAxis("left").isVisible() and lp.getAxis("bottom").isVisible()
    assert not view.kl_placeholder.isVisible()
    a, b = np.full(6, 0.1), np.full(6, 0.2)
    view.set_rows((5, a, b))
    rp = view.row_plot.getPlotItem()
    assert rp.getAxis("left").isVisible() and rp.getAxis("bottom").isVisible()
    assert not view.row_placeholder.isVisible()
    view._clear_result()  # nothing shown again: the placeholders are back
    assert view.kl_placeholder.isVisible() and view.row_placeholder.isVisible()
    assert not lp.getAxis("left").isVisible()
    win.close()
