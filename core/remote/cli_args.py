"""``--engine HOST:PORT`` and ``--token-file FILE``: the options of every command that can use a
remote engine (stdlib only, imported when the command line is built)."""

from __future__ import annotations

import argparse


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``--engine`` and ``--token-file`` (the token may also come from ``$ATTNSCOPE_TOKEN``)."""
    p.add_argument(
        "--engine",
        metavar="HOST:PORT",
        default=None,
        help="run the model in an 'attnscope serve' engine there instead of in this process "
        "(--model is then a path on the engine's machine)",
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        default=None,
        help="the engine's token (default: $ATTNSCOPE_TOKEN)",
    )
