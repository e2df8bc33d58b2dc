"""The Compare tab's engine jobs (:mod:`attnscope.app.views.compare`): run B and the comparison, one head's
A and B maps (or a long head's pooled overview), an exact tile on zoom, and one query row of both runs.

Each job runs on the engine thread where both runs are, in this process or on the remote engine
(:mod:`attnscope.core.analysis.compare_run_b`); the GUI only draws what comes back. Also what run B is
(:class:`RunBSpec`) and what makes run A the run a comparison was made of (:func:`run_a_key`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_CELLS = (
    512  # maps longer than this show a pooled overview (this many blocks a side) + exact tiles on zoom
)


def run_a_key(snap, session, ids=None) -> tuple | None:
    """What makes run A the run a comparison was made of: the session object (B is held for it, and a
    new load replaces it), its model info (name, dtype, quantisation…), backend, device, chat-template
    setting and token ids (``ids``: these instead of the snapshot's). None without a snapshot."""
    if snap is None:
        return None
    ids = tuple(t.id for t in snap.tokens) if ids is None else tuple(ids)
    return (id(session), snap.info, snap.backend, snap.device, snap.chat_template, ids)


@dataclass(frozen=True)
class RunBSpec:
    """What run B is: every field None = A's."""

    kind: str
    model: str | None
    backend: str
    dtype: str
    prompt: str
    weighting: str = "attention"


def run_b_job(spec: RunBSpec):
    def job(ctx):
        from attnscope.core.analysis.compare_run_b import kept_all_logits, run_b
        from attnscope.core.errors import SessionError

        sa = ctx.session
        if sa is None or sa.seq_len == 0:
            raise SessionError("run a prompt first: run A is the window's sequence")
        if not kept_all_logits(sa):  # the window's prefill kept only the last logits: replay A once
            ctx.progress("Re-running A to keep every position's logits…", 0.02)
            gen = sa.ids[sa.n_prompt :]
            sa.prefill(sa.prompt, chat_template=sa.chat_template, all_logits=True, cancelled=ctx.cancelled)
            if gen:
                sa.feed(gen, cancelled=ctx.cancelled)
        # B is loaded, run and compared where A's model is: here, or on the remote engine
        res, labels_a, labels_b = run_b(
            sa,
            spec.kind,
            spec.model,
            spec.backend,
            spec.dtype,
            spec.prompt,
            spec.weighting,
            progress=ctx.progress,
            cancelled=ctx.cancelled,
        )
        return res, (list(labels_a), list(labels_b))

    return job


def maps_job(layer: int, head: int, n: int, weighting: str):
    """A's and B's maps of one head over the aligned ``n × n``. Up to :data:`MAX_CELLS` the exact maps
    (payload ``(key, wa, wb, None)``); longer, the overview :class:`attnscope.core.analysis.compare_overview.PairOverview`
    (payload ``(key, a, b, overview)``), computed in row bands: never a whole long map on either side."""

    def job(ctx):
        # computed where both runs are: here, or on the remote engine (attnscope.core.analysis.compare_run_b)
        from attnscope.core.analysis.compare_run_b import b_maps, b_overview
        from attnscope.core.errors import Cancelled, SessionError

        if ctx.session is None:
            raise SessionError("run B first")
        if n > MAX_CELLS:
            ov = b_overview(ctx.session, layer, head, n, MAX_CELLS, weighting, cancelled=ctx.cancelled)
            return (layer, head), ov.a, ov.b, ov
        band = max(1, (1 << 22) // n)  # rows per band: about 4M cells of each map at a time
        pa, pb = [], []
        for r0 in range(0, n, band):
            if ctx.cancelled():
                raise Cancelled("cancelled")
            wa, wb = b_maps(
                ctx.session, layer, head, n, rows=slice(r0, min(r0 + band, n)), weighting=weighting
            )
            pa.append(np.asarray(wa, np.float32))
            pb.append(np.asarray(wb, np.float32))
        return (layer, head), np.concatenate(pa), np.concatenate(pb), None

    return job


def tile_job(layer: int, head: int, n: int, r0: int, r1: int, c0: int, c1: int, weighting: str):
    """The exact ``rows r0:r1 × cols c0:c1`` tile of A and B (engine thread, both runs' weights)."""

    def job(ctx):
        from attnscope.core.analysis.compare_run_b import b_maps
        from attnscope.core.errors import SessionError

        if ctx.session is None:
            raise SessionError("run B first")
        wa, wb = b_maps(
            ctx.session, layer, head, n, rows=slice(r0, r1), cols=slice(c0, c1), weighting=weighting
        )
        return (layer, head), n, r0, c0, wa, wb

    return job


def row_job(layer: int, head: int, row: int, n: int, weighting: str):
    def job(ctx):
        from attnscope.core.analysis.compare_run_b import b_maps

        wa, wb = b_maps(ctx.session, layer, head, n, rows=slice(row, row + 1), weighting=weighting)
        return row, wa[0], wb[0]

    return job
