"""Process-wide pyqtgraph options, set once by the entry point, never as a side effect of an import.

:func:`attnscope.app.launch.run_gui` calls :func:`configure` before it builds the window (the test
suite's ``conftest.py`` does the same at start-up). Every image item in the views relies on
row-major arrays (row = query, column = key, as numpy holds a map).
"""

from __future__ import annotations

#: ``imageAxisOrder="row-major"``: images are ``(rows, cols)`` arrays, as numpy holds a map;
#: ``antialias=False``: crisp curves and cell edges (and faster repaints)
PYQTGRAPH_OPTIONS = {"imageAxisOrder": "row-major", "antialias": False}


def configure() -> None:
    """Set :data:`PYQTGRAPH_OPTIONS` (idempotent)."""
    import pyqtgraph as pg

    pg.setConfigOptions(**PYQTGRAPH_OPTIONS)
