"""A long map's bare PNG, streamed: written from row bands, never coloured whole.

Qt-free. :func:`write_png_rows` writes a PNG from row bands (IHDR, an ``iTXt`` chunk with the
metadata, zlib-compressed IDAT chunks as bands arrive, IEND; PNG spec §11), so a map is never
coloured whole: extra memory is one band of weights (``band_rows × n`` float32, plus its float64
normalisation and RGB bytes), not the 6 GB a 16k map took through Pillow (``n² × (4 + 8 + 8 + 3)``
bytes of temporaries). A long map's bare PNG (from
:data:`attnscope.core.io.colour_scale.LONG_MAP` tokens) is by default a **max-pooled overview**
(:data:`OVERVIEW_SIDE` px a side, or ``size``; the pooling is recorded under ``"pooling"`` in the
metadata); one pixel per cell above :data:`FULL_SIZE_LIMIT` a side needs ``full_size=True`` (CLI
``--full-size``).
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core.errors import Cancelled
from attnscope.core.io.colormaps import ColourSpec
from attnscope.core.io.colour_scale import LONG_COLOUR

if TYPE_CHECKING:
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

OVERVIEW_SIDE = 2048  # default side of a long map's bare PNG overview (pixels)
FULL_SIZE_LIMIT = 4096  # one pixel per cell above this side needs full_size=True (16k: 268 M pixels)
BAND_ROWS = 256  # rows per streamed band


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def write_png_rows(
    path: str | os.PathLike,
    width: int,
    height: int,
    bands: Iterable[np.ndarray],
    metadata: dict | None = None,
    dpi: float | None = None,
    level: int = 6,
) -> Path:
    """Write an 8-bit RGB PNG from row bands ``(h_i, width, 3)`` uint8 (``Σ h_i = height``).

    Metadata goes into an ``iTXt`` chunk keyed ``"attnscope"`` (JSON, UTF-8), as
    :func:`attnscope.core.io.data_writers.save_map_png` writes it; ``dpi`` into ``pHYs``. Each band is compressed as it
    arrives (filter type 0 per row). Raises ValueError when the bands do not add up to ``height``
    rows of ``width`` pixels.
    """
    path = Path(path)
    comp = zlib.compressobj(level)
    rows = 0
    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n")
            f.write(_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)))
            if dpi:
                ppm = int(round(float(dpi) / 0.0254))
                f.write(_chunk(b"pHYs", struct.pack(">IIB", ppm, ppm, 1)))
            if metadata is not None:
                text = json.dumps(metadata, ensure_ascii=False).encode("utf-8")
                f.write(_chunk(b"iTXt", b"attnscope\x00\x00\x00\x00\x00" + text))
            for band in bands:
                band = np.ascontiguousarray(band, dtype=np.uint8)
                if band.ndim != 3 or band.shape[1:] != (width, 3):
                    raise ValueError(f"band of shape {band.shape}, expected (rows, {width}, 3)")
                raw = np.empty((band.shape[0], 1 + width * 3), dtype=np.uint8)
                raw[:, 0] = 0
                raw[:, 1:] = band.reshape(band.shape[0], -1)
                data = comp.compress(raw.tobytes())
                if data:
                    f.write(_chunk(b"IDAT", data))
                rows += band.shape[0]
            if rows != height:
                raise ValueError(f"bands hold {rows} rows, expected {height}")
            f.write(_chunk(b"IDAT", comp.flush()))
            f.write(_chunk(b"IEND", b""))
        tmp.replace(path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def map_bands(
    session: Session | RemoteSession,
    layer: int,
    head: int,
    n: int,
    mode: str = "head",
    band_rows: int = BAND_ROWS,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Iterable[np.ndarray]:
    """The exact ``n × n`` (mean) map as row bands ``(≤ band_rows, n)`` float32, top to bottom."""
    from attnscope.core.analysis.aggregate import map_tile

    starts = range(0, n, band_rows)
    for k, r0 in enumerate(starts):
        if cancelled is not None and cancelled():
            raise Cancelled("export cancelled")
        yield map_tile(session, layer, head, mode, slice(r0, min(n, r0 + band_rows)), slice(0, n))
        if progress is not None:
            progress(k + 1, len(starts))


def coloured(
    bands: Iterable[np.ndarray], colour: ColourSpec, window: int | None = None, masked: bool = True
) -> Iterable[np.ndarray]:
    """RGB uint8 bands of the row bands of a map from row 0 (:func:`attnscope.core.io.render.map_pixels`:
    the cells every image draws; with ``masked`` the causal mask and sliding ``window`` hatched)."""
    from attnscope.core.attention.masks import hidden_cells
    from attnscope.core.io.render import map_pixels

    r0 = 0
    for b in bands:
        rows, cols = np.arange(r0, r0 + b.shape[0]), np.arange(b.shape[1])
        m = hidden_cells(rows, cols, window) if masked else None
        yield map_pixels(b, colour, masked=m, origin=(0, r0))
        r0 += b.shape[0]


def long_colour_range(
    session: Session | RemoteSession,
    layer: int,
    head: int,
    n: int,
    mode: str,
    range_mode: str,
    rows: int = 512,
) -> tuple[float, float]:
    """``(vmin, vmax)`` for a long map without holding it: ``auto`` is :func:`attnscope.core.analysis.aggregate.robust_max`
    of its last ``rows`` rows (they see the most keys), ``shared`` the layer's (as
    :func:`attnscope.core.analysis.aggregate.layer_robust_max`), ``fixed`` [0, 1]."""
    from attnscope.core.analysis import aggregate
    from attnscope.core.analysis.aggregate import map_tile

    if range_mode == "fixed":
        return 0.0, 1.0
    if range_mode == "auto":
        return 0.0, aggregate.robust_max(
            map_tile(session, layer, head, mode, slice(max(0, n - rows), n), slice(0, n))
        )
    if range_mode == "shared":
        return 0.0, aggregate.layer_robust_max(session, layer, n)
    raise ValueError(f"unknown colour range {range_mode!r}: use fixed, auto, shared")


def export_long_png(
    session: Session | RemoteSession,
    layer: int,
    head: int,
    path: str | os.PathLike,
    *,
    n: int,
    mode: str = "head",
    size: tuple[int, int] | None = None,
    full_size: bool = False,
    colour: ColourSpec = LONG_COLOUR,
    metadata: dict | None = None,
    dpi: float | None = None,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """A long map's bare PNG, never holding the map: streamed at one pixel per cell when
    ``full_size`` (or ``size`` is ``(n, n)``), else a max-pooled overview of ``size`` (default
    :data:`OVERVIEW_SIDE` a side, at most ``n``). ``metadata`` gains ``"pooling"`` (``None`` at full
    size) and ``"image_size"``. ``colour``: map, scale and the resolved range
    (:func:`long_colour_range`); default viridis, log, [0, 1].

    Raises:
        ValueError: one pixel per cell above :data:`FULL_SIZE_LIMIT` a side without ``full_size``;
            ``size`` larger than the map (enlarging a long map has no use).
    """
    from attnscope.core.analysis.aggregate import pooled_map

    meta = dict(metadata or {})
    if size is not None and (size[0] > n or size[1] > n):
        raise ValueError(f"size {size[0]}x{size[1]} is larger than the {n}x{n} map; use at most {n}x{n}")
    full = full_size or size == (n, n) or (size is None and n <= OVERVIEW_SIDE)
    if full and n > FULL_SIZE_LIMIT and not full_size:
        raise ValueError(
            f"a {n}x{n} PNG at one pixel per cell is {n * n / 1e6:.0f} M pixels; pass --full-size "
            f"(full_size=True) to write it, or --size WxH for a max-pooled overview"
        )
    from attnscope.core.attention.masks import hidden_blocks
    from attnscope.core.io.render import layer_sliding_window, map_pixels

    window = None if mode == "all" else layer_sliding_window(session, layer)
    if full:
        meta["pooling"] = None
        meta["image_size"] = [n, n]
        bands = coloured(
            map_bands(session, layer, head, n, mode, cancelled=cancelled, progress=progress), colour, window
        )
        return write_png_rows(path, n, n, bands, meta, dpi)
    w, h = size if size is not None else (min(n, OVERVIEW_SIDE), min(n, OVERVIEW_SIDE))
    pm = pooled_map(session, layer, head, mode, n, out=h, out_cols=w, cancelled=cancelled, progress=progress)
    meta["pooling"] = {
        "kind": "max",
        "image_size": [w, h],
        "map_size": [n, n],
        "block_rows": round(n / h, 3),
        "block_cols": round(n / w, 3),
        "note": "each pixel is the max of the exact weights over its block of cells, so "
        "one-cell features (a sink column, the diagonal) stay visible",
    }
    meta["image_size"] = [w, h]
    # blocks of only masked cells hatched (a block with one allowed cell shows its max)
    rgb = map_pixels(pm.image, colour, masked=hidden_blocks(pm.row_edges, pm.col_edges, window))
    return write_png_rows(path, w, h, [rgb], meta, dpi)
