"""What transformers' ``from_pretrained`` left random, said in one line.

transformers (5.x) builds the model from config.json, then fills it from the checkpoint; a tensor
the config asks for but the weights lack is *initialised at random* and only logged (a
``config.json`` that says 40 layers over a 30-layer checkpoint loads "fine" and draws maps from
random weights), and a shape mismatch raises "You set `ignore_mismatched_sizes` to `False` ... look
at the above report!" with the report itself logged (and hidden by AttnScope's quiet logging).

:func:`collect` records transformers' own loading report (``LoadStateDictInfo``: missing,
unexpected and mismatched keys) of every load inside it, and :func:`missing_message` /
:func:`mismatch_message` turn it into the one line a :class:`~attnscope.core.errors.ModelLoadError`
says. Where transformers has no such report (another version), nothing is collected and the checks
pass silently.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
SHOWN = 3  # tensor names a message lists before "…"


@contextmanager
def collect() -> Iterator[list[Any]]:
    """Within the block, every ``from_pretrained`` appends its ``LoadStateDictInfo`` to the yielded list.

    Wraps ``transformers.modeling_utils.log_state_dict_report`` (the function each load hands its
    report to) for the block's duration only; the wrapped function still runs (and still raises).
    """
    try:
        import transformers.modeling_utils as mu
    except ImportError:  # pragma: no cover - transformers is a dependency
        yield []
        return
    original = getattr(mu, "log_state_dict_report", None)
    reports: list[Any] = []
    if original is None:
        yield reports
        return

    def spy(*args, **kwargs):
        info = kwargs.get("loading_info", args[3] if len(args) > 3 else None)
        if info is not None:
            reports.append(info)
        return original(*args, **kwargs)

    mu.log_state_dict_report = spy
    try:
        yield reports
    finally:
        mu.log_state_dict_report = original


def _names(keys, n: int = SHOWN) -> str:
    keys = sorted(keys, key=_natural)
    return ", ".join(keys[:n]) + (", …" if len(keys) > n else "")


def _natural(key: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key)]


def missing_message(reports: list[Any], model_keys, n_layers: int) -> str | None:
    """One line saying which of the model's tensors no checkpoint held (they would be random), or None.

    ``model_keys``: the loaded model's state-dict names; ``n_layers``: the config's decoder layers.
    Whole decoder layers missing read ``config.json says 40 layers but the weights hold 30``.
    """
    missing = set().union(*(set(getattr(r, "missing_keys", ()) or ()) for r in reports)) if reports else set()
    if not missing:
        return None
    per_layer: dict[int, int] = {}
    for k in model_keys:
        m = _LAYER.search(k)
        if m:
            per_layer[int(m.group(1))] = per_layer.get(int(m.group(1)), 0) + 1
    gone = {
        i
        for i, total in per_layer.items()
        if sum(1 for k in missing if (m := _LAYER.search(k)) and int(m.group(1)) == i) == total
    }
    count = f"{len(missing)} tensor{'s' if len(missing) != 1 else ''}"
    if gone and gone == set(range(min(gone), n_layers)):
        held = min(gone)
        which = f"layer {held}" if held == n_layers - 1 else f"layers {held}..{n_layers - 1}"
        return (
            f"config.json says {n_layers} layers but the weights hold {held}: {which} "
            f"({count}, e.g. {_names(missing, 1)}) would be random weights; fix num_hidden_layers"
        )
    return (
        f"the weights lack {count} the model's config.json asks for ({_names(missing)}): they would be "
        "random weights; the checkpoint does not match its config.json"
    )


def mismatch_message(reports: list[Any]) -> str | None:
    """One line naming a tensor whose shape in the weights differs from the one config.json makes
    (and how many more do), or None when no report holds a mismatch."""
    return mismatch_line([t for r in reports for t in (getattr(r, "mismatched_keys", ()) or ())])


def mismatch_line(mism: list[tuple[str, Any, Any]]) -> str | None:
    """:func:`mismatch_message` of ``(name, shape in the weights, shape config.json makes)`` triples
    (None when empty); the streamed quantised load (:mod:`attnscope.core.loading.stream_load`) checks
    the checkpoint's headers with it."""
    if not mism:
        return None
    mism = list(mism)
    mism.sort(key=lambda t: _natural(t[0]))
    key, ckpt, model = mism[0]
    more = f" (and {len(mism) - 1} more tensor{'s' if len(mism) != 2 else ''})" if len(mism) > 1 else ""
    return (
        f"{key} is {_shape(ckpt)} in the weights but config.json makes it {_shape(model)}{more}: "
        "config.json's sizes (hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, "
        "head_dim) do not match the checkpoint"
    )


def _shape(shape) -> str:
    dims = tuple(int(d) for d in shape)
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"
