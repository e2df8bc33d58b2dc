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
from typing import Any

from attnscope.core import __version__
from attnscope.core.errors import AttnScopeError
from attnscope.core.io.render import Renderers
from attnscope.core.remote.cli_args import add_engine_arguments

EXIT_USAGE = 2
EXIT_ERROR = 1


def add_model_arguments(p: argparse.ArgumentParser, device_map: bool = True) -> None:
    """``--model/--backend/--device/--dtype/--quantize[/--device-map]``, shared by every command that
    loads a model; ``device_map=False`` for a command that does not pass it on (a command lists only
    the options it honours)."""
    p.add_argument(
        "--model",
        default=None,
        help="HF model folder or .gguf file (default: embedded SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--backend", choices=("torch", "mlx"), default="torch", help="compute backend (default: torch)"
    )
    p.add_argument(
        "--device", default=None, help="torch device, e.g. cpu or cuda (default: cuda if available)"
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="model precision (default auto: the checkpoint's own, float32 where this device has no "
        "fast bf16/fp16 matmul and float32 fits)",
    )
    p.add_argument(
        "--quantize",
        default="none",
        choices=("none", "int8", "int4"),
        help="weight-only quantisation of the linear layers (torchao; MLX: mlx.nn.quantize); "
        "int4 runs at bfloat16 (default none)",
    )
    if not device_map:
        return
    p.add_argument(
        "--device-map",
        default=None,
        choices=("auto", "balanced", "sequential"),
        help="spread the layers over GPUs, then CPU, then disk (accelerate; torch only)",
    )


def add_prompt_arguments(p: argparse.ArgumentParser, required: bool = True, steps: bool = True) -> None:
    """``--prompt/--no-chat-template[/--steps]`` shared by commands that run a prompt (``steps=False``:
    a command that runs the prompt only)."""
    p.add_argument("--prompt", required=required, help="prompt text")
    p.add_argument(
        "--no-chat-template",
        dest="chat_template",
        action="store_false",
        help="feed the prompt as is, without the model's chat template",
    )
    if steps:
        p.add_argument("--steps", type=int, default=0, help="greedy decode steps after prefill (default 0)")


def open_session(
    args,
    progress: Callable[[str, float], None] | None = None,
    check: Callable[[Any], None] | None = None,
):
    """Load the model named by ``args`` and run ``args.prompt`` + ``args.steps`` steps.

    ``check(info)``: called with the model's ``ModelInfo`` once it is loaded (or, on ``--engine``,
    the engine's), BEFORE any prefill, so an argument the model rules out (``--layer 99``) fails
    with its one line before anything runs (on an engine: before the window's run there is replaced).
    """
    from attnscope.core.errors import SessionError
    from attnscope.core.session import Session

    if getattr(args, "steps", 0) < 0:
        raise SessionError(f"--steps must be >= 0, got {args.steps}")
    if getattr(args, "prompt", None) is not None and not args.prompt.strip():
        raise SessionError("the prompt is empty: give some text with --prompt")

    def model_check(info) -> None:  # --steps past the context is refused before the prefill, every command
        context = getattr(info, "max_context", None)
        if context and getattr(args, "steps", 0) >= context:
            raise SessionError(f"--steps {args.steps} does not fit the model's context of {context} tokens")
        if check is not None:
            check(info)

    if getattr(args, "engine", None):  # the model runs in an `attnscope serve` engine (core/remote)
        from attnscope.core.remote.client import open_remote

        return open_remote(args, progress, check=model_check)
    s = Session.load(
        args.model,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        progress=progress,
        quantize=getattr(args, "quantize", "none"),
        device_map=getattr(args, "device_map", None),
    )
    if getattr(s.info, "load_note", ""):  # e.g. the quantised-weights cache was not written
        print(f"attnscope: note: {s.info.load_note}", file=sys.stderr)
    note = dtype_note(args, s.info)
    if note:
        print(f"attnscope: note: {note}", file=sys.stderr)
    model_check(s.info)
    if getattr(args, "prompt", None) is not None:
        s.prefill(args.prompt, chat_template=args.chat_template)
        if args.steps:
            s.step(args.steps)
        for note in s.notices:
            print(f"attnscope: note: {note}", file=sys.stderr)
    return s


def dtype_note(args, info) -> str:
    """One line when the model runs at another precision than ``--dtype`` asked (``--quantize int4``
    runs at bfloat16), ``""`` otherwise (and for ``--dtype auto``)."""
    asked = getattr(args, "dtype", None)
    ran = str(getattr(info, "dtype", "") or "").removeprefix("torch.")
    if asked in (None, "auto") or not ran or ran == asked:
        return ""
    quant = getattr(args, "quantize", "none") or "none"
    why = f" (--quantize {quant} runs at {ran})" if quant != "none" else ""
    return f"--dtype {asked} was asked, the model runs at {ran}{why}"


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
