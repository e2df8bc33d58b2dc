"""Output paths of the ``attnscope`` commands: checked before any model loads, written whole or not at all.

Every ``--json``/``--csv``/``--out``/``--save-session``/``--frames`` path goes through
:func:`check_output` up front, so a folder given as a file name, a missing folder or a place this
process cannot write is refused with one line before the (slow) model load, not after it.
``-`` means standard output wherever a command writes JSON (:func:`write_json`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

STDOUT = "-"


def check_output(text: str | os.PathLike, flag: str, *, stdout: bool = False) -> Path | None:
    """Check that a file can be written at ``text`` (the value of ``flag``, for the message).

    Returns:
        The path, or None for ``-`` when ``stdout`` is allowed (the caller prints instead).

    Raises:
        IsADirectoryError: ``text`` names an existing folder. FileNotFoundError: its folder does not
        exist. NotADirectoryError: its "folder" is a file. PermissionError: nothing can be created
        in the folder (read-only, ``/proc``, no permission) or the file itself is read-only.
    """
    if stdout and str(text) == STDOUT:
        return None
    path = Path(text)
    if str(text) == STDOUT:
        raise ValueError(f"{flag} -: this option writes a file, not standard output")
    if path.is_dir():
        raise IsADirectoryError(f"{flag} {path} is a folder: give a file name")
    parent = path.parent
    if not parent.exists():
        raise FileNotFoundError(f"folder {parent} does not exist")
    if not parent.is_dir():
        raise NotADirectoryError(f"{flag} {path}: {parent} is not a folder")
    probe_folder(parent, flag, path)
    if path.exists() and not os.access(path, os.W_OK):
        raise PermissionError(f"{flag} {path}: the file is read-only")
    return path


def probe_folder(folder: Path, flag: str, shown: Path | None = None) -> None:
    """Create and remove a probe file in ``folder``: the one test that also catches root on a
    read-only or virtual file system (``os.access`` says yes to root there).

    Raises:
        PermissionError: the probe could not be created (its reason in the message).
    """
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".attnscope-probe-")
    except OSError as e:
        raise PermissionError(
            f"{flag} {shown if shown is not None else folder}: cannot write in {folder} "
            f"({e.strerror or type(e).__name__})"
        ) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)


def write_text(path: Path | None, text: str) -> None:
    """Write ``text`` to ``path`` whole (a temporary file in the same folder, then renamed; the
    temporary file is removed on any failure), or to standard output when ``path`` is None."""
    if path is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: Path | None, data: Any, **dumps: Any) -> None:
    """:func:`write_text` of ``json.dumps(data, indent=1, **dumps)``."""
    write_text(path, json.dumps(data, indent=1, **dumps))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def shown(path: Path | None) -> str:
    """How a written path is named in a message: the path, or ``standard output``."""
    return "standard output" if path is None else str(path)
