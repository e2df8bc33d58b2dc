"""The export formats: one table that the writers (:mod:`attnscope.core.io.data_writers`, :mod:`attnscope.core.io.head_export`), ``attnscope export``
(its ``--out``/``--format``/``--frames`` checks and help) and the window (the Export menu, the file
dialogs' filters, the batch dialog's format list) all read. A new format is one :data:`FORMATS` entry
plus its writer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExportFormat:
    """One file format an export writes.

    Attributes:
        suffix: the file suffix without its dot (``"npy"``), also ``--format``'s value.
        kind: ``"image"`` (a picture of the map), ``"data"`` (the numbers, with a JSON sidecar) or
            ``"animation"`` (every decode step of one head).
        title: how file dialogs and menus name it (``"NumPy array"``).
        figure_only: always drawn as a labelled figure (SVG, PDF); PNG is the plain map unless a
            figure is asked for.
    """

    suffix: str
    kind: str
    title: str
    figure_only: bool = False


FORMATS: tuple[ExportFormat, ...] = (
    ExportFormat("png", "image", "PNG image"),
    ExportFormat("svg", "image", "SVG vector image", figure_only=True),
    ExportFormat("pdf", "image", "PDF document", figure_only=True),
    ExportFormat("npy", "data", "NumPy array"),
    ExportFormat("csv", "data", "CSV table"),
    ExportFormat("safetensors", "data", "safetensors"),
    ExportFormat("gif", "animation", "Animated GIF"),
    ExportFormat("mp4", "animation", "MP4 video (H.264)"),
)


def suffixes(*kinds: str) -> tuple[str, ...]:
    """The suffixes (no dot) of the formats of ``kinds``, in table order: ``suffixes("data")`` is
    ``("npy", "csv", "safetensors")``."""
    return tuple(f.suffix for f in FORMATS if f.kind in kinds)


def listing(*kinds: str, last: str = ", ") -> str:
    """The suffixes of ``kinds`` for a message or help text: ``listing("data", last=" or ")`` is
    ``".npy, .csv or .safetensors"``."""
    dotted = [f".{s}" for s in suffixes(*kinds)]
    return dotted[0] if len(dotted) == 1 else ", ".join(dotted[:-1]) + last + dotted[-1]


def file_filter(*kinds: str) -> str:
    """A Qt file-dialog filter for ``kinds``: ``"NumPy array (*.npy);;CSV table (*.csv);;..."``."""
    return ";;".join(f"{f.title} (*.{f.suffix})" for f in FORMATS if f.kind in kinds)


def get(suffix: str) -> ExportFormat:
    """The format of ``suffix`` (with or without its dot, any case).

    Raises:
        KeyError: no such format.
    """
    s = suffix.lower().lstrip(".")
    for f in FORMATS:
        if f.suffix == s:
            return f
    raise KeyError(suffix)


DATA_FORMATS = suffixes("data")
IMAGE_FORMATS = suffixes("image")
BATCH_FORMATS = IMAGE_FORMATS + DATA_FORMATS
ANIMATION_FORMATS = suffixes("animation")
FIGURE_ONLY_FORMATS = tuple(f.suffix for f in FORMATS if f.figure_only)
