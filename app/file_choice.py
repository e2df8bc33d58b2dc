"""Where the window's file dialogs start and the suffix a chosen filter adds: shared by the session
files (:mod:`attnscope.app.session_files`) and the exports (:mod:`attnscope.app.export_actions`,
:mod:`attnscope.app.export_dialogs`).
"""

from __future__ import annotations

from pathlib import Path

#: the folder of the last file saved, exported or opened in this run of the app (each file dialog
#: starts there; the home folder until then)
_last_dir: list[Path] = []


def last_dir() -> Path:
    """Where the next file dialog starts: the folder of the last file chosen, else the home folder."""
    return _last_dir[-1] if _last_dir and _last_dir[-1].is_dir() else Path.home()


def remember_dir(path) -> None:
    """Remember ``path``'s folder for the next file dialog (a folder is remembered as itself)."""
    p = Path(path).expanduser()
    folder = p if p.is_dir() else p.parent
    if folder.is_dir():
        _last_dir[:] = [folder]


def suffix_from_filter(path: str, chosen_filter: str) -> str:
    """Add the chosen filter's suffix when the typed name has none."""
    if Path(path).suffix or "*." not in chosen_filter:
        return path
    return path + chosen_filter.split("*", 1)[1].split(")")[0]
