"""Counts over a rank's events that the steps' statuses (:mod:`perfscope.analysis.evidence`) use
or report: how many events overlap each step, and what Data quality lists beside the statuses
(events outside every step, operators cut by a step's end, runtime calls sharing a correlation
id, GPU events without a launch record or sharing one that is not a CUDA graph launch; counted,
never a reason to withhold a verdict). A chunk of rows at a time (:mod:`perfscope.analysis.chunked`)."""

from __future__ import annotations

import numpy as np

from perfscope.analysis.chunked import row_chunks, select_rows
from perfscope.analysis.intervals import locate
from perfscope.analysis.steps import Launches, StepWindows, graph_launched, shared_correlation_calls
from perfscope.trace.kinds import GPU_KINDS, EventKind
from perfscope.trace.quality import NOTED, DataQuality
from perfscope.trace.table import TraceTable


def events_inside(table: TraceTable, active: np.ndarray, steps: StepWindows) -> np.ndarray:
    """Per step, how many active events overlap its window (sorted starts and ends, no loop).

    An event overlaps ``[s, e)`` when it starts before ``e`` and ends after ``s``; a zero-length
    event counts as lasting 1 ns, so one at ``s`` is inside.
    """
    # Counted a chunk of rows at a time against the few sorted window bounds, not by sorting
    # every event's start and end: the same counts in memory that does not grow with the trace.
    n = len(steps)
    end_order, start_order = np.argsort(steps.end, kind="stable"), np.argsort(steps.start, kind="stable")
    ends_sorted, starts_sorted = steps.end[end_order], steps.start[start_order]
    began_sorted, before_sorted = np.zeros(n + 1, np.int64), np.zeros(n + 1, np.int64)
    for part in row_chunks(active):
        ts = table.ts_ns[part]
        # an event starting at x began before the windows whose end is past x
        began_sorted += np.bincount(np.searchsorted(ends_sorted, ts, side="right"), minlength=n + 1)
        ended = np.maximum(table.end_of(part), ts + 1)
        # one ending at y ended before the windows starting at or after y
        before_sorted += np.bincount(np.searchsorted(starts_sorted, ended, side="left"), minlength=n + 1)
    began, before = np.empty(n, np.int64), np.empty(n, np.int64)
    began[end_order] = np.cumsum(began_sorted)[:n]
    before[start_order] = np.cumsum(before_sorted)[:n]
    return began - before


def _crosses_step_end(table: TraceTable, steps: StepWindows, rows: np.ndarray) -> np.ndarray:
    """Per row: it starts inside a step's CPU span and ends after that span."""
    where = locate(table.ts_ns[rows], steps.cpu_start, steps.cpu_end)
    ok = where >= 0
    out = np.zeros(rows.size, bool)
    out[ok] = table.end_of(rows[ok]) > steps.cpu_end[where[ok]]
    return out


def count_quality(table: TraceTable, steps: StepWindows, launches: Launches, marker: np.ndarray,
                  active: np.ndarray, q: DataQuality) -> None:
    """Analysis-level counts, added to ``q``: events outside every step, GPU events without a launch record,
    operators cut by a step boundary."""
    if steps.has_markers:
        # a chunk of rows at a time (perfscope.analysis.chunked): active is most of the trace
        outside = select_rows(active, lambda r: locate(table.ts_ns[r], steps.start, steps.end) < 0)
        q.add(NOTED, "outside every step (before the first, after the last or between steps)", int(outside.size),
              table.name_of(outside))
        main = table.mask(EventKind.CPU_OP, EventKind.ANNOTATION) & (table.thread_id == steps.main_thread) & ~marker
        crosses = select_rows(main, lambda r: _crosses_step_end(table, steps, r))
        q.add(NOTED, "start in one step and end after it, on the training thread", int(crosses.size),
              table.name_of(crosses))
    shared = shared_correlation_calls(table)
    q.add(NOTED, "runtime calls sharing their correlation id with another call: none of them is taken as "
          "the launch of its GPU events", int(shared.size), table.name_of(shared))
    gpu_rows = np.flatnonzero(table.mask(*GPU_KINDS))
    unlinked = gpu_rows[launches.start_of(gpu_rows) < 0]
    q.add(NOTED, "GPU events without a launch record (no runtime call with their correlation id)",
          int(unlinked.size), table.name_of(unlinked))
    linked = gpu_rows[launches.start_of(gpu_rows) >= 0]
    linked = linked[~graph_launched(table, linked)]
    ids, counts = np.unique(table.correlation[linked], return_counts=True)
    many = linked[np.isin(table.correlation[linked], ids[counts > 1])]
    q.add(NOTED, "GPU events sharing one launch call that is not a CUDA graph launch", int(many.size),
          table.name_of(many))
