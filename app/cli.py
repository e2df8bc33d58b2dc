"""Entry point of the ``attnscope`` command: headless subcommands from :mod:`attnscope.core.cli.main`, GUI otherwise."""

from __future__ import annotations

import sys


def _gui(args) -> int:
    from attnscope.app.launch import run_gui

    return run_gui(args)


def _qt_renderers():
    """The labelled figure and animation-frame renderers (Qt), imported only when an export asks."""
    from attnscope.app.figure import figure_frame, save_heatmap_figure
    from attnscope.core.io.render import Renderers

    return Renderers(figure=save_heatmap_figure, frame=figure_frame)


def main(argv=None) -> int:
    from attnscope.core.openmp import quiet_openmp

    quiet_openmp()  # before anything loads torch: OpenMP reads its spin count once
    from attnscope.core.loading import torchao_defer

    torchao_defer.defer()  # transformers' quantiser registry would import torchao on every start
    from attnscope.core.cli.main import main as core_main

    return core_main(sys.argv[1:] if argv is None else argv, gui=_gui, renderers=_qt_renderers)


def gui_main() -> int:
    return main([])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
