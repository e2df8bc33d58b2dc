"""One rendering of a map (attnscope.core.io.render) in every output, checked by pixel: weights in
their colour (a weight of 0 the map's lowest colour), masked cells hatched grey on white, NaN cells
magenta, in the bare PNG, the figure PNG/SVG/PDF, both kinds of animation frame (decoded from the
GIF file) and the window's heatmap; and the heatmap is not transposed without the app's start-up."""

from __future__ import annotations

import re
import zlib

import numpy as np
import pytest
from attnscope.core.attention.masks import hidden_cells
from attnscope.core.io import animation, data_writers
from attnscope.core.io import render as R
from attnscope.core.io.colormaps import NONFINITE_RGB, ColourSpec, lut, to_rgb
from attnscope.core.tokens import Token
from PIL import Image

N = 6
ZERO, NAN = (4, 2), (3, 1)  # an allowed cell of weight exactly 0, and one that is NaN
COLOUR = ColourSpec(cmap="magma")  # magma's lowest colour #000004 is what masked cells were painted
LOWEST = tuple(int(c) for c in lut("magma")[0])
MAGENTA = tuple(NONFINITE_RGB)
GREY, WHITE = R.MASK_HATCH, R.MASK_BG


def _map() -> tuple[np.ndarray, np.ndarray]:
    """``(weights, masked)``: a causal 6 × 6 map whose row i spreads over keys 0..i, with one zero
    and one NaN cell among the allowed ones."""
    w = np.tril(np.arange(1, N * N + 1, dtype=np.float32).reshape(N, N))
    w /= w.sum(axis=1, keepdims=True)
    w[ZERO] = 0.0
    w[NAN] = np.nan
    return w, hidden_cells(np.arange(N), np.arange(N))


def _tokens(n: int = N) -> list[Token]:
    return [Token(i, 100 + i, f"t{i}", f"t{i}") for i in range(n)]


def _check_cell_block(px: np.ndarray, kind: str, expect=None) -> None:
    """Pixels of one cell's interior: all the colour ``expect`` (a weight), magenta, or only the
    hatch's grey and white with some grey."""
    flat = {tuple(int(c) for c in p) for p in px.reshape(-1, px.shape[-1])[:, :3]}
    if kind == "masked":
        assert flat <= {GREY, WHITE} and GREY in flat, flat
    elif kind == "nan":
        assert flat == {MAGENTA}, flat
    else:
        assert flat == {tuple(int(c) for c in expect)}, flat


def _check_cells(cell_px, colour=COLOUR, margin: int = 0) -> None:
    """``cell_px(i, j)`` → the pixels of cell (i, j)'s interior: every kind checked."""
    w, masked = _map()
    rgb = to_rgb(w, colour.cmap, colour.vmin, colour.vmax, colour.scale)
    for i in range(N):
        for j in range(N):
            block = cell_px(i, j)
            if masked[i, j]:
                _check_cell_block(block, "masked")
            elif (i, j) == NAN:
                _check_cell_block(block, "nan")
            else:
                _check_cell_block(block, "weight", rgb[i, j])
    assert tuple(rgb[ZERO]) == LOWEST  # a zero is a weight: the lowest colour, and only there


# -- the shared function ---------------------------------------------------------------------------------
def test_cell_kinds_palette_and_legend():
    w, masked = _map()
    kinds = R.cell_kinds(w, masked)
    assert kinds[NAN] == R.NONFINITE and kinds[ZERO] == R.WEIGHT and (kinds[masked] == R.MASKED).all()
    assert [k for k, _ in R.legend(kinds)] == [R.MASKED, R.NONFINITE]
    assert [k for k, _ in R.legend(R.cell_kinds(w, masked, blank_rows=4))] == [R.MASKED, R.NONFINITE, R.BLANK]
    assert R.legend(R.cell_kinds(np.ones((2, 2)))) == []
    pal = R.map_palette(COLOUR)
    np.testing.assert_array_equal(pal[:256], lut("magma"))  # 256 steps: exactly to_rgb's colours
    assert tuple(pal[256 + R.SPECIAL_NONFINITE]) == MAGENTA
    # magenta is in no colour map: a non-finite cell never reads as a weight
    for cmap in ("viridis", "magma", "inferno", "plasma", "cividis"):
        assert np.abs(lut(cmap).astype(int) - np.array(MAGENTA)).sum(axis=1).min() > 150
    with pytest.raises(ValueError, match="mask of shape"):
        R.cell_kinds(w, masked[:3])


# -- bare PNG --------------------------------------------------------------------------------------------
def test_bare_png_cells(tmp_path):
    w, masked = _map()
    c = 12
    path = data_writers.save_map_png(w, tmp_path / "m.png", COLOUR, size=(N * c, N * c), masked=masked)
    a = np.asarray(Image.open(path).convert("RGB"))
    _check_cells(lambda i, j: a[i * c : (i + 1) * c, j * c : (j + 1) * c])


# -- figures ---------------------------------------------------------------------------------------------
def _figure_rect(size, dpi):
    from attnscope.app.figure import _label_metrics, figure_layout
    from attnscope.app.paint import ensure_gui

    ensure_gui()
    labels = [t.text for t in _tokens()]
    _, _, _, _, _, label_w, label_h = _label_metrics(labels, labels, dpi)
    return figure_layout(N, N, size, dpi, label_w, label_h, legend=True)


def _figure_cells(a: np.ndarray, rect, cell: float, margin: int = 3):
    def px(i, j):
        x0, y0 = rect.left() + j * cell, rect.top() + i * cell
        return a[
            int(np.ceil(y0)) + margin : int(np.floor(y0 + cell)) - margin,
            int(np.ceil(x0)) + margin : int(np.floor(x0 + cell)) - margin,
        ]

    return px


@pytest.mark.slow  # Qt's fonts and figure layout: seconds on a loaded machine
def test_figure_png_and_svg_cells(tmp_path):
    from attnscope.app.figure import save_heatmap_figure
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    w, _ = _map()
    size, dpi = (700, 620), 100.0
    rect, cell = _figure_rect(size, dpi)
    png = save_heatmap_figure(w, tmp_path / "f.png", tokens=_tokens(), colour=COLOUR, size=size, dpi=dpi)
    a = np.asarray(Image.open(png).convert("RGB"))
    _check_cells(_figure_cells(a, rect, cell))
    # the legend under the map names the masked and the non-finite cells
    below = a[int(rect.bottom()) + 1 :]
    assert (np.all(below == MAGENTA, axis=-1)).sum() > 20  # the legend's magenta swatch

    svg = save_heatmap_figure(w, tmp_path / "f.svg", tokens=_tokens(), colour=COLOUR, size=size, dpi=dpi)
    text = svg.read_text()
    assert "#ff00ff" in text.lower()
    img = QImage(size[0], size[1], QImage.Format_RGB32)
    img.fill(Qt.white)
    p = QPainter(img)
    QSvgRenderer(str(svg)).render(p)
    p.end()
    b = np.frombuffer(img.constBits(), np.uint8).reshape(size[1], img.bytesPerLine() // 4, 4)[:, : size[0]]
    _check_cells(_figure_cells(np.ascontiguousarray(b[..., 2::-1]), rect, cell, margin=4))


def _pdf_content(path) -> bytes:
    data = path.read_bytes()
    out = []
    for m in re.finditer(rb"stream\r?\n(.*?)endstream", data, re.S):
        try:
            out.append(zlib.decompress(m.group(1)))
        except zlib.error:
            pass
    return b"\n".join(out)


@pytest.mark.slow  # Qt's fonts and figure layout: seconds on a loaded machine
def test_figure_pdf_cells(tmp_path):
    """No PDF rasteriser here: the page's fill operators are read instead. The NaN cell is one
    magenta rectangle, the zero cell the only one in magma's lowest colour, and the masked cells a
    pattern (the hatch) over white: the shared cell colours (:func:`cell_colours`) on the page."""
    from attnscope.app.figure import save_heatmap_figure

    w, masked = _map()
    pdf = save_heatmap_figure(
        w, tmp_path / "f.pdf", tokens=_tokens(), colour=COLOUR, size=(700, 620), dpi=100
    )
    page = _pdf_content(pdf).decode("latin-1")
    fills = re.findall(
        r"([\d.]+) ([\d.]+) ([\d.]+) scn\n/GSa gs\n(?:q\n[^\n]* cm\n)?[\d.]+ [\d.]+ [\d.]+ [\d.]+ re\nf", page
    )
    colours = [tuple(round(float(c) * 255) for c in f) for f in fills]
    assert colours.count(MAGENTA) == 2  # the NaN cell and the legend's swatch
    assert colours.count(LOWEST) == 1  # the zero cell; masked cells are never the lowest colour
    rgb, kinds = R.cell_colours(w, COLOUR, masked)
    assert tuple(rgb[NAN]) == MAGENTA and tuple(rgb[ZERO]) == LOWEST and (rgb[masked] == WHITE).all()
    assert "/Pattern" in pdf.read_bytes().decode("latin-1") or "Pattern" in page  # the hatch


# -- animation frames, decoded from the GIF --------------------------------------------------------------
class _Info:
    sliding_window = None


class _Trace:
    layers: list = []


class _FakeSession:
    """What :func:`attnscope.core.io.animation.decode_frames` reads of a session: the map of the last
    step (``N`` tokens, 3 of them generated)."""

    def __init__(self, w):
        self._w, self.n_prompt, self.n_generated, self.seq_len = w, N - 3, 3, N
        self.tokens, self.info, self.trace = _tokens(), _Info(), _Trace()

    def weights(self, layer, head, rows=None, cols=None):
        return self._w


def test_bare_gif_frames_cells(tmp_path):
    w, masked = _map()
    s = _FakeSession(w)
    cap = 18
    gif = animation.save_animation(
        animation.decode_frames(s, 0, 0, colour=COLOUR, max_size=N * 20), tmp_path / "a.gif"
    )
    im = Image.open(gif)
    assert im.n_frames == 4
    pal = animation.frame_palette("magma")
    for step in range(4):
        im.seek(step)
        a = np.asarray(im.convert("RGB"))
        n = s.n_prompt + step
        blank = [i for i in range(N) if i >= n]
        for i in blank:  # rows not generated yet: white, and said in the legend strip
            assert (a[cap + i * 20 : cap + (i + 1) * 20, : N * 20] == 255).all()
        # cells of the generated rows; a weight is its frame-palette step (250 steps of the map)
        want = pal[np.round(COLOUR.normalize(w) * (animation.N_FRAME_LEVELS - 1)).astype(int)]
        for i in range(n):
            for j in range(N):
                blk = a[cap + i * 20 + 1 : cap + (i + 1) * 20 - 1, j * 20 + 1 : (j + 1) * 20 - 1]
                kind = "masked" if masked[i, j] else "nan" if (i, j) == NAN else "weight"
                _check_cell_block(blk, kind, want[i, j])
        assert tuple(want[ZERO]) == LOWEST
        legend = a[cap + N * 20 :]
        assert (np.all(legend == GREY, axis=-1)).any()  # the hatched swatch
        if blank:
            assert step < 3
    im.seek(3)  # the NaN row is generated by the last step: its swatch joins the legend
    assert (np.all(np.asarray(im.convert("RGB"))[cap + N * 20 :] == MAGENTA, axis=-1)).any()


@pytest.mark.slow  # Qt's fonts and figure layout: seconds on a loaded machine
def test_figure_gif_frames_cells(tmp_path):
    from attnscope.app.figure import FRAME_DPI, FRAME_SIZE, figure_frame

    w, masked = _map()
    frames = [
        figure_frame(w, n, tokens=_tokens(), title=f"n {n}", colour=COLOUR, masked=masked) for n in (4, N)
    ]
    gif = animation.save_animation(frames, tmp_path / "f.gif")
    im = Image.open(gif)
    rect, cell = _figure_rect(FRAME_SIZE, FRAME_DPI)
    for k, n in enumerate((4, N)):
        im.seek(k)
        a = np.asarray(im.convert("RGB"))
        px = _figure_cells(a, rect, cell)
        for i in range(N):
            for j in range(N):
                blk = px(i, j)
                if i >= n:  # not generated yet: blank white (named in the legend), not a weight
                    assert (blk == 255).all()
                elif masked[i, j]:
                    _check_cell_block(blk, "masked")
                elif (i, j) == NAN:
                    _check_cell_block(blk, "nan")
                else:  # the frame palette holds 236 steps: within one step of 256
                    want = to_rgb(w[i : i + 1, j : j + 1], "magma")[0, 0].astype(int)
                    assert np.abs(blk.astype(int) - want).max() <= 8
        inside = a[int(rect.top()) : int(rect.bottom()), int(rect.left()) : int(rect.right())]
        assert np.all(inside == LOWEST, axis=-1).sum() <= (cell + 1) ** 2  # the zero cell, nothing else


# -- the window's heatmap ---------------------------------------------------------------------------------
def _cell_pixel(hm, img, row: float, col: float):
    from PySide6.QtCore import QPointF

    scene = hm.plot.vb.mapViewToScene(QPointF(col + 0.5, row + 0.5))
    pt = hm.glw.mapFromScene(scene)
    return tuple(int(c) for c in img[pt.y(), pt.x(), :3])


def _grab(widget) -> np.ndarray:
    qimg = widget.grab().toImage().convertToFormat(widget.grab().toImage().Format.Format_RGB888)
    arr = np.frombuffer(qimg.constBits(), np.uint8).reshape(qimg.height(), qimg.bytesPerLine())
    return arr[:, : qimg.width() * 3].reshape(qimg.height(), qimg.width(), 3).copy()


def test_heatmap_is_not_transposed_without_the_apps_start_up(qtbot, monkeypatch):
    """A HeatmapView from a plain script: pyqtgraph at its own default (col-major), as before any
    entry point configured it. Query rows run down, key columns across."""
    import pyqtgraph as pg
    from attnscope.app.views.heatmap import HeatmapView

    monkeypatch.setitem(pg.CONFIG_OPTIONS, "imageAxisOrder", "col-major")
    assert pg.getConfigOption("imageAxisOrder") == "col-major"
    n = 5
    w = np.zeros((n, n), np.float32)
    w[:, 0] = 0.0
    w[4, 0] = 1.0  # query 4 → key 0: bottom-left; its mirror (query 0, key 4) is masked
    w[2, 1] = 0.6
    hm = HeatmapView()
    qtbot.addWidget(hm)
    hm.resize(600, 560)
    hm.show()
    qtbot.waitExposed(hm)
    hm.set_weights(w, _tokens(n), _tokens(n))
    qtbot.wait(50)
    img = _grab(hm.glw)
    top = tuple(int(c) for c in lut("viridis")[-1])
    assert _cell_pixel(hm, img, 4, 0) == top  # query 4, key 0
    assert _cell_pixel(hm, img, 0, 4) != top  # the transposed place: masked, hatched
    mid = tuple(int(c) for c in to_rgb(np.array([[0.6]]))[0, 0])
    assert np.abs(np.array(_cell_pixel(hm, img, 2, 1)) - mid).max() <= 2
    for item in (hm.image, hm.tile_image, hm.nonfinite_image, hm.tile_nonfinite):
        assert item.axisOrder == "row-major"


def test_heatmap_draws_nan_cells_magenta_with_a_legend(qtbot):
    from attnscope.app.views.heatmap import HeatmapView, weight_text

    w, _ = _map()
    hm = HeatmapView()
    qtbot.addWidget(hm)
    hm.resize(600, 560)
    hm.show()
    qtbot.waitExposed(hm)
    hm.set_weights(w, _tokens(), _tokens())
    qtbot.wait(50)
    img = _grab(hm.glw)
    assert _cell_pixel(hm, img, *NAN) == MAGENTA
    assert _cell_pixel(hm, img, *ZERO) == tuple(int(c) for c in lut("viridis")[0])
    assert "NaN/inf" in hm.mask_legend.text and "hatched grey: masked" in hm.mask_legend.text
    assert "non-finite" in weight_text(float("nan"))
    hm.set_weights(np.nan_to_num(w), _tokens(), _tokens())
    assert "NaN" not in hm.mask_legend.text and _cell_pixel(hm, _grab(hm.glw), *NAN) != MAGENTA
