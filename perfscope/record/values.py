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
