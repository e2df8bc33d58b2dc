"""Exports: SVG with a clicked row (outline thin, cells crisp in librsvg), lossless
PDF images, the chosen DPI and embedded provenance, small sizes refused not cropped, MP4 named and
written (or said unavailable), labelled animation frames."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from attnscope.app import export_dialogs as AE
from attnscope.app import figure as AF
from attnscope.app import paint as AP
from attnscope.app.svg_fixups import fix_svg
from attnscope.core.io import animation, provenance
from attnscope.core.io.colormaps import to_rgb
from attnscope.core.tokens import Token
from gui_helpers import choose_export_format, choose_export_scope
from PIL import Image
from PySide6.QtCore import QObject, Qt, Signal

SVG = "{http://www.w3.org/2000/svg}"


def _map(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = np.tril(rng.random((n, n)) ** 3).astype(np.float32)
    return w / w.sum(axis=1, keepdims=True)


def _tokens(n: int) -> list[Token]:
    return [Token(i, 100 + i, f"t{i}", f"t{i}") for i in range(n)]


def _heatmap(qtbot, n=12, row=5, title="L3 · query head 4", show=True):
    from attnscope.app.views.heatmap import HeatmapView

    v = HeatmapView()
    qtbot.addWidget(v)
    v.resize(700, 600)
    if show:
        v.show()
        qtbot.waitExposed(v)
    w = _map(n)
    v.set_weights(w, _tokens(n), _tokens(n), title=title)
    if row is not None:
        v.mark_row(row)
    return v, w


def _rsvg(svg_path, png_path):
    if shutil.which("rsvg-convert") is None:
        pytest.skip("rsvg-convert (librsvg2-bin) is not installed")
    subprocess.run(["rsvg-convert", str(svg_path), "-o", str(png_path)], check=True, timeout=60)
    return np.asarray(Image.open(png_path).convert("RGB")).astype(int)


def _scale(transform: str) -> float:
    m = re.match(r"matrix\(([^)]*)\)", transform or "")
    if not m:
        return 1.0
    a, b, c, d, *_ = (float(x) for x in m.group(1).split(","))
    return abs(a * d - b * c) ** 0.5


# -- SVG with a clicked row -------------------------------------------------------------------------------
def test_svg_clicked_row_outline_is_thin_and_cells_crisp(qtbot, tmp_path):
    v, w = _heatmap(qtbot)
    out = AP.render_widget(v, tmp_path / "row.svg")
    root = ET.parse(out).getroot()
    # every non-scaling stroke is drawn its intended width in user space (1.5 px outline, 1–2 px frames)
    parents = {c: p for p in root.iter() for c in p}
    for el in root.iter():
        if el.get("vector-effect") == "non-scaling-stroke" and el.get("stroke-width"):
            g = parents[el]
            px = float(el.get("stroke-width")) * _scale(g.get("transform"))
            assert px <= 3.0, (el.attrib, px)
    assert all("pixelated" in (im.get("style") or "") for im in root.iter(SVG + "image"))
    # rendered by librsvg: the marked row keeps its cells' colours, and each cell is one colour
    img = _rsvg(out, tmp_path / "row.png")
    rgb = to_rgb(w, "viridis", 0.0, 1.0)

    # locate the map: cell (0, 0) is its top-left block, cell (11, 11) its bottom-right (left of the colour bar)
    def block(colour):
        ys, xs = np.nonzero(np.all(np.abs(img[:, :600] - colour) <= 2, axis=2))
        assert len(xs), colour
        return xs, ys

    xs0, ys0 = block(rgb[0, 0])
    xs1, ys1 = block(rgb[11, 11])
    x0, top = xs0.min(), ys0.min()
    cell = (xs1.max() - x0 + 1) / 12
    assert cell >= 20 and abs((ys1.max() - top + 1) / 12 - cell) < 1
    for j in range(6):  # row 5, columns 0..5: the cell's colour at its centre and near its corners
        cx, cy = int(x0 + (j + 0.5) * cell), int(top + 5.5 * cell)
        for dx, dy in ((0, 0), (-int(cell / 3), -int(cell / 4)), (int(cell / 3), int(cell / 4))):
            assert np.abs(img[cy + dy, cx + dx] - rgb[5, j]).max() <= 3, (
                j,
                dx,
                dy,
                img[cy + dy, cx + dx],
                rgb[5, j],
            )


def test_svg_fixups_whole_kind():
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><desc>a\x0cb\x1b</desc>'
        '<g stroke-width="2" stroke-dasharray="4,2" transform="matrix(10,0,0,10,0,0)">'
        '<rect vector-effect="non-scaling-stroke" x="0" y="0" width="1" height="1"/></g>'
        "<text>\x07bell</text></svg>"
    )
    out = fix_svg(svg)
    root = ET.fromstring(out)
    assert root.find(SVG + "desc").text == "a␌b␛" and root.find(SVG + "text").text == "␇bell"
    rect = root.find(f"{SVG}g/{SVG}rect")
    assert float(rect.get("stroke-width")) == pytest.approx(0.2) and rect.get("stroke-dasharray") == "0.4,0.2"


def test_svg_figure_of_a_long_map_is_crisp(tmp_path):
    w = _map(300)  # > VECTOR_MAX_CELLS: one image
    out = AF.save_heatmap_figure(w, tmp_path / "big.svg", tokens=_tokens(300), size=(900, 800), dpi=100)
    root = ET.parse(out).getroot()
    images = list(root.iter(SVG + "image"))
    assert images and all("pixelated" in im.get("style") for im in images)


# -- PDF --------------------------------------------------------------------------------------------------------
def test_pdf_images_are_lossless(qtbot, tmp_path):
    out = AF.save_heatmap_figure(
        _map(300), tmp_path / "big.pdf", tokens=_tokens(300), size=(900, 800), dpi=100
    )
    data = out.read_bytes()
    assert b"/DCTDecode" not in data and b"/FlateDecode" in data and b"/Image" in data
    v, _ = _heatmap(qtbot)
    data = AP.render_widget(v, tmp_path / "view.pdf").read_bytes()
    assert b"/DCTDecode" not in data and b"/Image" in data


# -- Export → view: DPI, provenance, sizes ----------------------------------------------------------------------------
def test_view_png_records_the_chosen_dpi(qtbot, tmp_path):  # 384 recorded for 192
    v, _ = _heatmap(qtbot)
    out = AP.render_widget(v, tmp_path / "v.png", size=(700, 600), dpi=192)
    img = Image.open(out)
    assert img.size == (1400, 1200) and img.info["dpi"] == pytest.approx((192, 192), abs=0.03)
    AP.render_widget(v, tmp_path / "v96.png", size=(700, 600), dpi=96)
    assert Image.open(tmp_path / "v96.png").info["dpi"] == pytest.approx((96, 96), abs=0.03)


def test_embedded_provenance_png_and_svg(qtbot, tmp_path):
    v, _ = _heatmap(qtbot)
    meta = {"kind": "view", "prompt": "a\x0cb <&>", "token_texts": ["ör", "␛"]}
    png = provenance.embed_metadata(AP.render_widget(v, tmp_path / "v.png", dpi=192), meta)
    img = Image.open(png)
    assert json.loads(img.text["attnscope"]) == meta and img.info["dpi"] == pytest.approx(
        (192, 192), abs=0.03
    )
    svg = provenance.embed_metadata(AP.render_widget(v, tmp_path / "v.svg"), meta)
    assert json.loads(ET.parse(svg).getroot().find(SVG + "desc").text) == meta


@pytest.mark.parametrize("show", [True, False])
def test_small_size_is_whole_with_the_title_elided(qtbot, tmp_path, show):  # 320 × 240 was cropped
    title = "SmolLM2-135M-Instruct · Layer 3 · query head 4 (reads KV head 1) · step 2 · seq_len 29"
    v, _ = _heatmap(qtbot, title=title, show=show)
    yellow_rgb = to_rgb(np.array([[1.0]]), "viridis", 0, 1)[0, 0]
    for size in ((320, 240), (600, 450), (900, 700)):
        out = AP.render_widget(v, tmp_path / f"v{size[0]}.png", size=size, dpi=96)
        img = np.asarray(Image.open(out).convert("RGB")).astype(int)
        assert img.shape[:2] == (size[1], size[0])
        yellow = np.all(np.abs(img - yellow_rgb) <= 12, axis=2)
        cols = np.nonzero(yellow.any(axis=0))[0]
        # the map's cell (0, 0) and the colour bar's top: two yellow areas, the bar near the right edge
        assert len(cols) and cols.max() > 0.7 * size[0], (size, cols.max() if len(cols) else None)
        assert v.plot.titleLabel.text == title  # the on-screen title is put back
    # below what even the elided view needs: one line, no file
    with pytest.raises(
        ValueError, match=r"^60 × 40 px is too small for this view: it needs at least \d+ × \d+ px"
    ):
        AP.render_widget(v, tmp_path / "tiny.png", size=(60, 40), dpi=96)
    assert not (tmp_path / "tiny.png").exists()


# -- animations ---------------------------------------------------------------------------------------------------------
def test_figure_frame_has_labels_and_colour_bar(tmp_path):
    w = _map(10)
    frame = AF.figure_frame(w, 7, tokens=_tokens(10), title="L0 H0 · step 1/3 · seq_len 7 · new token 't6'")
    assert frame.mode == "P" and frame.size == AF.FRAME_SIZE
    rgb = np.asarray(frame.convert("RGB")).astype(int)
    dark = np.all(rgb < 80, axis=2)
    assert dark[:, :80].sum() > 200  # query labels and axis title on the left
    top = to_rgb(np.array([[1.0]]), "viridis", 0, 1)[0, 0]
    assert np.all(np.abs(rgb - top) <= 6, axis=2)[:, 560:].any()  # the colour bar's yellow end


def test_animation_frames_are_figures(smol_ran, tmp_path):
    s = smol_ran
    s.prefill("The quick brown fox", chat_template=False)
    s.step(2)
    out, side = animation.export_animation(s, 0, 0, tmp_path / "a.gif", frame_renderer=AF.figure_frame)
    img = Image.open(out)
    assert img.n_frames == 3 and img.size == AF.FRAME_SIZE
    assert json.loads(side.read_text())["frames"] == 3


class _Engine(QObject):
    progress = Signal(str, float)

    def __init__(self, session):
        super().__init__()
        self.session = session

    def enqueue(self, job, done, error, label=""):
        class Ctx:
            session = self.session

            @staticmethod
            def progress(*a):
                pass

            @staticmethod
            def cancelled():
                return False

            @staticmethod
            def require():
                return self.session

        try:
            done(job(Ctx()))
        except Exception as e:  # as the engine reports errors
            error(str(e))
        return 1


def _window(qtbot, session):
    from attnscope.app.state import ViewState
    from PySide6.QtWidgets import QMainWindow

    win = QMainWindow()
    qtbot.addWidget(win)
    win.engine = _Engine(session)
    win.snapshot = session.snapshot()
    win.state = ViewState(snapshot=win.snapshot)  # layer 0, head 0, viridis (what the dialog reads)
    win.layer, win.head = 0, 0
    return win


def test_batch_mp4_switch_renames_and_writes_mp4(qtbot, smol_ran, tmp_path, monkeypatch):
    s = smol_ran
    s.prefill("The quick brown fox", chat_template=False)
    s.step(2)
    win = _window(qtbot, s)
    d = AE.BatchExportDialog(win)
    qtbot.addWidget(d)
    choose_export_scope(d, "steps")
    d.path_edit.setText(str(tmp_path / "steps.gif"))
    if animation.mp4_unavailable():
        pytest.skip(animation.mp4_unavailable())
    choose_export_format(d, "mp4")
    assert d.path_edit.text() == str(tmp_path / "steps.mp4")  # the name follows the format
    d.path_edit.setText(str(tmp_path / "typed.gif"))  # a stale suffix typed by hand: the Format decides
    d.start()
    assert d.message.startswith("Wrote 1 file(s)"), d.message
    data = (tmp_path / "typed.mp4").read_bytes()
    assert data[4:8] == b"ftyp" and not (tmp_path / "typed.gif").exists()
    choose_export_format(d, "gif")
    assert d.path_edit.text() == str(tmp_path / "typed.gif")


def test_mp4_unavailable_is_said(qtbot, smol_ran, monkeypatch):  # the packaged app without imageio-ffmpeg
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "imageio_ffmpeg" else real(name, *a)
    )
    why = animation.mp4_unavailable()
    assert why.startswith("MP4 is unavailable:") and "imageio-ffmpeg" in why and "GIF" in why
    monkeypatch.setattr("sys.frozen", True, raising=False)
    assert "ATTNSCOPE_WITH_MP4=1" in animation.mp4_unavailable()
    win = _window(qtbot, smol_ran)
    d = AE.BatchExportDialog(win)
    qtbot.addWidget(d)
    choose_export_scope(d, "steps")
    item = d.format_combo.model().item(1)
    assert not item.isEnabled() and "unavailable" in item.text()
    assert d.format_combo.itemData(1, Qt.ToolTipRole) == animation.mp4_unavailable()
    with pytest.raises(ValueError, match="^MP4 is unavailable"):
        choose_export_format(d, "mp4")
    with pytest.raises(ValueError, match="^MP4 is unavailable"):
        animation.save_animation([Image.new("P", (4, 4))], "/tmp/x.mp4")
