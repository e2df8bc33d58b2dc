"""Decode-step animations of one head: one frame per decode step, as GIF (Pillow) or MP4.

Qt-free. Because the mask is causal, the map after step ``s`` is exactly the top-left
``(n_prompt + s)²`` block of the final map (rows already computed never see later keys), so frames
are crops of one exact map, not a replay (:func:`decode_frames`, :func:`save_animation`). MP4 only
when the optional ``imageio-ffmpeg`` package (which ships its own ffmpeg binary) is installed
(:func:`mp4_unavailable`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core.errors import Cancelled
from attnscope.core.io.colormaps import DEFAULT_COLOUR, ColourSpec
from attnscope.core.io.data_writers import suffix_format
from attnscope.core.io.formats import ANIMATION_FORMATS
from attnscope.core.io.head_export import colour_range, map_mask
from attnscope.core.io.provenance import head_metadata, sidecar_path, write_json
from attnscope.core.io.render import FrameRenderer

if TYPE_CHECKING:
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

N_FRAME_LEVELS = (
    250  # palette: 250 colour-map steps, the 4 cell specials (attnscope.core.io.render), black, white
)
BLACK, WHITE = 254, 255
LEGEND_H = 18  # pixels of the legend strip under a frame's map


def frame_palette(cmap: str = "viridis") -> np.ndarray:
    """``(256, 3)`` uint8 palette of animation frames: :func:`attnscope.core.io.render.map_palette`
    with :data:`N_FRAME_LEVELS` colour-map steps (masked white, hatch grey, non-finite magenta,
    blank white after them), then black (text) and white (background)."""
    from attnscope.core.io.render import map_palette

    pal = np.empty((256, 3), dtype=np.uint8)
    pal[:254] = map_palette(ColourSpec(cmap=cmap), N_FRAME_LEVELS)
    pal[BLACK] = 0
    pal[WHITE] = 255
    return pal


def frame_legend_lines(items, font, width: int) -> list[list]:
    """The legend ``items`` (:func:`attnscope.core.io.render.legend`) laid out in lines of at most
    ``width`` pixels (swatch, text, gap), at least one item a line."""
    lines: list[list] = [[]]
    x = 3
    for item in items:
        need = 16 + int(font.getlength(item[1])) + 12
        if lines[-1] and x + need > width:
            lines.append([])
            x = 3
        lines[-1].append(item)
        x += need
    return lines if lines[0] else []


def draw_frame_legend(img, y: int, lines, font, n_levels: int = N_FRAME_LEVELS) -> None:
    """Draw the legend ``lines`` (:func:`frame_legend_lines`), :data:`LEGEND_H` pixels each, as
    swatch + text from ``(3, y)`` on the palette image ``img`` (palette of :func:`frame_palette`)."""
    from attnscope.core.io.render import swatch_pixels
    from PIL import Image, ImageDraw

    draw = ImageDraw.Draw(img)
    for k, line in enumerate(lines):
        x, top = 3, y + k * LEGEND_H
        for kind, text in line:
            sw = swatch_pixels(kind, ColourSpec(), 12, 12, n_levels).astype(np.uint8)
            img.paste(Image.fromarray(sw, mode="P"), (x, top + 3))  # indices as they are: one palette
            draw.rectangle((x, top + 3, x + 11, top + 14), outline=BLACK)
            draw.text((x + 16, top + 2), text, fill=BLACK, font=font)
            x += 16 + int(draw.textlength(text, font=font)) + 12


def decode_frames(
    session: Session | RemoteSession,
    layer: int,
    head: int,
    *,
    colour: ColourSpec = DEFAULT_COLOUR,
    max_size: int = 640,
    caption: bool = True,
    first_step: int = 0,
    cancelled: Callable[[], bool] | None = None,
    levels: tuple[float, float] | None = None,
    mode: str = "head",
):
    """One palette image per decode step of ``(layer, head)``: steps ``first_step .. n_generated``.

    Every frame has the final map's size (``seq_len`` cells a side, ``cell`` pixels each, the largest
    integer keeping the map within ``max_size``); frame ``s`` shows the exact map after step ``s``
    (its top-left ``(n_prompt + s)²`` block, see module doc), drawn as every image draws a map
    (:func:`attnscope.core.io.render.map_indices`): masked cells hatched, non-finite cells magenta,
    the rows not generated yet blank (white). With ``caption`` a white strip above the map reads
    ``L3 H4 · step s/N · seq_len T · 'token'`` and one under it names the blank, masked and
    non-finite cells (:func:`attnscope.core.io.render.legend`). A weight's pixel value ``v`` is
    ``round(x · 249)`` for its normalised weight ``x`` (:data:`N_FRAME_LEVELS`, :func:`frame_palette`);
    ``colour`` colours as :func:`export_head` does (its ``range_mode`` resolved on the final map, so
    every frame shares one scale; ``levels = (vmin, vmax)`` gives that range precomputed).

    Returns:
        list of PIL ``"P"`` images, ``n_generated - first_step + 1`` of them.

    Raises:
        SessionError: nothing has run. IndexError: layer/head out of range.
    """
    from attnscope.core.io.render import cell_kinds, legend, map_indices
    from PIL import Image, ImageDraw, ImageFont

    w = session.weights(layer, head)
    T, n0 = w.shape[0], session.n_prompt
    cell = max(1, max_size // T)
    colour = colour.with_range(*(levels or colour_range(session, layer, w, colour.range_mode)))
    masked = map_mask(session, layer, T, mode)
    cap_h = 18 if caption else 0
    font = ImageFont.load_default(size=13) if caption else None
    # the legend of the first frame holds the most kinds but the non-finite rows it has not reached
    # yet: lay out every kind the frames show, so every frame has the same size
    every = legend(cell_kinds(w, masked, n0 if session.n_generated else None)) + legend(cell_kinds(w, masked))
    kinds_seen = list(dict.fromkeys(every))
    leg_h = LEGEND_H * len(frame_legend_lines(kinds_seen, font, T * cell)) if caption else 0
    pal = frame_palette(colour.cmap).reshape(-1).tolist()
    toks = session.tokens
    frames: list[Image.Image] = []
    for s in range(first_step, session.n_generated + 1):
        if cancelled is not None and cancelled():
            raise Cancelled(f"stopped after {len(frames)} frames")
        n = n0 + s
        grid = map_indices(
            w, colour, masked=masked, blank_rows=n, size=(T * cell, T * cell), n_levels=N_FRAME_LEVELS
        ).astype(np.uint8)
        frame = np.full((cap_h + grid.shape[0] + leg_h, grid.shape[1]), WHITE, dtype=np.uint8)
        frame[cap_h : cap_h + grid.shape[0]] = grid
        img = Image.fromarray(frame, mode="P")
        img.putpalette(pal)
        if caption:
            tok = _ascii_label(toks[n - 1].text) if s > 0 else "(prompt)"
            text = f"L{layer} H{head}  step {s}/{session.n_generated}  seq_len {n}  new token {tok}"
            ImageDraw.Draw(img).text((3, 2), text, fill=BLACK, font=font)
            lines = frame_legend_lines(legend(cell_kinds(w, masked, n)), font, grid.shape[1])
            draw_frame_legend(img, cap_h + grid.shape[0], lines, font)
        frames.append(img)
    return frames


def _ascii_label(text: str) -> str:
    """A token label in ASCII (Pillow's default font lacks most symbols): ``'↵'`` → ``'\\n'``, others as ``\\uXXXX``."""
    text = text.replace("↵", "\n").replace("⇥", "\t").replace("␍", "\r")
    return repr(text).encode("ascii", "backslashreplace").decode("ascii")


def export_animation(
    session: Session | RemoteSession,
    layer: int,
    head: int,
    path: str | os.PathLike,
    *,
    colour: ColourSpec = DEFAULT_COLOUR,
    fps: float = 4.0,
    cancelled: Callable[[], bool] | None = None,
    frame_renderer: FrameRenderer | None = None,
) -> list[Path]:
    """Every decode step of ``(layer, head)`` as an animation (:func:`decode_frames`,
    :func:`save_animation`) plus its sidecar ``<file>.json``: the head's metadata for the whole
    sequence, the frames (step ``i`` shows positions ``0 .. n_prompt + i − 1``), fps and colours.

    ``frame_renderer`` (the app's :func:`attnscope.app.figure.figure_frame`): each frame is the labelled figure
    (token axes, colour bar, a caption with the step) instead of the bare map with a caption.

    Returns ``[animation, sidecar]``. Raises what those two raise.
    """
    w = session.weights(layer, head)
    colour = colour.with_range(*colour_range(session, layer, w, colour.range_mode))
    masked = map_mask(session, layer, w.shape[0])
    if frame_renderer is None:
        frames = decode_frames(
            session, layer, head, colour=colour, cancelled=cancelled, levels=(colour.vmin, colour.vmax)
        )
    else:
        toks, n0, frames = session.tokens, session.n_prompt, []
        for s in range(session.n_generated + 1):
            if cancelled is not None and cancelled():
                raise Cancelled(f"stopped after {len(frames)} frames")
            n = n0 + s
            new = f"new token {toks[n - 1].text!r}" if s > 0 else "prompt"
            caption = f"L{layer} H{head} · step {s}/{session.n_generated} · seq_len {n} · {new}"
            frames.append(
                frame_renderer(
                    w,
                    n,
                    tokens=toks,
                    title=caption,
                    colour=colour,
                    masked=masked,
                )
            )
    out = save_animation(frames, path, fps=fps)
    meta = head_metadata(session, layer, head)
    meta.update(
        {
            "kind": "animation",
            "frames": len(frames),
            "fps": fps,
            "frame_steps": list(range(session.n_generated + 1)),
            "colour": colour.metadata(),
            "nonfinite_cells": int(np.count_nonzero(~np.isfinite(w))),
        }
    )
    return [out, write_json(sidecar_path(out), meta)]


def mp4_unavailable() -> str | None:
    """None when MP4 export works here, else the one-line reason (shown by the window and the CLI).

    MP4 needs the optional package ``imageio-ffmpeg`` and the ffmpeg binary it ships; the packaged app
    leaves both out unless built with ``ATTNSCOPE_WITH_MP4=1`` (packaging/bundle_rules.py: +165 MB).
    """
    import importlib.util
    import sys

    frozen = getattr(sys, "frozen", False)
    why = (
        "this packaged build leaves out imageio-ffmpeg and its 165 MB ffmpeg (rebuild with "
        "ATTNSCOPE_WITH_MP4=1)"
        if frozen
        else "it needs the optional package imageio-ffmpeg (pip install imageio-ffmpeg), which ships ffmpeg"
    )
    if importlib.util.find_spec("imageio_ffmpeg") is None:
        return f"MP4 is unavailable: {why}; GIF works without it"
    try:
        import imageio_ffmpeg

        exe = imageio_ffmpeg.get_ffmpeg_exe()
    except Exception as e:  # the package without its binary (a trimmed bundle)
        return f"MP4 is unavailable: imageio-ffmpeg finds no ffmpeg binary ({str(e).splitlines()[0][:120]}); GIF works"
    return None if exe and os.path.exists(exe) else "MP4 is unavailable: no ffmpeg binary; GIF works"


def save_animation(frames, path: str | os.PathLike, fps: float = 4.0, hold_last: float = 1.5) -> Path:
    """Write frames as an animated ``.gif`` (Pillow, loops forever) or ``.mp4`` (H.264 via imageio-ffmpeg).

    ``hold_last`` seconds keep the last frame on screen (GIF only).

    Raises:
        ValueError: no frames, unknown suffix, or MP4 without the optional ``imageio-ffmpeg`` package.
    """
    path = Path(path)
    fmt = suffix_format(path, ANIMATION_FORMATS)
    if not frames:
        raise ValueError("no frames to write")
    if not path.parent.exists():
        raise FileNotFoundError(f"folder {path.parent} does not exist")
    if fps <= 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    if fmt == "gif":
        ms = int(round(1000 / fps))
        durations = [ms] * len(frames)
        durations[-1] = max(ms, int(hold_last * 1000))
        frames[0].save(
            path,
            format="GIF",
            save_all=True,
            append_images=list(frames[1:]),
            duration=durations,
            loop=0,
            optimize=False,
            disposal=1,
        )
        return path
    why = mp4_unavailable()
    if why is not None:
        raise ValueError(why)
    import imageio_ffmpeg

    rgb = [np.asarray(f.convert("RGB")) for f in frames]
    h, w = rgb[0].shape[:2]
    H, W = math.ceil(h / 16) * 16, math.ceil(w / 16) * 16  # H.264 wants macro-blocks of 16
    writer = imageio_ffmpeg.write_frames(
        str(path),
        (W, H),
        fps=fps,
        codec="libx264",
        pix_fmt_in="rgb24",
        macro_block_size=1,
        quality=8,
        ffmpeg_log_level="error",
    )
    writer.send(None)
    for a in rgb:
        padded = np.full((H, W, 3), 255, dtype=np.uint8)
        padded[:h, :w] = a
        writer.send(np.ascontiguousarray(padded))
    writer.close()
    return path
