"""Long-map exports: the streamed PNG equals the in-memory one; pooled overviews record their pooling;
full size above the limit needs a flag; colours by length."""

from __future__ import annotations

import json

import numpy as np
import pytest
from attnscope.core.analysis import aggregate
from attnscope.core.analysis.pooling import max_pool
from attnscope.core.io import colour_scale, data_writers, head_export, long_png
from attnscope.core.io.colormaps import ColourSpec, to_rgb
from PIL import Image
from tiny_models import save_tiny


@pytest.fixture(scope="module")
def sess(tmp_path_factory):
    from attnscope.core.session import Session

    folder = tmp_path_factory.mktemp("xl_tiny")
    save_tiny("llama", folder, seed=7)
    s = Session.load(str(folder))
    s.prefill("a long map is a short map seen from far away, they say, and so it is", chat_template=False)
    return s


def _pixels(path):
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")), dict(im.info)


def test_streamed_png_equals_pillow(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.random((37, 53)).astype(np.float32) ** 4
    data_writers.save_map_png(
        w, tmp_path / "pil.png", ColourSpec(cmap="magma", scale="log", vmax=0.8), size=(53, 37)
    )
    bands = [
        to_rgb(w[a : a + 5], "magma", 0.0, 0.8, "log") for a in range(0, 37, 5)
    ]  # 8 bands, last of 2 rows
    long_png.write_png_rows(tmp_path / "stream.png", 53, 37, bands, metadata={"a": 1, "é": "ü"}, dpi=300)
    a, _ = _pixels(tmp_path / "pil.png")
    b, info = _pixels(tmp_path / "stream.png")
    np.testing.assert_array_equal(a, b)
    assert json.loads(info["attnscope"]) == {"a": 1, "é": "ü"}
    assert round(info["dpi"][0]) == 300


def test_bands_must_add_up(tmp_path):
    with pytest.raises(ValueError, match="rows"):
        long_png.write_png_rows(tmp_path / "x.png", 4, 5, [np.zeros((3, 4, 3), np.uint8)])
    with pytest.raises(ValueError, match="band of shape"):
        long_png.write_png_rows(tmp_path / "x.png", 4, 3, [np.zeros((3, 5, 3), np.uint8)])
    assert not (tmp_path / "x.png").exists() and not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("mode", ["head", "all"])
def test_full_size_stream_equals_the_in_memory_map(sess, tmp_path, mode):
    s = sess
    n = s.seq_len
    w = aggregate.map_at(s, 1, 1, mode)
    # the streamed bands draw the cells as every image does (masked ones hatched, the hatch continuing
    # across bands): the in-memory PNG of the same mask
    masked = head_export.map_mask(s, 1, n, mode)
    data_writers.save_map_png(w, tmp_path / "mem.png", ColourSpec(scale="log"), size=(n, n), masked=masked)
    long_png.export_long_png(
        s, 1, 1, tmp_path / "st.png", n=n, mode=mode, full_size=True, colour=ColourSpec(scale="log")
    )
    a, _ = _pixels(tmp_path / "mem.png")
    b, info = _pixels(tmp_path / "st.png")
    assert a.shape == (n, n, 3)
    np.testing.assert_array_equal(a, b)
    assert json.loads(info["attnscope"])["pooling"] is None


def test_overview_is_max_pooled_and_says_so(sess, tmp_path):
    s = sess
    n = s.seq_len
    long_png.export_long_png(
        s, 0, 2, tmp_path / "ov.png", n=n, size=(9, 6), colour=ColourSpec(), metadata={"x": 1}
    )
    img, info = _pixels(tmp_path / "ov.png")
    assert img.shape == (6, 9, 3)
    np.testing.assert_array_equal(img, _overview(s.weights(0, 2), 6, 9, ColourSpec()))
    meta = json.loads(info["attnscope"])
    assert meta["x"] == 1 and meta["pooling"]["kind"] == "max" and meta["pooling"]["image_size"] == [9, 6]
    assert meta["pooling"]["map_size"] == [n, n]
    with pytest.raises(ValueError, match="larger than"):
        long_png.export_long_png(s, 0, 2, tmp_path / "big.png", n=n, size=(n + 1, 4))


def _overview(w, rows, cols, colour):
    """The max-pooled overview as drawn: block maxima coloured, blocks of only masked cells hatched."""
    from attnscope.core.analysis.pooling import block_edges
    from attnscope.core.attention.masks import hidden_blocks
    from attnscope.core.io.render import map_pixels

    n = w.shape[0]
    pooled = max_pool(w, rows, cols)
    masked = hidden_blocks(block_edges(n, rows), block_edges(n, cols))
    # the colours of the blocks with an allowed cell are to_rgb's
    np.testing.assert_array_equal(
        map_pixels(pooled, colour, masked=masked)[~masked],
        to_rgb(pooled, colour.cmap, scale=colour.scale)[~masked],
    )
    return map_pixels(pooled, colour, masked=masked)


def test_full_size_above_the_limit_needs_the_flag(sess, tmp_path, monkeypatch):
    s = sess
    n = s.seq_len
    monkeypatch.setattr(long_png, "FULL_SIZE_LIMIT", n - 1)
    with pytest.raises(ValueError, match="--full-size"):
        long_png.export_long_png(s, 0, 0, tmp_path / "f.png", n=n, size=(n, n))
    long_png.export_long_png(s, 0, 0, tmp_path / "f.png", n=n, full_size=True)
    assert _pixels(tmp_path / "f.png")[0].shape == (n, n, 3)


def test_colours_by_length():
    assert (
        colour_scale.default_colour_scale(2047) == "linear"
        and colour_scale.default_colour_scale(2048) == "log"
    )
    assert colour_scale.scale_note(4096, "log", True) == "log colours (chosen for 4,096 tokens)"


def test_export_head_routes_long_maps(sess, tmp_path, monkeypatch):
    """A bare PNG from LONG_MAP tokens: overview by default, log colours chosen by length, all recorded."""
    s = sess
    n = s.seq_len
    monkeypatch.setattr(colour_scale, "LONG_MAP", 8)
    monkeypatch.setattr(long_png, "OVERVIEW_SIDE", 8)
    (out,) = head_export.export_head(s, 1, 0, tmp_path / "long.png")
    img, info = _pixels(out)
    meta = json.loads(info["attnscope"])
    assert img.shape == (8, 8, 3)
    assert meta["colour"]["scale"] == "log" and meta["colour"]["scale_chosen"] == "by length"
    assert meta["pooling"]["kind"] == "max"
    np.testing.assert_array_equal(img, _overview(s.weights(1, 0), 8, 8, ColourSpec(scale="log")))
    # the user's choice wins and is said
    (out,) = head_export.export_head(s, 1, 0, tmp_path / "lin.png", colour=ColourSpec(), full_size=True)
    img, info = _pixels(out)
    assert img.shape == (n, n, 3)
    assert json.loads(info["attnscope"])["colour"]["scale_chosen"] == "by the user"
