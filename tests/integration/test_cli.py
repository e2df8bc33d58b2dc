"""`attnscope export` and `attnscope --screenshot` on the embedded model."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from attnscope.core.io.colormaps import to_rgb
from PIL import Image


def attnscope(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "attnscope.app.cli", *args], capture_output=True, text=True, timeout=timeout
    )


# Each call below is a fresh process that loads torch and the model (tens of seconds on 2 cores):
# the fast lane keeps test_screenshot (the only test of --screenshot) and tests/integration/test_bad_input.py's
# one-line errors from this entry point; export to npy/csv/png is tested in process by test_export.py.
@pytest.mark.slow
def test_export_npy_csv_png(tmp_path, smol_session):
    prompt = "Attention is all you need."
    r = attnscope(
        "export",
        "--prompt",
        prompt,
        "--no-chat-template",
        "--steps",
        "2",
        "--layer",
        "3",
        "--head",
        "4",
        "--out",
        str(tmp_path / "w.npy"),
    )
    assert r.returncode == 0, r.stderr
    w = np.load(tmp_path / "w.npy")
    # independent check: the same prompt and steps through the in-process session
    smol_session.prefill(prompt, chat_template=False)
    smol_session.step(2)
    np.testing.assert_allclose(w, smol_session.weights(3, 4), atol=1e-6)
    T = smol_session.seq_len
    assert w.shape == (T, T)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-5)
    assert np.all(np.triu(w, 1) == 0)
    # tokens printed one per line: position, id, label
    lines = r.stdout.strip().splitlines()
    assert len(lines) == T
    assert lines[0].split("\t")[:2] == ["0", str(smol_session.ids[0])]

    r = attnscope(
        "export",
        "--prompt",
        prompt,
        "--no-chat-template",
        "--steps",
        "2",
        "--layer",
        "3",
        "--head",
        "4",
        "--out",
        str(tmp_path / "w.csv"),
    )
    assert r.returncode == 0, r.stderr
    from attnscope.core.io.data_writers import read_map_csv

    got, rows, cols = read_map_csv(tmp_path / "w.csv")  # a header row and a label column name the tokens
    np.testing.assert_allclose(got, w, atol=1e-7)
    assert rows == cols and len(cols) == w.shape[1] and cols[0].startswith("0:")

    r = attnscope(
        "export",
        "--prompt",
        prompt,
        "--no-chat-template",
        "--steps",
        "2",
        "--layer",
        "3",
        "--head",
        "4",
        "--out",
        str(tmp_path / "w.png"),
    )
    assert r.returncode == 0, r.stderr
    img = np.asarray(Image.open(tmp_path / "w.png").convert("RGB"))
    cell = img.shape[0] // T
    assert img.shape[:2] == (T * cell, T * cell)
    # each causal cell carries the colour map's colour of its value; masked (future) cells are hatched,
    # never drawn as a weight of 0 (core/io/render.py)
    expected = to_rgb(w)
    sampled = img[cell // 2 :: cell, cell // 2 :: cell]
    causal = np.tril(np.ones((T, T), bool))
    np.testing.assert_array_equal(sampled[causal], expected[causal])
    zero = to_rgb(np.zeros((1, 1)))[0, 0]
    assert not (sampled[~causal] == zero).all(axis=-1).any()


@pytest.mark.slow  # the range check in process: tests/app/test_export.py, tests/app/test_view_state.py
def test_export_rejects_out_of_range_head(tmp_path):
    r = attnscope("export", "--prompt", "hi", "--layer", "0", "--head", "9", "--out", str(tmp_path / "w.npy"))
    assert r.returncode == 1
    assert r.stderr.strip() == "attnscope: error: head 9 out of range 0..8"


def test_screenshot(tmp_path):
    out = tmp_path / "shot.png"
    r = attnscope(
        "--screenshot",
        str(out),
        "--prompt",
        "The cat sat on the mat.",
        "--steps",
        "2",
        "--layer",
        "2",
        "--head",
        "5",
        "--size",
        "1000x700",
    )
    assert r.returncode == 0, r.stderr
    img = Image.open(out)
    assert img.size == (1000, 700)
    arr = np.asarray(img.convert("RGB"))
    assert len(np.unique(arr.reshape(-1, 3), axis=0)) > 50


@pytest.mark.slow  # a fresh process loading the model (see above)
def test_screenshot_bad_layer(tmp_path):
    r = attnscope("--screenshot", str(tmp_path / "s.png"), "--prompt", "hi", "--layer", "40")
    assert r.returncode == 1 and r.stderr.strip().endswith("layer 40 out of range 0..29")
    assert not (tmp_path / "s.png").exists()
