"""The window's view state: what is on screen, as declared fields that say when they change.

:class:`ViewState` holds the model choice (reference, backend, device, dtype, quantisation), the
sequence (the engine's last :class:`attnscope.core.session.Snapshot`) and the timeline's step, the
selected layer and query head, the current tab, the colour spec, the query row shown in the token
strip and each tab's own settings. Every field has an event, ``state.events.<field>``, emitted with
the new value only when the value really changes (``==``; the snapshot by identity), so a widget
that writes the state from its own change signal and listens to the state's event never loops.

Several changes made inside ``with state.batch():`` are applied at once and reported after the
block, each changed field once (glue's ``delay_callback``); ``events.selection`` fires once with
``(layer, head)`` when either changed, so a view asks for one new map, not two.

Qt-free on purpose (napari's models know nothing of Qt): the state's tests run without a display,
and the Qt bindings live in :mod:`attnscope.app.bind`. Studied, not copied: napari's
``EventedModel`` / ``connect_setattr`` and glue's ``State`` classes with ``CallbackProperty``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

from attnscope.core import backend_registry as registry
from attnscope.core.io.colormaps import DEFAULT_COLOUR, ColourSpec


class Event:
    """A named list of callbacks, each called with one value; :meth:`blocked` silences it."""

    def __init__(self, name: str):
        self.name = name
        self._callbacks: list[Callable[[Any], None]] = []
        self._blocked = 0

    def connect(self, callback: Callable[[Any], None]) -> Callable[[Any], None]:
        """Call ``callback(value)`` on every emission (in connection order); returns it (decorator use)."""
        if callback not in self._callbacks:
            self._callbacks.append(callback)
        return callback

    def disconnect(self, callback: Callable[[Any], None]) -> None:
        """Stop calling ``callback``; unknown callbacks are ignored."""
        with contextlib.suppress(ValueError):
            self._callbacks.remove(callback)

    def emit(self, value: Any = None) -> None:
        if self._blocked:
            return
        for cb in list(self._callbacks):
            cb(value)

    @contextlib.contextmanager
    def blocked(self) -> Iterator[None]:
        """Emissions inside the block reach nobody."""
        self._blocked += 1
        try:
            yield
        finally:
            self._blocked -= 1

    def __len__(self) -> int:
        return len(self._callbacks)


class Events:
    """One :class:`Event` per field, plus the extra event names a state class declares."""

    def __init__(self, names):
        for name in names:
            setattr(self, name, Event(name))

    def __getattr__(self, name: str) -> Event:  # only for names that are not events (typing: Event)
        raise AttributeError(f"no event {name!r}")


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    default: Any
    identity: bool  # compared by ``is`` (large objects whose ``==`` is costly or too coarse)


class EventedState:
    """Base of an evented state: declare fields as class attributes with annotations and defaults.

    Setting a field to a value equal to the current one does nothing; any other value is stored,
    then ``events.<field>`` is emitted with it (after the block when inside :meth:`batch`), then
    ``events.changed`` with the frozenset of the names that changed together.
    Mutable defaults (dicts) are copied per instance.
    """

    _fields: ClassVar[dict[str, _Field]] = {}
    IDENTITY: ClassVar[tuple[str, ...]] = ()  # fields compared by identity
    EXTRA_EVENTS: ClassVar[tuple[str, ...]] = ()  # events that are not fields
    events: Events
    _batch_depth: int
    _pending: dict[str, Any]

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        fields = dict(getattr(cls, "_fields", {}))
        for name in cls.__dict__.get("__annotations__", {}):
            if name.startswith("_") or name.isupper() or name in ("events",):
                continue
            fields[name] = _Field(name, cls.__dict__.get(name), name in cls.IDENTITY)
        cls._fields = fields

    def __init__(self, **values):
        object.__setattr__(self, "events", Events([*self._fields, *self.EXTRA_EVENTS, "changed"]))
        object.__setattr__(self, "_batch_depth", 0)
        object.__setattr__(self, "_pending", {})
        for f in self._fields.values():
            default = dict(f.default) if isinstance(f.default, dict) else f.default
            object.__setattr__(self, f.name, default)
        for name, value in values.items():
            if name not in self._fields:
                raise TypeError(f"{type(self).__name__} has no field {name!r}")
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        f = self._fields.get(name)
        if f is None:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}")
        old = getattr(self, name)
        if old is value or (not f.identity and _equal(old, value)):
            return
        object.__setattr__(self, name, value)
        self._pending[name] = value
        if not self._batch_depth:
            self._flush()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Apply several changes, then emit each changed field once (its final value)."""
        object.__setattr__(self, "_batch_depth", self._batch_depth + 1)
        try:
            yield
        finally:
            object.__setattr__(self, "_batch_depth", self._batch_depth - 1)
            if not self._batch_depth:
                self._flush()

    def update(self, **values) -> None:
        """Set several fields at once (one :meth:`batch`). Raises AttributeError for an unknown name."""
        with self.batch():
            for name, value in values.items():
                setattr(self, name, value)

    def _flush(self) -> None:
        pending = dict(self._pending)
        self._pending.clear()
        for name, value in pending.items():
            getattr(self.events, name).emit(value)
        if pending:
            self._changed(set(pending))
            self.events.changed.emit(frozenset(pending))

    def _changed(self, names: set[str]) -> None:
        """Hook after the field events of one change or batch (derived events)."""

    def connect_setattr(self, field: str, obj: object, attr: str) -> Callable[[Any], None]:
        """Keep ``obj.attr`` equal to ``field`` from now on (napari's ``connect_setattr``)."""

        def setter(value):
            setattr(obj, attr, value)

        return getattr(self.events, field).connect(setter)

    def fields(self) -> dict[str, Any]:
        """The fields and their current values."""
        return {name: getattr(self, name) for name in self._fields}


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # e.g. numpy arrays: ambiguous truth value
        return False


#: The heatmap's own options (``settings["heatmap"]``), saved at the top level of a session's ``view``
#: dict (the format session files have always had), next to the colour spec's
HEATMAP_KEYS = ("aggregate", "weighting")
COLOUR_KEYS = ("scale", "gamma", "range_mode")


class ViewState(EventedState):
    """What the window shows; views read it and listen to its events, widgets bind to it.

    Fields (``events.<name>`` each):

    - ``model`` (str | None: a path, or None for the embedded default), ``backend`` ("torch" | "mlx"),
      ``device`` (str | None), ``dtype`` (str), ``quantize`` ("none" | "int8" | "int4"), ``device_map``
      ("none" | "auto" | "balanced" | "sequential", :mod:`attnscope.core.loading.device_map`): the next load;
    - ``snapshot``: the engine's last :class:`attnscope.core.session.Snapshot` (None: no model yet);
      compared by identity, each snapshot is news;
    - ``step`` (int >= 0): the timeline's decode step; positions ``0 .. visible_len - 1`` are shown;
    - ``layer``, ``head`` (0-based ints): the selection; ``tab`` (str): the current tab's key;
    - ``colour`` (:class:`attnscope.core.io.colormaps.ColourSpec`: colour map, scale, gamma and range
      mode, as the heatmap shows them); ``query_row`` (int | None): the token strip's row;
    - ``settings`` (dict: tab key -> that tab's settings dict, e.g. the heatmap's aggregate and
      weighting); replace one tab's entry with :meth:`set_tab_settings`;
    - ``next_table``: the next-token table shown (:class:`attnscope.core.analysis.timeline.NextTokenTable`
      of the timeline's step, None: none); compared by identity;
    - ``prefilling`` (bool): a prompt runs (prefill); the views say so and Step / Back are off.

    Extra events: ``selection`` ``(layer, head)`` once per change of either; ``message``
    ``(text, timeout_ms)`` and ``error`` (text): what a view wants said in the status bar;
    ``loaded`` (the new model's first snapshot) once a model was loaded; ``stale`` ``(why, heatmap, table)``:
    what is shown no longer matches the request (:meth:`mark_stale`).
    """

    IDENTITY = ("snapshot", "next_table")
    EXTRA_EVENTS = ("selection", "message", "error", "loaded", "stale")

    model: str | None = None
    backend: str = registry.DEFAULT
    device: str | None = None
    dtype: str = "auto"
    quantize: str = "none"
    device_map: str = "none"
    snapshot: Any = None
    step: int = 0
    layer: int = 0
    head: int = 0
    tab: str = "heatmap"
    colour: ColourSpec = DEFAULT_COLOUR
    query_row: int | None = None
    settings: dict = {}
    next_table: Any = None
    prefilling: bool = False

    def __setattr__(self, name: str, value: Any) -> None:
        # A hybrid model's layer with no attention map (docs/how-it-works.md "Hybrid models") is never selected: the
        # request moves to the attention layer that way (the spin box shows where it went).
        if name == "layer" and self.snapshot is not None:
            arch = getattr(self.snapshot.info, "arch", None)
            if arch is not None and 0 <= int(value) < arch.n_layers and not arch.has_map(int(value)):
                old = self.layer
                value = arch.map_layer_near(int(value), int(value) - old)
                if value == old:  # no change: tell the bound widgets, which still show the request
                    self.events.layer.emit(old)
                    return
        super().__setattr__(name, value)

    def _changed(self, names: set[str]) -> None:
        if "layer" in names or "head" in names:
            self.events.selection.emit((self.layer, self.head))

    # -- derived ---------------------------------------------------------------------------------
    @property
    def has_model(self) -> bool:
        return self.snapshot is not None

    @property
    def has_sequence(self) -> bool:
        """True once a prompt ran (the snapshot holds at least one token)."""
        return self.snapshot is not None and self.snapshot.seq_len > 0

    @property
    def visible_len(self) -> int:
        """Positions shown at the timeline's step: ``n_prompt + step`` (0 without a sequence)."""
        if self.snapshot is None:
            return 0
        return min(self.snapshot.n_prompt + self.step, self.snapshot.seq_len)

    @property
    def at_latest(self) -> bool:
        """True when the timeline shows the newest token."""
        return self.snapshot is None or self.step >= self.snapshot.n_generated

    @property
    def group_size(self) -> int:
        """Query heads per KV head of the loaded model (1 without a model)."""
        return 1 if self.snapshot is None else self.snapshot.info.group_size

    @property
    def sequence_key(self) -> tuple:
        """What identifies the sequence shown: model, backend, prompt, chat template and token ids.
        A result computed for another key is stale."""
        s = self.snapshot
        if s is None:
            return ()
        return (
            s.info.name,
            s.backend,
            s.prompt,
            s.chat_template,
            tuple(t.id for t in s.tokens),
        )

    @property
    def colormap(self) -> str:
        """The colour map name of :attr:`colour`."""
        return self.colour.cmap

    # -- changes ---------------------------------------------------------------------------------
    def select(self, layer: int, head: int) -> None:
        """Select ``(layer, head)``; one ``selection`` event. Raises IndexError when out of range for
        the loaded model."""
        if self.snapshot is not None:
            info = self.snapshot.info
            if not 0 <= layer < info.n_layers:
                raise IndexError(f"layer {layer} out of range 0..{info.n_layers - 1}")
            if not 0 <= head < info.n_heads:
                raise IndexError(f"head {head} out of range 0..{info.n_heads - 1}")
        self.update(layer=int(layer), head=int(head))

    def set_colormap(self, name: str) -> None:
        """Paint with colour map ``name`` (an entry of :data:`attnscope.core.io.colormaps.COLORMAPS`)."""
        self.colour = dataclasses.replace(self.colour, cmap=str(name))

    def set_tab_settings(self, key: str, values: Mapping) -> None:
        """Replace tab ``key``'s settings (emits ``settings`` when they differ)."""
        if self.settings.get(key) != dict(values):
            self.settings = {**self.settings, key: dict(values)}

    def say(self, text: str, timeout_ms: int = 6000) -> None:
        """Ask for ``text`` in the status bar."""
        self.events.message.emit((text, timeout_ms))

    def mark_stale(self, why: str, *, heatmap: bool = True, table: bool = True) -> None:
        """Say that the heatmap's map (``heatmap``) and the next-token table (``table``) on screen are
        of an earlier sequence or step: ``why`` leads their header until new data replaces them."""
        self.events.stale.emit((why, heatmap, table))

    def fail(self, text: str) -> None:
        """Ask for ``text`` as an error (status bar, and a dialog when the window is shown)."""
        self.events.error.emit(text)

    # -- session files ---------------------------------------------------------------------------
    def to_view_dict(self) -> dict:
        """The ``view`` dict a session file stores: layer, head, tab, cmap, query row, the heatmap's
        options at the top level, the timeline step (None at the newest token) and the other tabs'
        settings under ``"views"`` (the format session files have always had)."""
        out: dict[str, Any] = {
            "layer": self.layer,
            "head": self.head,
            "tab": self.tab,
            "cmap": self.colormap,
            "query_row": self.query_row,
        }
        hm = self.settings.get("heatmap", {})
        out.update({k: hm[k] for k in HEATMAP_KEYS if k in hm})
        out.update({k: getattr(self.colour, k) for k in COLOUR_KEYS})
        out["timeline_step"] = None if self.at_latest else self.step
        views = {k: dict(v) for k, v in self.settings.items() if k != "heatmap"}
        if views:
            out["views"] = views
        return out

    @staticmethod
    def parse_view_dict(view: Mapping | None, current_colour: ColourSpec | None = None) -> dict:
        """A session's ``view`` dict (any version) as field values for :meth:`update`; entries of the
        wrong type or value are left out (an old or hand-edited file never breaks the window); the
        colour entries replace those of ``current_colour``. The layer,
        head, step and query row are returned as they are: the caller checks them against the
        sequence (:meth:`select` raises IndexError)."""
        view = view if isinstance(view, Mapping) else {}
        out: dict[str, Any] = {}
        for key in ("layer", "head"):
            if isinstance(view.get(key), int) and not isinstance(view.get(key), bool):
                out[key] = view[key]
        if isinstance(view.get("tab"), str):
            out["tab"] = view["tab"]
        colour = {k: view[k] for k in COLOUR_KEYS if view.get(k) is not None}
        if isinstance(view.get("cmap"), str) and view["cmap"]:
            colour["cmap"] = view["cmap"]
        if colour:
            try:
                out["colour"] = dataclasses.replace(current_colour or DEFAULT_COLOUR, **colour)
            except (TypeError, ValueError):  # an unknown map, scale or range: each entry alone, then
                spec = current_colour or DEFAULT_COLOUR
                for key, value in colour.items():
                    try:
                        spec = dataclasses.replace(spec, **{key: value})
                    except (TypeError, ValueError):
                        continue
                out["colour"] = spec
        row = view.get("query_row")
        if isinstance(row, int) and not isinstance(row, bool):
            out["query_row"] = row
        step = view.get("timeline_step")
        if isinstance(step, int) and not isinstance(step, bool):
            out["step"] = step
        settings: dict[str, dict] = {}
        hm = {k: view[k] for k in HEATMAP_KEYS if view.get(k) is not None}
        if hm:
            settings["heatmap"] = hm
        for key, values in (view.get("views") or {}).items():
            if isinstance(key, str) and isinstance(values, Mapping):
                settings[key] = dict(values)
        out["settings"] = settings
        return out
