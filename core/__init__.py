"""AttnScope engine: Qt-free attention, capture, models, sessions and CLI.

Nothing in this package imports PySide6, pyqtgraph or ``app``; the GUI drives it through
:class:`attnscope.core.session.Session`.
"""

__version__ = "0.1.0"
