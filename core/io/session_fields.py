"""Every field of a ``.attnscope`` session file, its type and the values it may take.

A session file is JSON that people edit by hand, so :func:`parse` checks each field before anything
uses it and turns the first bad one into ONE line that names the field, the value found and what is
allowed::

    bad session file: view.layer is "3", expected a non-negative integer
    bad session file: sampling.seed is "abc", expected a non-negative integer
    bad session file: device is "tpu", expected cpu, cuda, cuda:N, mps, mlx:cpu or mlx:gpu

The rules are the ones the readers of each field rely on: :class:`attnscope.core.sampling.Sampling`
(temperature >= 0, top_k >= 0, top_p in (0, 1], a seed numpy's SeedSequence takes),
:class:`attnscope.core.io.colormaps.ColourSpec` (colour map, scale, gamma > 0, range mode), the
``--quantize`` and ``--device-map`` choices, the backends and dtypes. JSON has no integer/float
distinction a person sees, so ``3.0`` is refused where an integer is expected (a layer is never 3.0)
and ``true`` is never a number. Unknown top-level and ``view`` keys are kept as they are (the window
stores its tabs' settings under ``view.views``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

#: what ``format`` must say
FORMAT = "attnscope.session"
#: ``device``: a torch device string the backend reported, or MLX's
DEVICE_RE = re.compile(r"(cpu|mps|cuda)(:\d+)?|mlx:(cpu|gpu)")
DEVICE_EXPECTED = "cpu, cuda, cuda:N, mps, mlx:cpu or mlx:gpu"
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "seed")


class FieldError(ValueError):
    """One bad field: the message is the whole line (``bad session file: …`` or ``… lacks the field …``)."""


def show(value: Any, limit: int = 40) -> str:
    """``value`` as the file writes it (JSON: ``"3"``, ``3.5``, ``null``, ``[1, 2]``), cut to ``limit``
    characters with an ellipsis."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def name(path: str, limit: int = 60) -> str:
    """A field's path as one printable line (a hand-edited key may hold a newline), cut to ``limit``."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in path)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def bad(path: str, value: Any, expected: str) -> FieldError:
    return FieldError(f"bad session file: {name(path)} is {show(value)}, expected {expected}")


def one_of(choices) -> str:
    """``"a, b or c"``."""
    choices = [str(c) for c in choices]
    return choices[0] if len(choices) == 1 else ", ".join(choices[:-1]) + " or " + choices[-1]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool)) and math.isfinite(v)


def integer(path: str, v: Any, lo: int = 0, hi: int | None = None) -> int:
    """``v`` if it is an integer in ``lo..hi`` (``hi`` None: no upper end)."""
    if _is_int(v) and v >= lo and (hi is None or v <= hi):
        return v
    if hi is not None:
        want = f"an integer {lo}..{hi}"
    else:
        want = "a non-negative integer" if lo == 0 else f"an integer >= {lo}"
    raise bad(path, v, want)


def number(path: str, v: Any, lo: float, *, lo_open: bool = False, hi: float | None = None) -> float:
    """``v`` as a float if it is a finite number ``>= lo`` (``> lo`` with ``lo_open``), ``<= hi``."""
    if _is_number(v) and (v > lo if lo_open else v >= lo) and (hi is None or v <= hi):
        return float(v)
    if hi is not None:
        want = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
    else:
        want = f"a number {'>' if lo_open else '>='} {lo:g}"
    raise bad(path, v, want)


def string(path: str, v: Any, *, nonempty: bool = False) -> str:
    if isinstance(v, str) and (not nonempty or v.strip()):
        return v
    raise bad(path, v, "a non-empty string" if nonempty else "a string")


def choice(path: str, v: Any, choices) -> str:
    if isinstance(v, str) and v in choices:
        return v
    raise bad(path, v, one_of(choices))


def boolean(path: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    raise bad(path, v, "true or false")


def mapping(path: str, v: Any, what: str = "an object") -> dict:
    if isinstance(v, dict):
        return v
    raise bad(path, v, what)


def required(d: dict, key: str, path: str | None = None) -> Any:
    if key not in d:
        raise FieldError(f"session file lacks the field {(path or key)!r}")
    return d[key]


def optional(d: dict, key: str, default: Any) -> Any:
    """``d[key]``, or ``default`` when the key is absent or null."""
    v = d.get(key)
    return default if v is None else v


# -- the fields ----------------------------------------------------------------------------------


def parse(d: Any, version: int) -> dict:
    """Check a session file's JSON and return :class:`attnscope.core.io.sessionfile.SessionFile`'s
    keyword arguments (``sampling`` as a dict of checked values; the caller builds the Sampling).

    ``version``: the newest format version this AttnScope reads.

    Raises:
        FieldError: the first bad or missing field, one line (see the module docstring).
    """
    from attnscope.core import backend_registry as registry
    from attnscope.core.loading.checkpoint_dtype import CHOICES as DTYPE_CHOICES

    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise FieldError(f'not an AttnScope session file (no "format": "{FORMAT}")')
    v = d.get("version")
    if isinstance(v, int) and not isinstance(v, bool) and v > version:
        raise FieldError(
            f"session file version {v!r} is newer than this AttnScope reads ({version}): update AttnScope"
        )
    integer("version", required(d, "version"), lo=1, hi=version)

    m = mapping("model", required(d, "model"), 'an object with "ref" (a path, or "default")')
    ref = string("model.ref", required(m, "ref", "model.ref"), nonempty=True)
    name = optional(m, "name", "")
    name = string("model.name", name) or ref
    sha = m.get("sha256")
    if sha is not None and not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
        raise bad("model.sha256", sha, "64 lowercase hex digits or null")

    ids = required(d, "token_ids")
    if not isinstance(ids, list) or not ids:
        raise bad("token_ids", ids, "a non-empty list of non-negative integers")
    for i, t in enumerate(ids):
        integer(f"token_ids[{i}]", t)
    n_prompt = integer("n_prompt", required(d, "n_prompt"), lo=1, hi=len(ids))

    device = optional(d, "device", "cpu")
    if not (isinstance(device, str) and DEVICE_RE.fullmatch(device)):
        raise bad("device", device, DEVICE_EXPECTED)

    return {
        "model": ref,
        "model_name": name,
        "model_sha256": sha,
        "backend": choice("backend", optional(d, "backend", registry.DEFAULT), registry.names()),
        "dtype": choice("dtype", optional(d, "dtype", "float32"), DTYPE_CHOICES),
        "device": device,
        "prompt": string("prompt", required(d, "prompt"), nonempty=True),
        "chat_template": boolean("chat_template", required(d, "chat_template")),
        "sampling": sampling(optional(d, "sampling", {})),
        "token_ids": tuple(ids),
        "n_prompt": n_prompt,
        "view": view(optional(d, "view", {})),
        "created": string("created", optional(d, "created", "")),
        "attnscope_version": string("attnscope_version", optional(d, "attnscope_version", "")),
        "quantization": quantization(d.get("quantization")),
        "engine": engine(d.get("engine")),
        "device_map": device_map(d.get("device_map")),
    }


def sampling(s: Any) -> dict:
    """``"sampling"``: ``{"temperature": >= 0, "top_k": int >= 0, "top_p": (0, 1], "seed": int >= 0}``,
    each optional (the :class:`attnscope.core.sampling.Sampling` defaults)."""
    s = mapping("sampling", s, "an object (temperature, top_k, top_p, seed)")
    for key in s:
        if key not in SAMPLING_FIELDS:
            raise FieldError(
                f"bad session file: sampling has the unknown field {show(key)} (expected {one_of(SAMPLING_FIELDS)})"
            )
    out: dict = {}
    if "temperature" in s:
        out["temperature"] = number("sampling.temperature", s["temperature"], 0.0)
    if "top_k" in s:
        out["top_k"] = integer("sampling.top_k", s["top_k"])
    if "top_p" in s:
        out["top_p"] = number("sampling.top_p", s["top_p"], 0.0, lo_open=True, hi=1.0)
    if "seed" in s:
        out["seed"] = integer("sampling.seed", s["seed"])
    return out


def view(v: Any) -> dict:
    """``"view"``: the window's view dict. The entries AttnScope reads are checked (layer, head,
    query_row, timeline_step: non-negative integers or null; tab: a string; cmap, scale, range_mode:
    their choices; gamma: a number > 0; aggregate, weighting: their choices; views: an object of
    objects); others are kept as they are. Layer and head are checked against the model's size
    when the model is loaded (it is not known here)."""
    from attnscope.core.analysis.aggregate import MODES as AGGREGATES
    from attnscope.core.analysis.value_weighted import WEIGHTINGS
    from attnscope.core.io.colormaps import COLORMAPS, RANGE_MODES, SCALES

    v = mapping("view", v)
    for key in ("layer", "head", "query_row", "timeline_step"):
        if v.get(key) is not None:
            integer(f"view.{key}", v[key])
    for key, choices in (
        ("cmap", COLORMAPS),
        ("scale", SCALES),
        ("range_mode", RANGE_MODES),
        ("aggregate", AGGREGATES),
        ("weighting", WEIGHTINGS),
    ):
        if v.get(key) is not None:
            choice(f"view.{key}", v[key], choices)
    if v.get("tab") is not None:
        string("view.tab", v["tab"])
    if v.get("gamma") is not None:
        number("view.gamma", v["gamma"], 0.0, lo_open=True)
    views = v.get("views")
    if views is not None:
        mapping("view.views", views, "an object (tab: its settings)")
        for key, settings in views.items():
            mapping(f"view.views.{key}", settings)
    return dict(v)


def quantization(q: Any) -> dict:
    """``"quantization"`` (:func:`attnscope.core.loading.quantize.record`): ``{"file": str, "runtime":
    str, "mode": "none" | "int8" | "int4"}``, each optional ({} when absent: older files)."""
    from attnscope.core.loading.quantize import MODES

    if q is None:
        return {}
    q = mapping("quantization", q, "an object (file, runtime, mode)")
    for key, value in q.items():
        if key == "mode":
            choice("quantization.mode", value, MODES)
        else:
            string(f"quantization.{key}", value)
    return dict(q)


def engine(e: Any) -> dict:
    """``"engine"`` (where the model ran, :func:`attnscope.core.io.provenance.engine_record`): an object of
    strings (address ``HOST:PORT``, host); {} when absent."""
    if e is None:
        return {}
    e = mapping("engine", e, "an object (address, host)")
    for key, value in e.items():
        string(f"engine.{key}", value)
    return dict(e)


def device_map(d: Any) -> dict:
    """``"device_map"`` (:func:`attnscope.core.loading.device_map.record`): ``{"strategy": "" | "auto" |
    "balanced" | "sequential" | "custom", "placement": {device: bytes >= 0}}``; {} when absent."""
    from attnscope.core.loading.device_map import DEVICE_MAPS

    if d is None:
        return {}
    d = mapping("device_map", d, "an object (strategy, placement)")
    # "" (one device), a named strategy, or "custom" (an explicit {module: device} map)
    strategy = optional(d, "strategy", "")
    if strategy not in ("", *DEVICE_MAPS, "custom") or not isinstance(strategy, str):
        raise bad("device_map.strategy", strategy, one_of((*DEVICE_MAPS, "custom", '"" (one device)')))
    placement = mapping("device_map.placement", optional(d, "placement", {}), "an object (device: bytes)")
    for key, value in placement.items():
        integer(f"device_map.placement.{key}", value)
    return {"strategy": strategy, "placement": dict(placement)}
