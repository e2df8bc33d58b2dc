"""The default colour scale is chosen from the map's own weights (log where the linear [0, 1] map
would be a dark field), and every CSV export names its rows and columns with the tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest
from attnscope.core.io import colour_scale, data_writers, head_export
from attnscope.core.io.colormaps import COLOUR_BY_LENGTH, ColourSpec
from PIL import Image


def _causal(rows: list[list[float]]) -> np.ndarray:
    w = np.zeros((len(rows), len(rows)), np.float32)
    for i, r in enumerate(rows):
        w[i, : len(r)] = r
    return w


def test_linear_share_counts_the_allowed_cells_that_show_on_linear():
    # 6 allowed cells (the zeros above the diagonal are masked); weights ≥ 1/64 show: 1, .5, .5, .98 -> 4 of 6
    w = _causal([[1.0], [0.5, 0.5], [0.01, 0.01, 0.98]])
    assert colour_scale.linear_share(w) == pytest.approx(4 / 6)
    # an explicit mask wins over "exactly 0 is masked": a real 0 weight counts as not shown
    masked = np.triu(np.ones((3, 3), bool), 1)
    w2 = w.copy()
    w2[2, 0] = 0.0
    assert colour_scale.linear_share(w2, masked) == pytest.approx(4 / 6)
    # NaN cells are not weights: neither shown nor counted
    w3 = w.copy()
    w3[2, :] = np.nan
    assert colour_scale.linear_share(w3, masked) == pytest.approx(3 / 3)
    # several maps shown together: one share for all of them
    assert colour_scale.linear_share([w, w]) == pytest.approx(8 / 12)


def test_default_colour_scale_follows_the_weights_not_a_length():
    rng = np.random.default_rng(0)

    def softmax_map(n, sharp):
        s = rng.normal(size=(n, n)) * sharp
        s[np.triu_indices(n, 1)] = -np.inf
        e = np.exp(s - s.max(1, keepdims=True))
        return (e / e.sum(1, keepdims=True)).astype(np.float32)

    short = softmax_map(12, 1.0)
    assert colour_scale.scale_for_map(short).scale == "linear"
    diffuse = softmax_map(300, 0.5)  # ~1/q a cell: a dark field on linear, 300 tokens << 2,048
    c = colour_scale.scale_for_map(diffuse)
    assert c.scale == "log" and c.share < 0.25 and "would show on linear" in c.note()
    # a previous-token head: sharp, few cells show at 100 tokens -> log as well
    prev = np.zeros((100, 100), np.float32)
    prev[0, 0] = 1
    for q in range(1, 100):
        prev[q, q - 1], prev[q, : q - 1] = 0.9, 0.1 / max(1, q - 1)
        if q == 1:
            prev[q, 0] = 1.0
    assert colour_scale.scale_for_map(prev).scale == "log"
    # from LONG_MAP tokens by length (a long map is not held whole)
    assert (
        colour_scale.scale_for_map(short, n=colour_scale.LONG_MAP).note()
        == "log colours (chosen for 2,048 tokens)"
    )


@pytest.fixture(scope="module")
def sess(tmp_path_factory):
    from attnscope.core.session import Session
    from tiny_models import save_tiny

    folder = tmp_path_factory.mktemp("llama_scale")
    save_tiny("llama", folder)
    s = Session.load(str(folder), device="cpu")
    s.prefill("The cat sat on the mat. The dog sat on the log. " * 4, chat_template=False)
    return s


def _off_zero(img: np.ndarray, colour: ColourSpec, allowed: np.ndarray) -> float:
    """Share of the allowed cells' pixels at least 4 colour levels away from the map's zero colour."""
    lut = colour.lut().astype(int)
    dist = np.abs(img.astype(int) - lut[0]).sum(-1)
    return float((dist[allowed] > np.abs(lut[4] - lut[0]).sum()).mean())


def _cells(img: np.ndarray, n: int) -> np.ndarray:
    """``(n, n, 3)``: the centre pixel of each cell of a bare PNG (square cells, scaled up)."""
    side = img.shape[0] // n
    assert img.shape[:2] == (n * side, n * side)
    c = np.arange(n) * side + side // 2
    return img[np.ix_(c, c)]


def test_the_default_bare_png_of_a_diffuse_head_is_not_blank(sess, tmp_path):
    """The issue's kind: far below 2,048 tokens a head's default PNG was a flat field on linear."""
    n = sess.seq_len
    assert 150 < n < colour_scale.LONG_MAP
    (out,) = head_export.export_head(sess, 1, 0, tmp_path / "h.png", colour=COLOUR_BY_LENGTH)
    img = _cells(np.asarray(Image.open(out).convert("RGB")), n)
    meta = json.loads(Image.open(out).info["attnscope"])
    assert meta["colour"]["scale"] == "log" and meta["colour"]["scale_chosen"] == "by the map's weights"
    assert 0 <= meta["colour"]["linear_share"] < colour_scale.LINEAR_MIN_SHARE
    allowed = np.tril(np.ones((n, n), bool))
    assert _off_zero(img, ColourSpec(scale="log"), allowed) > 0.9  # the picture shows its cells
    (lin,) = head_export.export_head(sess, 1, 0, tmp_path / "lin.png", colour=ColourSpec(scale="linear"))
    lin_img = _cells(np.asarray(Image.open(lin).convert("RGB")), n)
    assert _off_zero(lin_img, ColourSpec(scale="linear"), allowed) < 0.25  # what the old default drew
    assert json.loads(Image.open(lin).info["attnscope"])["colour"]["scale_chosen"] == "by the user"


def test_map_csv_has_token_labels_in_its_header_row_and_column(sess, tmp_path):
    n = 5
    out = head_export.export_head(sess, 0, 1, tmp_path / "m.csv", n=n)[0]
    lines = out.read_text(encoding="utf-8").splitlines()
    toks = sess.tokens[:n]
    header = lines[0].split(",")
    assert header[0] == data_writers.CSV_CORNER
    assert [h.strip('"') for h in header[1:]] == [f"{t.position}:{t.text}" for t in toks]
    assert lines[1].split(",")[0].strip('"') == f"0:{toks[0].text}"
    w, rows, cols = data_writers.read_map_csv(out)
    np.testing.assert_array_equal(w, sess.weights(0, 1, slice(0, n), slice(0, n)))
    assert rows == cols == data_writers.csv_labels(n, toks)


def test_csv_labels_are_one_line_and_never_a_formula(tmp_path):
    from attnscope.core.tokens import Token

    toks = [Token(0, 1, "=", "=SUM(A1)"), Token(1, 2, "\n", 'a,\n"b"')]
    path = data_writers.write_map_csv(np.eye(2, dtype=np.float32), tmp_path / "x.csv", toks)
    w, rows, cols = data_writers.read_map_csv(path)
    assert cols == ["0:=SUM(A1)", '1:a,↵"b"'] and rows == cols  # quoted by csv, newline made visible
    assert all(c[0].isdigit() for c in cols)
    np.testing.assert_array_equal(w, np.eye(2))
    assert len(path.read_text(encoding="utf-8").splitlines()) == 3
    with pytest.raises(ValueError, match="not an AttnScope map CSV"):
        (tmp_path / "y.csv").write_text("1,2\n3,4\n")
        data_writers.read_map_csv(tmp_path / "y.csv")
