"""The default colour scale of a map: linear or log, chosen from its own weights, or by length for a long map.

Qt-free. At T = 16,000 most weights of a head are about 1/T ≈ 6e-5: on the fixed [0, 1] linear
scale the map is one flat colour and its sink column, diagonal and local band are invisible, and
well before that (a 2,000-token head: 2 % of its causal cells off the zero colour) the picture is
blank. The default scale is therefore chosen from the map's own weights (:func:`scale_for_map`):
``log`` (log10 over [1e-6, 1], :func:`attnscope.core.io.colormaps.normalize`, where 1/T sits a third
of the way up the colour map, a 0.5 sink weight near its top) when fewer than
:data:`LINEAR_MIN_SHARE` of its cells would show on the linear scale, and from :data:`LONG_MAP`
tokens by length (:func:`default_colour_scale`). The choice is always said
(:meth:`ScaleChoice.note`: title, metadata).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from attnscope.core.io.colormaps import ColourSpec

LONG_MAP = 2048  # from this many tokens a map gets the long-map defaults (log scale, pooled overview)
LONG_COLOUR = ColourSpec(scale="log")  # a long map's colours unless told otherwise


def default_colour_scale(n: int) -> str:
    """Colour scale a map of ``n`` tokens gets by length alone: ``linear`` below :data:`LONG_MAP`,
    ``log`` from there (see the module docstring for why). A map held whole gets its scale from its
    own weights instead (:func:`scale_for_map`)."""
    return "log" if n >= LONG_MAP else "linear"


#: the linear [0, 1] scale is the default while at least this share of a map's allowed cells shows
#: on it (:func:`linear_share`); below it the picture is a dark field with a few dots. Measured on
#: SmolLM2-135M (tests/core/test_default_colour_scale.py has the kind): the median head shows 59 % of its cells
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
