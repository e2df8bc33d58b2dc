"""Headless heatmap images (Pillow): what `attnscope export --out map.png` writes without Qt.

Rows are queries (top to bottom), columns keys (left to right), so the causal triangle sits
below the diagonal exactly as in the GUI; values on a fixed [0, 1] scale by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core.io.colormaps import DEFAULT_COLOUR, ColourSpec

if TYPE_CHECKING:
    from PIL import Image

#: ``renderer(weights, path, *, tokens, title, colour, size, dpi, metadata)`` writes one labelled
#: figure (PNG/SVG/PDF by ``path``'s suffix) and returns its path.
Renderer = Callable[..., Path]
#: ``frame_renderer(weights, n, *, tokens, title, colour)`` → a PIL image of the figure of
#: ``weights`` (``(T, T)``) with only positions ``0 .. n-1`` shown (later ones blank).
FrameRenderer = Callable[..., object]


@dataclass(frozen=True)
class Renderers:
    """What draws the images an export writes, passed explicitly by the caller (core never imports Qt).

    ``figure``: labelled figures (``.svg``, ``.pdf``, ``--figure`` PNGs), e.g. the app's
    :func:`attnscope.app.figure.save_heatmap_figure`; None: only plain maps (Pillow,
    :func:`heatmap_image`) can be written. ``frame``: labelled animation frames
    (:func:`attnscope.app.figure.figure_frame`); None: Pillow's bare frames with a caption
    (:func:`attnscope.core.io.export.decode_frames`).
    """

    figure: Renderer | None = None
    frame: FrameRenderer | None = None


#: the renderers every process has: Pillow only (no labelled figures)
PILLOW = Renderers()


def heatmap_image(
    weights: np.ndarray,
    colour: ColourSpec = DEFAULT_COLOUR,
    cell: int | None = None,
    max_size: int = 2048,
) -> Image.Image:
    """An RGB image of a ``(n_query, n_key)`` matrix coloured by ``colour`` (its scale and range),
    each cell ``cell × cell`` pixels (nearest).

    ``cell`` defaults to the largest integer keeping the image within ``max_size`` pixels (≥ 1).

    Raises:
        ValueError: not a non-empty 2-D matrix; an empty colour range.
    """
    from PIL import Image

    w = np.asarray(weights)
    if w.ndim != 2 or w.size == 0:
        raise ValueError(f"expected a non-empty 2-D matrix, got shape {w.shape}")
    if cell is None:
        cell = max(1, max_size // max(w.shape))
    img = Image.fromarray(colour.to_rgb(w), mode="RGB")
    if cell > 1:
        img = img.resize((w.shape[1] * cell, w.shape[0] * cell), Image.Resampling.NEAREST)
    return img
