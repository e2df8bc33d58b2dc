"""The engine-thread jobs the window's commands and panels submit (:mod:`attnscope.app.engine`).

Each factory returns ``job(ctx)``: it runs on the engine thread, sees the session through
``ctx.require()`` (which raises "no model loaded" without one), checks ``ctx.cancelled()`` between
chunks, and returns numpy arrays or frozen dataclasses (a :class:`attnscope.core.session.Snapshot`
for commands). Commands go through ``Engine.enqueue``; view jobs through ``Engine.submit`` inside a
:class:`attnscope.app.engine.Request`, whose cancel token ``ctx.cancelled()`` includes.
"""

from __future__ import annotations

import math

from attnscope.core import backend_registry as registry


def load_job(model, backend, device, dtype, sampling=None, quantize="none", device_map=None):
    """Load a model; the new session samples with ``sampling`` (the panel's settings), so the
    controls on screen are what runs from the first step. While the session is a remote engine's
    (:class:`attnscope.core.remote.client.RemoteSession`), ``model`` is a path on the engine's
    machine (File → Open model lists the engine's models) and is loaded there; the session stays
    remote and a cancel stops the engine's load at its next stage. ``device_map``: None (one device)
    or ``auto|balanced|sequential`` (:mod:`attnscope.core.loading.device_map`)."""

    def job(ctx):
        from attnscope.core.errors import Cancelled
        from attnscope.core.session import Session

        def progress(message, fraction):
            # Loading is not chunked: cancel takes effect at the next stage (read, convert, save, load).
            if ctx.cancelled():
                raise Cancelled("loading cancelled; the previous model is still loaded")
            ctx.progress(message, fraction)

        if getattr(ctx.session, "remote_call", None) is not None:  # a remote engine: load it there
            s = ctx.session.load_model(
                model,
                backend=backend,
                device=device,
                dtype=dtype,
                progress=ctx.progress,
                quantize=quantize,
                device_map=device_map,
                cancelled=ctx.cancelled,
            )
        else:
            s = Session.load(
                model,
                backend=backend,
                device=device,
                dtype=dtype,
                progress=progress,
                quantize=quantize,
                device_map=device_map,
            )
        if ctx.cancelled() and s is not ctx.session:  # (an engine's finished load is not undone)
            raise Cancelled("loading cancelled; the previous model is still loaded")
        if sampling is not None:
            s.set_sampling(sampling)
        ctx.session = s  # replaced only on success: a failed load keeps the previous model
        return s.snapshot()

    return job


def prefill_job(prompt, chat):
    def job(ctx):
        s = ctx.require()

        def prog(done, total):
            ctx.progress(f"Prefill {done}/{total} tokens", done / max(1, total))

        s.prefill(prompt, chat_template=chat, progress=prog, cancelled=ctx.cancelled)
        return s.snapshot()

    return job


def step_job(n):
    def job(ctx):
        s = ctx.require()
        for i in range(n):
            if ctx.cancelled():
                break
            s.step(1)
            if n > 1:
                ctx.progress(f"Decode {i + 1}/{n}", (i + 1) / n)
        return s.snapshot()

    return job


def sync_job(ctx):
    """The session's snapshot as it is now (None without a model): what the window shows after a
    command failed or was cancelled, so every control agrees with what the engine holds."""
    return None if ctx.session is None else ctx.session.snapshot()


def switch_backend_job(backend, device, dtype, view):
    """Reload the running model on ``backend`` and replay the current sequence there (prompt, then
    the generated ids fed one by one, as a reopened session is: :func:`attnscope.core.io.sessionfile.replay`).
    Returns ``(snapshot, warnings)``; the old session stays when anything fails or is cancelled."""

    def job(ctx):
        from dataclasses import replace

        from attnscope.core.errors import Cancelled
        from attnscope.core.io import sessionfile

        old = ctx.require()
        if old.seq_len == 0:
            raise ValueError("nothing to replay")  # the caller only queues this job after a run
        sf = replace(sessionfile.SessionFile.from_session(old, view=view), backend=backend, dtype=dtype)
        if not registry.get(backend).takes_device_map:  # accelerate's (torch): MLX runs on one device
            sf = replace(sf, device_map={})

        def progress(message, fraction):
            if ctx.cancelled():
                raise Cancelled("switching backend cancelled; the previous backend and run stay")
            ctx.progress(message, fraction)

        s, warnings = sessionfile.replay(
            sf, session=None, device=device, progress=progress, cancelled=ctx.cancelled
        )
        if ctx.cancelled():
            raise Cancelled("switching backend cancelled; the previous backend and run stay")
        ctx.session = s
        return s.snapshot(), [w for w in warnings if "saved on" not in w and "running on" not in w]

    return job


def back_job(n):
    def job(ctx):
        s = ctx.require()
        s.step_back(n)
        return s.snapshot()

    return job


def percent_progress(ctx, what: str):
    """A ``progress(done, total)`` that reports to the status bar at most once per whole percent."""
    last = [-1]

    def progress(done: int, total: int) -> None:
        pct = 100 * done // max(total, 1)
        if pct != last[0]:
            last[0] = pct
            ctx.progress(f"{what}: {done}/{total}", done / max(total, 1))

    return progress


def map_job(layer, head, mode, n, shared, out=None, weighting="attention"):
    """The heatmap's data for positions ``0..n-1``: exact map, or pooled overview when long.

    ``weighting="value-weighted"``: the row-normalised value-weighted map (:mod:`attnscope.core.analysis.value_weighted`)
    for maps up to ``LONG_PROMPT`` tokens; long overviews stay attention (the title says so).

    ``out`` = ``(columns, rows)`` of a long map's overview (the plot's pixels); while it is computed,
    coarse-to-fine partial overviews go to ``ctx.partial`` as ``(key, PooledMap, auto_max)``.
    """

    def job(ctx):
        from attnscope.core.analysis import aggregate as agg

        s, cancelled = ctx.require(), ctx.cancelled
        shared_max = agg.layer_robust_max(s, layer, n, cancelled=cancelled) if shared else None
        progress = percent_progress(ctx, "Averaging heads") if mode in ("layer", "all") else None
        if n > agg.LONG_PROMPT:
            cols, rows = out or (agg.OVERVIEW, agg.OVERVIEW)

            def partial(pm):
                ctx.partial(((layer, head, mode, n), pm, agg.robust_max(pm.image)))

            pm = agg.pooled_map(
                s,
                layer,
                head,
                mode,
                n,
                out=rows,
                out_cols=cols,
                cancelled=cancelled,
                progress=progress,
                partial=partial,
            )
            return (layer, head, mode, n), None, pm, agg.robust_max(pm.image), shared_max
        if weighting == "value-weighted":
            from attnscope.core.analysis.value_weighted import value_weighted_tile

            w = value_weighted_tile(s, layer, head, mode, slice(0, n), slice(0, n), cancelled=cancelled)
        else:
            w = agg.map_at(s, layer, head, mode, n, cancelled=cancelled, progress=progress)
        return (layer, head, mode, n), w, None, agg.robust_max(w), shared_max

    return job


def tile_job(key, rows, cols):
    def job(ctx):
        from attnscope.core.analysis.aggregate import map_tile

        layer, head, mode, _n = key
        return (
            key,
            rows.start,
            cols.start,
            map_tile(ctx.require(), layer, head, mode, rows, cols, ctx.cancelled),
        )

    return job


def row_job(key, row):
    def job(ctx):
        from attnscope.core.analysis.aggregate import map_tile

        layer, head, mode, n = key
        return key, row, map_tile(ctx.require(), layer, head, mode, slice(row, row + 1), slice(0, n))[0]

    return job


def next_job(step):
    def job(ctx):
        from attnscope.core.analysis.timeline import next_tokens

        return next_tokens(ctx.require(), step, k=10)

    return job


def sampling_job(sampling):
    def job(ctx):
        ctx.require().set_sampling(sampling)
        return sampling

    return job


def grid_job(size, n, weighting="attention"):
    """Every head's max-pooled map over the first ``n`` positions (the timeline's step): ``(n,
    weighting, thumbs)``; ``weighting="value-weighted"``: of the row-normalised value-weighted maps
    (:func:`attnscope.core.analysis.value_weighted_grid.value_weighted_thumbnails`). Partials: ``(n, weighting, thumbs, frac)``."""

    def job(ctx):
        from attnscope.core.analysis.aggregate import thumbnails
        from attnscope.core.analysis.value_weighted_grid import value_weighted_thumbnails

        fn = value_weighted_thumbnails if weighting == "value-weighted" else thumbnails
        return (
            n,
            weighting,
            fn(
                ctx.require(),
                n,
                size=size,
                cancelled=ctx.cancelled,
                progress=percent_progress(ctx, "Head grid thumbnails"),
                partial=lambda th, frac: ctx.partial((n, weighting, th, frac)),
            ),
        )

    return job


def explain_job(layer, head, query, key):
    """The Why panel's data for one cell (:func:`attnscope.core.analysis.explain.explain`): ``(cell,
    Explanation, positional share of the head, provenance)`` with ``cell = (layer, head, query, key)``
    and the provenance the CLI's ``attnscope explain --json`` writes (model, prompt, token ids, their
    SHA-256: :func:`attnscope.core.cli.commands.explain.payload`, without the explanation's own keys)."""

    def job(ctx):
        from attnscope.core.analysis.explain import SHORT_TOKENS, explain, head_positional_share
        from attnscope.core.cli.commands.explain import payload

        s = ctx.require()
        e = explain(s, layer, head, query, key)
        share = None if ctx.cancelled() else head_positional_share(s, layer, head)
        whole = payload(s, e, math.nan if share is None else share, SHORT_TOKENS)  # NaN: stopped before it
        prov = {k: v for k, v in whole.items() if k not in e.to_dict()}
        return (layer, head, query, key), e, share, prov

    return job


def sources_job(layer, head, query, key, top=10):
    """The Why panel's By source box (:func:`attnscope.core.analysis.qk_sources.source_split`): ``(cell,
    SourceSplit)``, one forward of the prefix on the engine thread."""

    def job(ctx):
        from attnscope.core.analysis.qk_sources import source_split

        return (layer, head, query, key), source_split(ctx.require(), layer, head, query, key, top=top)

    return job


def share_grid_job():
    """Every head's positional share (:func:`attnscope.core.analysis.explain.positional_share_grid`),
    ``(L, H)`` float32; progress per layer, cancelled between layers."""

    def job(ctx):
        from attnscope.core.analysis.explain import positional_share_grid

        return positional_share_grid(
            ctx.require(), progress=percent_progress(ctx, "Positional share"), cancelled=ctx.cancelled
        )

    return job
