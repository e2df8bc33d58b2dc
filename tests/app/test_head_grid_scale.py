"""Head-grid thumbnails take the heatmap's colour default by length: log from 2,048
tokens, said in the title and the corner label; linear below."""

from __future__ import annotations

import numpy as np


def _thumbs(value: float) -> np.ndarray:
    t = np.zeros((2, 3, 40, 40), dtype=np.float32)
    t[:, :, :, 0] = 1.0  # a sink column
    t[:, :, 20:, 5:15] = value  # weights far below 1, as at long lengths
    return t


def test_long_grid_is_on_log_colours(qtbot):
    from attnscope.app.views.head_grid import HeadGridView

    v = HeadGridView()
    qtbot.addWidget(v)
    c = v.canvas
    c.set_thumbnails(_thumbs(1e-3), 3, "attention", n=4096)
    v.show_scale()
    assert c.scale == "log"
    assert "log colours (chosen for 4,096 tokens)" in v.title.text()
    x, y = c.head_x(0), c.layer_y(0)
    img = c._canvas
    weak, zero = img[y + 30, x + 10], img[y + 10, x + 10]
    # log over [1e-6, 1]: 1e-3 sits half-way up the colour map, far from the zero colour
    assert np.abs(weak.astype(int) - zero.astype(int)).sum() > 100
    c.set_thumbnails(_thumbs(1e-3), 3, "attention", n=500)
    v.show_scale()
    assert c.scale == "linear" and "log" not in v.title.text()
    img = c._canvas
    # linear [0, 1]: 1e-3 is the zero colour (what a 2k+ grid looked like before)
    assert np.abs(img[y + 30, x + 10].astype(int) - img[y + 10, x + 10].astype(int)).sum() < 10
    c.set_thumbnails(_thumbs(1e-3), 3)  # no length given: the scale stays
    assert c.scale == "linear"
