"""What the ``attnscope`` subcommands share: the model and prompt options, and opening a session from
them (:mod:`attnscope.core.cli.main` builds the parser from the command modules, which import these).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from attnscope.core import backend_registry as registry


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
        "--backend",
        choices=registry.names(),
        default=registry.DEFAULT,
        help=f"compute backend (default: {registry.DEFAULT})",
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
