"""Regenerate every picture the README and the docs show, made by the app itself on the embedded model.

Usage::

    QT_QPA_PLATFORM=offscreen .venv/bin/python packaging/screenshots.py [--out DIR] [NAME ...]

writes each picture of :data:`PICTURES` (or only the NAMEs given, e.g. ``grid.png``) to ``DIR``
(default ``docs/images``). Each picture is one user journey: type a prompt, Run, open a tab, set its
controls, run it, grab the window at 1400 × 900; the decode GIF is the CLI's batch export
(``attnscope export … --frames decode.gif``). PNGs are stored with an adaptive 256-colour palette
so that the pages stay light.

A new picture is one function ``def my_picture(sh: Shots, path: Path) -> None`` (bring the window
to the state to show with :meth:`Shots.run` / :meth:`Shots.tab`, then :meth:`Shots.grab` it to
``path``) and one entry in :data:`PICTURES`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "images"
SIZE = (1400, 900)

#: the tour's prompt (raw text, no chat template): a repeated phrase, so induction and
#: previous-token heads show, and a few decode steps after it
TOUR = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the"
TOUR_STEPS = 4
#: the tour's head: an induction head of SmolLM2 on this prompt (the Head roles tab names it)
TOUR_LAYER, TOUR_HEAD = 18, 6
#: the indirect-object prompt the "Which heads matter" picture runs
IOI = "When Mary and John went to the store, John gave a drink to"


class Shots:
    """One window on the embedded model, shared by every picture; runs only what changed."""

    def __init__(self) -> None:
        from PySide6.QtWidgets import QApplication

        self.app = QApplication.instance() or QApplication(sys.argv)
        from attnscope.app.main_window import MainWindow

        self.w = MainWindow(model=None)
        self.w.resize(*SIZE)
        self.w.show()
        self.wait()
        self._ran: tuple[str, int] | None = None

    def wait(self) -> None:
        """Until the engine is idle and the window has painted; a window error stops the script."""
        while not self.w.engine.wait_idle(1):
            self.app.processEvents()
        for _ in range(20):
            self.app.processEvents()
        if self.w.last_error:
            raise SystemExit(f"screenshots: {self.w.last_error}")

    def run(self, prompt: str, steps: int = 0) -> None:
        """Run ``prompt`` (no chat template) and ``steps`` greedy decode steps, unless that is on screen."""
        if self._ran == (prompt, steps):
            return
        self.w.prompt_edit.setPlainText(prompt)
        self.w.chat_check.setChecked(False)
        self.w.run_prompt()
        self.wait()
        if steps:
            self.w.step(steps)
            self.wait()
        self._ran = (prompt, steps)

    def tab(self, key: str, layer: int | None = None, head: int | None = None):
        """Show tab ``key`` (a ``MainWindow.views`` key) at ``layer``/``head``; returns its widget."""
        if layer is not None or head is not None:
            self.w.select(self.w.layer if layer is None else layer, self.w.head if head is None else head)
        self.w.show_view(key)
        self.w.refresh_current_view()
        self.wait()
        return self.w.views[key]

    def grab(self, path: Path) -> None:
        """Save the window to ``path`` as a palette PNG (256 colours)."""
        from PIL import Image

        self.wait()
        raw = path.with_suffix(".raw.png")
        if not self.w.grab().save(str(raw), "PNG"):
            raise SystemExit(f"screenshots: could not write {raw}")
        with Image.open(raw) as im:
            im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
        raw.unlink()

    def close(self) -> None:
        self.w.close()


# -- the pictures: one function each, listed in PICTURES ------------------------------------------


def window(sh: Shots, path: Path) -> None:
    """The README's first picture: the window on the heatmap after a few decode steps."""
    sh.run(TOUR, TOUR_STEPS)
    sh.tab("heatmap", TOUR_LAYER, TOUR_HEAD)
    sh.grab(path)


def tab_picture(key: str, layer: int = TOUR_LAYER, head: int = TOUR_HEAD) -> Callable[[Shots, Path], None]:
    """A tab on the tour's run, as the tab opens (its own default controls)."""

    def picture(sh: Shots, path: Path) -> None:
        sh.run(TOUR, TOUR_STEPS)
        sh.tab(key, layer, head)
        sh.grab(path)

    picture.__doc__ = f"The {key!r} tab on the tour's run."
    return picture


def compare(sh: Shots, path: Path) -> None:
    """The Compare tab: the same model at bfloat16 as run B."""
    sh.run(TOUR, TOUR_STEPS)
    view = sh.tab("compare", TOUR_LAYER, TOUR_HEAD)
    kinds = [view.kind_combo.itemData(i) for i in range(view.kind_combo.count())]
    view.kind_combo.setCurrentIndex(kinds.index("dtype"))
    view.dtype_combo.setCurrentText("bfloat16")
    if view.run_b() is None:
        raise SystemExit(f"screenshots: compare: {view.summary.text()}")
    sh.wait()
    sh.grab(path)


def which_heads_matter(sh: Shots, path: Path) -> None:
    """The Which heads matter tab on the IOI prompt: logit(" Mary") − logit(" John") with every head
    zero-ablated, patched against the Mary ⇄ John swap (attribution patching), and the logit lens at the
    last positions; the grid coloured by the ablation effects."""
    sh.run(IOI)
    view = sh.tab("heads")
    view.target_edit.setText(" Mary")
    view.other_edit.setText(" John")
    view.run()
    sh.wait()
    view.swap_a.setText("Mary")
    view.swap_b.setText("John")
    view.swap()
    view.patch_method_combo.setCurrentIndex(view.patch_method_combo.findData("attribution"))
    view.run_patch()
    sh.wait()
    view.run_lens()
    sh.wait()
    view.show_combo.setCurrentIndex(view.show_combo.findData("query"))
    sh.grab(path)


def head_grid_effects(sh: Shots, path: Path) -> None:
    """The Head grid framed by the "Which heads matter" effects (that tab's Colour by), on its prompt."""
    from PySide6.QtWidgets import QScrollArea

    which_heads_matter(sh, path)  # runs the tab's sweep; the grid picture replaces its file below
    grid = sh.tab("grid")
    areas = [grid] if isinstance(grid, QScrollArea) else grid.findChildren(QScrollArea)
    for area in areas:  # the late layers, where this prompt's effects are
        bar = area.verticalScrollBar()
        bar.setValue(bar.maximum())
    sh.app.processEvents()
    sh.grab(path)


def decode_gif(sh: Shots, path: Path) -> None:
    """Stepping through decode: the CLI's batch GIF export of the tour's head, one frame a step."""
    import contextlib
    import io

    from attnscope.app.cli import main as cli

    argv = ["export", "--prompt", TOUR, "--no-chat-template", "--steps", "6"]
    argv += ["--layer", str(TOUR_LAYER), "--head", str(TOUR_HEAD), "--frames", str(path), "--fps", "1.5"]
    with contextlib.redirect_stdout(io.StringIO()):  # the tokens it lists
        code = cli(argv)
    if code != 0:
        raise SystemExit("screenshots: the GIF export failed")
    Path(f"{path}.json").unlink(missing_ok=True)  # the provenance sidecar: not a picture


def why_panel(sh: Shots, path: Path) -> None:
    """The Why panel beside the heatmap: a previous-token head of SmolLM2 (layer 16, head 0) at the last
    query, its previous token clicked (the bands, the row's split, the row with the rotation removed, and
    the By source box, which follows the bands: one forward of the prefix)."""
    w = sh.w
    sh.run(TOUR, TOUR_STEPS)
    w.resize(1600, 1100)
    try:
        sh.tab("heatmap", 16, 0)
        T = w.snapshot.seq_len
        w.why_dock.show()
        w.heatmap.mark_row(T - 1)
        w.why_panel.explain_cell(T - 1, T - 2)
        sh.wait()
        panel = w.why_panel
        for _ in range(3000):
            if panel.source_bars is not None and panel.source_bars.rows:
                break
            w.engine.wait_idle(0.1)
            sh.app.processEvents()
        sh.grab(path)
    finally:
        w.why_dock.hide()
        w.resize(*SIZE)
        sh.wait()


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


def why_sources(sh: Shots, path: Path) -> None:
    """The induction example's top source pairs as bars (the Why panel's By source box), with a title
    naming the previous-token head that builds the key side."""
    from attnscope.app.views.source_bars import SourceBars
    from attnscope.core.analysis import roles
    from attnscope.core.session import Session
    from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

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
        sh.app.processEvents()
    if not w.grab().save(str(path)):
        raise SystemExit(f"screenshots: could not write {path}")
    w.close()


#: file name under the output folder -> the function that makes it (README / docs order)
PICTURES: dict[str, Callable[[Shots, Path], None]] = {
    "window.png": window,
    "grid.png": tab_picture("grid"),
    "gqa.png": tab_picture("gqa"),
    "mask.png": tab_picture("mask"),
    "sinks.png": tab_picture("sinks"),
    "kv.png": tab_picture("kv"),
    "roles.png": tab_picture("roles"),
    "experiments.png": tab_picture("experiments"),
    "compare.png": compare,
    "which_heads_matter.png": which_heads_matter,
    "head_grid_effects.png": head_grid_effects,
    "why_panel.png": why_panel,
    "why_sources.png": why_sources,
    "decode.gif": decode_gif,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "names", nargs="*", metavar="NAME", help=f"pictures to make (default all: {', '.join(PICTURES)})"
    )
    p.add_argument("--out", type=Path, default=OUT, help="output folder (default docs/images)")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in PICTURES]
    if unknown:
        p.error(f"unknown picture {unknown[0]!r}; choose from {', '.join(PICTURES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    sh = Shots()
    try:
        for name in args.names or PICTURES:
            PICTURES[name](sh, args.out / name)
            print(f"screenshots: wrote {args.out / name}", flush=True)
    finally:
        sh.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
