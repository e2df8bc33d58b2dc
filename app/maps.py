"""The heatmap, the head grid and the token strip: what they ask the engine for, and what they show.

:class:`MapPanel` listens to the :class:`attnscope.app.state.ViewState` (selection, step, colours)
and asks for one map per change through :class:`attnscope.app.engine.Request`, whose state key
``(layer, head, aggregate, visible_len)`` drops a result that arrives after the user moved on.
It holds what the window shows of the map (``weights``, ``map_key``, ``weights_key``); the heatmap's
options are kept in the state both ways: aggregate and weighting in ``state.settings["heatmap"]``,
scale, gamma and colour range in ``state.colour`` (the colour map comes from the window's combo).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
from attnscope.app import jobs
from attnscope.app.engine import Engine, Request
from attnscope.app.state import HEATMAP_KEYS, ViewState
from attnscope.app.token_strip import TokenStrip
from attnscope.app.views.head_grid import HeadGridCanvas, HeadGridView
from attnscope.app.views.heatmap import HeatmapView
from attnscope.core.attention.masks import aggregate_window


class MapPanel:
    """Requests and results of the heatmap (``heatmap``), the head grid (``grid``) and the token strip."""

    def __init__(
        self,
        state: ViewState,
        engine: Engine,
        heatmap: HeatmapView,
        grid: HeadGridView,
        token_strip: TokenStrip,
    ):
        self.state, self.engine = state, engine
        self.heatmap, self.grid, self.token_strip = heatmap, grid, token_strip
        self.weights: np.ndarray | None = None
        self.weights_key: tuple[int, int] | None = None
        self.map_key: tuple[int, int, str, int] | None = None  # (layer, head, aggregate, n) shown now
        heatmap.mask_window_provider = self.sliding_window  # asked at each redraw
        heatmap.rowClicked.connect(self.pick_row)
        heatmap.optionsChanged.connect(self.on_options)
        heatmap.tileWanted.connect(self.request_tile)
        token_strip.tokenClicked.connect(self.pick_row)
        # one scale for the heatmap and the grid: either combo sets both (the thumbnail clicked opens a
        # map on the scale it showed)
        grid.weightingChanged.connect(self._on_grid_weighting)
        heatmap.weighting_combo.currentIndexChanged.connect(self._on_heatmap_weighting)
        state.events.selection.connect(self._on_selection)
        state.events.colour.connect(self._on_colour)
        state.events.query_row.connect(lambda _row: self.show_token_strip())
        state.events.settings.connect(self._on_settings)
        for control in (heatmap.aggregate_combo, heatmap.weighting_combo):
            control.currentIndexChanged.connect(self.push_settings)
        heatmap.range_combo.currentIndexChanged.connect(self.push_colour)
        heatmap.scale_combo.currentIndexChanged.connect(self.push_colour)
        heatmap.gamma_spin.valueChanged.connect(self.push_colour)
        self.push_settings()
        self.push_colour()
        self.push_grid()

    # -- state ----------------------------------------------------------------------------------
    def heatmap_settings(self) -> dict:
        hm = self.heatmap
        return {k: getattr(hm, k) for k in HEATMAP_KEYS if hasattr(hm, k)}

    def push_settings(self, *_args) -> None:
        """``state.settings["heatmap"]`` := the heatmap's aggregate and weighting as shown."""
        self.state.set_tab_settings("heatmap", self.heatmap_settings())

    def push_grid(self) -> None:
        """``state.settings["grid"]`` := the grid's scale and pooling as shown (its ``view_state()``)."""
        self.state.set_tab_settings("grid", self.grid.view_state())

    def push_colour(self, *_args) -> None:
        """``state.colour`` := the heatmap's scale, gamma and colour range as shown."""
        hm, st = self.heatmap, self.state
        try:
            st.colour = replace(st.colour, scale=hm.scale, gamma=hm.gamma, range_mode=hm.range_mode)
        except ValueError:  # not a colour spec (cannot happen with the heatmap's own choices)
            pass

    def on_options(self) -> None:
        self.push_settings()
        self.request_weights()

    def _on_settings(self, settings: dict) -> None:
        """A reopened session's heatmap and grid options: applied to them (unknown values skipped)."""
        grid = settings.get("grid")
        if grid and grid != self.grid.view_state():
            self.grid.restore_view_state(grid)
        want = settings.get("heatmap") or {}
        if not want or want == self.heatmap_settings():
            return
        hm = self.heatmap
        if want.get("aggregate"):
            try:
                hm.set_aggregate(want["aggregate"])
            except ValueError:
                pass
        combo = hm.weighting_combo
        if want.get("weighting") and combo.findData(want["weighting"]) >= 0:
            combo.setCurrentIndex(combo.findData(want["weighting"]))
        self.push_settings()

    def _on_selection(self, _selection) -> None:
        self.grid.canvas.set_selected(self.state.layer, self.state.head)
        self.request_weights()

    def _on_colour(self, spec) -> None:
        hm = self.heatmap
        if (hm.scale, hm.gamma) != (spec.scale, spec.gamma) and spec.scale is not None:
            hm.set_scale(spec.scale, spec.gamma)
        if hm.range_mode != spec.range_mode:
            hm.set_range_mode(spec.range_mode)
        hm.set_colormap(spec.cmap)
        canvas = self.grid.canvas
        canvas.cmap = spec.cmap
        canvas.follow, canvas.gamma = spec.scale, spec.gamma  # the grid shows the heatmap's Scale
        canvas.range_mode, canvas.fixed_range = (
            hm.range_mode,
            (float(hm.levels[0]), float(hm.levels[1])),
        )  # ... and its Range
        if canvas.thumbs is not None:
            canvas.set_thumbnails(canvas.thumbs, canvas.group_size)
            self.grid.show_scale()
        self.show_token_strip()

    def clear(self, why: str = "") -> None:
        """The empty state: no map, no thumbnails, no tokens."""
        self.heatmap.clear()
        if why:
            self.heatmap.plot.setTitle(why)
        self.map_key = self.weights_key = None
        self.weights = None
        self.grid.canvas.clear_thumbnails()
        self.grid.canvas.set_placeholder(HeadGridCanvas.PLACEHOLDER)
        self.token_strip.clear()

    # -- the heatmap ------------------------------------------------------------------------------
    def wanted_key(self) -> tuple[int, int, str, int]:
        s = self.state
        return s.layer, s.head, self.heatmap.aggregate, s.visible_len

    def request_weights(self) -> None:
        s, hm = self.state, self.heatmap
        if not s.has_sequence:
            return
        job = jobs.map_job(
            s.layer,
            s.head,
            hm.aggregate,
            s.visible_len,
            hm.range_mode == "shared",
            out=hm.overview_pixels(),
            weighting=getattr(hm, "weighting", "attention"),
        )
        if self.map_key is not None and self.map_key != self.wanted_key():
            hm.mark_stale("stale: computing the map for this selection…")
        self.engine.submit(
            "heatmap",
            Request(
                job, self._on_weights, "weights", key=self.wanted_key, on_partial=self._on_weights_partial
            ),
        )

    def _request_learned_share(self, layer: int, head: int, mode: str) -> None:
        """A model with learned sinks: fetch the shown head's per-row share on the sink slot for the
        heatmap's readout (one head only: an aggregate map has no single sink)."""
        hm = self.heatmap
        hm.learned_share = None
        snap = self.state.snapshot
        if snap is None or not getattr(snap, "learned_sinks", False) or mode != "head":
            return

        def job(ctx):
            share = getattr(ctx.require().trace, "learned_sink_share", None)  # a remote trace has none
            return (layer, head), None if share is None else share(layer)[head]

        def done(result):
            if self.weights_key == result[0] and result[1] is not None:
                hm.learned_share = result[1]

        self.engine.submit(
            "heatmap-sink", Request(job, done, "learned sink share", key=lambda: self.weights_key)
        )

    def _on_weights(self, result) -> None:
        key, w, pooled, auto_max, shared_max = result
        from attnscope.core.analysis.aggregate import describe

        snap, hm = self.state.snapshot, self.heatmap
        layer, head, mode, n = key
        prev = self.map_key
        reset = prev is None or prev[3] != n
        self.map_key = key
        self.weights_key = (layer, head)
        self._request_learned_share(layer, head, mode)
        toks = list(snap.tokens)[:n]
        when = "" if self.state.at_latest else f" · step {self.state.step} of {snap.n_generated}"
        title = f"{describe(snap.info, layer, head, mode)} · seq_len {n}{when}"
        title += f" · {hm.apply_length_defaults(n, w if pooled is None else None)}"
        self.push_colour()  # the scale may follow the length (set with the combo's signals blocked)
        vw = getattr(hm, "weighting", "attention") == "value-weighted"
        hm.set_bar_label("value-weighted" if vw and pooled is None else "attention")
        if vw:
            title += (
                " · value-weighted α·‖v W_O‖, row-normalised"
                if pooled is None
                else " · value-weighted needs ≤ 1024 tokens: attention shown"
            )
        if pooled is None:
            self.weights = w
            hm.set_weights(
                w, toks, toks, title=title, reset_view=reset, auto_max=auto_max, shared_max=shared_max
            )
        else:
            self.weights = None  # long map: never held whole on the GUI side
            hm.set_overview(
                pooled,
                toks,
                title=title + " · overview: max-pooled",
                reset_view=reset,
                auto_max=auto_max,
                shared_max=shared_max,
            )
            hm.show_status(title + f" · overview: {pooled.pooling}-pooled")
        self.show_token_strip()

    def _on_weights_partial(self, result) -> None:
        """A coarse-to-fine overview of a long map while it is computed: shown at once, said partial."""
        key, pooled, auto_max = result
        from attnscope.core.analysis.aggregate import describe

        snap, hm = self.state.snapshot, self.heatmap
        layer, head, mode, n = key
        reset = self.map_key is None or self.map_key[3] != n
        self.map_key = None  # not final: the finished map replaces it (and tiles wait for it)
        self.weights = None
        toks = list(snap.tokens)[:n]
        title = f"{describe(snap.info, layer, head, mode)} · seq_len {n}"
        title += f" · {hm.apply_length_defaults(n)} · overview: {pooled.pooling}-pooled"
        hm.set_overview(pooled, toks, title=title, reset_view=reset, auto_max=auto_max)
        hm.show_status(title, f"partial: {pooled.done:.0%} of rows, refining")

    def request_tile(self, r0: int, r1: int, c0: int, c1: int) -> None:
        if self.map_key is None:
            return
        key = self.map_key
        job = jobs.tile_job(key, slice(r0, r1), slice(c0, c1))
        self.engine.submit(
            "heatmap-tile", Request(job, self._on_tile, "exact tile", key=lambda: self.map_key)
        )

    def _on_tile(self, result) -> None:
        _key, r0, c0, tile = result
        if self.heatmap.pooled is not None:
            self.heatmap.set_tile(tile, r0, c0)

    # -- the token strip -------------------------------------------------------------------------
    def pick_row(self, row: int) -> None:
        """Shade the token strip by query row ``row`` (a click on the heatmap or on a token)."""
        if 0 <= row < self.state.visible_len:
            self.state.query_row = row

    def show_token_strip(self) -> None:
        s = self.state
        if s.snapshot is None:
            return
        n = s.visible_len
        toks = list(s.snapshot.tokens)[:n]
        row = n - 1 if s.query_row is None else s.query_row
        self.heatmap.mark_row(s.query_row)  # outlined only once the user picked a row
        if self.weights is not None and self.weights.shape[0] == n:
            self.token_strip.show_tokens(toks, self.weights[row], row, s.colormap)
        elif self.heatmap.pooled is not None and self.map_key is not None:
            self.token_strip.show_tokens(toks, None, row)
            self.engine.submit(
                "strip-row",
                Request(
                    jobs.row_job(self.map_key, row), self._on_strip_row, "query row", key=lambda: self.map_key
                ),
            )
        else:
            self.token_strip.show_tokens(toks)

    def _on_strip_row(self, result) -> None:
        key, row, w = result
        toks = list(self.state.snapshot.tokens)[: key[3]]
        self.token_strip.show_tokens(toks, w, row, self.state.colormap)

    # -- the head grid -----------------------------------------------------------------------------
    def grid_key(self) -> tuple[int, str]:
        return self.state.visible_len, self.grid.weighting

    def request_grid(self) -> None:
        if not self.state.has_sequence:
            return
        self.grid.canvas.set_placeholder("Computing every head's thumbnail…")
        self.grid.show_scale()
        job = jobs.grid_job(40, self.state.visible_len, self.grid.weighting)
        self.engine.submit(
            "grid",
            Request(job, self._on_grid, "head grid", key=self.grid_key, on_partial=self._on_grid_partial),
        )

    def sliding_window(self) -> int | None:
        """The sliding window (keys) the shown map was masked with, from the snapshot's
        ``layer_windows`` (:func:`attnscope.core.attention.masks.aggregate_window`); None: causal only,
        or no map or snapshot yet."""
        snap, key = self.state.snapshot, self.map_key
        if snap is None or key is None:
            return None
        layer, _head, mode, _n = key
        return aggregate_window(snap.layer_windows, layer, mode)

    def _on_grid_weighting(self, weighting: str) -> None:
        combo = self.heatmap.weighting_combo
        combo.setCurrentIndex(combo.findData(weighting))  # -> _on_heatmap_weighting

    def _on_heatmap_weighting(self, _i) -> None:
        self.grid.set_weighting(self.heatmap.weighting)
        if self.state.tab == "grid":
            self.request_grid()
        else:
            self.grid.show_scale()

    def _show_thumbs(self, thumbs, weighting: str, note: str) -> None:
        canvas = self.grid.canvas
        canvas.set_note(note)
        canvas.cmap = self.state.colormap
        snap = self.state.snapshot  # sliding-window layers: blocks outside the window are hatched too
        canvas.windows = (snap.layer_windows or None) if snap is not None else None
        arch = snap.info.arch if snap is not None else None  # a hybrid model's layers with no map, named
        canvas.no_map = (
            {i: arch.no_map_line(i) for i in range(arch.n_layers) if not arch.has_map(i)} if arch else {}
        )
        canvas.set_thumbnails(thumbs, self.state.group_size, weighting, n=self.state.visible_len)
        self.push_grid()

    def _on_grid_partial(self, result) -> None:
        _n, weighting, thumbs, frac = result
        self._show_thumbs(thumbs, weighting, f"partial: {frac:.0%} of layers")
        self.grid.show_scale()

    def _on_grid(self, result) -> None:
        _n, weighting, thumbs = result
        self._show_thumbs(thumbs, weighting, "")
        self.grid.canvas.set_selected(self.state.layer, self.state.head)
        self.grid.show_scale()

    # -- saving what is shown ----------------------------------------------------------------------
    def save_png(self, path: str | os.PathLike) -> Path:
        """Save the heatmap as shown (labels, colour bar) to a PNG. Raises OSError on failure."""
        path = Path(path)
        if not self.heatmap.glw.grab().save(str(path), "PNG"):
            raise OSError(f"could not write {path}")
        self.state.say(f"Saved {path}", 5000)
        return path

    def save_data(self, path: str | os.PathLike) -> Path:
        """Save the current head's weights as .npy or .csv (by suffix). Raises OSError or ValueError
        (said in the status bar too)."""
        from attnscope.core.io.data_writers import write_weights

        path = Path(path)
        try:
            if self.weights is None:  # none shown yet, or a long map (an overview, never held whole)
                raise ValueError("no head's weights are held to save: use File → Export… for a long map")
            n = self.weights.shape[0]  # a CSV's header row and column name the tokens
            write_weights(self.weights, path, tokens=list(self.state.snapshot.tokens)[:n])
        except (OSError, ValueError) as e:
            self.state.fail(str(e))
            raise
        self.state.say(f"Saved {path}", 5000)
        return path
