"""``attnscope`` command line: GUI launch options plus headless subcommands.

Each subcommand is a module in :mod:`attnscope.core.cli.commands` exposing ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``; they are discovered at start-up, so a new
command is one new file. Errors the user can fix are printed as one line
(``attnscope: error: ...``) with a non-zero exit code, never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import sys
from collections.abc import Callable, Sequence

from attnscope.core import __version__
from attnscope.core.cli.options import add_model_arguments, add_prompt_arguments
from attnscope.core.errors import AttnScopeError
from attnscope.core.io.render import Renderers
from attnscope.core.remote.cli_args import add_engine_arguments

EXIT_USAGE = 2
EXIT_ERROR = 1


def _commands() -> dict:
    import attnscope.core.cli.commands as pkg

    mods = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"attnscope.core.cli.commands.{info.name}")
        if hasattr(mod, "NAME") and hasattr(mod, "run"):
            mods[mod.NAME] = mod
    return mods


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``attnscope export: error: … (see … --help)``), exit 2."""

    #: the top-level parser's subcommand parsers by name (set by the parser's builder)
    command_parsers: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def unrecognized(self, extras: Sequence[str]):
        """Exit 2 with one line naming ``extras`` and, for a mistyped option, the nearest one."""
        import difflib

        msg = f"unrecognized arguments: {' '.join(extras)}"
        options = [
            o
            for a in self._actions
            for o in a.option_strings
            if o.startswith("--") and o not in ("--help", "--version")
        ]
        first = next((x.split("=", 1)[0] for x in extras if x.startswith("--")), None)
        near = difflib.get_close_matches(first, options, n=1, cutoff=0.6) if first else []
        if near:
            msg += f"; did you mean {near[0]}?"
        self.error(msg)


def build_parser(commands: dict | None = None) -> argparse.ArgumentParser:
    commands = _commands() if commands is None else commands
    # no abbreviations (--lay for --layer): a prefix that is unique today is taken silently and
    # breaks a script the day another option shares it; a typo gets the nearest option instead
    p = OneLineParser(
        prog="attnscope",
        allow_abbrev=False,
        description="AttnScope: step through decode and inspect every attention head. "
        "Without a command, opens the window.",
    )
    p.add_argument("--version", action="version", version=f"attnscope {__version__}")
    add_model_arguments(p)
    add_engine_arguments(p)
    p.add_argument(
        "--screenshot", metavar="PATH", help="render the main window offscreen to PATH (PNG) and exit"
    )
    add_prompt_arguments(p, required=False)
    p.add_argument("--layer", type=int, default=None, help="layer to show (0-based)")
    p.add_argument("--head", type=int, default=None, help="query head to show (0-based)")
    p.add_argument("--view", default="heatmap", help="panel to show (with --screenshot)")
    p.add_argument("--size", default="1400x900", help="window size WxH for --screenshot")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in commands.items():
        sp = sub.add_parser(name, help=mod.HELP, description=mod.HELP, allow_abbrev=False)
        mod.add_arguments(sp)
    p.command_parsers = dict(sub.choices)  # name -> its parser, for a usage error in its own words
    return p


def main(
    argv: Sequence[str] | None = None,
    gui: Callable[[argparse.Namespace], int] | None = None,
    renderers: Callable[[], Renderers] | None = None,
) -> int:
    """Parse ``argv`` and run a subcommand, or hand GUI options to ``gui``. Returns the exit code.

    ``renderers``: a loader of the labelled figure/frame renderers (the app's entry point passes
    Qt's), handed to the commands whose ``run`` takes a ``renderers`` argument; None: Pillow only.
    """
    commands = _commands()
    parser = build_parser(commands)
    args, extras = parser.parse_known_args(argv)
    if extras:  # in the subcommand's words: "attnscope export: error: ... (see 'attnscope export --help')"
        parsers = getattr(parser, "command_parsers", {})
        parsers.get(args.command, parser).unrecognized(extras)
    try:
        if args.command:
            run = commands[args.command].run
            takes = "renderers" in inspect.signature(run).parameters
            return int((run(args, renderers=renderers) if takes else run(args)) or 0)
        if gui is None:
            parser.error("no command given (the GUI is not available in this entry point)")
        return int(gui(args) or 0)
    except (
        AttnScopeError,
        ValueError,
        IndexError,
        FileNotFoundError,
        PermissionError,
        IsADirectoryError,
        OSError,  # NotADirectoryError, a full disk, a file vanished: one line, not a traceback
    ) as e:
        text = str(getattr(e, "brief", None) or e).strip()  # EngineLost: without the window's next step
        if isinstance(e, OSError) and e.errno is not None and e.strerror:  # "[Errno 28] ...": in words
            text = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
        msg = text.splitlines()[0] if text else type(e).__name__
        print(f"attnscope: error: {msg}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("attnscope: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
