"""Quantities with units as users write them: link bandwidths (``200Mbit``, ``25Gbit``, ``10GB``)."""

from __future__ import annotations

import math
import re

_BANDWIDTH = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kKmMgGtT]?)(i?)(bit|Bit|BIT|B)(?:/s)?\s*")
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
MIN_BYTES_PER_S, MAX_BYTES_PER_S = 1.0, 1e15  # beyond either, a typo, not a link
_BINARY = {"": 1.0, "k": 2.0**10, "m": 2.0**20, "g": 2.0**30, "t": 2.0**40}


def parse_bandwidth(text: str) -> tuple[float, str]:
    """A bandwidth -> ``(bytes per second, "bit" or "byte")``: what unit the user wrote.

    ``bit`` units are bits (``200Mbit``, ``25gbit/s``: decimal prefixes, as link speeds are
    quoted); ``B`` (upper case) units are bytes (``10GB``, ``12.5GB/s``; ``GiB`` binary). A lower
    case ``b`` and ``bps`` are refused: ``tc`` reads ``mbps`` as megabytes, most people as megabits.

    Raises:
        ValueError: not a positive finite number followed by such a unit.
    """
    m = _BANDWIDTH.fullmatch(str(text))
    if m is not None:
        value, prefix, binary, unit = float(m.group(1)), m.group(2).lower(), m.group(3), m.group(4)
        unit = "b" if unit == "B" else "bit"
        if binary and unit == "bit":
            m = None
        elif value > 0 and math.isfinite(value):
            scale = (_BINARY if binary else _PREFIX)[prefix]
            rate = value * scale / 8.0 if unit == "bit" else value * scale
            if MIN_BYTES_PER_S <= rate <= MAX_BYTES_PER_S:
                return rate, unit if unit == "bit" else "byte"
            raise ValueError(f"a bandwidth must lie between 1 byte/s and 1 PB/s, got {str(text)[:40]!r}")
    why = ""
    if re.search(r"(bps|[0-9kmgt]b(/s)?)\s*$", str(text)):
        why = " (a lower-case b or bps is ambiguous: tc reads mbps as megabytes, most people as megabits)"
    raise ValueError(f"a bandwidth is a positive number with a unit such as 200Mbit, 25Gbit or 10GB (bytes){why}; got "
                     f"{str(text)[:40]!r}")


def format_bandwidth(bytes_per_s: float) -> str:
    """``25e6`` -> ``"200 Mbit/s"``; link speeds in bits, decimal prefixes."""
    bits = bytes_per_s * 8
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.3g} {unit}"
    return f"{bits:.3g} bit/s"
