"""Data files and plain map images of one matrix: ``.npy``, ``.csv``, ``.safetensors`` and the bare ``.png``.

Qt-free. A data file holds one head's exact weights, ``(n_query, n_key)`` float32, rows = query
positions, columns = key positions, each allowed row summing to 1, masked cells 0; next to it a
sidecar ``<file>.json`` (:mod:`attnscope.core.io.provenance`). ``.safetensors`` files carry the same
JSON in their header metadata (key ``"attnscope"``). CSV values use ``%.9g``, enough digits for a
float32 to read back bit-identical. A plain ``.png`` (Pillow, :mod:`attnscope.core.io.render`) has
one colour-map colour per cell; labelled figures and ``.svg``/``.pdf`` need the app's Qt renderer
(:mod:`attnscope.core.io.head_export`).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from attnscope.core.io import formats
from attnscope.core.io.colormaps import DEFAULT_COLOUR, ColourSpec
from attnscope.core.io.formats import DATA_FORMATS
from attnscope.core.io.provenance import sidecar_path, write_json

SAFETENSORS_KEY = "weights"


def suffix_format(path: Path, allowed: Sequence[str]) -> str:
    """The format of ``path`` by its suffix (``"npy"``, ``"png"``…), lower case.

    Raises:
        BadArgument (a ValueError): the suffix is not one of ``allowed``.
    """
    from attnscope.core.errors import BadArgument

    fmt = path.suffix.lower().lstrip(".")
    if fmt not in allowed:
        raise BadArgument(f"unsupported output {path.name!r}: use .{', .'.join(allowed)}")
    return fmt


#: the corner cell of a map CSV's header row: rows are queries, columns keys
CSV_CORNER = "query \\ key"


def csv_labels(n: int, tokens: Sequence | None = None) -> list[str]:
    """Header labels of ``n`` positions for a map CSV: ``"<position>:<token text>"`` (the text with
    :func:`attnscope.core.tokens.visible_text` stand-ins, so a label is one line), or the bare
    position where ``tokens`` (:class:`attnscope.core.tokens.Token`) runs out. Starting with a digit,
    no label reads as a spreadsheet formula."""
    from attnscope.core.tokens import visible_text

    toks = list(tokens or [])[:n]
    return [f"{i}:{visible_text(toks[i].text)}" if i < len(toks) else str(i) for i in range(n)]


def write_map_csv(w: np.ndarray, path: Path, tokens: Sequence | None = None) -> Path:
    """A map as CSV a spreadsheet reads: a header row (:data:`CSV_CORNER`, then each key's label),
    then one row per query (its label, then its weights, ``%.9g``: float32 round-trips).
    Labels from :func:`csv_labels`. Read back with :func:`read_map_csv`."""
    w = np.asarray(w, dtype=np.float32)
    rows, cols = csv_labels(w.shape[0], tokens), csv_labels(w.shape[1], tokens)
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow([CSV_CORNER, *cols])
        for label, row in zip(rows, w, strict=True):
            out.writerow([label, *(f"{float(x):.9g}" for x in row)])
    return path


def read_map_csv(path: str | os.PathLike) -> tuple[np.ndarray, list[str], list[str]]:
    """``(weights (n_q, n_k) float32, query labels, key labels)`` of a CSV :func:`write_map_csv` wrote.

    Raises:
        ValueError: not such a file (no header row starting with :data:`CSV_CORNER`, ragged rows).
    """
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0][:1] != [CSV_CORNER]:
        raise ValueError(f"{Path(path).name!r} is not an AttnScope map CSV (no {CSV_CORNER!r} header)")
    keys = rows[0][1:]
    if any(len(r) != len(keys) + 1 for r in rows[1:]):
        raise ValueError(f"{Path(path).name!r}: rows of unequal length")
    w = np.array([[float(x) for x in r[1:]] for r in rows[1:]], dtype=np.float32).reshape(-1, len(keys))
    return w, [r[0] for r in rows[1:]], keys


def write_data(
    w: np.ndarray, path: str | os.PathLike, metadata: dict | None = None, tokens: Sequence | None = None
) -> list[Path]:
    """Write a 2-D float32 matrix as .npy/.csv/.safetensors (by suffix), plus its sidecar JSON.

    A CSV has a header row and a label column (:func:`write_map_csv`: ``tokens`` label the positions,
    else their numbers). Returns the paths written (data file first). ``metadata=None`` writes no sidecar.

    Raises:
        ValueError: unknown suffix or not a 2-D matrix. OSError: the file cannot be written.
    """
    path = Path(path)
    fmt = suffix_format(path, DATA_FORMATS)
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"expected a 2-D matrix, got shape {w.shape}")
    meta = None
    if metadata is not None:
        meta = dict(metadata)
        meta["array"] = {
            "file": path.name,
            "format": fmt,
            "shape": list(w.shape),
            "dtype": "float32",
            **({"tensor": SAFETENSORS_KEY} if fmt == "safetensors" else {}),
        }
    if fmt == "npy":
        np.save(path, w)
    elif fmt == "csv":
        write_map_csv(w, path, tokens)
    else:
        from safetensors.numpy import save_file

        header = {"attnscope": json.dumps(meta, ensure_ascii=False)} if meta is not None else None
        save_file({SAFETENSORS_KEY: w}, str(path), metadata=header)
        umask = os.umask(0)  # safetensors creates the file 0600: give it the mode every export has
        os.umask(umask)
        os.chmod(path, 0o666 & ~umask)
    written = [path]
    if meta is not None:
        written.append(write_json(sidecar_path(path), meta))
    return written


def parse_size(text: str | None) -> tuple[int, int] | None:
    """``"1200x800"`` → ``(1200, 800)``; None passes through. Raises ValueError on anything else."""
    if text is None:
        return None
    try:
        w, h = (int(x) for x in str(text).lower().split("x"))
    except ValueError:
        raise ValueError(f"size must look like 1200x800, got {text!r}") from None
    if not (16 <= w <= 20000 and 16 <= h <= 20000):
        raise ValueError(f"size {w}x{h} out of range (16..20000 pixels a side)")
    return w, h


def save_map_png(
    w: np.ndarray,
    path: str | os.PathLike,
    colour: ColourSpec = DEFAULT_COLOUR,
    size: tuple[int, int] | None = None,
    dpi: float | None = None,
    metadata: dict | None = None,
    masked: np.ndarray | None = None,
) -> Path:
    """A plain map PNG (:func:`attnscope.core.io.render.map_pixels`): one colour-map colour per cell
    (``colour``: map, scale, range), ``masked`` cells (bool, the map's shape) hatched grey on white,
    non-finite cells magenta; rows = queries, columns = keys.

    ``size`` = exact ``(width, height)`` in pixels (nearest-neighbour, so every pixel still carries its
    cell's colour); default: square cells, longest side up to 2048 px. ``dpi`` is recorded in the PNG
    (pHYs). ``metadata`` goes into a PNG text chunk ``"attnscope"`` as JSON.
    """
    from attnscope.core.io.render import heatmap_image
    from PIL import PngImagePlugin

    path = Path(path)
    img = heatmap_image(w, colour, masked=masked, size=size)
    kw: dict = {}
    if dpi:
        kw["dpi"] = (float(dpi), float(dpi))
    if metadata is not None:
        info = PngImagePlugin.PngInfo()
        info.add_itxt("attnscope", json.dumps(metadata, ensure_ascii=False))
        kw["pnginfo"] = info
    img.save(path, format="PNG", **kw)
    return path


def write_weights(
    w: np.ndarray, out: Path, colour: ColourSpec = DEFAULT_COLOUR, tokens: Sequence | None = None
) -> None:
    """Write a weights matrix to ``out`` by its suffix (.png / .npy / .csv / .safetensors), no sidecar;
    ``tokens`` label a CSV's header row and column (:func:`write_map_csv`)."""
    suffix = out.suffix.lower().lstrip(".")
    if suffix in formats.DATA_FORMATS:
        write_data(w, out, tokens=tokens)
    elif suffix == "png":
        save_map_png(w, out, colour)
    else:
        raise ValueError(f"unsupported output {out.name!r}: use .png, {formats.listing('data', last=' or ')}")


def write_compare_csv(result, path: Path) -> Path:
    """The ranked heads table of a :class:`attnscope.core.analysis.compare_runs.CompareResult` as CSV:
    ``rank, layer, head, js_mean, js_max, js_argmax_row`` (``attnscope compare --csv``, the Compare tab)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["rank", "layer", "head", "js_mean", "js_max", "js_argmax_row"])
        for i, d in enumerate(result.ranked(), 1):
            w.writerow([i, d.layer, d.head, f"{d.js_mean:.9g}", f"{d.js_max:.9g}", d.js_argmax])
    return path
