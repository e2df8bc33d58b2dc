"""Batches of heads: every head of a layer, or every layer × head, one file each, plus a ``manifest.json``.

Qt-free. :func:`export_batch` writes each head as :func:`attnscope.core.io.head_export.export_head`
does, then a manifest (the shared metadata once, then one entry per file). Progress and cancel
through callbacks (engine job: ``ctx.progress``/``ctx.cancelled``; CLI: a stderr line).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from attnscope.core.errors import Cancelled
from attnscope.core.io.colormaps import DEFAULT_COLOUR, ColourSpec
from attnscope.core.io.formats import BATCH_FORMATS
from attnscope.core.io.head_export import export_head
from attnscope.core.io.provenance import mask_info, session_metadata, write_json
from attnscope.core.io.render import Renderer

if TYPE_CHECKING:
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

Progress = Callable[[int, int, str], None]


def heads_in_scope(n_layers: int, n_heads: int, layer: int | None = None, arch=None) -> list[tuple[int, int]]:
    """``(layer, head)`` pairs: every head of ``layer``, or every layer × head when ``layer`` is None;
    with ``arch`` (:class:`attnscope.core.arch.ArchConfig`) a hybrid model's layers with no map are left out.

    Raises:
        IndexError: ``layer`` out of range. NoAttentionMap: ``layer`` has no map (with ``arch``).
    """
    if layer is not None:
        if not 0 <= layer < n_layers:
            raise IndexError(f"layer {layer} out of range 0..{n_layers - 1}")
        if arch is not None:
            arch.check_map(layer)
        return [(layer, h) for h in range(n_heads)]
    layers = range(n_layers) if arch is None else arch.attention_layers
    return [(ll, h) for ll in layers for h in range(n_heads)]


def batch_file_name(layer: int, head: int, fmt: str, n_layers: int = 100, n_heads: int = 100) -> str:
    """``L03_H04.png``: zero-padded so files sort by layer then head."""
    lw, hw = max(2, len(str(n_layers - 1))), max(2, len(str(n_heads - 1)))
    return f"L{layer:0{lw}d}_H{head:0{hw}d}.{fmt}"


def export_batch(
    session: Session | RemoteSession,
    out_dir: str | os.PathLike,
    fmt: str,
    pairs: Sequence[tuple[int, int]],
    *,
    colour: ColourSpec = DEFAULT_COLOUR,
    size: tuple[int, int] | None = None,
    dpi: float | None = None,
    figure: bool = False,
    renderer: Renderer | None = None,
    progress: Progress | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> list[Path]:
    """Export each ``(layer, head)`` of ``pairs`` to ``out_dir/L.._H...<fmt>`` and write ``manifest.json``.

    Colours as :func:`export_head` (``colour``; its range resolved per map).

    One head's map is computed at a time (peak memory one ``seq_len²`` float32 map). ``progress(done,
    total, file_name)`` after each file; ``cancelled()`` before each. The manifest holds the shared
    metadata once and ``files: [{file, layer, head, kv_head, mask}]``; it is written also when the batch
    is cancelled (listing what was written).

    Returns every path written (data files, sidecars, images, the manifest last).

    Raises:
        ValueError: unknown format; SVG/PDF (or a PNG figure) without a renderer.
        FileNotFoundError: ``out_dir``'s parent does not exist.
        Cancelled: ``cancelled()`` became true (message says how many files were written).
    """
    fmt = fmt.lower().lstrip(".")
    if fmt not in BATCH_FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(BATCH_FORMATS)}")
    if (fmt in ("svg", "pdf") or (fmt == "png" and figure)) and renderer is None:
        raise ValueError(f"{fmt.upper()} figures need the Qt renderer (attnscope.app.figure); none was given")
    out = Path(out_dir)
    if not out.parent.exists():
        raise FileNotFoundError(f"folder {out.parent} does not exist")
    out.mkdir(exist_ok=True)
    info = session.info
    base = session_metadata(session)
    written: list[Path] = []
    entries: list[dict] = []
    total = len(pairs)
    stopped = None
    for i, (layer, head) in enumerate(pairs):
        if cancelled is not None and cancelled():
            stopped = i
            break
        name = batch_file_name(layer, head, fmt, info.n_layers, info.n_heads)
        written += export_head(
            session,
            layer,
            head,
            out / name,
            colour=colour,
            size=size,
            dpi=dpi,
            figure=figure,
            renderer=renderer,
            base=base,
        )
        entries.append(
            {
                "file": name,
                "layer": layer,
                "head": head,
                "kv_head": info.kv_head(head),
                "mask": mask_info(session, layer)["description"],
            }
        )
        if progress is not None:
            progress(i + 1, total, name)
    manifest = dict(base)
    manifest.update(
        {
            "kind": "batch",
            "format": fmt,
            "cmap": colour.cmap,
            "scale": colour.scale,
            "gamma": colour.gamma if colour.scale == "power" else None,
            "range": colour.range_mode,
            "files": entries,
            "complete": stopped is None,
        }
    )
    written.append(write_json(out / "manifest.json", manifest))
    if stopped is not None:
        raise Cancelled(f"batch export stopped after {stopped} of {total} files")
    return written
