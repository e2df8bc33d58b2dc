"""Colour maps and value → colour mapping shared by the GUI, the CLI and exports.

The perceptually uniform maps (viridis, magma, inferno, plasma, cividis; van der Walt & Smith,
CC0) live in ``assets/colormaps/*.csv`` as 256 RGB rows in [0, 1].
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np

ASSETS = Path(__file__).resolve().parents[2] / "assets"  # core/io/ -> the folder holding core/ and assets/
COLORMAPS = ("viridis", "magma", "inferno", "plasma", "cividis")
DEFAULT_COLORMAP = "viridis"


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
    """Colour a 2-D array: ``(H, W)`` values → ``(H, W, 3)`` uint8 RGB (:func:`normalize`, then the LUT)."""
    idx = np.round(normalize(values, vmin, vmax, scale, gamma) * 255).astype(np.intp)
    return lut(cmap)[idx]
