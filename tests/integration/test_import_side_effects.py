"""Configuration happens at the entry point, never as a side effect of importing a module."""

from __future__ import annotations

import os
import subprocess
import sys

CHECK = """
import pyqtgraph as pg
from PySide6.QtCore import QSettings
before = (pg.getConfigOption("imageAxisOrder"), pg.getConfigOption("antialias"), QSettings.defaultFormat())
import attnscope.app.views.heatmap, attnscope.app.main_window, attnscope.app.launch, attnscope.app.figure
after = (pg.getConfigOption("imageAxisOrder"), pg.getConfigOption("antialias"), QSettings.defaultFormat())
assert before == after, (before, after)
assert before[0] == "col-major", before  # pyqtgraph's own default: nothing set it on import
from attnscope.app import qt_options
qt_options.configure()
assert (pg.getConfigOption("imageAxisOrder"), pg.getConfigOption("antialias")) == ("row-major", False)
print("ok")
"""


def test_importing_the_app_sets_no_pyqtgraph_or_qsettings_options():
    r = subprocess.run(
        [sys.executable, "-c", CHECK],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_the_test_session_is_configured_as_the_entry_point_does():
    import pyqtgraph as pg

    assert pg.getConfigOption("imageAxisOrder") == "row-major"
    assert pg.getConfigOption("antialias") is False
