"""AttnScope desktop app (PySide6 + pyqtgraph). Draws what :mod:`core` computes; no model math here."""
