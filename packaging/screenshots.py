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


def why_panel(app, w, out: Path) -> Path:
    """The Why panel beside the heatmap: a previous-token head of SmolLM2 (layer 16, head 0) at the last
    query, its previous token clicked (the bands, the row's split, the row with the rotation removed)."""
    w.resize(1600, 1100)
    w.select(16, 0)
    w.show_view("heatmap")
    _wait(app, w)
    T = w.snapshot.seq_len
    w.why_dock.show()
    w.heatmap.mark_row(T - 1)
    w.why_panel.explain_cell(T - 1, T - 2)
    _wait(app, w)
    panel = w.why_panel
    for _ in range(3000):  # the By source box follows the bands: one forward of the prefix
        if panel.source_bars is not None and panel.source_bars.rows:
            break
        w.engine.wait_idle(0.1)
        app.processEvents()
    _wait(app, w)
    path = out / "why_panel.png"
    w.grab().save(str(path))
    print(f"screenshots: wrote {path}")
    return path


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
    why_panel(app, w, out)
    w.close()
    why_sources(out)
    return 0


def induction_split(session, top: int = 10):
    """The README's induction example: on the Head roles tab's probe (``[bos] r r``, |r| = 50) the strongest
    induction head's cell from the last query to the key after its earlier occurrence, split by source."""
    import numpy as np
    from attnscope.core.analysis import roles
    from attnscope.core.analysis.qk_sources import source_split

    R = roles.PROBE_LEN
    ids, off = roles.probe_ids(session.tokenizer, session.info.vocab_size, R, 0)
    session.prefill(ids)
    ind = roles.induction_scores_from_trace(session.trace, R, off)
    layer, head = (int(x) for x in np.unravel_index(np.argmax(ind), ind.shape))
    i = off + 2 * R - 1
    return source_split(session, layer, head, i, i - R + 1, top=top)


def why_sources(out: Path) -> Path:
    """``why_sources.png``: the induction example's top source pairs as bars (the Why panel's By source box)."""
    from PySide6.QtWidgets import QApplication, QLabel, QVBoxLayout, QWidget

    app = QApplication.instance() or QApplication(sys.argv)
    from attnscope.app.views.source_bars import SourceBars
    from attnscope.core.analysis import roles
    from attnscope.core.session import Session

    session = Session.load()
    split = induction_split(session)
    prev = roles.sequence_scores(session.trace)["previous_token"]
    kl, kh = (int(x) for x in split.key_totals[0][0][1:].split(" H"))
    w = QWidget()
    lay = QVBoxLayout(w)
    title = QLabel(
        f"<b>Why L{split.layer} H{split.head} (an induction head) attends from the second copy to the token "
        "after the first occurrence</b>: the key side is built by "
        f"L{kl} H{kh}, a previous-token head (previous-token score {prev[kl, kh]:.2f}, Head roles tab)"
    )
    title.setWordWrap(True)
    lay.addWidget(title)
    bars = SourceBars()
    bars.show_split(split)
    lay.addWidget(bars)
    w.resize(900, 560)
    w.show()
    for _ in range(20):
        app.processEvents()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "why_sources.png"
    w.grab().save(str(path))
    print(f"screenshots: wrote {path}")
    w.close()
    return path


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("assets/screenshots")))
