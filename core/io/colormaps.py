"""Colour maps and value → colour mapping shared by the GUI, the CLI and exports.

The perceptually uniform maps (viridis, magma, inferno, plasma, cividis; van der Walt & Smith,
CC0) live in ``assets/colormaps/*.csv`` as 256 RGB rows in [0, 1].
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

ASSETS = Path(__file__).resolve().parents[2] / "assets"  # core/io/ -> the folder holding core/ and assets/
COLORMAPS = ("viridis", "magma", "inferno", "plasma", "cividis")
DEFAULT_COLORMAP = "viridis"
SCALES = ("linear", "log", "power")
#: how a colour range is found: ``fixed`` [0, 1] (probabilities), ``auto`` (this map's robust max),
#: ``shared`` (the layer's robust max); :func:`attnscope.core.io.head_export.colour_range`
RANGE_MODES = ("fixed", "auto", "shared")
#: the colour of a non-finite value (NaN, ±inf): magenta, in none of :data:`COLORMAPS`, so a cell of
#: a forward that overflowed never reads as a weight (attnscope.core.io.render)
NONFINITE_RGB = (255, 0, 255)


@cache
def lut(name: str = DEFAULT_COLORMAP) -> np.ndarray:
    """``(256, 3)`` uint8 lookup table of colour map ``name``.

    Raises:
        ValueError: unknown colour map.
    """
    if name not in COLORMAPS:
        raise ValueError(f"unknown colour map {name!r}; choose one of {', '.join(COLORMAPS)}")
    rows = [
        line
        for line in (ASSETS / "colormaps" / f"{name}.csv").read_text().splitlines()
        if line.strip() and not line.startswith(";")
    ]
    data = np.array([[float(x) for x in r.split(",")[:3]] for r in rows])
    return np.clip(np.round(data * 255), 0, 255).astype(np.uint8)


def normalize(
    values: np.ndarray, vmin: float = 0.0, vmax: float = 1.0, scale: str = "linear", gamma: float = 0.5
) -> np.ndarray:
    """Map values to [0, 1] for colouring.

    ``scale``: ``"linear"``; ``"log"`` (log10 over ``[max(vmin, 1e-6), vmax]``); ``"power"``
    (``x ** gamma`` after linear normalisation). NaN maps to 0.

    Raises:
        ValueError: unknown scale or ``vmax <= vmin``.
    """
    if vmax <= vmin:
        raise ValueError(f"empty colour range [{vmin}, {vmax}]")
    v = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=vmin)
    if scale == "linear":
        x = (v - vmin) / (vmax - vmin)
    elif scale == "log":
        lo = max(vmin, 1e-6)
        x = (np.log10(np.clip(v, lo, None)) - np.log10(lo)) / (np.log10(vmax) - np.log10(lo))
    elif scale == "power":
        x = np.clip((v - vmin) / (vmax - vmin), 0, 1) ** gamma
    else:
        raise ValueError(f"unknown scale {scale!r}; choose linear, log or power")
    return np.clip(x, 0.0, 1.0)


def to_rgb(
    values: np.ndarray,
    cmap: str = DEFAULT_COLORMAP,
    vmin: float = 0.0,
    vmax: float = 1.0,
    scale: str = "linear",
    gamma: float = 0.5,
) -> np.ndarray:
    """Colour a 2-D array: ``(H, W)`` values → ``(H, W, 3)`` uint8 RGB (:func:`normalize`, then the LUT);
    NaN and ±inf are :data:`NONFINITE_RGB`, never a colour of the map."""
    idx = np.round(normalize(values, vmin, vmax, scale, gamma) * 255).astype(np.intp)
    rgb = lut(cmap)[idx]
    bad = ~np.isfinite(np.asarray(values, dtype=np.float64))
    if bad.any():
        rgb[bad] = NONFINITE_RGB
    return rgb


@dataclass(frozen=True)
class ColourSpec:
    """How a map's values become colours, as one value the GUI, the CLI and every export pass around.

    ``cmap``: one of :data:`COLORMAPS`. ``scale``: ``"linear"``, ``"log"`` or ``"power"``
    (:func:`normalize`), or None in a request = "chosen by the map's length"
    (:func:`attnscope.core.io.colour_scale.colour_for_length`; log from 2,048 tokens). ``gamma``: exponent of the power scale (> 0).
    ``range_mode``: how ``vmin``/``vmax`` are found (:data:`RANGE_MODES`); ``vmin``/``vmax``: the
    colour range itself, in weight units (``[0, 1]`` until a range is resolved, :meth:`with_range`).

    Raises:
        ValueError: unknown colour map, scale or range mode; ``gamma <= 0``.
    """

    cmap: str = DEFAULT_COLORMAP
    scale: str | None = "linear"
    gamma: float = 0.5
    range_mode: str = "fixed"
    vmin: float = 0.0
    vmax: float = 1.0

    def __post_init__(self) -> None:
        if self.cmap not in COLORMAPS:
            raise ValueError(f"unknown colour map {self.cmap!r}; choose one of {', '.join(COLORMAPS)}")
        if self.scale is not None and self.scale not in SCALES:
            raise ValueError(f"unknown scale {self.scale!r}; choose linear, log or power")
        if not self.gamma > 0:
            raise ValueError(f"gamma must be > 0, got {self.gamma}")
        if self.range_mode not in RANGE_MODES:
            raise ValueError(f"unknown colour range {self.range_mode!r}: use {', '.join(RANGE_MODES)}")

    def with_range(self, vmin: float, vmax: float) -> ColourSpec:
        """This spec with the colour range ``[vmin, vmax]`` (resolved for one map)."""
        return dataclasses.replace(self, vmin=float(vmin), vmax=float(vmax))

    def normalize(self, values: np.ndarray) -> np.ndarray:
        """Values → [0, 1] float64 (:func:`normalize` with this spec's range and scale)."""
        return normalize(values, self.vmin, self.vmax, self._scale(), self.gamma)

    def to_rgb(self, values: np.ndarray) -> np.ndarray:
        """``(H, W)`` values → ``(H, W, 3)`` uint8 RGB (:func:`to_rgb` with this spec)."""
        return to_rgb(values, self.cmap, self.vmin, self.vmax, self._scale(), self.gamma)

    def lut(self) -> np.ndarray:
        """The colour map's ``(256, 3)`` uint8 table (:func:`lut`)."""
        return lut(self.cmap)

    def metadata(self) -> dict:
        """How an image was coloured, as its metadata records it (``gamma`` only for the power scale)."""
        return {
            "cmap": self.cmap,
            "scale": self.scale,
            "gamma": self.gamma if self.scale == "power" else None,
            "range": self.range_mode,
            "vmin": self.vmin,
            "vmax": self.vmax,
        }

    def _scale(self) -> str:
        if self.scale is None:
            raise ValueError(
                "the colour scale is still to be chosen by length: call colour_scale.colour_for_length(spec, n) first"
            )
        return self.scale


#: viridis, linear, fixed [0, 1]: what every export uses unless told otherwise
DEFAULT_COLOUR = ColourSpec()
#: the same with the scale left to the map's length (linear below 2,048 tokens, log from there)
COLOUR_BY_LENGTH = ColourSpec(scale=None)
