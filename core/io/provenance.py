"""Provenance of every export: the metadata that says where a map's numbers come from.

Qt-free. :func:`head_metadata` is the sidecar JSON of one head's map (model name and SHA-256 of its
file, backend, dtype, device, prompt, token ids and texts, decode step, layer, head, mask, and
``exact: true``: the weights are recomputed from the captured post-RoPE queries, the cached keys and
the kernel's LSE, ``exp(q·Kᵀ·scale + mask − LSE)``, not read from a second softmax);
:func:`session_metadata` the part shared by every export of one sequence. Data files and PDFs get it
beside them (:func:`sidecar_path`, :func:`write_json`), PNGs and SVGs inside them
(:func:`embed_metadata`). The fields are documented in docs/file-formats.md.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from attnscope.core import __version__
from attnscope.core.errors import OutOfRange
from attnscope.core.io.render import layer_sliding_window
from attnscope.core.loading.device_map import record as dm_record
from attnscope.core.loading.model_hash import model_sha256
from attnscope.core.loading.quantize import record as quant_record
from attnscope.core.tokens import UNKNOWN_ID_NOTE, is_unknown
from attnscope.core.trace import softmax_variant

if TYPE_CHECKING:
    from attnscope.core.remote.client import RemoteSession
    from attnscope.core.session import Session

SCHEMA = "attnscope.export/1"
EXACT_NOTE = (
    "recomputed in float32 as exp(q·Kᵀ·scale + mask − LSE) from the captured post-RoPE queries, "
    "the cached keys and the fused kernel's log-sum-exp; not a second softmax, not pooled"
)


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
