"""Wording helpers for perfscope's warnings and notes: counts with their nouns, named lists."""

from __future__ import annotations

import re
import reprlib
from collections.abc import Iterable, Mapping

# C0 and C1 controls (escape sequences start with one) and the bidi embeddings, overrides and
# isolates that can make a line read otherwise than it is.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")

_IRREGULAR = {"entry": "entries", "category": "categories", "index": "indices"}


def plural(n: int, noun: str) -> str:
    """``plural(1, "event")`` -> ``"1 event"``; ``plural(1862, "call")`` -> ``"1,862 calls"``."""
    if n == 1:
        return f"1 {noun}"
    return f"{n:,} {_IRREGULAR.get(noun, noun + 's')}"


def named(counts: Mapping[str, int] | Iterable[tuple[str, int]], limit: int = 5) -> str:
    """The largest counts with their names: ``"cudaMemsetAsync (235), foo (3) and 2 more"``.

    Names are shown with :func:`repr`-style quoting removed but cut to 60 characters, so a
    hostile name cannot flood a warning line.
    """
    items = sorted(dict(counts).items() if isinstance(counts, Mapping) else counts, key=lambda kv: (-kv[1], str(kv[0])))
    shown = [f"{_short(k)} ({v:,})" for k, v in items[:limit]]
    rest = len(items) - limit
    return ", ".join(shown) + (f" and {rest} more" if rest > 0 else "")


def _short(name) -> str:
    text = str(name)
    return text if len(text) <= 60 else text[:59] + "…"


def safe(text) -> str:
    """``text`` for a terminal: control characters (escape sequences among them) and bidi
    controls shown as ``?``, so a file or kernel name cannot move the cursor or reorder a line."""
    return _UNSAFE.sub("?", str(text))


# Bounded at every level, so the repr of a huge or deeply nested value (an expanded YAML alias
# bomb) is cheap to build, not only short to show.
_REPR = reprlib.Repr()  # attributes, not keywords: those need Python 3.12
_REPR.maxlevel, _REPR.maxstring, _REPR.maxlong, _REPR.maxother = 3, 60, 40, 60
for _name in ("maxtuple", "maxlist", "maxarray", "maxdict", "maxset", "maxfrozenset", "maxdeque"):
    setattr(_REPR, _name, 6)


def short_repr(value, limit: int = 80) -> str:
    """A :func:`repr` of ``value`` for an error message: at most ``limit`` characters, nested
    containers and long strings elided with ``...``, control characters shown as ``?``.

    Args:
        value: Any object, e.g. a configuration value as the user wrote it.
        limit: Most characters returned.

    Returns:
        The shortened, terminal-safe repr.
    """
    text = safe(_REPR.repr(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def safe_lines(text: str) -> str:
    """:func:`safe` for each line of a multi-line text (its newlines kept)."""
    return "\n".join(safe(line) for line in str(text).split("\n"))
