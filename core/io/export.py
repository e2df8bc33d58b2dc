"""Exports with provenance: data files + sidecar JSON, batches of heads, decode-step animations.

Qt-free. What each export holds:

* **Data** (``.npy``, ``.csv``, ``.safetensors``): one head's exact weights, ``(n_query, n_key)``
  float32, rows = query positions, columns = key positions, each allowed row summing to 1, masked
  cells 0. Next to each data file a sidecar ``<file>.json`` (:func:`sidecar_path`) says where the
  numbers come from (:func:`head_metadata`): model name and SHA-256 of its file, backend, dtype,
  device, prompt, token ids and texts, decode step, layer, head, mask, and ``exact: true`` (the
  weights are recomputed from the captured post-RoPE queries, the cached keys and the kernel's LSE,
  ``exp(q·Kᵀ·scale + mask − LSE)``, not read from a second softmax). ``.safetensors`` files carry
  the same JSON in their header metadata (key ``"attnscope"``). CSV values use ``%.9g``, enough
  digits for a float32 to read back bit-identical.
* **Images**: ``.png`` here (Pillow, :mod:`attnscope.core.io.render`: one colour-map colour per cell); labelled
  figures and ``.svg``/``.pdf`` need a *renderer* passed in by the caller (the app's Qt renderer,
  :func:`attnscope.app.figure.save_heatmap_figure`), since this package never imports Qt.
* **Batches** (:func:`export_batch`): every head of a layer, or every layer × head, one file each,
  plus a ``manifest.json`` (shared metadata once, then one entry per file). Progress and cancel
  through callbacks (engine job: ``ctx.progress``/``ctx.cancelled``; CLI: a stderr line).
* **Decode-step animations** (:func:`decode_frames`, :func:`save_animation`): one frame per decode
  step. Because the mask is causal, the map after step ``s`` is exactly the top-left
  ``(n_prompt + s)²`` block of the final map (rows already computed never see later keys), so
  frames are crops of one exact map, not a replay. GIF via Pillow; MP4 only when the optional
  ``imageio-ffmpeg`` package (which ships its own ffmpeg binary) is installed.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from attnscope.core import __version__
from attnscope.core.errors import Cancelled, OutOfRange
from attnscope.core.io import formats
from attnscope.core.io.colormaps import COLOUR_BY_LENGTH, DEFAULT_COLOUR, RANGE_MODES, ColourSpec
from attnscope.core.io.formats import ANIMATION_FORMATS, BATCH_FORMATS, DATA_FORMATS
from attnscope.core.io.render import FrameRenderer, Renderer, layer_sliding_window
from attnscope.core.loading.device_map import record as dm_record
from attnscope.core.loading.model_hash import model_sha256
from attnscope.core.loading.quantize import record as quant_record
from attnscope.core.tokens import UNKNOWN_ID_NOTE, is_unknown
from attnscope.core.trace import softmax_variant

if TYPE_CHECKING:
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

SCHEMA = "attnscope.export/1"
SAFETENSORS_KEY = "weights"
EXACT_NOTE = (
    "recomputed in float32 as exp(q·Kᵀ·scale + mask − LSE) from the captured post-RoPE queries, "
    "the cached keys and the fused kernel's log-sum-exp; not a second softmax, not pooled"
)

Progress = Callable[[int, int, str], None]


# -- provenance --------------------------------------------------------------------------------------
def model_revision(source: str | os.PathLike | None) -> str | None:
    """The revision (commit hash) of a model loaded from the Hugging Face hub cache, read from its
    path ``models--<org>--<name>/snapshots/<revision>`` (:func:`attnscope.core.loading.resolve.hf_cache_snapshot`);
    None for any other source. The name stays ``org/name`` (``model.name``)."""
    from attnscope.core.loading.resolve import hf_cache_snapshot

    hub = hf_cache_snapshot(source) if source else None
    return hub[1] if hub else None


def engine_record(session: Session | RemoteSession) -> dict:
    """``{"engine": {"address": "HOST:PORT", "host": name}}`` for a session whose model runs in an
    ``attnscope serve`` engine (:mod:`attnscope.core.remote`), ``{}`` for an in-process one."""
    engine = getattr(session, "engine", None)
    if not isinstance(engine, str):
        return {}
    return {"engine": {"address": engine, "host": getattr(session.backend, "host", "")}}


def mask_info(session: Session | RemoteSession, layer: int) -> dict:
    """Description of the mask applied in ``layer``: kind, alignment, sliding window, one-line text.

    Convention (docs/how-it-works.md, :mod:`attnscope.core.attention.masks`): query ``i`` attends key ``j`` iff ``j <= i`` (bottom-right
    aligned causal, ``tril(k=S-L)``), and with a window ``W`` also ``j > i - W``.
    """
    w = layer_sliding_window(session, layer)
    text = "causal, bottom-right aligned (query i sees keys j <= i)"
    text += f", sliding window {w} (keys j > i - {w})" if w else ", no sliding window"
    return {"kind": "causal", "alignment": "bottom-right", "sliding_window": w, "description": text}


def session_metadata(session: Session | RemoteSession) -> dict:
    """Metadata shared by every export of the current sequence (no layer/head)."""
    info = session.info
    toks = session.tokens
    sampling = getattr(session, "sampling", None)
    meta = {
        "schema": SCHEMA,
        "attnscope_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "model": {
            "name": info.name,
            "source": info.source,
            # the Hugging Face hub cache revision (snapshot commit) the weights came from; None elsewhere
            "revision": model_revision(info.source),
            # a remote session knows the hash the engine computed on its own machine
            "sha256": getattr(session, "model_sha256", None) or model_sha256(info.source),
            "architecture": info.architecture,
            "n_layers": info.n_layers,
            "n_heads": info.n_heads,
            "n_kv_heads": info.n_kv_heads,
            "head_dim": info.head_dim,
            "group_size": info.group_size,
            "sliding_window": info.sliding_window,
            "n_params": info.n_params,
            # the softmax variant as captured (attnscope.core.trace.softmax_variant)
            **softmax_variant.metadata(getattr(session, "trace", None)),
        },
        "backend": getattr(session.backend, "name", "?"),
        "dtype": info.dtype,
        "quantization": quant_record(
            info
        ),  # {"file": "Q4_K_M", "runtime": "int8 weight-only (torchao …)", "mode"}
        # {"strategy": "auto", "placement": {"cpu": bytes, "disk": bytes}}; {} on one device
        "device_map": dm_record(info),
        "device": str(getattr(session.backend, "device", "cpu")),
        **engine_record(session),
        "prompt": session.prompt,
        "chat_template": bool(session.chat_template),
        "sampling": asdict(sampling) if sampling is not None else None,
        "n_prompt": session.n_prompt,
        "step": session.n_generated,
        "seq_len": session.seq_len,
        "token_ids": [t.id for t in toks],
        "token_texts": [t.text for t in toks],
        "token_raw": [t.raw for t in toks],
        "exact": True,
        "exact_note": EXACT_NOTE,
        # tensors of the forward that held inf/NaN, first first (attnscope.core.trace.finite); None:
        # this backend does not check (the maps' own non-finite cells are counted per export)
        "nonfinite": nonfinite_records(session),
    }
    if any(is_unknown(t.raw, t.id) for t in toks):  # their texts read <id N>: say why once
        meta["token_note"] = UNKNOWN_ID_NOTE
    return meta


def nonfinite_records(session: Session | RemoteSession) -> list[dict] | None:
    """The non-finite tensors of the session's forwards (:meth:`attnscope.core.trace.finite.FiniteWatch.records`):
    ``[]`` when every checked tensor was finite, None when the backend does not check."""
    try:  # a remote session's trace refuses what stays on the engine (SessionError)
        watch = getattr(getattr(session, "trace", None), "finite", None)
    except Exception:  # noqa: BLE001 - not checked here: said as None
        return None
    # attnscope.core.trace.finite.FiniteWatch (not imported: it needs torch)
    records = getattr(watch, "records", None) if callable(getattr(type(watch), "records", None)) else None
    return records() if records is not None else None


def head_metadata(
    session: Session | RemoteSession,
    layer: int,
    head: int,
    n: int | None = None,
    mode: str = "head",
    base: dict | None = None,
) -> dict:
    """Complete sidecar metadata for one head's map (``base`` = a :func:`session_metadata` to reuse).

    ``n``: the map covers positions ``0 .. n-1`` (the view at decode step ``n - n_prompt``; default the
    whole sequence): ``step``, ``seq_len`` and the token lists then describe that step. ``mode``: an
    aggregate of :mod:`attnscope.core.analysis.aggregate` ("group", "layer", "all": the mean of exact weights over the heads
    listed in ``aggregate_heads``) instead of the single head.
    """
    meta = dict(base if base is not None else session_metadata(session))
    T = session.seq_len
    n = T if n is None else int(n)
    if not 1 <= n <= T:
        raise OutOfRange(f"n {n} out of range 1..{T}")
    if n < T:
        meta.update(
            {
                "step": n - session.n_prompt,
                "seq_len": n,
                "token_ids": meta["token_ids"][:n],
                "token_texts": meta["token_texts"][:n],
                "token_raw": meta["token_raw"][:n],
                "session_seq_len": T,
            }
        )
    meta.update(
        {
            "kind": "attention_weights",
            "layer": int(layer),
            "head": int(head),
            "kv_head": session.info.kv_head(int(head)),
            "aggregate": mode,
            "rows": [0, n],
            "cols": [0, n],
            "axes": ["query position", "key position"],
            "mask": mask_info(session, layer),
            # soft-capping (Gemma 2) and learned sinks (gpt-oss): what the softmax did beyond the mask
            "softmax": softmax_variant.metadata(getattr(session, "trace", None), int(layer), int(head)),
        }
    )
    if mode != "head":
        from attnscope.core.analysis import aggregate

        meta["aggregate_heads"] = [list(p) for p in aggregate.heads_in(session.info, layer, head, mode)]
        meta["aggregate_description"] = aggregate.describe(session.info, layer, head, mode)
    return meta


def sidecar_path(path: str | os.PathLike) -> Path:
    """``map.npy`` → ``map.npy.json`` (the full file name is kept, so .npy and .csv never collide)."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def write_json(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


# -- data files ----------------------------------------------------------------------------------------
def _format(path: Path, allowed: Sequence[str]) -> str:
    from attnscope.core.errors import BadArgument

    fmt = path.suffix.lower().lstrip(".")
    if fmt not in allowed:
        raise BadArgument(f"unsupported output {path.name!r}: use .{', .'.join(allowed)}")
    return fmt


def check_head_call(
    session: Session | RemoteSession,
    layer,
    head,
    path: Path,
    fmt: str,
    n,
    mode: str,
    weighting: str,
    figure: bool,
    renderer,
) -> None:
    """Every argument of :func:`export_head` checked before any work, one line each.

    Raises:
        SessionError: nothing run yet. WrongType (a TypeError): layer/head/n not an int.
        OutOfRange (an IndexError): layer, head or n out of range. BadArgument (a ValueError): unknown
        mode or weighting, an SVG/PDF or labelled figure without ``renderer``. BadPath (a
        FileNotFoundError): the output's folder does not exist.
    """
    from attnscope.core.analysis.aggregate import MODES
    from attnscope.core.analysis.value_weighted import WEIGHTINGS
    from attnscope.core.checks import in_range, index
    from attnscope.core.errors import BadArgument, BadPath, SessionError

    info = session.info
    index("layer", layer, info.n_layers)
    info.arch.check_map(layer)  # NoAttentionMap: a hybrid model's layer with no softmax attention
    index("head", head, info.n_heads)
    if mode not in MODES:
        raise BadArgument(f"unknown mode {mode!r}: choose {', '.join(MODES)}")
    if weighting not in WEIGHTINGS:
        raise BadArgument(f"unknown weighting {weighting!r}: choose {' or '.join(WEIGHTINGS)}")
    if session.seq_len == 0:
        raise SessionError("nothing has run yet: run a prompt first (call prefill(prompt)), then export")
    if n is not None:
        in_range("n", n, 1, session.seq_len)
    if renderer is None and (fmt in ("svg", "pdf") or (figure and fmt == "png")):
        what = f"{fmt.upper()} figures" if fmt != "png" else "labelled PNG figures (figure=True)"
        raise BadArgument(
            f"{what} need the window's Qt renderer: pass renderer=attnscope.app.figure.save_heatmap_figure "
            "(needs PySide6), or write .png, .npy, .csv or .safetensors"
        )
    folder = path.parent
    if not folder.is_dir():
        raise BadPath(
            f"cannot write {str(path)!r}: the folder {str(folder)!r} does not exist (create it first)"
        )


#: the corner cell of a map CSV's header row: rows are queries, columns keys
CSV_CORNER = "query \\ key"


def csv_labels(n: int, tokens: Sequence | None = None) -> list[str]:
    """Header labels of ``n`` positions for a map CSV: ``"<position>:<token text>"`` (the text with
    :func:`attnscope.core.tokens.visible_text` stand-ins, so a label is one line), or the bare
    position where ``tokens`` (:class:`attnscope.core.tokens.Token`) runs out. Starting with a digit,
    no label reads as a spreadsheet formula."""
    from attnscope.core.tokens import visible_text

    toks = list(tokens or [])[:n]
    return [f"{i}:{visible_text(toks[i].text)}" if i < len(toks) else str(i) for i in range(n)]


def write_map_csv(w: np.ndarray, path: Path, tokens: Sequence | None = None) -> Path:
    """A map as CSV a spreadsheet reads: a header row (:data:`CSV_CORNER`, then each key's label),
    then one row per query (its label, then its weights, ``%.9g``: float32 round-trips).
    Labels from :func:`csv_labels`. Read back with :func:`read_map_csv`."""
    w = np.asarray(w, dtype=np.float32)
    rows, cols = csv_labels(w.shape[0], tokens), csv_labels(w.shape[1], tokens)
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow([CSV_CORNER, *cols])
        for label, row in zip(rows, w, strict=True):
            out.writerow([label, *(f"{float(x):.9g}" for x in row)])
    return path


def read_map_csv(path: str | os.PathLike) -> tuple[np.ndarray, list[str], list[str]]:
    """``(weights (n_q, n_k) float32, query labels, key labels)`` of a CSV :func:`write_map_csv` wrote.

    Raises:
        ValueError: not such a file (no header row starting with :data:`CSV_CORNER`, ragged rows).
    """
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0][:1] != [CSV_CORNER]:
        raise ValueError(f"{Path(path).name!r} is not an AttnScope map CSV (no {CSV_CORNER!r} header)")
    keys = rows[0][1:]
    if any(len(r) != len(keys) + 1 for r in rows[1:]):
        raise ValueError(f"{Path(path).name!r}: rows of unequal length")
    w = np.array([[float(x) for x in r[1:]] for r in rows[1:]], dtype=np.float32).reshape(-1, len(keys))
    return w, [r[0] for r in rows[1:]], keys


def write_data(
    w: np.ndarray, path: str | os.PathLike, metadata: dict | None = None, tokens: Sequence | None = None
) -> list[Path]:
    """Write a 2-D float32 matrix as .npy/.csv/.safetensors (by suffix), plus its sidecar JSON.

    A CSV has a header row and a label column (:func:`write_map_csv`: ``tokens`` label the positions,
    else their numbers). Returns the paths written (data file first). ``metadata=None`` writes no sidecar.

    Raises:
        ValueError: unknown suffix or not a 2-D matrix. OSError: the file cannot be written.
    """
    path = Path(path)
    fmt = _format(path, DATA_FORMATS)
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"expected a 2-D matrix, got shape {w.shape}")
    meta = None
    if metadata is not None:
        meta = dict(metadata)
        meta["array"] = {
            "file": path.name,
            "format": fmt,
            "shape": list(w.shape),
            "dtype": "float32",
            **({"tensor": SAFETENSORS_KEY} if fmt == "safetensors" else {}),
        }
    if fmt == "npy":
        np.save(path, w)
    elif fmt == "csv":
        write_map_csv(w, path, tokens)
    else:
        from safetensors.numpy import save_file

        header = {"attnscope": json.dumps(meta, ensure_ascii=False)} if meta is not None else None
        save_file({SAFETENSORS_KEY: w}, str(path), metadata=header)
        umask = os.umask(0)  # safetensors creates the file 0600: give it the mode every export has
        os.umask(umask)
        os.chmod(path, 0o666 & ~umask)
    written = [path]
    if meta is not None:
        written.append(write_json(sidecar_path(path), meta))
    return written


# -- images ---------------------------------------------------------------------------------------------
def parse_size(text: str | None) -> tuple[int, int] | None:
    """``"1200x800"`` → ``(1200, 800)``; None passes through. Raises ValueError on anything else."""
    if text is None:
        return None
    try:
        w, h = (int(x) for x in str(text).lower().split("x"))
    except ValueError:
        raise ValueError(f"size must look like 1200x800, got {text!r}") from None
    if not (16 <= w <= 20000 and 16 <= h <= 20000):
        raise ValueError(f"size {w}x{h} out of range (16..20000 pixels a side)")
    return w, h


def save_map_png(
    w: np.ndarray,
    path: str | os.PathLike,
    colour: ColourSpec = DEFAULT_COLOUR,
    size: tuple[int, int] | None = None,
    dpi: float | None = None,
    metadata: dict | None = None,
    masked: np.ndarray | None = None,
) -> Path:
    """A plain map PNG (:func:`attnscope.core.io.render.map_pixels`): one colour-map colour per cell
    (``colour``: map, scale, range), ``masked`` cells (bool, the map's shape) hatched grey on white,
    non-finite cells magenta; rows = queries, columns = keys.

    ``size`` = exact ``(width, height)`` in pixels (nearest-neighbour, so every pixel still carries its
    cell's colour); default: square cells, longest side up to 2048 px. ``dpi`` is recorded in the PNG
    (pHYs). ``metadata`` goes into a PNG text chunk ``"attnscope"`` as JSON.
    """
    from attnscope.core.io.render import heatmap_image
    from PIL import PngImagePlugin

    path = Path(path)
    img = heatmap_image(w, colour, masked=masked, size=size)
    kw: dict = {}
    if dpi:
        kw["dpi"] = (float(dpi), float(dpi))
    if metadata is not None:
        info = PngImagePlugin.PngInfo()
        info.add_itxt("attnscope", json.dumps(metadata, ensure_ascii=False))
        kw["pnginfo"] = info
    img.save(path, format="PNG", **kw)
    return path


def map_mask(
    session: Session | RemoteSession, layer: int, n: int | None = None, mode: str = "head"
) -> np.ndarray:
    """``(n, n)`` bool: the cells of an exported map the mask hid (causal, and ``layer``'s sliding
    window unless ``mode`` is the mean of all layers, where a cell is masked only where every layer
    masks it: the causal part), drawn hatched by every image (:mod:`attnscope.core.io.render`)."""
    from attnscope.core.attention.masks import hidden_cells

    n = session.seq_len if n is None else int(n)
    window = None if mode == "all" else layer_sliding_window(session, layer)
    pos = np.arange(n)
    return hidden_cells(pos, pos, window)


def embed_metadata(path: str | os.PathLike, metadata: dict) -> Path:
    """Put ``metadata`` (JSON) inside an image already written: a PNG's iTXt chunk ``"attnscope"``
    (pixels and DPI kept), an SVG's ``<desc>``. PDFs (and other files) are left alone: their metadata
    goes into a sidecar. Returns ``path``.

    Raises:
        OSError: the file cannot be read or written.
    """
    from xml.sax.saxutils import escape

    path = Path(path)
    text = json.dumps(metadata, ensure_ascii=False)
    fmt = path.suffix.lower()
    if fmt == ".png":
        from PIL import Image, PngImagePlugin

        with Image.open(path) as img:
            img.load()
            info = PngImagePlugin.PngInfo()
            for k, v in img.text.items() if hasattr(img, "text") else ():
                if k != "attnscope":
                    info.add_itxt(k, v)
            info.add_itxt("attnscope", text)
            kw = {"dpi": img.info["dpi"]} if "dpi" in img.info else {}
            tmp = path.with_name(path.name + ".part")
            img.save(tmp, format="PNG", pnginfo=info, **kw)
        os.replace(tmp, path)  # atomic: a reader never sees half a file
    elif fmt == ".svg":
        import re

        svg = path.read_text(encoding="utf-8")
        desc = f"<desc>{escape(text)}</desc>"
        svg, n = re.subn(r"<desc>.*?</desc>", lambda _: desc, svg, count=1, flags=re.S)
        if not n:
            svg = re.sub(r"(<svg\b(?:[^>\"]|\"[^\"]*\")*>)", lambda m: m.group(1) + desc, svg, count=1)
        tmp = path.with_name(path.name + ".part")
        tmp.write_text(svg, encoding="utf-8")
        os.replace(tmp, path)
    return path


def head_title(
    session: Session | RemoteSession, layer: int, head: int, n: int | None = None, mode: str = "head"
) -> str:
    """Figure title: ``"SmolLM2-135M-Instruct · Layer 3 · query head 4 (reads KV head 1) · step 2 · seq_len 29"``."""
    from attnscope.core.analysis import aggregate

    n = session.seq_len if n is None else n
    return (
        f"{session.info.name} · {aggregate.describe(session.info, layer, head, mode)}"
        f" · step {n - session.n_prompt} · seq_len {n}"
    )


def head_map(
    session: Session | RemoteSession,
    layer: int,
    head: int,
    n: int | None = None,
    mode: str = "head",
    weighting: str = "attention",
) -> np.ndarray:
    """The exact map an export writes: ``(n, n)`` float32 of one head (or a ``mode`` mean, :mod:`attnscope.core.analysis.aggregate`).

    ``weighting="value-weighted"``: the row-normalised α_ij·‖v_j W_O^h‖ map the heatmap shows under
    that scale (:func:`attnscope.core.analysis.value_weighted.value_weighted_tile`; Kobayashi et al. 2020).

    Raises:
        ValueError: unknown ``weighting`` or ``mode``. IndexError: ``n`` out of range.
    """
    from attnscope.core.analysis.value_weighted import check_weighting, value_weighted_tile

    if check_weighting(weighting) == "value-weighted":
        if n is not None and not 1 <= n <= session.seq_len:
            raise OutOfRange(f"n {n} out of range 1..{session.seq_len}")
        sel = slice(0, session.seq_len if n is None else int(n))
        return value_weighted_tile(session, layer, head, mode, sel, sel)
    if mode == "head":
        part = None if n is None else slice(0, int(n))
        if n is not None and not 1 <= n <= session.seq_len:
            raise OutOfRange(f"n {n} out of range 1..{session.seq_len}")
        return session.weights(layer, head, part, part)
    from attnscope.core.analysis import aggregate

    return aggregate.map_at(session, layer, head, mode, n)


def colour_range(
    session: Session | RemoteSession,
    layer: int,
    w: np.ndarray,
    range_mode: str = "fixed",
    n: int | None = None,
) -> tuple[float, float]:
    """``(vmin, vmax)`` of the colour scale, as the heatmap's Range control computes it.

    ``"fixed"``: ``[0, 1]`` (probabilities); ``"auto"``: ``[0, robust_max(w)]`` (99.5th percentile of
    the non-zero weights of this map); ``"shared"``: ``[0, layer_robust_max]`` over the heads of
    ``layer`` (first ``n`` positions), so a layer's maps are comparable (:mod:`attnscope.core.analysis.aggregate`).

    Raises:
        ValueError: unknown ``range_mode``.
    """
    from attnscope.core.analysis import aggregate

    if range_mode == "fixed":
        return 0.0, 1.0
    if range_mode == "auto":
        return 0.0, aggregate.robust_max(w)
    if range_mode == "shared":
        return 0.0, aggregate.layer_robust_max(session, layer, n)
    raise ValueError(f"unknown colour range {range_mode!r}: use {', '.join(RANGE_MODES)}")


def export_head(
    session: Session | RemoteSession,
    layer: int,
    head: int,
    path: str | os.PathLike,
    *,
    colour: ColourSpec = COLOUR_BY_LENGTH,
    size: tuple[int, int] | None = None,
    dpi: float | None = None,
    figure: bool = False,
    renderer: Renderer | None = None,
    base: dict | None = None,
    n: int | None = None,
    mode: str = "head",
    full_size: bool = False,
    weighting: str = "attention",
) -> list[Path]:
    """Export one head's map to ``path`` (format by suffix). Returns the files written.

    ``weighting`` is what a cell measures (``"attention"``, or ``"value-weighted"`` as in
    :func:`head_map`, below :data:`attnscope.core.io.export_long.LONG_MAP` tokens); the metadata records it.

    ``n``/``mode`` as in :func:`head_metadata` (default: the whole sequence, the single head). Data
    formats and PDFs get a sidecar ``<file>.json`` (PNG and SVG carry the metadata inside); ``.png``
    is the plain map unless ``figure`` (labelled, needs ``renderer``); ``.svg``/``.pdf`` always need
    ``renderer``. Images are coloured as the heatmap shows them by ``colour``
    (:class:`attnscope.core.io.colormaps.ColourSpec`: map, scale, power-scale gamma, and its
    ``range_mode`` resolved to ``vmin``/``vmax`` by :func:`colour_range`); the metadata records it under
    ``"colour"``. A None ``colour.scale`` (the default) is chosen from the map's own weights
    (:func:`attnscope.core.io.export_long.scale_for_map`: log when fewer than a quarter of its cells
    show on linear; recorded as ``"scale_chosen": "by the map's weights"`` with ``"linear_share"``),
    and by length from 2,048 tokens (``"by length"``). A long map's bare PNG
    (from :data:`attnscope.core.io.export_long.LONG_MAP` tokens) streams and is a max-pooled overview unless
    ``full_size`` (:func:`attnscope.core.io.export_long.export_long_png`; the pooling is in the metadata).

    Every argument is checked before any work (:func:`check_head_call`).

    Raises:
        SessionError: nothing run yet (run a prompt first).
        BadArgument (a ValueError): unknown suffix, aggregate, weighting or range, an SVG/PDF or
            labelled figure without ``renderer`` (pass ``attnscope.app.figure.save_heatmap_figure``:
            the window's Qt renderer, needs PySide6), a full-size long PNG above the size limit
            without ``full_size``.
        OutOfRange (an IndexError): layer/head/n. WrongType (a TypeError): layer/head/n not an int.
        BadPath (a FileNotFoundError): the output's folder does not exist.
    """
    from attnscope.core.io import export_long

    path = Path(path)
    fmt = _format(path, BATCH_FORMATS)
    check_head_call(session, layer, head, path, fmt, n, mode, weighting, figure, renderer)
    meta = head_metadata(session, layer, head, n=n, mode=mode, base=base)
    meta["weighting"] = weighting
    n_map = session.seq_len if n is None else int(n)
    if weighting != "attention" and n_map >= export_long.LONG_MAP:
        raise ValueError(
            f"value-weighted maps export up to {export_long.LONG_MAP - 1} tokens; this one has {n_map}"
        )
    by_length = colour.scale is None
    asked_scale = colour.scale
    colour = export_long.colour_for_length(colour, n_map)
    if fmt == "png" and not figure and n_map >= export_long.LONG_MAP:
        colour = colour.with_range(
            *export_long.long_colour_range(session, layer, head, n_map, mode, colour.range_mode)
        )
        meta["colour"] = colour.metadata()
        meta["colour"]["scale_chosen"] = "by length" if by_length else "by the user"
        return [
            export_long.export_long_png(
                session,
                layer,
                head,
                path,
                n=n_map,
                mode=mode,
                size=size,
                full_size=full_size,
                colour=colour,
                metadata=meta,
                dpi=dpi,
            )
        ]
    w = head_map(session, layer, head, n, mode, weighting)
    meta["nonfinite_cells"] = int(np.count_nonzero(~np.isfinite(w)))  # drawn as non-finite, not weights
    if fmt in DATA_FORMATS:
        return write_data(w, path, meta, tokens=session.tokens[: w.shape[0]])
    masked = map_mask(session, layer, w.shape[0], mode)
    # a scale not chosen by the user comes from this map's own weights (export_long.scale_for_map)
    colour, choice = export_long.colour_for_map(dataclasses.replace(colour, scale=asked_scale), w, masked)
    colour = colour.with_range(*colour_range(session, layer, w, colour.range_mode, n))
    meta["colour"] = colour.metadata()
    meta["colour"].update(choice.metadata() if choice is not None else {"scale_chosen": "by the user"})
    if fmt == "png" and not figure:
        return [save_map_png(w, path, colour, size=size, dpi=dpi, metadata=meta, masked=masked)]
    if renderer is None:
        raise ValueError(f"{fmt.upper()} figures need the Qt renderer (attnscope.app.figure); none was given")
    title = head_title(session, layer, head, w.shape[0], mode)
    out = Path(
        renderer(
            w,
            path,
            tokens=session.tokens[: w.shape[0]],
            title=title,
            colour=colour,
            size=size,
            dpi=dpi,
            metadata=meta,
        )
    )
    if fmt == "pdf":  # PNG keeps the metadata in a text chunk, SVG in <desc>; a PDF gets it beside it
        return [out, write_json(sidecar_path(out), meta)]
    return [out]


# -- batches ---------------------------------------------------------------------------------------------
def heads_in_scope(n_layers: int, n_heads: int, layer: int | None = None, arch=None) -> list[tuple[int, int]]:
    """``(layer, head)`` pairs: every head of ``layer``, or every layer × head when ``layer`` is None;
    with ``arch`` (:class:`attnscope.core.arch.ArchConfig`) a hybrid model's layers with no map are left out.

    Raises:
        IndexError: ``layer`` out of range. NoAttentionMap: ``layer`` has no map (with ``arch``).
    """
    if layer is not None:
        if not 0 <= layer < n_layers:
            raise IndexError(f"layer {layer} out of range 0..{n_layers - 1}")
        if arch is not None:
            arch.check_map(layer)
        return [(layer, h) for h in range(n_heads)]
    layers = range(n_layers) if arch is None else arch.attention_layers
    return [(ll, h) for ll in layers for h in range(n_heads)]


def batch_file_name(layer: int, head: int, fmt: str, n_layers: int = 100, n_heads: int = 100) -> str:
    """``L03_H04.png``: zero-padded so files sort by layer then head."""
    lw, hw = max(2, len(str(n_layers - 1))), max(2, len(str(n_heads - 1)))
    return f"L{layer:0{lw}d}_H{head:0{hw}d}.{fmt}"


def export_batch(
    session: Session | RemoteSession,
    out_dir: str | os.PathLike,
    fmt: str,
    pairs: Sequence[tuple[int, int]],
    *,
    colour: ColourSpec = DEFAULT_COLOUR,
    size: tuple[int, int] | None = None,
    dpi: float | None = None,
    figure: bool = False,
    renderer: Renderer | None = None,
    progress: Progress | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> list[Path]:
    """Export each ``(layer, head)`` of ``pairs`` to ``out_dir/L.._H...<fmt>`` and write ``manifest.json``.

    Colours as :func:`export_head` (``colour``; its range resolved per map).

    One head's map is computed at a time (peak memory one ``seq_len²`` float32 map). ``progress(done,
    total, file_name)`` after each file; ``cancelled()`` before each. The manifest holds the shared
    metadata once and ``files: [{file, layer, head, kv_head, mask}]``; it is written also when the batch
    is cancelled (listing what was written).

    Returns every path written (data files, sidecars, images, the manifest last).

    Raises:
        ValueError: unknown format; SVG/PDF (or a PNG figure) without a renderer.
        FileNotFoundError: ``out_dir``'s parent does not exist.
        Cancelled: ``cancelled()`` became true (message says how many files were written).
    """
    fmt = fmt.lower().lstrip(".")
    if fmt not in BATCH_FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(BATCH_FORMATS)}")
    if (fmt in ("svg", "pdf") or (fmt == "png" and figure)) and renderer is None:
        raise ValueError(f"{fmt.upper()} figures need the Qt renderer (attnscope.app.figure); none was given")
    out = Path(out_dir)
    if not out.parent.exists():
        raise FileNotFoundError(f"folder {out.parent} does not exist")
    out.mkdir(exist_ok=True)
    info = session.info
    base = session_metadata(session)
    written: list[Path] = []
    entries: list[dict] = []
    total = len(pairs)
    stopped = None
    for i, (layer, head) in enumerate(pairs):
        if cancelled is not None and cancelled():
            stopped = i
            break
        name = batch_file_name(layer, head, fmt, info.n_layers, info.n_heads)
        written += export_head(
            session,
            layer,
            head,
            out / name,
            colour=colour,
            size=size,
            dpi=dpi,
            figure=figure,
            renderer=renderer,
            base=base,
        )
        entries.append(
            {
                "file": name,
                "layer": layer,
                "head": head,
                "kv_head": info.kv_head(head),
                "mask": mask_info(session, layer)["description"],
            }
        )
        if progress is not None:
            progress(i + 1, total, name)
    manifest = dict(base)
    manifest.update(
        {
            "kind": "batch",
            "format": fmt,
            "cmap": colour.cmap,
            "scale": colour.scale,
            "gamma": colour.gamma if colour.scale == "power" else None,
            "range": colour.range_mode,
            "files": entries,
            "complete": stopped is None,
        }
    )
    written.append(write_json(out / "manifest.json", manifest))
    if stopped is not None:
        raise Cancelled(f"batch export stopped after {stopped} of {total} files")
    return written


# -- decode-step animations ----------------------------------------------------------------------------
N_FRAME_LEVELS = (
    250  # palette: 250 colour-map steps, the 4 cell specials (attnscope.core.io.render), black, white
)
BLACK, WHITE = 254, 255
LEGEND_H = 18  # pixels of the legend strip under a frame's map


def frame_palette(cmap: str = "viridis") -> np.ndarray:
    """``(256, 3)`` uint8 palette of animation frames: :func:`attnscope.core.io.render.map_palette`
    with :data:`N_FRAME_LEVELS` colour-map steps (masked white, hatch grey, non-finite magenta,
    blank white after them), then black (text) and white (background)."""
    from attnscope.core.io.render import map_palette

    pal = np.empty((256, 3), dtype=np.uint8)
    pal[:254] = map_palette(ColourSpec(cmap=cmap), N_FRAME_LEVELS)
    pal[BLACK] = 0
    pal[WHITE] = 255
    return pal


def frame_legend_lines(items, font, width: int) -> list[list]:
    """The legend ``items`` (:func:`attnscope.core.io.render.legend`) laid out in lines of at most
    ``width`` pixels (swatch, text, gap), at least one item a line."""
    lines: list[list] = [[]]
    x = 3
    for item in items:
        need = 16 + int(font.getlength(item[1])) + 12
        if lines[-1] and x + need > width:
            lines.append([])
            x = 3
        lines[-1].append(item)
        x += need
    return lines if lines[0] else []


def draw_frame_legend(img, y: int, lines, font, n_levels: int = N_FRAME_LEVELS) -> None:
    """Draw the legend ``lines`` (:func:`frame_legend_lines`), :data:`LEGEND_H` pixels each, as
    swatch + text from ``(3, y)`` on the palette image ``img`` (palette of :func:`frame_palette`)."""
    from attnscope.core.io.render import swatch_pixels
    from PIL import Image, ImageDraw

    draw = ImageDraw.Draw(img)
    for k, line in enumerate(lines):
        x, top = 3, y + k * LEGEND_H
        for kind, text in line:
            sw = swatch_pixels(kind, ColourSpec(), 12, 12, n_levels).astype(np.uint8)
            img.paste(Image.fromarray(sw, mode="P"), (x, top + 3))  # indices as they are: one palette
            draw.rectangle((x, top + 3, x + 11, top + 14), outline=BLACK)
            draw.text((x + 16, top + 2), text, fill=BLACK, font=font)
            x += 16 + int(draw.textlength(text, font=font)) + 12


def decode_frames(
    session: Session | RemoteSession,
    layer: int,
    head: int,
    *,
    colour: ColourSpec = DEFAULT_COLOUR,
    max_size: int = 640,
    caption: bool = True,
    first_step: int = 0,
    cancelled: Callable[[], bool] | None = None,
    levels: tuple[float, float] | None = None,
    mode: str = "head",
):
    """One palette image per decode step of ``(layer, head)``: steps ``first_step .. n_generated``.

    Every frame has the final map's size (``seq_len`` cells a side, ``cell`` pixels each, the largest
    integer keeping the map within ``max_size``); frame ``s`` shows the exact map after step ``s``
    (its top-left ``(n_prompt + s)²`` block, see module doc), drawn as every image draws a map
    (:func:`attnscope.core.io.render.map_indices`): masked cells hatched, non-finite cells magenta,
    the rows not generated yet blank (white). With ``caption`` a white strip above the map reads
    ``L3 H4 · step s/N · seq_len T · 'token'`` and one under it names the blank, masked and
    non-finite cells (:func:`attnscope.core.io.render.legend`). A weight's pixel value ``v`` is
    ``round(x · 249)`` for its normalised weight ``x`` (:data:`N_FRAME_LEVELS`, :func:`frame_palette`);
    ``colour`` colours as :func:`export_head` does (its ``range_mode`` resolved on the final map, so
    every frame shares one scale; ``levels = (vmin, vmax)`` gives that range precomputed).

    Returns:
        list of PIL ``"P"`` images, ``n_generated - first_step + 1`` of them.

    Raises:
        SessionError: nothing has run. IndexError: layer/head out of range.
    """
    from attnscope.core.io.render import cell_kinds, legend, map_indices
    from PIL import Image, ImageDraw, ImageFont

    w = session.weights(layer, head)
    T, n0 = w.shape[0], session.n_prompt
    cell = max(1, max_size // T)
    colour = colour.with_range(*(levels or colour_range(session, layer, w, colour.range_mode)))
    masked = map_mask(session, layer, T, mode)
    cap_h = 18 if caption else 0
    font = ImageFont.load_default(size=13) if caption else None
    # the legend of the first frame holds the most kinds but the non-finite rows it has not reached
    # yet: lay out every kind the frames show, so every frame has the same size
    every = legend(cell_kinds(w, masked, n0 if session.n_generated else None)) + legend(cell_kinds(w, masked))
    kinds_seen = list(dict.fromkeys(every))
    leg_h = LEGEND_H * len(frame_legend_lines(kinds_seen, font, T * cell)) if caption else 0
    pal = frame_palette(colour.cmap).reshape(-1).tolist()
    toks = session.tokens
    frames: list[Image.Image] = []
    for s in range(first_step, session.n_generated + 1):
        if cancelled is not None and cancelled():
            raise Cancelled(f"stopped after {len(frames)} frames")
        n = n0 + s
        grid = map_indices(
            w, colour, masked=masked, blank_rows=n, size=(T * cell, T * cell), n_levels=N_FRAME_LEVELS
        ).astype(np.uint8)
        frame = np.full((cap_h + grid.shape[0] + leg_h, grid.shape[1]), WHITE, dtype=np.uint8)
        frame[cap_h : cap_h + grid.shape[0]] = grid
        img = Image.fromarray(frame, mode="P")
        img.putpalette(pal)
        if caption:
            tok = _ascii_label(toks[n - 1].text) if s > 0 else "(prompt)"
            text = f"L{layer} H{head}  step {s}/{session.n_generated}  seq_len {n}  new token {tok}"
            ImageDraw.Draw(img).text((3, 2), text, fill=BLACK, font=font)
            lines = frame_legend_lines(legend(cell_kinds(w, masked, n)), font, grid.shape[1])
            draw_frame_legend(img, cap_h + grid.shape[0], lines, font)
        frames.append(img)
    return frames


def _ascii_label(text: str) -> str:
    """A token label in ASCII (Pillow's default font lacks most symbols): ``'↵'`` → ``'\\n'``, others as ``\\uXXXX``."""
    text = text.replace("↵", "\n").replace("⇥", "\t").replace("␍", "\r")
    return repr(text).encode("ascii", "backslashreplace").decode("ascii")


def export_animation(
    session: Session | RemoteSession,
    layer: int,
    head: int,
    path: str | os.PathLike,
    *,
    colour: ColourSpec = DEFAULT_COLOUR,
    fps: float = 4.0,
    cancelled: Callable[[], bool] | None = None,
    frame_renderer: FrameRenderer | None = None,
) -> list[Path]:
    """Every decode step of ``(layer, head)`` as an animation (:func:`decode_frames`,
    :func:`save_animation`) plus its sidecar ``<file>.json``: the head's metadata for the whole
    sequence, the frames (step ``i`` shows positions ``0 .. n_prompt + i − 1``), fps and colours.

    ``frame_renderer`` (the app's :func:`attnscope.app.figure.figure_frame`): each frame is the labelled figure
    (token axes, colour bar, a caption with the step) instead of the bare map with a caption.

    Returns ``[animation, sidecar]``. Raises what those two raise.
    """
    w = session.weights(layer, head)
    colour = colour.with_range(*colour_range(session, layer, w, colour.range_mode))
    masked = map_mask(session, layer, w.shape[0])
    if frame_renderer is None:
        frames = decode_frames(
            session, layer, head, colour=colour, cancelled=cancelled, levels=(colour.vmin, colour.vmax)
        )
    else:
        toks, n0, frames = session.tokens, session.n_prompt, []
        for s in range(session.n_generated + 1):
            if cancelled is not None and cancelled():
                raise Cancelled(f"stopped after {len(frames)} frames")
            n = n0 + s
            new = f"new token {toks[n - 1].text!r}" if s > 0 else "prompt"
            caption = f"L{layer} H{head} · step {s}/{session.n_generated} · seq_len {n} · {new}"
            frames.append(
                frame_renderer(
                    w,
                    n,
                    tokens=toks,
                    title=caption,
                    colour=colour,
                    masked=masked,
                )
            )
    out = save_animation(frames, path, fps=fps)
    meta = head_metadata(session, layer, head)
    meta.update(
        {
            "kind": "animation",
            "frames": len(frames),
            "fps": fps,
            "frame_steps": list(range(session.n_generated + 1)),
            "colour": colour.metadata(),
            "nonfinite_cells": int(np.count_nonzero(~np.isfinite(w))),
        }
    )
    return [out, write_json(sidecar_path(out), meta)]


def mp4_unavailable() -> str | None:
    """None when MP4 export works here, else the one-line reason (shown by the window and the CLI).

    MP4 needs the optional package ``imageio-ffmpeg`` and the ffmpeg binary it ships; the packaged app
    leaves both out unless built with ``ATTNSCOPE_WITH_MP4=1`` (packaging/bundle_rules.py: +165 MB).
    """
    import importlib.util
    import sys

    frozen = getattr(sys, "frozen", False)
    why = (
        "this packaged build leaves out imageio-ffmpeg and its 165 MB ffmpeg (rebuild with "
        "ATTNSCOPE_WITH_MP4=1)"
        if frozen
        else "it needs the optional package imageio-ffmpeg (pip install imageio-ffmpeg), which ships ffmpeg"
    )
    if importlib.util.find_spec("imageio_ffmpeg") is None:
        return f"MP4 is unavailable: {why}; GIF works without it"
    try:
        import imageio_ffmpeg

        exe = imageio_ffmpeg.get_ffmpeg_exe()
    except Exception as e:  # the package without its binary (a trimmed bundle)
        return f"MP4 is unavailable: imageio-ffmpeg finds no ffmpeg binary ({str(e).splitlines()[0][:120]}); GIF works"
    return None if exe and os.path.exists(exe) else "MP4 is unavailable: no ffmpeg binary; GIF works"


def save_animation(frames, path: str | os.PathLike, fps: float = 4.0, hold_last: float = 1.5) -> Path:
    """Write frames as an animated ``.gif`` (Pillow, loops forever) or ``.mp4`` (H.264 via imageio-ffmpeg).

    ``hold_last`` seconds keep the last frame on screen (GIF only).

    Raises:
        ValueError: no frames, unknown suffix, or MP4 without the optional ``imageio-ffmpeg`` package.
    """
    path = Path(path)
    fmt = _format(path, ANIMATION_FORMATS)
    if not frames:
        raise ValueError("no frames to write")
    if not path.parent.exists():
        raise FileNotFoundError(f"folder {path.parent} does not exist")
    if fps <= 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    if fmt == "gif":
        ms = int(round(1000 / fps))
        durations = [ms] * len(frames)
        durations[-1] = max(ms, int(hold_last * 1000))
        frames[0].save(
            path,
            format="GIF",
            save_all=True,
            append_images=list(frames[1:]),
            duration=durations,
            loop=0,
            optimize=False,
            disposal=1,
        )
        return path
    why = mp4_unavailable()
    if why is not None:
        raise ValueError(why)
    import imageio_ffmpeg

    rgb = [np.asarray(f.convert("RGB")) for f in frames]
    h, w = rgb[0].shape[:2]
    H, W = math.ceil(h / 16) * 16, math.ceil(w / 16) * 16  # H.264 wants macro-blocks of 16
    writer = imageio_ffmpeg.write_frames(
        str(path),
        (W, H),
        fps=fps,
        codec="libx264",
        pix_fmt_in="rgb24",
        macro_block_size=1,
        quality=8,
        ffmpeg_log_level="error",
    )
    writer.send(None)
    for a in rgb:
        padded = np.full((H, W, 3), 255, dtype=np.uint8)
        padded[:h, :w] = a
        writer.send(np.ascontiguousarray(padded))
    writer.close()
    return path


# -- files written whole by the CLI and the window ----------------------------------------------------
def write_weights(
    w: np.ndarray, out: Path, colour: ColourSpec = DEFAULT_COLOUR, tokens: Sequence | None = None
) -> None:
    """Write a weights matrix to ``out`` by its suffix (.png / .npy / .csv / .safetensors), no sidecar;
    ``tokens`` label a CSV's header row and column (:func:`write_map_csv`)."""
    suffix = out.suffix.lower().lstrip(".")
    if suffix in formats.DATA_FORMATS:
        write_data(w, out, tokens=tokens)
    elif suffix == "png":
        save_map_png(w, out, colour)
    else:
        raise ValueError(f"unsupported output {out.name!r}: use .png, {formats.listing('data', last=' or ')}")


def write_compare_csv(result, path: Path) -> Path:
    """The ranked heads table of a :class:`attnscope.core.analysis.compare.CompareResult` as CSV:
    ``rank, layer, head, js_mean, js_max, js_argmax_row`` (``attnscope compare --csv``, the Compare tab)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["rank", "layer", "head", "js_mean", "js_max", "js_argmax_row"])
        for i, d in enumerate(result.ranked(), 1):
            w.writerow([i, d.layer, d.head, f"{d.js_mean:.9g}", f"{d.js_max:.9g}", d.js_argmax])
    return path
