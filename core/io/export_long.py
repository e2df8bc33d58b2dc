"""Long maps: readable colour defaults and PNG exports that stream.

**Colours by length.** At T = 16,000 most weights of a head are about 1/T ≈ 6e-5: on the fixed
[0, 1] linear scale the map is one flat colour and its sink column, diagonal and local band are
invisible, and well before that (a 2,000-token head: 2 % of its causal cells off the zero colour)
the picture is blank. The default scale is therefore chosen from the map's own weights
(:func:`scale_for_map`): ``log`` (log10 over [1e-6, 1], :func:`attnscope.core.io.colormaps.normalize`,
where 1/T sits a third of the way up the colour map, a 0.5 sink weight near its top) when fewer
than :data:`LINEAR_MIN_SHARE` of its cells would show on the linear scale, and from
:data:`LONG_MAP` tokens by length. The choice is always said (:meth:`ScaleChoice.note`: title,
metadata).

**Streaming PNG.** :func:`write_png_rows` writes a PNG from row bands (IHDR, an ``iTXt`` chunk
with the metadata, zlib-compressed IDAT chunks as bands arrive, IEND; PNG spec §11), so a map is
never coloured whole: extra memory is one band of weights (``band_rows × n`` float32, plus its
float64 normalisation and RGB bytes), not the 6 GB a 16k map took through Pillow
(``n² × (4 + 8 + 8 + 3)`` bytes of temporaries). A long map's bare PNG is by default a
**max-pooled overview** (:data:`OVERVIEW_SIDE` px a side, or ``size``; the pooling is recorded
under ``"pooling"`` in the metadata); one pixel per cell above :data:`FULL_SIZE_LIMIT` a side
needs ``full_size=True`` (CLI ``--full-size``).
"""

from __future__ import annotations

import dataclasses
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

if TYPE_CHECKING:
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

LONG_MAP = 2048  # from this many tokens a map gets the long-map defaults (log scale, pooled overview)
OVERVIEW_SIDE = 2048  # default side of a long map's bare PNG overview (pixels)
FULL_SIZE_LIMIT = 4096  # one pixel per cell above this side needs full_size=True (16k: 268 M pixels)
BAND_ROWS = 256  # rows per streamed band
LONG_COLOUR = ColourSpec(scale="log")  # a long map's colours unless told otherwise


def default_colour_scale(n: int) -> str:
    """Colour scale a map of ``n`` tokens gets by length alone: ``linear`` below :data:`LONG_MAP`,
    ``log`` from there (see the module docstring for why). A map held whole gets its scale from its
    own weights instead (:func:`scale_for_map`)."""
    return "log" if n >= LONG_MAP else "linear"


#: the linear [0, 1] scale is the default while at least this share of a map's allowed cells shows
#: on it (:func:`linear_share`); below it the picture is a dark field with a few dots. Measured on
#: SmolLM2-135M (tests/core/test_default_scale.py has the kind): the median head shows 59 % of its cells
#: at 12 tokens, 39 % at 27, 21 % at 64, 6 % at 256, 1.5 % at 1,000
LINEAR_MIN_SHARE = 0.25
#: a cell "shows" on the linear [0, 1] scale from this weight: 4 of the 256 colour levels above the
#: zero colour (the lowest levels of viridis or magma are not told apart from it by eye)
SHOWS_FROM = 1 / 64
#: a weight below this is drawn in the zero colour itself on the linear [0, 1] scale (level 0)
ZERO_COLOUR_BELOW = 0.5 / 255


def linear_share(weights, masked=None, shows_from: float = SHOWS_FROM) -> float:
    """Share in [0, 1] of a map's allowed cells that show on the linear [0, 1] scale: weight ≥
    ``shows_from`` (default :data:`SHOWS_FROM`, level 4 of 256; :data:`ZERO_COLOUR_BELOW` counts
    every cell off the zero colour itself).

    ``weights``: one ``(n_q, n_k)`` array or a sequence of them (maps shown together: one share
    for all). Allowed cells are the finite ones the mask did not hide: ``masked`` (bool, the
    weights' shape, or one per map) when given, else every cell whose weight is not exactly 0
    (a masked cell is exp(−inf) = 0; a float32 softmax underflows to 0 only below ~1e-45).
    A map with no allowed cell has share 1.0 (nothing to see either way: linear)."""
    maps = [weights] if isinstance(weights, np.ndarray) or np.ndim(weights) == 2 else list(weights)
    masks = [masked] * len(maps) if masked is None or isinstance(masked, np.ndarray) else list(masked)
    n_allowed = n_shown = 0
    for w, m in zip(maps, masks, strict=True):
        w = np.asarray(w, dtype=np.float32)
        allowed = np.isfinite(w) & ((w != 0) if m is None else ~np.asarray(m, dtype=bool))
        n_allowed += int(np.count_nonzero(allowed))
        n_shown += int(np.count_nonzero(allowed & (w >= shows_from)))
    return 1.0 if n_allowed == 0 else n_shown / n_allowed


@dataclasses.dataclass(frozen=True)
class ScaleChoice:
    """The default colour scale of a map and why: ``scale`` (``"linear"``/``"log"``), ``n`` its
    tokens, ``share`` the :func:`linear_share` it was chosen from (None: chosen by length, a long map
    not held whole)."""

    scale: str
    n: int
    share: float | None = None

    def note(self) -> str:
        """Title text, e.g. ``"log colours (chosen: 2 % of cells would show on linear)"``, ``"log colours
        (chosen for 4,096 tokens)"`` or ``"linear colours"``."""
        if self.share is None:
            return scale_note(self.n, self.scale, self.n >= LONG_MAP)
        if self.scale == "log":
            pct = f"{self.share:.0%}".replace("%", " %") if self.share >= 0.01 else "< 1 %"
            return f"log colours (chosen: {pct} of cells would show on linear)"
        return f"{self.scale} colours"

    def metadata(self) -> dict:
        """What an export records under ``"colour"``: ``scale_chosen`` and the share."""
        if self.share is None:
            return {"scale_chosen": "by length"}
        return {"scale_chosen": "by the map's weights", "linear_share": round(self.share, 4)}


def scale_for_map(weights, masked=None, n: int | None = None) -> ScaleChoice:
    """The default scale of ``weights`` (one map or several shown together, as in
    :func:`linear_share`): ``linear`` when at least :data:`LINEAR_MIN_SHARE` of the allowed cells
    show on it, else ``log``. ``n``: the tokens the maps cover (default: the first map's rows); from
    :data:`LONG_MAP` tokens it is ``log`` by length (a long map is not held whole; a row sums to 1,
    so at most ``1 / SHOWS_FROM`` = 64 of its cells show, ≤ 6 % of a 2,048-token map's)."""
    first = weights if isinstance(weights, np.ndarray) or np.ndim(weights) == 2 else next(iter(weights))
    n = int(np.shape(first)[0]) if n is None else int(n)
    if n >= LONG_MAP:
        return ScaleChoice("log", n)
    share = linear_share(weights, masked)
    return ScaleChoice("linear" if share >= LINEAR_MIN_SHARE else "log", n, share)


def colour_for_length(colour: ColourSpec, n: int) -> ColourSpec:
    """``colour`` with a concrete scale: a None scale becomes :func:`default_colour_scale` for ``n`` tokens;
    a scale the user chose stays."""
    if colour.scale is not None:
        return colour
    return dataclasses.replace(colour, scale=default_colour_scale(n))


def colour_for_map(colour: ColourSpec, weights, masked=None) -> tuple[ColourSpec, ScaleChoice | None]:
    """``colour`` with a concrete scale for ``weights``: a None scale becomes :func:`scale_for_map`'s
    (returned too, for the title and metadata); a scale the user chose stays (choice None)."""
    if colour.scale is not None:
        return colour, None
    choice = scale_for_map(weights, masked)
    return dataclasses.replace(colour, scale=choice.scale), choice


def scale_note(n: int, scale: str, chosen_by_length: bool) -> str:
    """Title text for the colour scale, e.g. ``"log colours (chosen for 4,096 tokens)"``."""
    if chosen_by_length:
        return f"{scale} colours (chosen for {n:,} tokens)"
    return f"{scale} colours"


# -- PNG writing -----------------------------------------------------------------------------------
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
    :func:`attnscope.core.io.export.save_map_png` writes it; ``dpi`` into ``pHYs``. Each band is compressed as it
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
