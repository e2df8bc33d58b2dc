"""Argument checks for the public API (:class:`attnscope.core.session.Session`, the trace, exports,
:class:`attnscope.core.sampling.Sampling`).

Each check raises one line that names the argument, the value given and what is allowed, as an
:mod:`attnscope.core.errors` class that is also the matching builtin (:class:`~attnscope.core.errors.WrongType`
is a ``TypeError``, :class:`~attnscope.core.errors.BadArgument` a ``ValueError``,
:class:`~attnscope.core.errors.OutOfRange` an ``IndexError``), so ``except IndexError`` callers keep working.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from attnscope.core.errors import BadArgument, OutOfRange, WrongType


def _type_name(value) -> str:
    return type(value).__name__


def whole(name: str, value) -> int:
    """``value`` as an int: an integral number that is not a bool (numpy integers pass).

    Raises:
        WrongType: a float, a bool, a string, None, ...
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise WrongType(f"{name} must be a whole number (int), got {_type_name(value)} {value!r}")
    return int(value)


def flag(name: str, value) -> bool:
    """``value`` as a bool: True, False (or numpy's bools).

    Raises:
        WrongType: anything else (``"no"`` is truthy; refused rather than read as True).
    """
    if not isinstance(value, bool | np.bool_):
        raise WrongType(f"{name} must be True or False, got {_type_name(value)} {value!r}")
    return bool(value)


def in_range(name: str, value, lo: int, hi: int) -> int:
    """``value`` checked as :func:`whole` and within ``lo .. hi`` (both included).

    Message: ``"layer 30 out of range 0..29"`` (``hi < lo``: ``"... out of range: there are none"``).

    Raises:
        WrongType: not a whole number. OutOfRange: outside ``lo .. hi``.
    """
    v = whole(name, value)
    if not lo <= v <= hi:
        if hi < lo:
            raise OutOfRange(f"{name} {v} out of range: there are none")
        raise OutOfRange(f"{name} {v} out of range {lo}..{hi}")
    return v


def index(name: str, value, n: int) -> int:
    """``value`` as an index into ``n`` things: a whole number in ``0 .. n - 1``.

    Raises:
        WrongType: not a whole number. OutOfRange: outside ``0 .. n - 1``.
    """
    return in_range(name, value, 0, n - 1)


def span(name: str, sel, n: int) -> slice:
    """``sel`` (None = everything, or a slice of ints with step 1 or None) resolved against length
    ``n`` as ``slice(start, stop)`` with ``0 <= start <= stop <= n``.

    Negative bounds count from the end as in Python (``slice(-4, None)``: the last four); a bound
    outside ``-n .. n`` is refused rather than clipped; an empty selection (start >= stop) is
    allowed and selects nothing.

    Raises:
        WrongType: not a slice, or a bound that is not a whole number.
        BadArgument: a step other than 1 (tiles are contiguous). OutOfRange: a bound outside ``-n .. n``.
    """
    if sel is None:
        return slice(0, n)
    if not isinstance(sel, slice):
        hint = f": for one position use {name}=slice({sel}, {sel + 1})" if isinstance(sel, int) else ""
        raise WrongType(f"{name} must be a slice or None, got {_type_name(sel)} {sel!r}{hint}")
    for part, v in (("start", sel.start), ("stop", sel.stop), ("step", sel.step)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral)):
            raise WrongType(f"{name}={_show(sel)}: the {part} must be a whole number or None, got {v!r}")
    if sel.step is not None and sel.step != 1:
        raise BadArgument(
            f"{name}={_show(sel)} has step {sel.step}: selections are contiguous (step 1 or None)"
        )
    for v in (sel.start, sel.stop):
        if v is not None and not -n <= v <= n:
            raise OutOfRange(
                f"{name}={_show(sel)} out of range: bounds must be within -{n}..{n} (length {n})"
            )
    start, stop, _ = sel.indices(n)
    return slice(start, max(start, stop))


def _show(sel: slice) -> str:
    parts = [sel.start, sel.stop] + ([sel.step] if sel.step is not None else [])
    return "slice(" + ", ".join("None" if p is None else repr(p) for p in parts) + ")"


def real(name: str, value, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> float:
    """``value`` as a finite float (an int or float that is not a bool) within ``lo .. hi``
    (``lo`` excluded when ``lo_open``).

    Raises:
        WrongType: not a real number. BadArgument: NaN, infinite, or outside the range.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise WrongType(f"{name} must be a number, got {_type_name(value)} {value!r}")
    v = float(value)
    low = lo is not None and (v <= lo if lo_open else v < lo)
    if not math.isfinite(v) or low or (hi is not None and v > hi):
        if lo is not None and hi is not None:
            allowed = f"in ({lo:g}, {hi:g}]" if lo_open else f"in [{lo:g}, {hi:g}]"
        elif lo is not None:
            allowed = f"> {lo:g}" if lo_open else f">= {lo:g}"
        else:
            allowed = "finite"
        raise BadArgument(f"{name} must be {allowed}, got {value!r}")
    return v
