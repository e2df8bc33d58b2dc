"""Data files equal the session's weights, sidecars are complete, PNG cells carry
the colour map's colour, batches (progress, cancel, manifest), decode-step frames and animations, CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from attnscope.core.errors import Cancelled
from attnscope.core.io import animation, batch_export, data_writers, head_export, provenance
from attnscope.core.io.colormaps import ColourSpec, to_rgb
from attnscope.core.loading.cache_folder import file_sha256
from export_files import read_data
from PIL import Image, ImageSequence

SIDECAR_KEYS = {
    "schema",
    "attnscope_version",
    "created",
    "model",
    "backend",
    "dtype",
    "quantization",
    "device_map",
    "device",
    "prompt",
    "chat_template",
    "sampling",
    "n_prompt",
    "step",
    "seq_len",
    "token_ids",
    "token_texts",
    "token_raw",
    "exact",
    "exact_note",
    "kind",
    "layer",
    "head",
    "kv_head",
    "rows",
    "cols",
    "axes",
    "mask",
    "array",
}


@pytest.fixture(scope="module")
def stepped_once(smol_session):
    from conftest import SMOL_PROMPT

    smol_session.prefill(SMOL_PROMPT, chat_template=False)
    smol_session.step(3)
    return smol_session, list(smol_session.ids)


@pytest.fixture()
def stepped(stepped_once):
    """The shared session after the conftest prompt and 3 greedy decode steps (prefilled once per module;
    restored here when another test changed the sequence)."""
    s, ids = stepped_once
    if s.ids != ids:
        from conftest import SMOL_PROMPT

        s.prefill(SMOL_PROMPT, chat_template=False)
        s.feed(ids[s.n_prompt :])
    return s


@pytest.mark.parametrize("suffix", ["npy", "csv", "safetensors"])
def test_data_equals_weights_and_sidecar_is_complete(stepped, tmp_path, suffix):
    s = stepped
    path = tmp_path / f"L3_H4.{suffix}"
    written = head_export.export_head(s, 3, 4, path)
    assert written == [path, tmp_path / f"L3_H4.{suffix}.json"]
    expected = s.weights(3, 4)
    back = read_data(path)
    # bit-identical, CSV included (%.9g round-trips float32)
    assert back.dtype == np.float32 and back.shape == (s.seq_len, s.seq_len)
    np.testing.assert_array_equal(back, expected)

    meta = json.loads(written[1].read_text(encoding="utf-8"))
    assert SIDECAR_KEYS <= set(meta)
    assert meta["model"]["name"] == "SmolLM2-135M-Instruct"
    assert meta["model"]["sha256"] == file_sha256(__import__("pathlib").Path(s.info.source))
    assert len(meta["model"]["sha256"]) == 64
    assert (meta["backend"], meta["dtype"], meta["device"]) == ("torch", "float32", "cpu")
    assert meta["prompt"] == s.prompt and meta["chat_template"] is False
    assert meta["token_ids"] == s.ids and meta["token_texts"] == [t.text for t in s.tokens]
    assert (meta["n_prompt"], meta["step"], meta["seq_len"]) == (s.n_prompt, 3, s.n_prompt + 3)
    assert (meta["layer"], meta["head"], meta["kv_head"]) == (3, 4, 1)  # 9 query heads / 3 KV heads
    assert meta["rows"] == [0, s.seq_len] and meta["cols"] == [0, s.seq_len]
    assert meta["mask"]["kind"] == "causal" and meta["mask"]["alignment"] == "bottom-right"
    assert meta["mask"]["sliding_window"] is None and "no sliding window" in meta["mask"]["description"]
    assert meta["exact"] is True
    assert meta["array"] == {
        "file": path.name,
        "format": suffix,
        "shape": [s.seq_len, s.seq_len],
        "dtype": "float32",
        **({"tensor": "weights"} if suffix == "safetensors" else {}),
    }
    assert meta["created"].endswith("Z")
    if suffix == "safetensors":
        from safetensors import safe_open

        with safe_open(str(path), "np") as f:
            assert json.loads(f.metadata()["attnscope"]) == meta


def test_map_png_cells_carry_the_colour_map_colour(stepped, tmp_path):
    s = stepped
    w = s.weights(5, 0)
    T = s.seq_len
    meta = provenance.head_metadata(s, 5, 0)
    path = data_writers.save_map_png(w, tmp_path / "m.png", ColourSpec(cmap="magma"), dpi=300, metadata=meta)
    img = Image.open(path)
    cell = 2048 // T
    assert img.size == (T * cell, T * cell)
    assert img.info["dpi"] == pytest.approx((300, 300), abs=0.01)
    assert json.loads(img.text["attnscope"])["layer"] == 5
    a = np.asarray(img.convert("RGB"))
    expected = to_rgb(w, "magma")
    # every pixel of every cell, not just centres
    np.testing.assert_array_equal(a, np.repeat(np.repeat(expected, cell, axis=0), cell, axis=1))

    # a chosen size: nearest-neighbour, pixel (x, y) shows cell (floor((y+½)·T/H), floor((x+½)·T/W))
    data_writers.save_map_png(w, tmp_path / "s.png", ColourSpec(scale="log"), size=(301, 157))
    b = np.asarray(Image.open(tmp_path / "s.png").convert("RGB"))
    assert b.shape == (157, 301, 3)
    ys = [int((y + 0.5) * T // 157) for y in range(157)]  # exact in floats: (y + ½)·T is a multiple of ½
    xs = [int((x + 0.5) * T // 301) for x in range(301)]
    np.testing.assert_array_equal(b, to_rgb(w, scale="log")[ys][:, xs])


def _hatch_only(pixels: np.ndarray) -> bool:
    """Every RGB pixel is the masked cells' white or hatch grey (attnscope.core.io.render)."""
    from attnscope.core.io.render import MASK_BG, MASK_HATCH

    px = pixels.reshape(-1, 3)
    return bool(np.all(np.all(px == MASK_BG, axis=1) | np.all(px == MASK_HATCH, axis=1)))


def test_batch_images_are_coloured_as_the_view(stepped, tmp_path):
    """Power γ and the auto/shared ranges reach every exported image, and the metadata says so."""
    from attnscope.core.analysis import aggregate

    s = stepped
    out = tmp_path / "pw"
    batch_export.export_batch(
        s,
        out,
        "png",
        batch_export.heads_in_scope(30, 9, layer=4),
        colour=ColourSpec(cmap="plasma", scale="power", gamma=0.25, range_mode="shared"),
    )
    top = aggregate.layer_robust_max(s, 4)
    assert top < 1.0
    for h in (0, 7):
        img = Image.open(out / f"L04_H{h:02d}.png")
        colour = json.loads(img.text["attnscope"])["colour"]
        assert colour == {
            "cmap": "plasma",
            "scale": "power",
            "gamma": 0.25,
            "range": "shared",
            "vmin": 0.0,
            "vmax": pytest.approx(top),
            "scale_chosen": "by the user",
        }
        w = s.weights(4, h)
        cell = 2048 // s.seq_len
        a = np.asarray(img.convert("RGB"))[::cell, ::cell]
        ok = np.tril(np.ones(w.shape, dtype=bool))  # allowed cells: their colour; masked: the hatch
        np.testing.assert_array_equal(a[ok], to_rgb(w, "plasma", 0.0, top, "power", 0.25)[ok])
        assert _hatch_only(a[~ok])
        assert not np.array_equal(a[ok], to_rgb(w, "plasma", 0.0, 1.0, "power", 0.5)[ok])  # not the defaults
    man = json.loads((out / "manifest.json").read_text())
    assert (man["scale"], man["gamma"], man["range"]) == ("power", 0.25, "shared")
    # auto: each map's own robust max; fixed stays [0, 1]
    head_export.export_head(s, 4, 2, tmp_path / "auto.png", colour=ColourSpec(range_mode="auto"))
    w = s.weights(4, 2)
    a = np.asarray(Image.open(tmp_path / "auto.png").convert("RGB"))[
        :: 2048 // s.seq_len, :: 2048 // s.seq_len
    ]
    ok = np.tril(np.ones(w.shape, dtype=bool))
    np.testing.assert_array_equal(a[ok], to_rgb(w, vmax=aggregate.robust_max(w))[ok])
    with pytest.raises(ValueError, match="unknown colour range"):
        batch_export.export_batch(s, out, "png", [(0, 0)], colour=ColourSpec(range_mode="widest"))
    # decode frames share the same colouring
    power_auto = ColourSpec(scale="power", gamma=0.25, range_mode="auto")
    frames = animation.decode_frames(s, 4, 2, colour=power_auto, caption=False)
    idx = np.asarray(frames[-1])[:: 640 // s.seq_len, :: 640 // s.seq_len]
    from attnscope.core.io.colormaps import normalize

    want = np.round(normalize(w, 0.0, aggregate.robust_max(w), "power", 0.25) * 249).astype(np.uint8)
    np.testing.assert_array_equal(idx[ok], want[ok])
    assert set(np.unique(idx[~ok]).tolist()) <= {
        animation.N_FRAME_LEVELS,
        animation.N_FRAME_LEVELS + 1,
    }  # hatch
    # an animation gets its provenance sidecar like any other export
    gif, side = animation.export_animation(s, 4, 2, tmp_path / "steps.gif", colour=power_auto)
    meta = json.loads(side.read_text())
    assert side == tmp_path / "steps.gif.json" and Image.open(gif).n_frames == s.n_generated + 1
    assert (meta["kind"], meta["layer"], meta["head"], meta["frames"]) == (
        "animation",
        4,
        2,
        s.n_generated + 1,
    )
    assert meta["token_ids"] == s.ids and meta["colour"]["range"] == "auto"


def test_batch_one_layer_every_head(stepped, tmp_path):
    s = stepped
    seen = []
    out = tmp_path / "batch"
    written = batch_export.export_batch(
        s,
        out,
        "npy",
        batch_export.heads_in_scope(30, 9, layer=2),
        progress=lambda d, t, n: seen.append((d, t, n)),
    )
    assert seen == [(i + 1, 9, f"L02_H{i:02d}.npy") for i in range(9)]
    assert len(written) == 9 * 2 + 1 and written[-1] == out / "manifest.json"
    for h in range(9):
        np.testing.assert_array_equal(np.load(out / f"L02_H{h:02d}.npy"), s.weights(2, h))
        side = json.loads((out / f"L02_H{h:02d}.npy.json").read_text())
        assert (side["layer"], side["head"], side["kv_head"]) == (2, h, h // 3)
    man = json.loads((out / "manifest.json").read_text())
    assert man["complete"] is True and man["format"] == "npy" and man["token_ids"] == s.ids
    assert [(f["layer"], f["head"]) for f in man["files"]] == [(2, h) for h in range(9)]


def test_batch_cancel_keeps_what_was_written(stepped, tmp_path):
    s = stepped
    done = []
    with pytest.raises(Cancelled, match="stopped after 4 of 270 files"):
        batch_export.export_batch(
            s,
            tmp_path / "c",
            "png",
            batch_export.heads_in_scope(30, 9),
            progress=lambda d, t, n: done.append(d),
            cancelled=lambda: len(done) >= 4,
        )
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        "L00_H00.png",
        "L00_H01.png",
        "L00_H02.png",
        "L00_H03.png",
        "manifest.json",
    ]
    man = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert man["complete"] is False and len(man["files"]) == 4


def test_batch_bad_requests(stepped, tmp_path):
    with pytest.raises(ValueError, match="need the Qt renderer"):
        batch_export.export_batch(stepped, tmp_path / "x", "svg", [(0, 0)])
    with pytest.raises(ValueError, match="unknown format 'tif'"):
        batch_export.export_batch(stepped, tmp_path / "x", "tif", [(0, 0)])
    with pytest.raises(IndexError, match="layer 30 out of range"):
        batch_export.heads_in_scope(30, 9, layer=30)
    with pytest.raises(FileNotFoundError):
        batch_export.export_batch(stepped, tmp_path / "no" / "such", "npy", [(0, 0)])
    with pytest.raises(ValueError, match="unsupported output"):
        data_writers.write_data(np.zeros((2, 2)), tmp_path / "x.txt")


def test_decode_frames_are_the_exact_maps_of_each_step(stepped):
    s = stepped
    layer, head, n0, T = 7, 2, s.n_prompt, s.seq_len
    final = s.weights(layer, head)
    frames = animation.decode_frames(s, layer, head, max_size=T * 4, caption=False)
    # frames with a caption are 18 px taller, and have a legend of 18 px lines under the map
    width, height = animation.decode_frames(s, layer, head, max_size=T * 4)[0].size
    legend_h = height - 4 * T - 18
    assert width == 4 * T and legend_h > 0 and legend_h % animation.LEGEND_H == 0
    assert len(frames) == 4
    pal = animation.frame_palette()
    assert np.array_equal(pal[:250], to_rgb(np.linspace(0, 1, 250)[None, :])[0])
    for step in (3, 2, 1, 0):  # the map after each step, recomputed independently by stepping back
        a = np.asarray(frames[step])  # palette indices
        assert frames[step].mode == "P" and a.shape == (4 * T, 4 * T)
        n = n0 + step
        w_step = s.weights(layer, head)
        assert w_step.shape == (n, n)
        np.testing.assert_array_equal(w_step, final[:n, :n])  # causal: earlier maps are crops of the last
        cells = a[2::4, 2::4]
        ok = np.tril(np.ones((n, n), dtype=bool))
        np.testing.assert_array_equal(cells[:n, :n][ok], np.round(w_step * 249).astype(np.uint8)[ok])
        from attnscope.core.io.render import SPECIAL_BG, SPECIAL_BLANK, SPECIAL_HATCH

        lv = animation.N_FRAME_LEVELS
        # masked cells (later keys) hatched, rows not generated yet blank: never a colour-map index
        assert set(np.unique(cells[:n][~np.tril(np.ones((n, T), dtype=bool))]).tolist()) <= {
            lv + SPECIAL_BG,
            lv + SPECIAL_HATCH,
        }
        assert np.all(cells[n:, :] == lv + SPECIAL_BLANK)
        if step:
            s.step_back(1)


def test_gif_and_mp4(stepped, tmp_path):
    s = stepped
    frames = animation.decode_frames(s, 1, 1)
    gif = animation.save_animation(frames, tmp_path / "a.gif", fps=5, hold_last=2)
    im = Image.open(gif)
    assert im.n_frames == 4 and im.info["loop"] == 0
    assert [f.info["duration"] for f in ImageSequence.Iterator(im)] == [200, 200, 200, 2000]
    im.seek(3)
    np.testing.assert_array_equal(np.asarray(im.convert("RGB")), np.asarray(frames[3].convert("RGB")))
    with pytest.raises(ValueError, match="unsupported output"):
        animation.save_animation(frames, tmp_path / "a.avi")
    pytest.importorskip("imageio_ffmpeg")
    mp4 = animation.save_animation(frames, tmp_path / "a.mp4", fps=5)
    head = mp4.read_bytes()[:12]
    assert head[4:8] == b"ftyp" and mp4.stat().st_size > 1000


# -- CLI ----------------------------------------------------------------------------------------------------
def _cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "attnscope.app.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--layer", "0", "--head", "0", "--out", "x.npy"],
            "give a prompt with --prompt TEXT, or a saved session",
        ),
        (
            ["--prompt", "hi", "--session", "s.attnscope", "--out", "x.npy"],
            "give either --prompt or --session",
        ),
        (["--prompt", "hi", "--layer", "0"], "nothing to write: give --out, --frames or --save-session"),
        (
            ["--prompt", "hi", "--all-heads", "--head", "1", "--out", "d"],
            "--all-heads exports every head: drop --head",
        ),
        (["--prompt", "hi", "--all-heads", "--out", "d.svg"], "--out must be a folder, not 'd.svg'"),
        (
            ["--prompt", "hi", "--layer", "0", "--head", "0", "--frames", "a.avi"],
            "unsupported animation 'a.avi'",
        ),
        (
            ["--prompt", "hi", "--layer", "0", "--head", "0", "--out", "a.png", "--size", "big"],
            "size must look like 1200x800",
        ),
        (
            ["--prompt", "hi", "--layer", "0", "--head", "0", "--out", "a.png", "--cmap", "jet"],
            "unknown colour map 'jet'",
        ),
        (
            ["--prompt", "hi", "--layer", "0", "--head", "0", "--out", "a.png", "--dpi", "0"],
            "--dpi must be between",
        ),
        (["--prompt", "hi", "--layer", "0", "--head", "0", "--out", "nodir/a.png"], "does not exist"),
    ],
)
def test_cli_bad_arguments_one_line(tmp_path, args, message):
    r = subprocess.run(
        [sys.executable, "-m", "attnscope.app.cli", "export", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnscope: error: ") and message in lines[0], r.stderr


@pytest.mark.slow
def test_cli_all_heads_session_and_frames(tmp_path, smol_session):
    """Headless end to end: batch of one layer as safetensors + a saved session; then from the session: an SVG
    figure, a PDF and a GIF, and data equal to an independent in-process run."""
    env = {"QT_QPA_PLATFORM": "", "DISPLAY": ""}  # no display at all: the CLI must pick offscreen itself
    import os

    env = {**os.environ, **env}
    env.pop("QT_QPA_PLATFORM")
    prompt = "Attention is all you need."
    out = tmp_path / "L4"
    sess = tmp_path / "run.attnscope"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnscope.app.cli",
            "export",
            "--prompt",
            prompt,
            "--no-chat-template",
            "--steps",
            "2",
            "--all-heads",
            "--layer",
            "4",
            "--format",
            "safetensors",
            "--out",
            str(out),
            "--save-session",
            str(sess),
            "--cmap",
            "plasma",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "export 9/9 L04_H08.safetensors" in r.stderr
    smol_session.prefill(prompt, chat_template=False)
    smol_session.step(2)
    for h in range(9):
        np.testing.assert_array_equal(
            read_data(out / f"L04_H{h:02d}.safetensors"), smol_session.weights(4, h)
        )
    saved = json.loads(sess.read_text())
    assert saved["token_ids"] == smol_session.ids and saved["view"]["cmap"] == "plasma"

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnscope.app.cli",
            "export",
            "--session",
            str(sess),
            "--layer",
            "4",
            "--head",
            "7",
            "--out",
            str(tmp_path / "f.svg"),
            "--frames",
            str(tmp_path / "f.gif"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == smol_session.seq_len  # tokens printed
    import xml.etree.ElementTree as ET

    root = ET.parse(tmp_path / "f.svg").getroot()
    assert root.get("shape-rendering") == "crispEdges"  # abutting cells, no seams in other viewers
    assert (
        root.tag.endswith("svg")
        and json.loads(root.find("{http://www.w3.org/2000/svg}desc").text)["head"] == 7
    )
    assert Image.open(tmp_path / "f.gif").n_frames == 3


def test_core_export_modules_stay_qt_free():
    code = (
        "import sys, attnscope.core.io.provenance, attnscope.core.io.data_writers, attnscope.core.io.head_export, "
        "attnscope.core.io.batch_export, attnscope.core.io.animation, attnscope.core.io.colour_scale, "
        "attnscope.core.io.long_png, attnscope.core.io.sessionfile, attnscope.core.cli.commands.export; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph', 'app')]; print(bad)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
