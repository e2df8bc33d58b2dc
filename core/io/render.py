"""One rendering of a map for every output, and the headless images (Pillow) built on it.

Rows are queries (top to bottom), columns keys (left to right), so the causal triangle sits
below the diagonal exactly as in the GUI; values on a fixed [0, 1] scale by default.

**Cells.** Every cell of a map is one of four kinds (:func:`cell_kinds`), and each kind has one
look in every output — the bare PNG, the long streamed PNG, both kinds of GIF/MP4 frame, the
``--figure`` PNG/SVG/PDF — because they all take their pixels or colours from here:

* a weight: the colour map's colour of it (:meth:`attnscope.core.io.colormaps.ColourSpec.to_rgb`);
  a weight of 0 is the map's lowest colour;
* masked (the causal mask, a sliding window): grey diagonal hatch lines (:data:`MASK_HATCH`, one
  pixel every :data:`HATCH_PERIOD` along ``x + y``) on white, outside every colour map, never the
  colour of 0;
* non-finite (NaN, ±inf: a forward that overflowed, :mod:`attnscope.core.trace.finite`): magenta
  :data:`attnscope.core.io.colormaps.NONFINITE_RGB`, in no colour map, never a weight;
* blank (an animation frame's rows not generated yet at that step): white.

:func:`map_indices` gives each output pixel an index into :func:`map_palette` (the colour-map
steps, then the four specials); :func:`map_pixels` is that as RGB. Vector figures draw cells as
rectangles with :func:`cell_colours` and the hatch as a vector pattern of the same grey.
:func:`legend` names the kinds other than weights a map holds, for the legend every output draws.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core.io.colormaps import DEFAULT_COLOUR, NONFINITE_RGB, ColourSpec

if TYPE_CHECKING:
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session
    from PIL import Image

#: ``renderer(weights, path, *, tokens, title, colour, size, dpi, metadata)`` writes one labelled
#: figure (PNG/SVG/PDF by ``path``'s suffix) and returns its path.
Renderer = Callable[..., Path]
#: ``frame_renderer(weights, n, *, tokens, title, colour, masked)`` → a PIL image of the figure of
#: ``weights`` (``(T, T)``, ``masked`` its bool mask) with only positions ``0 .. n-1`` shown (later
#: rows blank, named in the legend).
FrameRenderer = Callable[..., object]


@dataclass(frozen=True)
class Renderers:
    """What draws the images an export writes, passed explicitly by the caller (core never imports Qt).

    ``figure``: labelled figures (``.svg``, ``.pdf``, ``--figure`` PNGs), e.g. the app's
    :func:`attnscope.app.figure.save_heatmap_figure`; None: only plain maps (Pillow,
    :func:`heatmap_image`) can be written. ``frame``: labelled animation frames
    (:func:`attnscope.app.figure.figure_frame`); None: Pillow's bare frames with a caption
    (:func:`attnscope.core.io.animation.decode_frames`).
    """

    figure: Renderer | None = None
    frame: FrameRenderer | None = None


#: the renderers every process has: Pillow only (no labelled figures)
PILLOW = Renderers()

# -- the cells of a map ------------------------------------------------------------------------------
WEIGHT, MASKED, NONFINITE, BLANK = 0, 1, 2, 3  # cell kinds (:func:`cell_kinds`)
MASK_BG = (255, 255, 255)  # masked cells: white under ...
MASK_HATCH = (150, 150, 150)  # ... grey diagonal lines, outside every colour map
HATCH_PERIOD = 6  # pixels between hatch lines, along x + y
BLANK_RGB = (255, 255, 255)  # rows not generated yet (animation frames)
#: index offsets of the special colours after the colour-map steps of :func:`map_palette`
SPECIAL_BG, SPECIAL_HATCH, SPECIAL_NONFINITE, SPECIAL_BLANK = 0, 1, 2, 3
N_SPECIAL = 4
LEGEND_TEXT = {
    MASKED: "masked (not a weight of 0)",
    NONFINITE: "NaN/inf (not a weight)",
    BLANK: "not generated yet",
}


def cell_kinds(
    weights: np.ndarray, masked: np.ndarray | None = None, blank_rows: int | None = None
) -> np.ndarray:
    """``(n_query, n_key)`` uint8 kind of each cell: :data:`WEIGHT`, :data:`MASKED` (``masked``,
    bool of the map's shape, wins over a value), :data:`NONFINITE` (NaN/±inf, not masked) or
    :data:`BLANK` (rows from ``blank_rows`` on).

    Raises:
        ValueError: ``masked`` of another shape than ``weights``.
    """
    w = np.asarray(weights)
    kinds = np.where(np.isfinite(w), WEIGHT, NONFINITE).astype(np.uint8)
    if masked is not None:
        m = np.asarray(masked, dtype=bool)
        if m.shape != w.shape:
            raise ValueError(f"mask of shape {m.shape} for a map of shape {w.shape}")
        kinds[m] = MASKED
    if blank_rows is not None and blank_rows < w.shape[0]:
        kinds[max(0, int(blank_rows)) :] = BLANK
    return kinds


def map_palette(colour: ColourSpec = DEFAULT_COLOUR, n_levels: int = 256) -> np.ndarray:
    """``(n_levels + 4, 3)`` uint8: ``n_levels`` steps of ``colour``'s map (all 256 at the default:
    exactly :meth:`ColourSpec.to_rgb`'s colours), then masked white, hatch grey, non-finite
    magenta and blank white (offsets ``SPECIAL_*`` after ``n_levels``)."""
    steps = colour.lut()[np.round(np.linspace(0, 255, n_levels)).astype(int)]
    special = np.array([MASK_BG, MASK_HATCH, NONFINITE_RGB, BLANK_RGB], dtype=np.uint8)
    return np.concatenate([steps, special]).astype(np.uint8)


def pixel_cells(n: int, pixels: int) -> np.ndarray:
    """The cell each of ``pixels`` pixels shows along a side of ``n`` cells (nearest, in integers):
    pixel ``y`` shows cell ``⌊(2y + 1)·n / (2·pixels)⌋``."""
    return (2 * np.arange(int(pixels)) + 1) * int(n) // (2 * int(pixels))


def map_indices(
    weights: np.ndarray,
    colour: ColourSpec = DEFAULT_COLOUR,
    *,
    masked: np.ndarray | None = None,
    blank_rows: int | None = None,
    size: tuple[int, int] | None = None,
    n_levels: int = 256,
    origin: tuple[int, int] = (0, 0),
) -> np.ndarray:
    """Each pixel of the image of ``weights`` as an index into :func:`map_palette` ``(colour, n_levels)``.

    ``size`` = ``(width, height)`` in pixels (default one pixel per cell); pixel ``(x, y)`` shows
    cell ``(pixel_cells(n_query, height)[y], pixel_cells(n_key, width)[x])``. A weight's index is
    ``round(colour.normalize(w) · (n_levels − 1))``; masked pixels are hatch lines where
    ``(x + y + origin_x + origin_y) % HATCH_PERIOD == 0`` (``origin``: the image's top-left pixel
    within a larger one, so bands of a streamed image join up), white otherwise; non-finite and
    blank pixels their own colours. Returns ``(height, width)`` uint16.

    Raises:
        ValueError: not a non-empty 2-D matrix; a mask of another shape; an empty colour range.
    """
    w = np.asarray(weights)
    if w.ndim != 2 or w.size == 0:
        raise ValueError(f"expected a non-empty 2-D matrix, got shape {w.shape}")
    kinds = cell_kinds(w, masked, blank_rows)
    idx = np.round(colour.normalize(w) * (n_levels - 1)).astype(np.uint16)
    idx[kinds == MASKED] = n_levels + SPECIAL_BG
    idx[kinds == NONFINITE] = n_levels + SPECIAL_NONFINITE
    idx[kinds == BLANK] = n_levels + SPECIAL_BLANK
    if size is not None:
        ys, xs = pixel_cells(w.shape[0], size[1]), pixel_cells(w.shape[1], size[0])
        idx, kinds = idx[ys][:, xs], kinds[ys][:, xs]
    if (kinds == MASKED).any():
        h, wd = idx.shape
        diag = np.arange(h)[:, None] + np.arange(wd)[None, :] + (origin[0] + origin[1])
        idx[(kinds == MASKED) & (diag % HATCH_PERIOD == 0)] = n_levels + SPECIAL_HATCH
    return idx


def map_pixels(
    weights: np.ndarray,
    colour: ColourSpec = DEFAULT_COLOUR,
    *,
    masked: np.ndarray | None = None,
    blank_rows: int | None = None,
    size: tuple[int, int] | None = None,
    origin: tuple[int, int] = (0, 0),
) -> np.ndarray:
    """:func:`map_indices` as ``(height, width, 3)`` uint8 RGB (256 colour-map steps: a weight's
    pixel is exactly ``colour.to_rgb(w)``)."""
    idx = map_indices(weights, colour, masked=masked, blank_rows=blank_rows, size=size, origin=origin)
    return map_palette(colour)[idx]


def cell_colours(
    weights: np.ndarray,
    colour: ColourSpec = DEFAULT_COLOUR,
    masked: np.ndarray | None = None,
    blank_rows: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(rgb (n_query, n_key, 3) uint8, kinds)``: each cell's fill for a vector figure (weights
    their colour, masked cells white: the caller draws the :data:`MASK_HATCH` hatch over them,
    non-finite magenta, blank white) and its kind (:func:`cell_kinds`)."""
    kinds = cell_kinds(weights, masked, blank_rows)
    rgb = colour.to_rgb(np.asarray(weights))
    rgb[kinds == MASKED] = MASK_BG
    rgb[kinds == NONFINITE] = NONFINITE_RGB
    rgb[kinds == BLANK] = BLANK_RGB
    return rgb, kinds


def legend(kinds: np.ndarray) -> list[tuple[int, str]]:
    """``[(kind, text)]`` for the kinds other than weights that ``kinds`` (:func:`cell_kinds`) holds,
    in the order masked, non-finite, blank: what every output's legend lists."""
    present = set(np.unique(np.asarray(kinds)).tolist())
    return [(k, LEGEND_TEXT[k]) for k in (MASKED, NONFINITE, BLANK) if k in present]


def swatch_pixels(kind: int, colour: ColourSpec, h: int, w: int, n_levels: int = 256) -> np.ndarray:
    """``(h, w)`` uint16 palette indices of a legend swatch of ``kind`` (hatched for masked)."""
    if kind == MASKED:
        diag = np.arange(h)[:, None] + np.arange(w)[None, :]
        return np.where(diag % HATCH_PERIOD == 0, n_levels + SPECIAL_HATCH, n_levels + SPECIAL_BG).astype(
            np.uint16
        )
    special = {NONFINITE: SPECIAL_NONFINITE, BLANK: SPECIAL_BLANK}.get(kind)
    if special is None:
        raise ValueError(f"no swatch for cell kind {kind}")
    return np.full((h, w), n_levels + special, dtype=np.uint16)


def heatmap_image(
    weights: np.ndarray,
    colour: ColourSpec = DEFAULT_COLOUR,
    cell: int | None = None,
    max_size: int = 2048,
    masked: np.ndarray | None = None,
    size: tuple[int, int] | None = None,
) -> Image.Image:
    """An RGB image of a ``(n_query, n_key)`` matrix (:func:`map_pixels`: weights coloured by
    ``colour``, ``masked`` cells hatched, non-finite cells magenta), each cell ``cell × cell``
    pixels, or exactly ``size`` = ``(width, height)`` pixels (nearest).

    ``cell`` defaults to the largest integer keeping the image within ``max_size`` pixels (≥ 1).

    Raises:
        ValueError: not a non-empty 2-D matrix; a mask of another shape; an empty colour range.
    """
    from PIL import Image

    w = np.asarray(weights)
    if w.ndim != 2 or w.size == 0:
        raise ValueError(f"expected a non-empty 2-D matrix, got shape {w.shape}")
    if size is None:
        if cell is None:
            cell = max(1, max_size // max(w.shape))
        size = (w.shape[1] * cell, w.shape[0] * cell)
    return Image.fromarray(np.ascontiguousarray(map_pixels(w, colour, masked=masked, size=size)), mode="RGB")


def layer_sliding_window(session: Session | RemoteSession, layer: int) -> int | None:
    """The sliding window the kernel applied in ``layer`` (None = full causal), as captured."""
    layers = getattr(session.trace, "layers", None)
    if layers is not None and 0 <= layer < len(layers):
        return getattr(layers[layer], "sliding_window", None)
    return session.info.sliding_window
