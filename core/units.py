"""Byte sizes as text: the one formatter every size AttnScope prints goes through.

Decimal units (``kB``, ``MB``, ``GB``: powers of 1000, as file managers and the handbook's KV-cache
tables show sizes) or binary ones (``KiB``, ``MiB``, ``GiB``: powers of 1024, the PyTorch walk-through's "256 MB per
head"). A value is rounded half-up to ``digits`` significant digits *first*, and the unit is chosen
from the rounded value, so a size never prints as "1000 kB" or "1024 KiB": 999,500 B is
``"1.00 MB"``, 1,048,575 B is ``"1.00 MiB"``. Values of 1000–1023 of a binary unit print as whole
numbers (``"1023 KiB"``), since they need four digits. Bytes below one unit print exactly
(``"999 B"``, ``"1023 B"``).
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

DECIMAL_UNITS = ("B", "kB", "MB", "GB", "TB", "PB", "EB")
BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def _round_sig(x: Decimal, digits: int) -> Decimal:
    """``x`` (> 0) rounded half-up to ``digits`` significant digits, never to fewer than whole units."""
    exp = x.adjusted() - digits + 1  # exponent of the last kept digit
    q = Decimal(1).scaleb(min(exp, 0) if x >= 1000 else exp)
    return x.quantize(q, rounding=ROUND_HALF_UP)


def format_bytes(n: float | int | None, *, binary: bool = False, digits: int = 3, none: str = "?") -> str:
    """``n`` bytes as ``"21.5 GB"`` / ``"1.00 MiB"``: ``digits`` significant digits, trailing zeros kept.

    Args:
        n: a byte count (int or float; negative values get a leading ``-``). None prints ``none``.
        binary: powers of 1024 with ``KiB``/``MiB``/… instead of powers of 1000 with ``kB``/``MB``/….
        digits: significant digits (≥ 1) of values of one unit or more; whole bytes below that.

    Examples: ``format_bytes(1_048_576, binary=True) == "1.00 MiB"``, ``format_bytes(999_500) == "1.00 MB"``,
    ``format_bytes(999) == "999 B"``, ``format_bytes(1_047_552, binary=True) == "1023 KiB"``.

    Raises:
        ValueError: ``digits < 1`` or ``n`` not finite.
    """
    if n is None:
        return none
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    x = Decimal(n) if isinstance(n, int) else Decimal(repr(float(n)))
    if not x.is_finite():
        raise ValueError(f"not a byte count: {n!r}")
    if x < 0:
        return "-" + format_bytes(-n if isinstance(n, int) else -float(n), binary=binary, digits=digits)
    base, units = (1024, BINARY_UNITS) if binary else (1000, DECIMAL_UNITS)
    if x < base:
        whole = int(x.quantize(Decimal(1), rounding=ROUND_HALF_UP))
        if whole < base:
            return f"{whole} B"
    i = 0
    while i < len(units) - 1 and x >= base:
        x /= base
        i += 1
    r = _round_sig(x, digits)
    if r >= base and i < len(units) - 1:  # 1023.9996 KiB rounds to 1024: the next unit
        i += 1
        r = _round_sig(r / base, digits)
    return f"{r:f} {units[i]}"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``"1 layer"``, ``"30 layers"``: ``n`` with ``noun`` singular for exactly one (``plural``
    defaults to ``noun + "s"``)."""
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"
