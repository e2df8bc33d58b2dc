"""``attnscope export``: heads' exact attention maps as images or data, headless.

One head (rows = query positions, columns = key positions, zero above the diagonal, rows sum to 1)::

    attnscope export --prompt TEXT [--steps N] --layer L --head H --out map.png|.svg|.pdf|.npy|.csv|.safetensors

Every head of a layer (``--layer L``) or every layer × head (no ``--layer``) into a folder::

    attnscope export --prompt TEXT --all-heads [--layer L] --format svg --out DIR

Every decode step of one head as an animation::

    attnscope export --prompt TEXT --steps 20 --layer L --head H --frames steps.gif|.mp4

From a saved session (model, prompt, replayed tokens and view; ``--layer``/``--head`` default to the
session's view), and saving one::

    attnscope export --session fox.attnscope --out map.pdf
    attnscope export --prompt TEXT --steps 5 --save-session fox.attnscope

Data files and PDFs get a sidecar ``<file>.json`` (model + hash, backend, dtype, device, prompt,
tokens, step, layer, head, mask, ``exact: true``); batches a ``manifest.json``. ``.png`` is the plain map (one
colour per cell) unless ``--figure``; ``.svg``/``.pdf`` are labelled figures drawn with Qt's own SVG
and PDF devices on the offscreen platform (no display needed). For a single head the tokens are
printed, one per line, as ``position<TAB>id<TAB>label``; progress goes to stderr.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from attnscope.core.cli.options import add_model_arguments, add_prompt_arguments
from attnscope.core.io import colour_scale, formats
from attnscope.core.io.colormaps import ColourSpec
from attnscope.core.io.paths import check_output, probe_folder
from attnscope.core.io.render import PILLOW, Renderers
from attnscope.core.tokens import UNKNOWN_ID_NOTE, is_unknown

NAME = "export"
HELP = "export attention maps as PNG/SVG/PDF or NPY/CSV/safetensors (+ JSON provenance), batches, animations"
FORMATS = tuple(f".{s}" for s in formats.BATCH_FORMATS)


#: flags a saved session also sets: (dest, the session file's field). Given explicitly next to --session,
#: the flag wins (what ran goes into every sidecar); --no-chat-template would change the tokens: a conflict.
SESSION_FLAGS = (("backend", "backend"), ("device", "device"), ("dtype", "dtype"))


def add_arguments(p) -> None:
    from attnscope.core.remote.cli_args import add_engine_arguments

    add_model_arguments(p)
    add_engine_arguments(p)
    add_prompt_arguments(p, required=False)
    # None = "not given", so an explicit flag can be told from the default next to --session; the
    # usual defaults travel with the parsed arguments (args.usual_defaults), not in module state
    dests = (*(d for d, _ in SESSION_FLAGS), "chat_template")
    usual = {dest: p.get_default(dest) for dest in dests}
    p.set_defaults(usual_defaults=usual, **dict.fromkeys(dests))
    p.add_argument(
        "--session",
        metavar="FILE",
        help="take model, prompt, tokens and view from a saved .attnscope session",
    )
    p.add_argument(
        "--save-session", metavar="FILE", help="also save the session (model, prompt, tokens, view) to FILE"
    )
    p.add_argument(
        "--layer", type=int, default=None, help="layer (0-based); with --all-heads: only this layer"
    )
    p.add_argument("--head", type=int, default=None, help="query head (0-based)")
    p.add_argument(
        "--out",
        help=f"output file ({' '.join(FORMATS)}), or a folder with --all-heads",
    )
    p.add_argument(
        "--all-heads",
        action="store_true",
        help="every head of --layer, or every layer x head, into --out DIR",
    )
    p.add_argument(
        "--format",
        default=None,
        choices=formats.BATCH_FORMATS,
        help="file format with --all-heads (default png; one head's format is --out's suffix)",
    )
    p.add_argument(
        "--frames",
        metavar="FILE",
        help=f"every decode step of --layer/--head as an animation ({formats.listing('animation', last=' or ')}; "
        ".mp4 needs imageio-ffmpeg)",
    )
    p.add_argument("--fps", type=float, default=4.0, help="frames per second for --frames (default 4)")
    p.add_argument(
        "--figure",
        action="store_true",
        help="PNG as a labelled figure (tokens, colour bar) instead of the plain map",
    )
    p.add_argument(
        "--cmap", default=None, help="colour map: viridis, magma, inferno, plasma, cividis (default viridis)"
    )
    p.add_argument(
        "--scale",
        default=None,
        choices=("linear", "log", "power"),
        help="colour scale (default for one map: chosen from its weights, log when under a quarter of its "
        "cells show on linear, and log from 2,048 tokens; an animation: from its last frame; said in the metadata)",
    )
    p.add_argument("--gamma", type=float, default=None, help="exponent of the power scale (default 0.5)")
    p.add_argument(
        "--range",
        dest="range_mode",
        default=None,
        choices=("fixed", "auto", "shared"),
        help="colour range: fixed [0, 1], auto (this map's 99.5th percentile) or shared (the "
        "layer's); default fixed",
    )
    p.add_argument(
        "--dpi", type=float, default=None, help="dots per inch (PNG metadata; figure font and page size)"
    )
    p.add_argument(
        "--size",
        default=None,
        help="image size WxH in pixels (plain PNG: exact size; figures: canvas; "
        "a long map's plain PNG: a max-pooled overview of that size)",
    )
    p.add_argument(
        "--weighting",
        default="attention",
        choices=("attention", "value-weighted"),
        help="what a cell measures: the attention weight, or α·‖v W_O‖ row-normalised "
        "(value-weighted, Kobayashi et al. 2020; maps under 2,048 tokens)",
    )
    p.add_argument(
        "--full-size",
        action="store_true",
        help="a long map's plain PNG at one pixel per cell (streamed; needed above 4096 tokens; "
        "default for maps from 2,048 tokens: a 2048x2048 max-pooled overview)",
    )


def figure_renderer(renderers) -> Callable:
    """The labelled-figure renderer of ``renderers`` (a :class:`attnscope.core.io.render.Renderers`).

    Raises:
        ValueError: it has none (core used without the app package, whose entry point passes Qt's).
    """
    if renderers.figure is None:
        raise ValueError(
            "SVG/PDF and labelled figures need the app package: run them through `attnscope export`"
        )
    return renderers.figure


def _needs_figure(args) -> bool:
    """Whether ``args`` write a labelled figure: SVG, PDF, or a PNG with ``--figure``."""
    if args.all_heads:
        fmt = args.format
    elif args.out:
        fmt = Path(args.out).suffix.lower().lstrip(".")
    else:
        return False
    return fmt in formats.FIGURE_ONLY_FORMATS or (fmt in formats.IMAGE_FORMATS and args.figure)


def _check_args(args) -> None:
    from attnscope.core.errors import SessionError
    from attnscope.core.io.colormaps import COLORMAPS
    from attnscope.core.io.data_writers import parse_size

    if args.session and args.prompt is not None:
        raise SessionError("give either --prompt or --session, not both")
    if not args.session:  # flags not given take the usual defaults
        for dest, default in args.usual_defaults.items():
            if getattr(args, dest, None) is None:
                setattr(args, dest, default)
    if not args.session and args.prompt is None:
        raise SessionError("give a prompt with --prompt TEXT, or a saved session with --session FILE")
    if args.prompt is not None and not args.prompt.strip():
        raise SessionError("the prompt is empty: give some text with --prompt")
    if args.steps < 0:
        raise SessionError(f"--steps must be >= 0, got {args.steps}")
    if not (args.out or args.frames or args.save_session):
        raise SessionError("nothing to write: give --out, --frames or --save-session")
    if args.cmap is not None and args.cmap not in COLORMAPS:
        raise ValueError(f"unknown colour map {args.cmap!r}; choose one of {', '.join(COLORMAPS)}")
    if args.dpi is not None and not 10 <= args.dpi <= 2400:
        raise ValueError(f"--dpi must be between 10 and 2400, got {args.dpi:g}")
    if args.fps <= 0:
        raise ValueError(f"--fps must be > 0, got {args.fps:g}")
    parse_size(args.size)
    _check_contradictions(args)
    if args.all_heads:
        if args.head is not None:
            raise ValueError(
                "--all-heads exports every head: drop --head (use --layer to limit to one layer)"
            )
        if args.frames:
            raise ValueError("--frames animates one head: use it without --all-heads")
        if not args.out:
            raise ValueError("--all-heads needs --out DIR")
        out = Path(args.out)
        if out.suffix.lower() in FORMATS:
            raise ValueError(f"--all-heads writes many files: --out must be a folder, not {out.name!r}")
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} exists and is not a folder")
        if not out.parent.exists():
            raise FileNotFoundError(f"folder {out.parent} does not exist")
        probe_folder(out if out.is_dir() else out.parent, "--out", out)
    elif args.out:
        out = Path(args.out)
        if out.suffix.lower() not in FORMATS:
            raise ValueError(f"unsupported output {out.name!r}: use one of {', '.join(FORMATS)}")
        check_output(out, "--out")
    if args.frames:
        fr = Path(args.frames)
        if fr.suffix.lower().lstrip(".") not in formats.ANIMATION_FORMATS:
            raise ValueError(
                f"unsupported animation {fr.name!r}: use {formats.listing('animation', last=' or ')}"
            )
        check_output(fr, "--frames")
        if fr.suffix.lower() == ".mp4":
            from attnscope.core.io.animation import mp4_unavailable

            why = mp4_unavailable()
            if why:  # before the model loads, not after
                raise ValueError(why)
    if args.save_session:
        _check_save_session(args.save_session)
    if args.session and Path(args.session).is_dir():
        raise IsADirectoryError(f"--session {args.session} is a folder, not a session file (.attnscope)")


def _check_save_session(text: str) -> Path:
    """The file ``--save-session`` writes (``.attnscope`` added to a name without a suffix, as
    :func:`attnscope.core.io.sessionfile.save` does), checked before the model loads.

    Raises:
        IsADirectoryError: the name, or the name with the suffix, is a folder. FileNotFoundError,
        PermissionError: as :func:`attnscope.core.io.paths.check_output`.
    """
    from attnscope.core.io.sessionfile import SUFFIX

    given = Path(text)
    if given.is_dir():
        raise IsADirectoryError(
            f"--save-session {given} is a folder: give a file name, e.g. {given / ('session' + SUFFIX)}"
        )
    path = given if given.suffix else given.with_suffix(SUFFIX)
    check_output(path, "--save-session")
    return path


def _check_contradictions(args) -> None:
    """Options that cannot all be honoured: refused where the result would not be what was asked
    (``--format svg`` next to one head's ``--out map.npy``), a ``note:`` line where one option is
    simply moot (``--figure`` on a data file)."""
    one = not args.all_heads and args.out
    suffix = Path(args.out).suffix.lower().lstrip(".") if one else None
    if one and args.format is not None and args.format != suffix:
        raise ValueError(
            f"--format {args.format} conflicts with --out {Path(args.out).name}: one head's format is "
            f"its --out suffix (--format is for --all-heads)"
        )
    if args.format is None:
        args.format = "png"
    fmt = args.format if args.all_heads else suffix
    if args.figure and fmt is not None and fmt not in formats.IMAGE_FORMATS:
        print(
            f"attnscope: note: --figure draws images: the .{fmt} output is data, written without it",
            file=sys.stderr,
        )
    if args.figure and not args.out and args.frames:
        print("attnscope: note: --figure applies to --out images, not to --frames", file=sys.stderr)


def _progress_line(label: str):
    """``progress(done, total, name)`` printing ``label 12/270 L01_H02.png`` on stderr."""
    tty = sys.stderr.isatty()
    t0 = time.monotonic()

    def show(done: int, total: int, name: str) -> None:
        line = f"{label} {done}/{total} {name} ({time.monotonic() - t0:.1f} s)"
        if tty:
            print(f"\r{line}\x1b[K", end="\n" if done == total else "", file=sys.stderr, flush=True)
        elif done == total or done % max(1, total // 10) == 0:
            print(line, file=sys.stderr, flush=True)

    return show


def _model_check(args, view: dict):
    """``check(info)`` for :func:`_open`: the arguments the model's shape rules out, refused with one
    line once the model's info is known and BEFORE any prefill (on an engine, the run there stays).

    Raises (from the returned function):
        ValueError: no layer/head for a one-head export. IndexError: ``--layer``/``--head`` out of
        the model's range. SessionError: ``--steps`` at least the model's context.
    """
    from attnscope.core.errors import SessionError

    def check(info) -> None:
        if args.all_heads:
            layer, head = args.layer, None
        elif args.out or args.frames:
            layer = args.layer if args.layer is not None else view.get("layer")
            head = args.head if args.head is not None else view.get("head")
            if layer is None or head is None:
                raise ValueError("give --layer and --head (or --all-heads)")
        else:
            layer, head = None, None
        if layer is not None and not 0 <= layer < info.n_layers:
            raise IndexError(f"layer {layer} out of range 0..{info.n_layers - 1}")
        if head is not None and not 0 <= head < info.n_heads:
            raise IndexError(f"head {head} out of range 0..{info.n_heads - 1}")
        context = getattr(info, "max_context", None)
        if context and args.steps >= context:
            raise SessionError(f"--steps {args.steps} does not fit the model's context of {context} tokens")

    return check


def _open(args):
    """The Session (prompt run, or saved session replayed) and the view dict to default from;
    the arguments the model rules out (:func:`_model_check`) are refused before any prefill."""
    from attnscope.core.cli.options import open_session

    if not args.session:
        return open_session(args, check=_model_check(args, {})), {}
    from attnscope.core.io import sessionfile

    sf = sessionfile.load(args.session)
    sf = _session_overrides(sf, args)
    remote = None
    if getattr(args, "engine", None):  # replay on the engine (core/remote): its model, its device
        from attnscope.core.remote.client import RemoteSession, read_token

        remote = RemoteSession.connect(args.engine, token=read_token(args.token_file))
    s, warnings = sessionfile.replay(
        sf,
        session=remote,
        model=args.model,
        device=args.device,
        check=_model_check(args, dict(sf.view)),
        dtype_reason=None if args.dtype is not None else sessionfile.SAVED_DTYPE_REASON,  # --dtype: asked
    )
    for w in warnings:
        print(f"attnscope: warning: {w}", file=sys.stderr)
    if args.steps:
        s.step(args.steps)
    return s, dict(sf.view)


def _session_overrides(sf, args):
    """The session file with the explicitly given --backend/--dtype in place of its own (a note on
    stderr for each); --device and --model go to the replay.

    Raises:
        SessionError: --no-chat-template next to a session saved with the chat template (another
        token sequence: use --prompt instead).
    """
    import dataclasses

    from attnscope.core.errors import SessionError

    if args.chat_template is False and sf.chat_template:
        raise SessionError(
            f"--no-chat-template conflicts with {Path(args.session).name}, saved with the chat "
            "template: drop the flag, or give the prompt with --prompt"
        )
    changes = {}
    for dest, field in SESSION_FLAGS:
        given, saved = getattr(args, dest, None), getattr(sf, field)
        if given is not None and str(given) != str(saved):
            print(
                f"attnscope: note: --{dest} {given} overrides the session's {field} {saved}", file=sys.stderr
            )
            if field != "device":  # the device goes to replay(device=...)
                changes[field] = given
    if args.model is not None and args.model != sf.model:
        print(
            f"attnscope: note: --model {args.model} overrides the session's model {sf.model}", file=sys.stderr
        )
    return dataclasses.replace(sf, **changes) if changes else sf


def _animation_colour(s, layer: int, head: int, asked, settled):
    """The one colour scale of an animation's frames: the user's, or chosen from the last frame's
    map (the whole sequence: :func:`attnscope.core.io.colour_scale.scale_for_map`), by length from
    2,048 tokens (``settled``)."""
    if asked.scale is not None or s.seq_len >= colour_scale.LONG_MAP:
        return settled
    return colour_scale.colour_for_map(asked, s.weights(layer, head))[0]


def run(args, renderers: Callable[[], Renderers] | None = None) -> int:
    """Run ``attnscope export``. ``renderers``: a loader of the figure/frame renderers (the app's
    entry point passes Qt's, loaded only when called); None: Pillow only (plain PNG maps, bare
    frames; figures refused with one line)."""
    from attnscope.core.io import animation, batch_export, data_writers, head_export

    _check_args(args)
    load = renderers if renderers is not None else (lambda: PILLOW)  # called only when a figure is drawn
    # the figure renderer before the model loads (a missing one is refused at once, not after it)
    figure = figure_renderer(load()) if _needs_figure(args) else None
    s, view = _open(args)
    cmap = args.cmap or view.get("cmap") or "viridis"
    scale_choice = args.scale or view.get("scale")  # None: by the map's length (log from 2,048 tokens)
    gamma = args.gamma if args.gamma is not None else float(view.get("gamma") or 0.5)
    if not gamma > 0:
        raise ValueError(f"--gamma must be > 0, got {gamma}")
    range_mode = args.range_mode or view.get("range_mode") or "fixed"
    # what the user asked for (scale None: by the map's length), and with the scale settled for the
    # whole sequence (batches, animations, the saved session)
    asked = ColourSpec(cmap=cmap, scale=scale_choice, gamma=gamma, range_mode=range_mode)
    colour = colour_scale.colour_for_length(asked, s.seq_len)
    if args.gamma is not None and colour.scale != "power":
        print(
            f"attnscope: note: --gamma applies to the power scale; this map uses the {colour.scale} "
            f"scale, so --gamma {args.gamma:g} has no effect (add --scale power)",
            file=sys.stderr,
        )
    size = data_writers.parse_size(args.size)
    info = s.info
    layer = args.layer if args.layer is not None else view.get("layer")
    head = args.head if args.head is not None else view.get("head")

    if args.save_session:
        from attnscope.core.io import sessionfile

        v = dict(view)
        v.update(
            {
                k: val
                for k, val in (
                    ("layer", layer),
                    ("head", head),
                    ("cmap", colour.cmap),
                    ("scale", colour.scale),
                    ("gamma", colour.gamma),
                    ("range_mode", colour.range_mode),
                )
                if val is not None
            }
        )
        path = sessionfile.save(sessionfile.SessionFile.from_session(s, view=v), args.save_session)
        print(f"saved session {path}", file=sys.stderr)

    if args.all_heads:
        if args.layer is not None and not 0 <= args.layer < info.n_layers:
            raise IndexError(f"layer {args.layer} out of range 0..{info.n_layers - 1}")
        pairs = batch_export.heads_in_scope(info.n_layers, info.n_heads, args.layer, info.arch)
        t0 = time.monotonic()
        written = batch_export.export_batch(
            s,
            args.out,
            args.format,
            pairs,
            colour=asked,  # a scale not given: each map's own (colour_scale.scale_for_map), recorded
            size=size,
            dpi=args.dpi,
            figure=args.figure,
            renderer=figure,
            progress=_progress_line("export"),
        )
        print(
            f"wrote {len(pairs)} {args.format} files ({len(written)} with sidecars and manifest) to {args.out} "
            f"in {time.monotonic() - t0:.1f} s",
            file=sys.stderr,
        )
    elif args.out or args.frames:
        if layer is None or head is None:
            raise ValueError("give --layer and --head (or --all-heads)")
        if not 0 <= layer < info.n_layers:
            raise IndexError(f"layer {layer} out of range 0..{info.n_layers - 1}")
        if not 0 <= head < info.n_heads:
            raise IndexError(f"head {head} out of range 0..{info.n_heads - 1}")
        if args.out:
            out = Path(args.out)
            files = head_export.export_head(
                s,
                layer,
                head,
                out,
                colour=asked,
                size=size,
                dpi=args.dpi,
                figure=args.figure,
                renderer=figure,
                full_size=args.full_size,
                weighting=args.weighting,
            )
            print("wrote " + ", ".join(str(f) for f in files), file=sys.stderr)
        if args.frames:
            files = animation.export_animation(
                s,
                layer,
                head,
                args.frames,
                colour=_animation_colour(s, layer, head, asked, colour),
                fps=args.fps,
                frame_renderer=load().frame,
            )
            print(
                f"wrote {s.n_generated + 1} frames (decode steps 0..{s.n_generated}) to "
                + ", ".join(str(f) for f in files),
                file=sys.stderr,
            )
    if args.all_heads or args.out or args.frames:  # the tokens of every map export (README), batches too
        toks = s.tokens
        for t in toks:
            print(f"{t.position}\t{t.id}\t{t.text!r}")
        if any(is_unknown(t.raw, t.id) for t in toks):
            print(f"note: {UNKNOWN_ID_NOTE}", file=sys.stderr)
    return 0
