"""What the window remembers across restarts (QSettings, as desktop tools do): the last prompt, the
colour map, the colour scale when the user chose one, and the window's layout (its geometry and
the splitters between the tabs, the next-token panel and the token strip).

:func:`restore` runs at the entry point once the window is built (a prompt given with ``--prompt``
wins over the remembered one); :func:`save` when the application quits. Values of the wrong type or
an unknown colour map or scale are skipped: a damaged settings file never breaks the window. The
engine's address is remembered by :mod:`attnscope.app.connect`.
"""

from __future__ import annotations

from attnscope.core.io.colormaps import COLORMAPS, SCALES
from PySide6.QtCore import QByteArray, QSettings

PROMPT, CMAP, SCALE, GEOMETRY, SPLITTERS = (
    "window/prompt",
    "window/cmap",
    "window/scale",
    "window/geometry",
    "window/splitters",
)


def save(win, settings: QSettings | None = None) -> None:
    """Remember ``win``'s prompt text, colour map, chosen scale (none when the map's length picks
    it) and layout."""
    settings = settings or QSettings()
    settings.setValue(PROMPT, win.prompt_edit.toPlainText())
    settings.setValue(CMAP, win.state.colormap)
    hm = win.heatmap
    if hm.scale_chosen:
        settings.setValue(SCALE, hm.scale)
    else:
        settings.remove(SCALE)
    settings.setValue(GEOMETRY, win.saveGeometry())
    settings.setValue(SPLITTERS, [s.saveState() for s in win.splitters])
    settings.sync()


def restore(win, settings: QSettings | None = None, prompt: bool = True) -> None:
    """Put back what :func:`save` remembered; ``prompt=False`` leaves the prompt box as it is (a
    ``--prompt`` given)."""
    settings = settings or QSettings()
    text = settings.value(PROMPT)
    if prompt and isinstance(text, str) and text.strip():
        win.prompt_edit.setPlainText(text)
    cmap = settings.value(CMAP)
    if isinstance(cmap, str) and cmap in COLORMAPS:
        win.state.set_colormap(cmap)
    scale = settings.value(SCALE)
    if isinstance(scale, str) and scale in SCALES:
        win.heatmap.set_scale(scale)
    geometry = settings.value(GEOMETRY)
    if isinstance(geometry, QByteArray | bytes) and geometry:
        win.restoreGeometry(QByteArray(geometry))
    states = settings.value(SPLITTERS)
    if isinstance(states, list | tuple):
        for splitter, state in zip(win.splitters, states, strict=False):
            if isinstance(state, QByteArray | bytes):
                splitter.restoreState(QByteArray(state))
