"""One head's map exported to a file: data, plain PNG, labelled figure, SVG or PDF, with its provenance.

Qt-free. :func:`export_head` writes the exact map (:func:`head_map`) of one head (or a mean of
heads, :mod:`attnscope.core.analysis.aggregate`) in the format its suffix names: data files and
bare PNGs through :mod:`attnscope.core.io.data_writers`, a long map's bare PNG streamed
(:mod:`attnscope.core.io.long_png`), labelled figures and ``.svg``/``.pdf`` through a *renderer*
passed in by the caller (the app's Qt renderer, :func:`attnscope.app.figure.save_heatmap_figure`),
since this package never imports Qt. The metadata comes from :mod:`attnscope.core.io.provenance`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core.errors import OutOfRange
from attnscope.core.io.colormaps import COLOUR_BY_LENGTH, RANGE_MODES, ColourSpec
from attnscope.core.io.data_writers import save_map_png, suffix_format, write_data
from attnscope.core.io.formats import BATCH_FORMATS, DATA_FORMATS
from attnscope.core.io.provenance import head_metadata, sidecar_path, write_json
from attnscope.core.io.render import Renderer, layer_sliding_window

if TYPE_CHECKING:
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session


def check_head_call(
    session: Session | RemoteSession,
    layer,
    head,
    path: Path,
    fmt: str,
    n,
    mode: str,
    weighting: str,
    figure: bool,
    renderer,
) -> None:
    """Every argument of :func:`export_head` checked before any work, one line each.

    Raises:
        SessionError: nothing run yet. WrongType (a TypeError): layer/head/n not an int.
        OutOfRange (an IndexError): layer, head or n out of range. BadArgument (a ValueError): unknown
        mode or weighting, an SVG/PDF or labelled figure without ``renderer``. BadPath (a
        FileNotFoundError): the output's folder does not exist.
    """
    from attnscope.core.analysis.aggregate import MODES
    from attnscope.core.analysis.value_weighted import WEIGHTINGS
    from attnscope.core.checks import in_range, index
    from attnscope.core.errors import BadArgument, BadPath, SessionError

    info = session.info
    index("layer", layer, info.n_layers)
    info.arch.check_map(layer)  # NoAttentionMap: a hybrid model's layer with no softmax attention
    index("head", head, info.n_heads)
    if mode not in MODES:
        raise BadArgument(f"unknown mode {mode!r}: choose {', '.join(MODES)}")
    if weighting not in WEIGHTINGS:
        raise BadArgument(f"unknown weighting {weighting!r}: choose {' or '.join(WEIGHTINGS)}")
    if session.seq_len == 0:
        raise SessionError("nothing has run yet: run a prompt first (call prefill(prompt)), then export")
    if n is not None:
        in_range("n", n, 1, session.seq_len)
    if renderer is None and (fmt in ("svg", "pdf") or (figure and fmt == "png")):
        what = f"{fmt.upper()} figures" if fmt != "png" else "labelled PNG figures (figure=True)"
        raise BadArgument(
            f"{what} need the window's Qt renderer: pass renderer=attnscope.app.figure.save_heatmap_figure "
            "(needs PySide6), or write .png, .npy, .csv or .safetensors"
        )
    folder = path.parent
    if not folder.is_dir():
        raise BadPath(
            f"cannot write {str(path)!r}: the folder {str(folder)!r} does not exist (create it first)"
        )


def map_mask(
    session: Session | RemoteSession, layer: int, n: int | None = None, mode: str = "head"
) -> np.ndarray:
    """``(n, n)`` bool: the cells of an exported map the mask hid (causal, and ``layer``'s sliding
    window unless ``mode`` is the mean of all layers, where a cell is masked only where every layer
    masks it: the causal part), drawn hatched by every image (:mod:`attnscope.core.io.render`)."""
    from attnscope.core.attention.masks import hidden_cells

    n = session.seq_len if n is None else int(n)
    window = None if mode == "all" else layer_sliding_window(session, layer)
    pos = np.arange(n)
    return hidden_cells(pos, pos, window)


def head_title(
    session: Session | RemoteSession, layer: int, head: int, n: int | None = None, mode: str = "head"
) -> str:
    """Figure title: ``"SmolLM2-135M-Instruct · Layer 3 · query head 4 (reads KV head 1) · step 2 · seq_len 29"``."""
    from attnscope.core.analysis import aggregate

    n = session.seq_len if n is None else n
    return (
        f"{session.info.name} · {aggregate.describe(session.info, layer, head, mode)}"
        f" · step {n - session.n_prompt} · seq_len {n}"
    )


def head_map(
    session: Session | RemoteSession,
    layer: int,
    head: int,
    n: int | None = None,
    mode: str = "head",
    weighting: str = "attention",
) -> np.ndarray:
    """The exact map an export writes: ``(n, n)`` float32 of one head (or a ``mode`` mean, :mod:`attnscope.core.analysis.aggregate`).

    ``weighting="value-weighted"``: the row-normalised α_ij·‖v_j W_O^h‖ map the heatmap shows under
    that scale (:func:`attnscope.core.analysis.value_weighted.value_weighted_tile`; Kobayashi et al. 2020).

    Raises:
        ValueError: unknown ``weighting`` or ``mode``. IndexError: ``n`` out of range.
    """
    from attnscope.core.analysis.value_weighted import check_weighting, value_weighted_tile

    if check_weighting(weighting) == "value-weighted":
        if n is not None and not 1 <= n <= session.seq_len:
            raise OutOfRange(f"n {n} out of range 1..{session.seq_len}")
        sel = slice(0, session.seq_len if n is None else int(n))
        return value_weighted_tile(session, layer, head, mode, sel, sel)
    if mode == "head":
        part = None if n is None else slice(0, int(n))
        if n is not None and not 1 <= n <= session.seq_len:
            raise OutOfRange(f"n {n} out of range 1..{session.seq_len}")
        return session.weights(layer, head, part, part)
    from attnscope.core.analysis import aggregate

    return aggregate.map_at(session, layer, head, mode, n)


def colour_range(
    session: Session | RemoteSession,
    layer: int,
    w: np.ndarray,
    range_mode: str = "fixed",
    n: int | None = None,
) -> tuple[float, float]:
    """``(vmin, vmax)`` of the colour scale, as the heatmap's Range control computes it.

    ``"fixed"``: ``[0, 1]`` (probabilities); ``"auto"``: ``[0, robust_max(w)]`` (99.5th percentile of
    the non-zero weights of this map); ``"shared"``: ``[0, layer_robust_max]`` over the heads of
    ``layer`` (first ``n`` positions), so a layer's maps are comparable (:mod:`attnscope.core.analysis.aggregate`).

    Raises:
        ValueError: unknown ``range_mode``.
    """
    from attnscope.core.analysis import aggregate

    if range_mode == "fixed":
        return 0.0, 1.0
    if range_mode == "auto":
        return 0.0, aggregate.robust_max(w)
    if range_mode == "shared":
        return 0.0, aggregate.layer_robust_max(session, layer, n)
    raise ValueError(f"unknown colour range {range_mode!r}: use {', '.join(RANGE_MODES)}")


def export_head(
    session: Session | RemoteSession,
    layer: int,
    head: int,
    path: str | os.PathLike,
    *,
    colour: ColourSpec = COLOUR_BY_LENGTH,
    size: tuple[int, int] | None = None,
    dpi: float | None = None,
    figure: bool = False,
    renderer: Renderer | None = None,
    base: dict | None = None,
    n: int | None = None,
    mode: str = "head",
    full_size: bool = False,
    weighting: str = "attention",
) -> list[Path]:
    """Export one head's map to ``path`` (format by suffix). Returns the files written.

    ``weighting`` is what a cell measures (``"attention"``, or ``"value-weighted"`` as in
    :func:`head_map`, below :data:`attnscope.core.io.colour_scale.LONG_MAP` tokens); the metadata records it.

    ``n``/``mode`` as in :func:`head_metadata` (default: the whole sequence, the single head). Data
    formats and PDFs get a sidecar ``<file>.json`` (PNG and SVG carry the metadata inside); ``.png``
    is the plain map unless ``figure`` (labelled, needs ``renderer``); ``.svg``/``.pdf`` always need
    ``renderer``. Images are coloured as the heatmap shows them by ``colour``
    (:class:`attnscope.core.io.colormaps.ColourSpec`: map, scale, power-scale gamma, and its
    ``range_mode`` resolved to ``vmin``/``vmax`` by :func:`colour_range`); the metadata records it under
    ``"colour"``. A None ``colour.scale`` (the default) is chosen from the map's own weights
    (:func:`attnscope.core.io.colour_scale.scale_for_map`: log when fewer than a quarter of its cells
    show on linear; recorded as ``"scale_chosen": "by the map's weights"`` with ``"linear_share"``),
    and by length from 2,048 tokens (``"by length"``). A long map's bare PNG
    (from :data:`attnscope.core.io.colour_scale.LONG_MAP` tokens) streams and is a max-pooled overview unless
    ``full_size`` (:func:`attnscope.core.io.long_png.export_long_png`; the pooling is in the metadata).

    Every argument is checked before any work (:func:`check_head_call`).

    Raises:
        SessionError: nothing run yet (run a prompt first).
        BadArgument (a ValueError): unknown suffix, aggregate, weighting or range, an SVG/PDF or
            labelled figure without ``renderer`` (pass ``attnscope.app.figure.save_heatmap_figure``:
            the window's Qt renderer, needs PySide6), a full-size long PNG above the size limit
            without ``full_size``.
        OutOfRange (an IndexError): layer/head/n. WrongType (a TypeError): layer/head/n not an int.
        BadPath (a FileNotFoundError): the output's folder does not exist.
    """
    from attnscope.core.io import colour_scale, long_png

    path = Path(path)
    fmt = suffix_format(path, BATCH_FORMATS)
    check_head_call(session, layer, head, path, fmt, n, mode, weighting, figure, renderer)
    meta = head_metadata(session, layer, head, n=n, mode=mode, base=base)
    meta["weighting"] = weighting
    n_map = session.seq_len if n is None else int(n)
    if weighting != "attention" and n_map >= colour_scale.LONG_MAP:
        raise ValueError(
            f"value-weighted maps export up to {colour_scale.LONG_MAP - 1} tokens; this one has {n_map}"
        )
    by_length = colour.scale is None
    asked_scale = colour.scale
    colour = colour_scale.colour_for_length(colour, n_map)
    if fmt == "png" and not figure and n_map >= colour_scale.LONG_MAP:
        colour = colour.with_range(
            *long_png.long_colour_range(session, layer, head, n_map, mode, colour.range_mode)
        )
        meta["colour"] = colour.metadata()
        meta["colour"]["scale_chosen"] = "by length" if by_length else "by the user"
        return [
            long_png.export_long_png(
                session,
                layer,
                head,
                path,
                n=n_map,
                mode=mode,
                size=size,
                full_size=full_size,
                colour=colour,
                metadata=meta,
                dpi=dpi,
            )
        ]
    w = head_map(session, layer, head, n, mode, weighting)
    meta["nonfinite_cells"] = int(np.count_nonzero(~np.isfinite(w)))  # drawn as non-finite, not weights
    if fmt in DATA_FORMATS:
        return write_data(w, path, meta, tokens=session.tokens[: w.shape[0]])
    masked = map_mask(session, layer, w.shape[0], mode)
    # a scale not chosen by the user comes from this map's own weights (colour_scale.scale_for_map)
    colour, choice = colour_scale.colour_for_map(dataclasses.replace(colour, scale=asked_scale), w, masked)
    colour = colour.with_range(*colour_range(session, layer, w, colour.range_mode, n))
    meta["colour"] = colour.metadata()
    meta["colour"].update(choice.metadata() if choice is not None else {"scale_chosen": "by the user"})
    if fmt == "png" and not figure:
        return [save_map_png(w, path, colour, size=size, dpi=dpi, metadata=meta, masked=masked)]
    if renderer is None:
        raise ValueError(f"{fmt.upper()} figures need the Qt renderer (attnscope.app.figure); none was given")
    title = head_title(session, layer, head, w.shape[0], mode)
    out = Path(
        renderer(
            w,
            path,
            tokens=session.tokens[: w.shape[0]],
            title=title,
            colour=colour,
            size=size,
            dpi=dpi,
            metadata=meta,
        )
    )
    if fmt == "pdf":  # PNG keeps the metadata in a text chunk, SVG in <desc>; a PDF gets it beside it
        return [out, write_json(sidecar_path(out), meta)]
    return [out]
