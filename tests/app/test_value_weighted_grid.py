"""The head grid on the value-weighted scale (attnscope.core.analysis.value_weighted_grid) and in the window."""

from __future__ import annotations

import numpy as np
import pytest
from attnscope.core.analysis.pooling import max_pool, mean_pool
from attnscope.core.analysis.value_weighted import value_weighted
from tiny_models import save_tiny

PROMPT = "The cat sat on the mat. The dog sat on the cat, then it ran off."


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    out = {}
    for fam in ("llama", "mistral"):  # mistral: sliding window 4 (bands that skip masked keys)
        folder = tmp_path_factory.mktemp(fam)
        save_tiny(fam, folder)
        out[fam] = folder
    return out


def _session(folder):
    from attnscope.core.session import Session

    s = Session.load(str(folder), device="cpu")
    s.prefill(PROMPT, chat_template=False)
    return s


def _direct(s, n, size, pooling):
    pool = max_pool if pooling == "max" else mean_pool
    L, H = s.info.n_layers, s.info.n_heads
    P = min(n, size)
    out = np.zeros((L, H, P, P), np.float32)
    for layer in range(L):
        for h in range(H):
            full = value_weighted(s, layer, h, rows=slice(0, n), cols=slice(0, n), normalise=True)
            out[layer, h] = pool(full, P, P)
    return out


@pytest.mark.parametrize("fam", ["llama", "mistral"])
@pytest.mark.parametrize("pooling", ["max", "mean"])
def test_value_weighted_thumbnails_equal_pooled_full_maps(tiny_folders, fam, pooling):
    from attnscope.core.analysis.aggregate import thumbnails
    from attnscope.core.analysis.value_weighted_grid import value_weighted_thumbnails

    s = _session(tiny_folders[fam])
    T = s.seq_len
    assert T > 12
    for n, size, budget in ((T, 40, 1 << 24), (T, 5, 1 << 24), (T - 3, 7, 64)):  # whole, pooled, tiny bands
        got = value_weighted_thumbnails(s, n, size, pooling, budget=budget, fast=False)
        want = _direct(s, n, size, pooling)
        assert got.shape == want.shape == (s.info.n_layers, s.info.n_heads, min(n, size), min(n, size))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        att = thumbnails(s, n, size, pooling=pooling)
        assert not np.allclose(got, att, atol=1e-3)  # a different scale, not the weights again
    whole = value_weighted_thumbnails(s, T, T + 5, pooling, fast=False)  # one cell per token
    if pooling == "max":
        np.testing.assert_allclose(whole.sum(axis=-1), 1.0, atol=1e-5)  # each row a distribution


def test_value_weighted_thumbnails_progress_partial_and_errors(tiny_folders):
    from attnscope.core.analysis.value_weighted_grid import value_weighted_thumbnails
    from attnscope.core.errors import Cancelled

    s = _session(tiny_folders["llama"])
    L, H = s.info.n_layers, s.info.n_heads
    seen, parts = [], []
    value_weighted_thumbnails(
        s, size=8, progress=lambda d, t: seen.append((d, t)), partial=lambda th, f: parts.append(f)
    )
    assert seen[-1] == (L * H, L * H) and len(seen) == L * H
    assert parts == [(k + 1) / L for k in range(L - 1)]
    with pytest.raises(IndexError):
        value_weighted_thumbnails(s, s.seq_len + 1)
    with pytest.raises(Cancelled):
        value_weighted_thumbnails(s, cancelled=lambda: True)


def test_grid_follows_the_weights_choice(qtbot, tiny_folders):
    from attnscope.core.analysis.value_weighted_grid import value_weighted_thumbnails
    from gui_helpers import ran_window

    w = ran_window(qtbot, tiny_folders["llama"], PROMPT)
    try:
        w.show_view("grid")
        assert w.engine.wait_idle(60) and w.last_error is None
        qtbot.waitUntil(lambda: w.grid.canvas.thumbs is not None, timeout=10000)
        att = w.grid.canvas.thumbs.copy()
        assert w.grid.canvas.weighting == "attention"
        assert "attention" in w.grid.title.text() and "value-weighted" not in w.grid.title.text()
        assert w.grid.view_state() == {"weighting": "attention", "pooling": "max"}
        # the grid's own combo: one choice shared with the heatmap's Weights
        w.grid.weighting_combo.setCurrentIndex(w.grid.weighting_combo.findData("value-weighted"))
        assert w.heatmap.weighting == "value-weighted"
        assert w.engine.wait_idle(60) and w.last_error is None
        qtbot.waitUntil(lambda: w.grid.canvas.weighting == "value-weighted", timeout=10000)
        vw = w.grid.canvas.thumbs
        assert not np.allclose(vw, att, atol=1e-3)
        s = w.engine.session
        np.testing.assert_allclose(vw, value_weighted_thumbnails(s, w.visible_len, 40), rtol=1e-4, atol=1e-5)
        assert "value-weighted" in w.grid.title.text()
        assert w.grid.view_state()["weighting"] == "value-weighted"
        # an export of the grid records the scale shown in its sidecar
        import json
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as tmp:
            out = w.exports.export_view(Path(tmp) / "grid.png", dpi=96)[0]
            assert w.engine.wait_idle(60) and w.last_error is None
            side = json.loads(Path(str(out) + ".json").read_text())
        assert side["view"] == "grid"
        assert side["view_state"]["weighting"] == "value-weighted"
        assert side["view_state"]["views"]["grid"] == {"weighting": "value-weighted", "pooling": "max"}
        # and back from the heatmap's combo
        w.heatmap.weighting_combo.setCurrentIndex(w.heatmap.weighting_combo.findData("attention"))
        assert w.grid.weighting_combo.currentData() == "attention"
        assert w.engine.wait_idle(60) and w.last_error is None
        qtbot.waitUntil(lambda: w.grid.canvas.weighting == "attention", timeout=10000)
        np.testing.assert_allclose(w.grid.canvas.thumbs, att, atol=1e-6)
        assert "value-weighted" not in w.grid.title.text()
    finally:
        w.close()


def test_data_export_writes_and_records_the_scale_shown(qtbot, tiny_folders, tmp_path):
    """Export data under the value-weighted scale writes that map (not the attention weights) and its
    sidecar says so; the CLI's --weighting does the same; attention stays the default."""
    import json
    import subprocess
    import sys

    from attnscope.core.analysis.value_weighted import value_weighted_tile
    from attnscope.core.io.provenance import sidecar_path
    from gui_helpers import ran_window

    w = ran_window(qtbot, tiny_folders["llama"], PROMPT)
    try:
        combo = w.heatmap.weighting_combo
        combo.setCurrentIndex(combo.findData("value-weighted"))
        assert w.engine.wait_idle(60)
        out = tmp_path / "vw.npy"
        w.exports.export_data(out)
        assert w.engine.wait_idle(60) and w.last_error is None
        s = w.engine.session
        expected = value_weighted_tile(s, w.layer, w.head, "head", slice(0, s.seq_len), slice(0, s.seq_len))
        np.testing.assert_allclose(np.load(out), expected, atol=1e-7)
        assert not np.allclose(np.load(out), s.weights(w.layer, w.head), atol=1e-3)
        assert json.loads(sidecar_path(out).read_text())["weighting"] == "value-weighted"
    finally:
        w.close()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnscope.app.cli",
            "export",
            "--model",
            str(tiny_folders["llama"]),
            "--prompt",
            PROMPT,
            "--no-chat-template",
            "--layer",
            "1",
            "--head",
            "2",
            "--weighting",
            "value-weighted",
            "--out",
            str(tmp_path / "cli.npy"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    s = _session(tiny_folders["llama"])
    np.testing.assert_allclose(
        np.load(tmp_path / "cli.npy"),
        value_weighted_tile(s, 1, 2, "head", slice(0, s.seq_len), slice(0, s.seq_len)),
        atol=1e-6,
    )
    assert json.loads(sidecar_path(tmp_path / "cli.npy").read_text())["weighting"] == "value-weighted"
