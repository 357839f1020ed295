"""Reading a saved record's values: a record may be hand-edited or damaged, so a number is taken
only where it is one."""

from __future__ import annotations

import math


def finite_number(value) -> float | None:
    """A finite float, or None for anything else (None, NaN, infinities, a bool, text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def finite_numbers(values) -> list[float]:
    """The finite numbers of an iterable, as floats, in order (anything else dropped; None reads
    as an empty one)."""
    return [v for v in (finite_number(x) for x in values or ()) if v is not None]
