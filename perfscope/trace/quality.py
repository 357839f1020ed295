"""The data-quality record: every event the analysis could not use as written, counted and named.

A profiler must never be silently wrong, so nothing is dropped, clipped or set aside without an
entry here. The record travels with the trace table into ``summary.json`` (``data_quality``) and
the report; its entries that changed or left out data are also warnings.

Repair order of the duration events (``docs/metrics.md``, "Repairs"), applied by
:func:`perfscope.trace.assemble.build_table`:

1. entries of ``traceEvents`` that are not JSON objects are dropped;
2. events without a numeric ``ts``/``dur`` in range are dropped;
3. events whose ``ts`` and ``dur`` are both 0 -- what Kineto writes for an event it lost -- are
   set aside;
4. events with a negative duration, or one longer than :data:`ABSURD_DUR_US` (a day), are dropped;
5. an event that is an exact copy of an earlier one (every field equal) is dropped;
6. a GPU event that runs past the start of the next event on its own stream (a stream runs one
   thing at a time) is clipped at that start.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from perfscope.record.schema import TraceQuality
from perfscope.text import named, plural

# A day in microseconds: no event of a profiling window lasts that long (windows are seconds to
# minutes), so a longer duration is a corrupt value, not work.
ABSURD_DUR_US = 86_400e6
EXAMPLES = 5  # names kept per entry

DROPPED, CLIPPED, SET_ASIDE, REPAIRED, NOT_READ, TRUNCATED, NOTED = (
    "dropped", "clipped", "set aside", "repaired", "not read", "truncated", "noted")
# Entries with these actions changed or left out data: each is also a warning.
WARN_ACTIONS = (DROPPED, CLIPPED, SET_ASIDE, REPAIRED, NOT_READ, TRUNCATED)


@dataclass
class QualityEntry:
    """One kind of problem and what was done about it.

    Attributes:
        action: ``dropped``, ``clipped``, ``set aside``, ``repaired``, ``not read`` (present in
            the file, not used by the analysis), ``truncated`` (the file ends early), or
            ``noted`` (kept as they are, but worth knowing).
        reason: What was wrong, in words (``"negative duration"``).
        count: How many of ``unit`` it concerns.
        unit: What is counted: ``event`` (most entries), ``string`` or ``value`` (JSON repairs),
            ``byte`` (what a truncated file lost).
        examples: Up to five event names (or categories, field names) with their counts.
    """

    action: str
    reason: str
    count: int
    unit: str = "event"
    examples: dict[str, int] = field(default_factory=dict)

    def sentence(self) -> str:
        """``"3 events dropped: negative duration (aten::mm (2), gemm (1))"``."""
        ex = f" ({named(self.examples)})" if self.examples else ""
        if self.action == NOTED:
            return f"{plural(self.count, self.unit)} {self.reason}{ex}"
        return f"{plural(self.count, self.unit)} {self.action}: {self.reason}{ex}"

    def to_record(self) -> TraceQuality:
        """The entry as ``summary.json``'s ``traces[].data_quality[]`` holds it."""
        return TraceQuality(action=self.action, reason=self.reason, count=int(self.count), unit=self.unit,
                            examples={str(k): int(v) for k, v in self.examples.items()})


@dataclass
class DataQuality:
    """The data-quality record of one trace file (see the module docstring).

    Attributes:
        entries: One per kind of problem, in the order found.
    """

    entries: list[QualityEntry] = field(default_factory=list)

    def add(self, action: str, reason: str, count: int, names=None, unit: str = "event") -> None:
        """Record ``count`` of ``unit`` (if any); ``names`` is an iterable of their names, or a
        mapping of names to counts."""
        if count <= 0:
            return
        if names is None:
            examples = {}
        else:
            counter = Counter(names) if not isinstance(names, dict) else Counter(names)
            examples = {str(k): int(v) for k, v in counter.most_common(EXAMPLES)}
        self.entries.append(QualityEntry(action, reason, int(count), unit, examples))

    def count(self, action: str, reason: str | None = None) -> int:
        return sum(e.count for e in self.entries if e.action == action and (reason is None or e.reason == reason))

    def warnings(self, where: str) -> list[str]:
        """One line per entry that changed or left out data, prefixed with the file name."""
        return [f"{where}: {e.sentence()}" for e in self.entries if e.action in WARN_ACTIONS]

    def to_list(self) -> list[TraceQuality]:
        """The entries as ``summary.json``'s ``traces[].data_quality`` holds them."""
        return [e.to_record() for e in self.entries]


_MIX_CHUNK = 1 << 20  # rows mixed at a time (each key's int64 form is a temporary of this size)


def _mix(keys: list[np.ndarray], lo: int, hi: int) -> np.ndarray:
    """FNV-1a-style 64-bit mix of rows ``lo:hi`` of ``keys`` (uint64, shape ``(hi - lo,)``)."""
    mix = np.zeros(hi - lo, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in keys:
            mix *= np.uint64(0x100000001B3)  # FNV-1a's 64-bit prime
            mix ^= k[lo:hi].astype(np.int64, copy=False).view(np.uint64)
    return mix


def duplicate_rows(keys: list[np.ndarray], fingerprints) -> np.ndarray:
    """Rows that repeat an earlier row exactly.

    Args:
        keys: Columns (equal length) that two copies of an event share; rows equal in all of them
            are candidates.
        fingerprints: ``fingerprints(rows)`` gives, for an int64 array of candidate rows, one
            hashable per row, equal for two rows exactly when they are the same event in every
            field; called once, for the candidates only, so it may be slow (the streaming reader
            reads those events again).

    Returns:
        Indices of the later copies (int64, sorted). One in-place sort of one mixed key finds the
        candidates, which are grouped by fingerprint, never compared pairwise.
    """
    n = keys[0].shape[0] if keys else 0
    if n < 2:
        return np.zeros(0, np.int64)
    # One 64-bit mix of the keys, 8 bytes a row: copies mix equal, and the rare other rows that
    # collide are told apart by their fingerprints. The mix is sorted in place to find the values
    # that repeat (few), then computed again a chunk at a time to mark their rows, so the peak is
    # that one array: no sort order, no sorted copy (a large trace's read peaked here).
    mix = np.empty(n, dtype=np.uint64)
    for i in range(0, n, _MIX_CHUNK):
        mix[i : i + _MIX_CHUNK] = _mix(keys, i, min(n, i + _MIX_CHUNK))
    mix.sort()
    repeated = np.unique(mix[1:][mix[1:] == mix[:-1]])
    del mix
    if not repeated.size:
        return np.zeros(0, np.int64)
    candidate = np.zeros(n, dtype=bool)
    for i in range(0, n, _MIX_CHUNK):
        candidate[i : i + _MIX_CHUNK] = np.isin(_mix(keys, i, min(n, i + _MIX_CHUNK)), repeated)
    rows = np.flatnonzero(candidate)  # file order: the first copy is kept
    seen: set = set()
    dup = []
    for r, fp in zip(rows.tolist(), fingerprints(rows)):
        if fp in seen:
            dup.append(r)
        else:
            seen.add(fp)
    return np.array(dup, dtype=np.int64)


def stream_overruns(ts: np.ndarray, dur: np.ndarray, device: np.ndarray, stream: np.ndarray,
                    rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GPU events that run past the start of the next event on their own stream.

    Args:
        ts, dur: Start and duration of every row (ns); ends are computed for ``rows`` only.
        device, stream: The stream of every row is the pair; rows where either is negative (not
            known) are left alone.
        rows: The GPU event rows to look at.

    Returns:
        ``(overrun_rows, clip_to)``: the rows to clip and the end each gets (the next event's
        start on the same stream).
    """
    rows = rows[(device[rows] >= 0) & (stream[rows] >= 0)]
    if rows.size < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = rows[np.lexsort((ts[rows], stream[rows], device[rows]))]
    same_stream = (stream[order][1:] == stream[order][:-1]) & (device[order][1:] == device[order][:-1])
    next_start = ts[order][1:]
    over = same_stream & (ts[order[:-1]] + dur[order[:-1]] > next_start)
    return order[:-1][over], next_start[over]
