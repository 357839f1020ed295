"""Wording helpers for perfscope's warnings and notes: counts with their nouns, named lists."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

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
