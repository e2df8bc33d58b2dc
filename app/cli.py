"""Entry point of the ``attnscope`` command: headless subcommands from :mod:`attnscope.core.cli.main`, GUI otherwise."""

from __future__ import annotations

import sys


def _gui(args) -> int:
    from attnscope.app.main_window import run_gui

    return run_gui(args)


def _figure_renderer():
    from attnscope.app.export import save_heatmap_figure  # Qt, imported only when a figure is asked for

    return save_heatmap_figure


def _frame_renderer():
    from attnscope.app.export import figure_frame  # labelled animation frames (token axes, colour bar)

    return figure_frame


def main(argv=None) -> int:
    import attnscope.core.cli.commands.export as export_command
    from attnscope.core.cli.main import main as core_main

    export_command.FIGURE_RENDERER = _figure_renderer
    export_command.FRAME_RENDERER = _frame_renderer
    return core_main(sys.argv[1:] if argv is None else argv, gui=_gui)


def gui_main() -> int:
    return main([])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
