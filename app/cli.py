"""Entry point of the ``attnscope`` command: headless subcommands from :mod:`core.cli`, GUI otherwise."""

from __future__ import annotations

import sys


def _gui(args) -> int:
    from app.main_window import run_gui

    return run_gui(args)


def main(argv=None) -> int:
    from core.cli import main as core_main

    return core_main(sys.argv[1:] if argv is None else argv, gui=_gui)


def gui_main() -> int:
    return main([])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
