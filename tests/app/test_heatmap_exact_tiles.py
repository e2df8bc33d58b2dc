"""The long heatmap as a new user saw it (a 3,031-token prompt, zoomed to the diagonal): where the window
says a region is exact, it draws the exact cells (one colour per cell, masked cells as masked), the red
frame it mentions is on screen, and a tile still computing is not called exact; the hover readout has
the digits the log scale needs; the map's keys stay in a text box; a long title never wraps mid-word."""

from __future__ import annotations

import numpy as np
import pytest
from attnscope.app.views.heatmap import MASK_HATCH, NB_HYPHEN, HeatmapView, weight_text
from attnscope.core.analysis.aggregate import PooledMap
from attnscope.core.analysis.pooling import block_edges, max_pool
from attnscope.core.tokens import Token
from PySide6.QtCore import QPointF, Qt

N = 3031  # the trial's prompt length
TITLE = "Layer 4 · query head 4 (reads KV head 1) · seq_len 3031 · log colours (chosen for 3,031 tokens)"


def _tokens(n):
    return [Token(position=i, id=i, text=f"t{i}", raw=f"t{i}") for i in range(n)]


def _softmax_map(n, window=None, seed=0):
    """An exact ``(n, n)`` float32 map of a causal (and ``window``-key sliding window) softmax whose
    diagonal holds most of each row's mass, as a local head's does."""
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(n, n)).astype(np.float32) * 2.0
    s[np.arange(n), np.arange(n)] += 6.0
    q, k = np.arange(n)[:, None], np.arange(n)[None, :]
    masked = k > q
    if window is not None:
        masked |= k <= q - window
    s[masked] = -np.inf
    w = np.exp(s - s.max(1, keepdims=True))
    return (w / w.sum(1, keepdims=True)).astype(np.float32)


@pytest.fixture
def long_map(qtbot):
    def make(window=None, n=N):
        hm = HeatmapView()
        qtbot.addWidget(hm)
        hm.resize(1100, 720)
        hm.show()
        qtbot.waitExposed(hm)
        hm.set_mask_window(window)
        w = _softmax_map(n, window)
        cols, rows = hm.overview_pixels()
        pm = PooledMap(max_pool(w, rows, cols), block_edges(n, rows), block_edges(n, cols), n, "max")
        hm.apply_length_defaults(n)
        hm.set_overview(pm, _tokens(n), title=TITLE + " · overview: max-pooled")
        return hm, w

    return make


def _zoom_to(qtbot, hm, x0, x1, y0, y1):
    hm.plot.setRange(xRange=(x0, x1), yRange=(y0, y1), padding=0)
    qtbot.wait(1)


def _answer_tile(qtbot, hm, w, action):
    """Do ``action`` (a zoom or a pan) and answer the tile it makes the view ask for, as the window's
    panel does: exact, drawn over the overview. The wait starts before the action: the view's 150 ms
    tile timer can fire while the action's events are processed (it did under load)."""
    with qtbot.waitSignal(hm.tileWanted, timeout=5000) as sig:
        action()
    r0, r1, c0, c1 = sig.args
    title = hm.plot.titleLabel.text
    assert (
        hm.tile_state() == "computing"
        and "overview: max-pooled · computing the exact weights in view…" in title
    )
    assert (
        "exact" not in title.replace("computing the exact weights", "") and "Computing" in hm.readout.text()
    )
    hm.set_tile(w[r0:r1, c0:c1], r0, c0)
    qtbot.wait(1)
    return r0, r1, c0, c1


def _at(hm, x, y):
    """Viewport pixel coordinates (floats) of view point ``(x, y)`` (``x`` = key, ``y`` = query)."""
    p = hm.glw.mapFromScene(hm.plot.vb.mapViewToScene(QPointF(x, y)))
    return p.x(), p.y()


def _pixel(img, hm, x, y):
    """The on-screen colour at view point ``(x, y)``."""
    px, py = _at(hm, x, y)
    return img.pixelColor(px, py).getRgb()[:3]


def _cell_pixels(img, hm, r, c):
    """The colours of the pixels wholly inside cell ``(r, c)`` (none when it is under 3 pixels)."""
    import math

    (ax, ay), (bx, by) = _at(hm, c, r), _at(hm, c + 1, r + 1)
    xs = range(math.floor(ax) + 1, math.ceil(bx) - 1)
    ys = range(math.floor(ay) + 1, math.ceil(by) - 1)
    return {img.pixelColor(x, y).getRgb()[:3] for x in xs for y in ys}


def _check_exact_cells(hm, cells):
    """Every cell of ``cells`` ``[(row, col)]`` looks as the exact tile says: a masked one white or
    hatch grey (never a colour of the map), any other one in its own colour (the tile image's pixel for
    that cell) at every pixel inside it (one colour per cell). Returns how many cells were checked."""
    img = hm.glw.viewport().grab().toImage()
    t, r0, c0 = hm.tile
    own = hm.tile_image.qimage  # one pixel per cell, the tile's colours
    (x0, x1), (y0, y1) = hm.plot.vb.viewRange()  # cells on the view's edge meet the axes' lines
    cells = [(r, c) for r, c in cells if x0 < c and c + 1 < x1 and y0 < r and r + 1 < y1]
    masked = hm.masked([r for r, _ in cells], [c for _, c in cells]).diagonal()
    bad, checked = [], 0
    for (r, c), m in zip(cells, masked, strict=True):
        seen = _cell_pixels(img, hm, r, c)
        if not seen:
            continue
        checked += 1
        if m:
            if not seen <= {(255, 255, 255), MASK_HATCH}:
                bad.append((r, c, "masked", seen))
        else:
            want = own.pixelColor(c - c0, r - r0).getRgb()[:3]
            if seen != {want}:
                bad.append((r, c, want, seen))
    assert not bad, f"{len(bad)} of {checked} cells not drawn exactly, e.g. {bad[:3]}"
    assert checked >= 0.8 * len(cells) and checked > 50, (checked, len(cells))
    return checked


def _band_around_diagonal(r0, r1, c0, c1, reach=6):
    return [(r, c) for r in range(r0, r1) for c in range(r - reach, r + reach + 1) if c0 <= c < c1]


def test_zoomed_long_map_draws_exact_cells_where_it_says_exact(qtbot, long_map):
    """The trial: layer 4 head 4, log colours, wheel-zoomed at the diagonal near query 2455: the cells
    after the diagonal are masked (the readout says so) and were drawn in the pooled block's colour (a
    staircase of ~8 × 4-cell blocks) under a title that said "exact tile in view"."""
    hm, w = long_map()
    vb = hm.plot.vb
    centre = QPointF(2458, 2458)

    def wheel():
        for _ in range(8):  # eight wheel steps in at the diagonal, one out (what a wheel step does)
            vb.scaleBy((0.8, 0.8), center=centre)
        vb.scaleBy((1.25, 1.25), center=centre)
        qtbot.wait(1)

    _answer_tile(qtbot, hm, w, wheel)
    (x0, x1), (y0, y1) = vb.viewRange()
    assert x1 - x0 < 768 and x0 < 2458 < x1
    assert hm.tile_state() == "exact"
    assert "exact weights in view" in hm.plot.titleLabel.text and "red frame" not in hm.readout.text()
    assert "masked: a later key" in hm.cell_text(2455, 2462)
    assert weight_text(w[2455, 2450], hm.scale) in hm.cell_text(2455, 2450)
    _zoom_to(qtbot, hm, 2440, 2480, 2440, 2480)  # closer still: cells a dozen pixels wide
    _check_exact_cells(hm, [(r, c) for r in range(2445, 2475) for c in range(2445, 2475)])


def test_a_pan_past_the_tile_shows_the_red_frame_and_says_so(qtbot, long_map):
    hm, w = long_map()
    r0, r1, c0, c1 = _answer_tile(qtbot, hm, w, lambda: _zoom_to(qtbot, hm, 1000, 1300, 1000, 1300))
    assert hm.tile_state() == "exact"
    # pan so that the view runs past the tile's bottom edge: part exact (framed), part overview
    _zoom_to(qtbot, hm, c1 - 40, c1 + 40, r1 - 40, r1 + 40)  # along the diagonal, past the corner
    assert hm.tile_state() == "framed"
    title, readout = hm.plot.titleLabel.text, hm.readout.text()
    assert (
        "exact inside the red frame, max-pooled around it" in title and "exact weights in view" not in title
    )
    assert "inside the red frame" in readout
    (x0, x1), (y0, y1) = hm.plot.vb.viewRange()
    frame = hm.tile_frame.rect()
    assert hm.tile_frame.isVisible() and y0 < frame.bottom() < y1  # the frame's edge is on screen
    img = hm.glw.viewport().grab().toImage()
    red = _pixel(img, hm, c1 - 20, frame.bottom())
    assert red[0] > 180 and red[1] < 120 and red[2] < 120, red
    _check_exact_cells(hm, _band_around_diagonal(r1 - 38, r1, c1 - 40, c1))
    assert "block max" in hm.cell_text(r1 + 20, r1 + 10)  # below the tile: the overview, said as such


def test_sliding_window_and_end_of_sequence(qtbot, long_map):
    """A sliding-window layer (64 keys) zoomed at the window's far edge, and the map's last rows and
    keys: masked cells on both sides of the band stay masked inside the exact tile."""
    hm, w = long_map(window=64)
    _answer_tile(qtbot, hm, w, lambda: _zoom_to(qtbot, hm, 1500, 1700, 1550, 1750))
    assert hm.tile_state() == "exact"
    _zoom_to(qtbot, hm, 1560, 1620, 1600, 1660)
    edge = [(r, c) for r in range(1605, 1655) for c in range(r - 70, r - 58) if 1560 <= c < 1620]
    _check_exact_cells(hm, edge + _band_around_diagonal(1605, 1615, 1560, 1620))
    assert "outside the 64-key sliding window" in hm.cell_text(1640, 1570)
    # the end of the sequence: the tile is clipped to the map, the last query and key are exact
    r0, r1, c0, c1 = _answer_tile(qtbot, hm, w, lambda: _zoom_to(qtbot, hm, N - 200, N + 5, N - 200, N + 5))
    assert r1 == N and c1 == N and hm.tile_state() == "exact"
    _zoom_to(qtbot, hm, N - 40, N, N - 40, N)
    _check_exact_cells(hm, _band_around_diagonal(N - 35, N, N - 40, N))
    assert weight_text(w[N - 1, N - 1], hm.scale) in hm.cell_text(N - 1, N - 1)


def test_zooming_out_past_the_tile_size_is_the_overview_again(qtbot, long_map):
    hm, w = long_map()
    _answer_tile(qtbot, hm, w, lambda: _zoom_to(qtbot, hm, 2300, 2500, 2300, 2500))
    _zoom_to(qtbot, hm, 0, N, 0, N)  # the whole map: the tile is a small framed part of it
    assert hm.tile_state() == "framed" and "red frame" in hm.plot.titleLabel.text
    _zoom_to(qtbot, hm, 0, 1000, 0, 1000)  # a region the tile is not in: the overview, no "exact"
    assert hm.tile_state() == "overview" and "exact" not in hm.plot.titleLabel.text
    assert "overview: max-pooled" in hm.plot.titleLabel.text


def test_a_partial_overview_asks_for_no_tile(qtbot, long_map):
    """While the overview is still refining the panel drops tile requests: the view must not ask (and
    then say "computing") for a tile nobody computes; the finished overview asks again."""
    hm, w = long_map()
    pm = hm.pooled
    hm.set_overview(
        PooledMap(pm.image, pm.row_edges, pm.col_edges, pm.n, "max", 0.5), _tokens(N), title=TITLE
    )
    wanted = []
    hm.tileWanted.connect(lambda *a: wanted.append(a))
    _zoom_to(qtbot, hm, 100, 300, 100, 300)
    hm._maybe_request_tile()
    assert wanted == [] and hm.tile_state() == "overview"


# -- the hover readout --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("v", "text"),
    [
        (0.5, "0.5000"),
        (0.0123, "0.0123"),
        (0.00999, "9.99e-03"),
        (4.56e-5, "4.56e-05"),  # was "0.0000" while the log scale coloured it 1e-5..1e-4
        (1.0, "1.0000"),
    ],
)
def test_weight_text_has_the_digits_of_the_scale(v, text):
    assert weight_text(v) == text
    assert weight_text(v, "log") == text


def test_weight_text_tells_tiny_from_zero():
    assert weight_text(3e-8, "log").startswith("3.00e-08 (under the log scale's 1e-06")
    assert weight_text(3e-8) == "3.00e-08"
    assert weight_text(0.0).startswith("0 (not masked")


def test_readout_of_tiny_masked_and_pooled_cells(qtbot, long_map):
    hm, w = long_map()
    _answer_tile(qtbot, hm, w, lambda: _zoom_to(qtbot, hm, 2300, 2500, 2300, 2500))
    r, c = 2455, 2400  # a small weight the log scale colours well above its floor
    t, r0, c0 = hm.tile
    tile = t.copy()
    tile[r - r0, c - c0] = 4.56e-5
    hm.set_tile(tile, r0, c0)
    text = hm.cell_text(r, c)
    assert "weight 4.56e-05" in text and "0.0000" not in text and "masked" not in text
    assert "masked: a later key" in hm.cell_text(r, r + 1)
    pooled = hm.cell_text(100, 50)
    assert "≤ " in pooled and "block max" in pooled and "0.0000" not in pooled


# -- the map's keys in a text box -----------------------------------------------------------------------
@pytest.mark.slow  # a window on a tiny model: ~10 s, most of it loading torch and transformers
def test_map_keys_stay_in_the_prompt_and_act_elsewhere(qtbot, tmp_path):
    """In the prompt box ] types a bracket and PgDown moves the cursor, and neither changes the head or
    the layer (the trial: "]]" typed while PgDown changed the layer); on the map they move the view; the
    View menu says so, and its entries act wherever the focus is."""
    from attnscope.app.main_window import MainWindow
    from tiny_models import save_tiny

    save_tiny("llama", tmp_path, seed=1)  # 2 layers, 4 query heads
    w = MainWindow(model=str(tmp_path))
    qtbot.addWidget(w)
    w.show()
    try:
        assert w.engine.wait_idle(120)
        qtbot.waitExposed(w)
        w.activateWindow()
        prompt = w.prompt_edit
        prompt.setPlainText("on the")
        prompt.moveCursor(prompt.textCursor().MoveOperation.End)
        prompt.setFocus()
        qtbot.waitUntil(prompt.hasFocus, timeout=5000)
        layer, head = w.layer_spin.value(), w.head_spin.value()
        qtbot.keyClicks(prompt, "]]")
        qtbot.keyClick(prompt, Qt.Key_PageDown)
        qtbot.keyClick(prompt, Qt.Key_BracketLeft)
        assert prompt.toPlainText() == "on the]][" and (w.layer_spin.value(), w.head_spin.value()) == (
            layer,
            head,
        )
        w.heatmap.glw.setFocus()
        qtbot.waitUntil(w.heatmap.glw.hasFocus, timeout=5000)
        qtbot.keyClick(w.heatmap.glw, Qt.Key_BracketRight)
        qtbot.keyClick(w.heatmap.glw, Qt.Key_PageDown)
        assert (w.layer_spin.value(), w.head_spin.value()) == (layer + 1, head + 1)
        assert prompt.toPlainText() == "on the]]["
        entries = {a.text(): a for a in w.view_menu.actions()}
        for name in ("Next layer", "Previous layer", "Next head", "Previous head"):
            assert f"{name} (outside text boxes)" in entries
        prompt.setFocus()
        entries["Previous head (outside text boxes)"].trigger()  # the menu entry itself always acts
        assert w.head_spin.value() == head
    finally:
        w.close()


# -- long titles -------------------------------------------------------------------------------------
def _title_lines(hm) -> list[str]:
    doc = hm.plot.titleLabel.item.document()
    lines, block = [], doc.begin()
    while block.isValid():
        lay, text = block.layout(), block.text()
        for i in range(lay.lineCount()):
            line = lay.lineAt(i)
            lines.append(text[line.textStart() : line.textStart() + line.textLength()])
        block = block.next()
    return lines


@pytest.mark.parametrize("width", [1100, 900, 700])
def test_a_long_title_wraps_after_a_separator_never_inside_a_word(qtbot, long_map, width):
    """The trial's title wrapped as "… overview: max-" / "pooled"; it now breaks after a "·"."""
    hm, _w = long_map()
    hm.resize(width, 600)
    qtbot.wait(20)
    long_title = "Layer 29 · query head 2 (reads KV head 0) · seq_len 3031 · log colours (chosen for 3,031 tokens) · overview: max-pooled"
    hm.show_status(long_title, "stale: computing the map for this selection…")
    lines = _title_lines(hm)
    assert len(lines) >= 2, lines
    for line in lines[:-1]:
        assert line.rstrip().endswith("·"), lines
    assert any(f"max{NB_HYPHEN}pooled" in line for line in lines)
    assert hm.plot.titleLabel.text.startswith(long_title)  # what readers of the title see: unchanged


def test_a_title_part_wider_than_the_map_wraps_at_spaces(qtbot):
    hm = HeatmapView()
    qtbot.addWidget(hm)
    hm.resize(420, 400)
    hm.show()
    qtbot.waitExposed(hm)
    part = "value-weighted needs ≤ 1024 tokens: attention shown, max-pooled over blocks of many cells"
    hm.show_status(f"Layer 0 · {part}")
    lines = _title_lines(hm)
    assert len(lines) >= 2, lines
    words = set(f"Layer 0 · {part}".replace("-", NB_HYPHEN).split())
    for line in lines:  # every line is whole words
        assert set(line.replace("\u00a0", " ").split()) <= words, (line, lines)
