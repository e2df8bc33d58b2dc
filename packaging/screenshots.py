"""Regenerate the README's screenshots of the window, made by the app itself on the embedded model.

Usage: ``QT_QPA_PLATFORM=offscreen .venv/bin/python packaging/screenshots.py [OUT_DIR]`` (default
``assets/screenshots``). Each picture is one user journey: type a prompt, Run, open a tab, set its
controls, run it, grab the window at 1400 × 900.
"""

from __future__ import annotations

import sys
from pathlib import Path

IOI = "When Mary and John went to the store, John gave a drink to"


def _wait(app, w) -> None:
    while not w.engine.wait_idle(1):
        app.processEvents()
    for _ in range(20):
        app.processEvents()
    if w.last_error:
        raise SystemExit(f"screenshots: {w.last_error}")


def main(out: Path) -> int:
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv)
    from attnscope.app.main_window import MainWindow

    out.mkdir(parents=True, exist_ok=True)
    w = MainWindow(model=None)
    w.resize(1400, 900)
    w.show()
    _wait(app, w)
    w.prompt_edit.setPlainText(IOI)
    w.chat_check.setChecked(False)
    w.run_prompt()
    _wait(app, w)
    w.show_view("heads")
    view = w.views["heads"]
    view.target_edit.setText(" Mary")
    view.other_edit.setText(" John")
    view.run()
    _wait(app, w)
    w.grab().save(str(out / "which_heads_matter.png"))
    print(f"screenshots: wrote {out / 'which_heads_matter.png'}")
    w.show_view("grid")  # the Head grid framed by the same effects (the tab's "Colour by")
    _wait(app, w)
    w.grab().save(str(out / "head_grid_effects.png"))
    print(f"screenshots: wrote {out / 'head_grid_effects.png'}")
    w.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("assets/screenshots")))
