"""PNG/SVG/PDF through Qt's own paint devices (figure cells carry the colour map's colour,
SVG and PDF parse), any tab rendered at a chosen size/DPI, and the window's export, batch and session commands."""

from __future__ import annotations

import json
import re
import sys
import threading
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from attnscope.app import export_dialogs as AE
from attnscope.app import figure as AF
from attnscope.app import paint as AP
from attnscope.core.io.colormaps import ColourSpec, to_rgb
from attnscope.core.tokens import Token
from gui_helpers import choose_export_format, choose_export_scope
from PIL import Image
from PySide6.QtCore import Qt

SVG = "{http://www.w3.org/2000/svg}"


def _map(n: int, seed: int = 0) -> np.ndarray:
    """A causal attention-like map: lower triangle, rows summing to 1."""
    rng = np.random.default_rng(seed)
    w = np.tril(rng.random((n, n)) ** 3).astype(np.float32)
    return w / w.sum(axis=1, keepdims=True)


def _tokens(n: int) -> list[Token]:
    words = ["The", " cat", " sat", " on", " the", " mat", ".", "↵", " It", " was", " happy", " "]
    return [Token(i, 100 + i, words[i % len(words)], words[i % len(words)]) for i in range(n)]


def _paint(path, w, size=(900, 800), dpi=120.0, **kw):
    """Paint the figure into ``path`` and return the map's rectangle (x, y, width, height) in figure px."""
    rects = []
    labels = [t.text for t in _tokens(w.shape[0])]
    AP.paint_to_file(
        path,
        size,
        lambda p: rects.append(AF.paint_heatmap(p, size, w, labels, labels, title="T itle", dpi=dpi, **kw)),
        dpi=dpi,
        title="T itle",
        metadata={"layer": 3},
        crisp_svg=True,
    )
    r = rects[0]
    return r.x(), r.y(), r.width(), r.height()


def test_void_qt_calls_keep_none_alive(qapp):
    """PySide6 6.12.0 took a reference from None on every void call (Python aborted with
    'Fatal Python error: none_dealloc' after ~50 000 calls); pyproject pins a release without the bug."""
    from PySide6.QtCore import QRectF
    from PySide6.QtWidgets import QLabel

    r, label = QRectF(), QLabel()
    before = sys.getrefcount(None)
    for _ in range(20_000):
        r.setWidth(1.0)
        label.setText("x")
    assert abs(before - sys.getrefcount(None)) < 100


def test_figure_png_cells_carry_the_colour_map_colour(tmp_path):
    w = _map(14)
    x, y, cw, ch = _paint(tmp_path / "f.png", w, colour=ColourSpec(cmap="magma"))
    img = Image.open(tmp_path / "f.png")
    assert img.size == (900, 800)
    assert img.info["dpi"] == pytest.approx((120, 120), abs=0.02)  # PNG stores whole dots per metre
    assert json.loads(img.text["attnscope"]) == {"layer": 3}
    a = np.asarray(img.convert("RGB"))
    cell = cw / 14
    assert cell == int(cell) and ch == cw  # square, whole-pixel cells
    centres = a[(y + (np.arange(14) + 0.5) * cell).astype(int)][
        :, (x + (np.arange(14) + 0.5) * cell).astype(int)
    ]
    np.testing.assert_array_equal(centres, to_rgb(w, "magma"))
    # left of the map: white margin with labels, never the map colours
    assert tuple(a[int(y + 2), 2]) == (255, 255, 255)


def test_figure_svg_parses_and_every_cell_has_its_colour(tmp_path):
    w = _map(12, seed=1)
    x, y, cw, ch = _paint(tmp_path / "f.svg", w, size=(900, 800), dpi=120)
    root = ET.parse(tmp_path / "f.svg").getroot()
    assert root.tag == SVG + "svg"
    assert root.get("viewBox") == "0 0 900 800"
    assert float(root.get("width").rstrip("m")) == pytest.approx(900 / 120 * 25.4, abs=0.01)  # mm
    assert json.loads(root.find(SVG + "desc").text) == {"layer": 3}
    assert root.get("shape-rendering") == "crispEdges"  # no anti-aliased seams between cells in viewers
    # painter's order: the last rectangle covering a cell's centre gives its colour
    cell = cw / 12
    want = to_rgb(w)
    got = np.zeros((12, 12, 3), dtype=int) - 1
    for g in root.iter(SVG + "g"):
        fill = g.get("fill", "")
        if not re.fullmatch(r"#[0-9a-f]{6}", fill):
            continue
        rgb = [int(fill[k : k + 2], 16) for k in (1, 3, 5)]
        for r in g.findall(SVG + "rect"):
            rx, ry, rw, rh = (float(r.get(k)) for k in ("x", "y", "width", "height"))
            for i in range(12):
                cy = y + (i + 0.5) * cell
                if not ry <= cy < ry + rh:
                    continue
                for j in range(12):
                    cx = x + (j + 0.5) * cell
                    if rx <= cx < rx + rw:
                        got[i, j] = rgb
    np.testing.assert_array_equal(got, want)
    texts = ["".join(t.itertext()) for t in root.iter(SVG + "text")]
    assert "T itle" in texts and " cat" in texts and "↵" in texts and "␣" in texts
    assert "attention weight" in texts and "1.00" in texts and "0.00" in texts
    assert len(list(root.iter(SVG + "image"))) == 1  # only the colour bar: cells are vector rectangles


def test_single_pdf_gets_a_sidecar(smol_ran, tmp_path):
    """A PDF cannot carry the JSON metadata (PNG has a text chunk, SVG a <desc>): it goes beside it."""
    from attnscope.core.io import head_export

    files = head_export.export_head(smol_ran, 4, 7, tmp_path / "f.pdf", renderer=AF.save_heatmap_figure)
    assert files == [tmp_path / "f.pdf", tmp_path / "f.pdf.json"]
    assert (tmp_path / "f.pdf").read_bytes().startswith(b"%PDF-")
    meta = json.loads((tmp_path / "f.pdf.json").read_text())
    assert (meta["layer"], meta["head"], meta["token_ids"]) == (4, 7, smol_ran.ids)
    assert meta["exact"] is True


def test_figure_pdf_parses(tmp_path):
    w = _map(10)
    _paint(tmp_path / "f.pdf", w, size=(900, 800), dpi=150)
    data = (tmp_path / "f.pdf").read_bytes()
    assert data.startswith(b"%PDF-1.") and data.rstrip().endswith(b"%%EOF") and b"startxref" in data
    assert len(re.findall(rb"/Type\s*/Page\b", data)) == 1
    box = [float(v) for v in re.search(rb"/MediaBox\s*\[([^\]]+)\]", data).group(1).split()]
    assert box[2] - box[0] == pytest.approx(900 / 150 * 72, abs=0.6)  # points
    assert box[3] - box[1] == pytest.approx(800 / 150 * 72, abs=0.6)
    assert b"AttnScope" in data  # creator


def test_large_maps_are_images_and_pooling_keeps_spikes(tmp_path):
    w = _map(300)
    x, y, cw, _ = _paint(tmp_path / "big.svg", w, size=(1000, 1000), dpi=100)
    root = ET.parse(tmp_path / "big.svg").getroot()
    assert len(list(root.iter(SVG + "image"))) == 2  # the map and the colour bar
    assert len(list(root.iter(SVG + "rect"))) < 10  # frames, not 45 000 cells
    # more cells than pixels: max-pooled, so one strong weight stays visible
    w = np.zeros((3000, 3000), dtype=np.float32)
    w[1234, 17] = 1.0
    x, y, cw, ch = _paint(tmp_path / "huge.png", w, size=(600, 600), dpi=72)
    a = np.asarray(Image.open(tmp_path / "huge.png").convert("RGB"))
    inside = a[int(y) + 1 : int(y + ch) - 1, int(x) + 1 : int(x + cw) - 1].reshape(-1, 3)
    assert (inside == to_rgb(np.ones((1, 1)))[0, 0]).all(axis=1).sum() >= 1


def test_save_heatmap_figure_defaults_and_errors(tmp_path):
    w = _map(6)
    p = AF.save_heatmap_figure(w, tmp_path / "d.png", tokens=_tokens(6), title="x", dpi=100)
    assert Image.open(p).size == (800, 700)  # 8 × 7 inches at 100 dpi
    with pytest.raises(ValueError, match="unsupported image"):
        AF.save_heatmap_figure(w, tmp_path / "d.tif")
    with pytest.raises(FileNotFoundError):
        AF.save_heatmap_figure(w, tmp_path / "no" / "d.png")
    with pytest.raises(ValueError, match="non-empty 2-D"):
        AF.save_heatmap_figure(np.zeros((0, 0)), tmp_path / "e.png")


def test_render_widget_size_dpi_and_whole_tables(qtbot, tmp_path):
    from PySide6.QtWidgets import QTableWidget, QTableWidgetItem

    t = QTableWidget(40, 3)
    for i in range(40):
        t.setItem(i, 0, QTableWidgetItem(f"row {i}"))
    qtbot.addWidget(t)
    t.resize(300, 200)
    t.show()
    qtbot.waitExposed(t)
    AP.render_widget(t, tmp_path / "t.png", dpi=96)
    full = Image.open(tmp_path / "t.png").size
    assert full[1] >= 40 * t.rowHeight(0)  # every row, not the 200 px on screen
    assert t.size().width() == 300 and t.size().height() == 200  # put back
    AP.render_widget(t, tmp_path / "s.png", size=(400, 300), dpi=192)
    assert Image.open(tmp_path / "s.png").size == (800, 600)  # size × dpi / 96
    AP.render_widget(t, tmp_path / "t.svg", size=(400, 300))
    root = ET.parse(tmp_path / "t.svg").getroot()
    assert root.get("viewBox") == "0 0 400 300"
    assert "row 3" in ["".join(x.itertext()) for x in root.iter(SVG + "text")]
    AP.render_widget(t, tmp_path / "t.pdf", size=(400, 300))
    assert (tmp_path / "t.pdf").read_bytes().startswith(b"%PDF-")


# -- the window -----------------------------------------------------------------------------------------------
@pytest.fixture()
def ran_window(make_window):
    win = make_window(size=(1300, 850))
    win.prompt_edit.setPlainText("The quick brown fox jumps over the lazy dog.")
    win.chat_check.setChecked(False)
    win.run_prompt()
    assert win.engine.wait_idle(120)
    win.step(2)
    assert win.engine.wait_idle(120)
    win.select(3, 4)
    assert win.engine.wait_idle(60)
    return win


@pytest.mark.slow
def test_window_exports_batches_and_sessions(ran_window, qtbot, tmp_path, monkeypatch):
    win = ran_window
    s = win.engine.session
    ex = win.exports
    assert win.weights is not None and win.weights_key == (3, 4)

    # every tab renders to PNG, SVG and PDF; a sidecar with the session's provenance follows
    for key in win.views:
        win.show_view(key)
        win._refresh_current_view()
        assert win.engine.wait_idle(120)
        for ext in ("png", "svg", "pdf"):
            out = ex.export_view(tmp_path / f"{key}.{ext}", dpi=144)[0]
            assert out.stat().st_size > 1000
    assert win.engine.wait_idle(60)
    side = json.loads((tmp_path / "heatmap.svg.json").read_text())
    assert side["view"] == "heatmap" and side["token_ids"] == s.ids and side["view_state"]["layer"] == 3
    win.show_view("heatmap")
    img = Image.open(tmp_path / "heatmap.png")
    plot = win.heatmap.glw.size()  # the plot only: not the option bar or the hint line
    assert img.size == (round(plot.width() * 1.5), round(plot.height() * 1.5))
    assert plot.height() < win.views["heatmap"].height()
    ET.parse(tmp_path / "grid.svg")  # a scroll area: its whole canvas
    assert Image.open(tmp_path / "grid.png").size[1] >= win.grid.canvas.height() * 1.5 - 1

    # data of the map on screen (+ sidecar)
    ex.export_data(tmp_path / "m.safetensors")
    assert win.engine.wait_idle(60) and win.last_error is None
    from export_files import read_data

    np.testing.assert_array_equal(read_data(tmp_path / "m.safetensors"), win.weights)
    assert json.loads((tmp_path / "m.safetensors.json").read_text())["head"] == 4

    # batch: every head of the layer as .npy, equal to the engine's weights
    d = AE.BatchExportDialog(win)
    qtbot.addWidget(d)
    choose_export_scope(d, "layer")
    choose_export_format(d, "npy")
    d.path_edit.setText(str(tmp_path / "layer3"))
    d.start()
    assert win.engine.wait_idle(120)
    assert d.message.startswith("Wrote 9 file(s)") and d.progress_bar.value() == 1000
    for h in range(9):
        np.testing.assert_array_equal(np.load(tmp_path / "layer3" / f"L03_H{h:02d}.npy"), s.weights(3, h))
    # every layer × head as SVG figures, cancelled after a few files
    # (the 5th figure waits on the engine thread until Cancel was pressed: 270 small SVGs can take
    # under a second, so cancelling "a bit later" would race the end of the job)
    written, reached, released = [], threading.Event(), threading.Event()
    render = AF.save_heatmap_figure

    def held_renderer(*args, **kwargs):
        written.append(render(*args, **kwargs))
        if len(written) == 5:
            reached.set()
            released.wait(60)
        return written[-1]

    monkeypatch.setattr(AE, "save_heatmap_figure", held_renderer)
    choose_export_scope(d, "all")
    choose_export_format(d, "svg", True)
    d.path_edit.setText(str(tmp_path / "all"))
    d.start()
    qtbot.waitUntil(reached.is_set, timeout=60_000)
    d.cancel()
    released.set()
    assert win.engine.wait_idle(120)
    monkeypatch.undo()
    m = re.fullmatch(r"Stopped: batch export stopped after (\d+) of 270 files", d.message)
    assert m and int(m.group(1)) == 5, d.message
    assert len(list((tmp_path / "all").glob("*.svg"))) == int(m.group(1))
    assert json.loads((tmp_path / "all" / "manifest.json").read_text())["complete"] is False
    # every decode step as a GIF
    choose_export_scope(d, "steps")
    d.path_edit.setText(str(tmp_path / "steps.gif"))
    d.start()
    assert win.engine.wait_idle(60)
    assert Image.open(tmp_path / "steps.gif").n_frames == 3

    # save, wander off, reopen: same tokens, same weights, same view (the tabs' own controls too)
    win.cmap_combo.setCurrentText("cividis")
    sinks, kv, exp = win.views["sinks"], win.views["kv"], win.views["experiments"]
    sinks.threshold_spin.setValue(0.35)
    kv.calc_tokens.setValue(123_456)
    exp.kind_combo.setCurrentIndex(exp.kind_combo.count() - 1)
    exp_kind = exp.kind_combo.currentText()
    win.sessions.save_session(tmp_path / "s.attnscope")
    assert win.engine.wait_idle(60)
    saved_views = json.loads((tmp_path / "s.attnscope").read_text())["view"]["views"]
    assert saved_views["sinks"]["threshold_spin"] == 0.35 and saved_views["kv"]["calc_tokens"] == 123_456
    sinks.threshold_spin.setValue(0.8)
    kv.calc_tokens.setValue(1)
    exp.kind_combo.setCurrentIndex(0)
    ids, w = list(s.ids), win.weights.copy()
    win.prompt_edit.setPlainText("Something else entirely.")
    win.cmap_combo.setCurrentText("viridis")
    win.run_prompt()
    assert win.engine.wait_idle(120)
    win.select(0, 0)
    win.show_view("grid")
    assert win.engine.wait_idle(60)
    win.sessions.open_session(tmp_path / "s.attnscope")
    assert win.engine.wait_idle(300)
    assert win.engine.wait_idle(60)
    assert win.last_error is None and win.sessions.last_warnings == []
    assert [t.id for t in win.snapshot.tokens] == ids and win.snapshot.n_generated == 2
    assert (win.layer, win.head) == (3, 4) and win.cmap_combo.currentText() == "cividis"
    assert win.tabs.currentWidget() is win.views["heatmap"]
    assert win.prompt_edit.toPlainText() == "The quick brown fox jumps over the lazy dog."
    np.testing.assert_array_equal(win.weights, w)
    assert sinks.threshold_spin.value() == 0.35 and kv.calc_tokens.value() == 123_456
    assert exp.kind_combo.currentText() == exp_kind
    # a hand-edited session with nonsense in the views' state still opens
    sinks.restore_view_state({"threshold_spin": "lots", "metric_combo": "no such metric", "unknown": 1})
    assert sinks.threshold_spin.value() == 0.35


def test_open_bad_session_shows_one_line(ran_window, tmp_path):
    p = tmp_path / "bad.attnscope"
    p.write_text("{}")
    assert ran_window.sessions.open_session(p) is None
    assert ran_window.last_error.startswith("Could not open the session: not an AttnScope session file")


def test_export_view_shows_every_row_of_a_tab_table(ran_window, tmp_path):
    """Export → view of the Sinks tab: the picture holds all 30 layer rows, not the scrolled part
    on screen; the tab is put back as it was."""
    win = ran_window
    win.show_view("sinks")
    win._refresh_current_view()
    assert win.engine.wait_idle(120)
    view, page = win.views["sinks"], win.tabs.page_of(win.views["sinks"])
    before = view.size()
    t = view.table
    hidden = t.verticalHeader().length() - t.viewport().height()
    assert t.rowCount() == 30 and hidden > 0  # on screen the table scrolls
    out = win.exports.export_view(tmp_path / "sinks.png", dpi=96)[0]
    assert win.engine.wait_idle(60)
    img = Image.open(out)
    assert img.size[0] == before.width() and img.size[1] >= before.height() + hidden
    assert view.size() == before and page.widgetResizable()
    assert t.verticalScrollBarPolicy() == Qt.ScrollBarAsNeeded


def test_file_dialogs_start_in_the_folder_of_the_last_file(ran_window, tmp_path, monkeypatch):
    """Export view, Export data and Save/Open session all start where the last file went (they
    always offered the home folder, or the current one)."""
    from attnscope.app import export_dialogs as X
    from PySide6.QtWidgets import QFileDialog

    win = ran_window
    figs = tmp_path / "figs"
    figs.mkdir()

    def accept_into_figs(dlg):  # the user types a path in the figures folder and presses OK
        dlg.path_edit.setText(str(figs / "grid.png"))
        return 1

    monkeypatch.setattr(X.ExportViewDialog, "exec", accept_into_figs)
    win.exports.export_view_dialog()
    assert (figs / "grid.png").is_file()
    offered = []

    def save_name(parent, title, start, filters):
        offered.append(start)
        return "", ""

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_name)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", save_name)
    win.exports.export_data_dialog()
    win.sessions.save_session_dialog()
    win.sessions.open_session_dialog()
    from pathlib import Path

    data_start, session_start, open_start = offered
    assert Path(data_start).parent == figs and Path(data_start).suffix == ".npy"
    assert Path(session_start) == figs / "session.attnscope" and Path(open_start) == figs
    key = win.exports.current_view_key()
    assert X.ExportViewDialog(win, key, win.size()).path() == str(figs / f"attnscope_{key}.png")
