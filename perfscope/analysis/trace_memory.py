"""Memory read from the traces: the allocator's ``[memory]`` instants over the counted steps
(``details.trace_memory``, ``docs/metrics.md`` Memory from the traces).

Kineto writes one instant per allocation and free when the profiler runs with
``profile_memory=True``: the bytes (negative for a free), the device, and in traces since 2022 the
allocator's totals after it (``Total Allocated``, ``Total Reserved``). From them, per trace and
device: the allocated (and reserved) bytes over the window, the peak in each counted step, the
growth across the steps, and the operators that allocate the most. Traces without totals (the
2021 format) give the allocated bytes as the running sum of the instants, relative to the level
at the first one (``relative``): peaks and growth are then changes, not levels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.analysis.nesting import MAX_SWEPT, by_start, innermost
from perfscope.record.schema import TraceMemoryDevice, TraceMemoryOperator, TraceMemoryRank, TraceMemoryStep
from perfscope.trace.kinds import EventKind

if TYPE_CHECKING:
    from perfscope.analysis.rank_trace import RankTrace

CURVE_POINTS = 240  # points kept of each device's curve: the report's chart is 900 px wide
TOP_OPERATORS = 10
# Operators that only provide the memory another operator asked for: an allocation is charged to
# the innermost operator around it that is not one of these (the convolution, not its aten::empty).
ALLOCATOR_OPS = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided",
    "aten::resize_", "aten::zeros", "aten::zeros_like", "aten::new_zeros", "aten::zero_", "aten::fill_",
    "aten::ones", "aten::ones_like", "aten::full", "aten::full_like", "aten::new_full",
})


def _levels(events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray | None, bool]:
    """(allocated after each event, reserved after each event or None, relative) of one device's
    events in time order."""
    allocated = events["allocated"].to_numpy()
    relative = bool(np.isnan(allocated).any())
    if relative:  # a running sum from an unknown start: changes since the first instant
        allocated = np.cumsum(events["bytes"].to_numpy())
    reserved = events["reserved"].to_numpy()
    # the CPU allocator reports no reserve (0 throughout): no reserved curve, not a flat zero
    if np.isnan(reserved).any() or not (reserved > 0).any():
        reserved = None
    return allocated, reserved, relative


def _level_before(ts: np.ndarray, level: np.ndarray, at: np.ndarray, start: float) -> np.ndarray:
    """The level in force at each time ``at`` (the last event at or before it; ``start`` before any)."""
    i = np.searchsorted(ts, at, side="right") - 1
    return np.where(i >= 0, level[np.maximum(i, 0)], start)


def _step_rows(ts: np.ndarray, level: np.ndarray, size: np.ndarray, start_level: float, steps: np.ndarray,
               lo: np.ndarray, hi: np.ndarray) -> list[TraceMemoryStep]:
    """Per counted step ``[lo, hi)`` (ns): its peak level, its growth (level at its end less at its
    start; None when the level before it is unknown) and its allocations (``size`` > 0)."""
    at_start = _level_before(ts, level, lo, start_level)
    at_end = _level_before(ts, level, hi, start_level)
    a, b = np.searchsorted(ts, lo, side="left"), np.searchsorted(ts, hi, side="left")
    rows = []
    for k in range(len(steps)):
        seen = np.concatenate([[at_start[k]], level[a[k]:b[k]]])
        seen = seen[~np.isnan(seen)]
        growth = at_end[k] - at_start[k]
        rows.append(TraceMemoryStep(step=int(steps[k]), peak_allocated_bytes=int(seen.max()) if seen.size else None,
                                    growth_bytes=None if np.isnan(growth) else int(growth),
                                    allocations=int((size[a[k]:b[k]] > 0).sum())))
    return rows


def _curve(ts: np.ndarray, allocated: np.ndarray, reserved: np.ndarray | None, lo: float, hi: float,
           start_level: float) -> list[list]:
    """At most :data:`CURVE_POINTS` ``[t_ms, allocated, reserved]`` points over ``[lo, hi)``: per
    time bucket its highest level (a peak is never averaged away)."""
    a, b = np.searchsorted(ts, lo, side="left"), np.searchsorted(ts, hi, side="left")
    first = _level_before(ts, allocated, np.array([lo]), start_level)[0]
    first_r = None if reserved is None else _level_before(ts, reserved, np.array([lo]), np.nan)[0]
    points = [[0.0, float(first), None if first_r is None or np.isnan(first_r) else float(first_r)]]
    if b > a:
        span = max(hi - lo, 1.0)
        bucket = np.minimum(((ts[a:b] - lo) / span * (CURVE_POINTS - 2)).astype(np.int64), CURVE_POINTS - 3)
        ends = np.flatnonzero(np.diff(np.concatenate([bucket, [-1]])))  # last event of each bucket
        starts = np.concatenate([[0], ends[:-1] + 1])
        peak_alloc = np.maximum.reduceat(allocated[a:b], starts)
        peak_res = None if reserved is None else np.maximum.reduceat(reserved[a:b], starts)
        for j, e in enumerate(ends):
            points.append([round(float(ts[a + e] - lo) / 1e6, 3), float(peak_alloc[j]),
                           None if peak_res is None else float(peak_res[j])])
    last = points[-1]
    points.append([round((hi - lo) / 1e6, 3), last[1], last[2]])
    return points


def _charged_ops(rt: RankTrace, ts: np.ndarray, thread: np.ndarray) -> np.ndarray | None:
    """Per instant the row of the operator it is charged to (-1: none around it); None when the
    allocating threads hold more than :data:`MAX_SWEPT` operators."""
    t = rt.table
    out = np.full(len(ts), -1, np.int64)
    ops = np.flatnonzero((t.kind == EventKind.CPU_OP) & np.isin(t.thread_id, np.unique(thread)))
    if ops.size > MAX_SWEPT:
        return None
    provider = np.isin(t.names, list(ALLOCATOR_OPS))
    for th in np.unique(thread):
        rows = ops[t.thread_id[ops] == th]
        if not rows.size:
            continue
        rows = by_start(t, rows)
        mine = np.flatnonzero(thread == th)
        found = innermost(t.ts_ns[rows].tolist(), t.end_of(rows).tolist(), provider[t.name_id[rows]].tolist(),
                           ts[mine].tolist())
        out[mine] = np.where(found >= 0, rows[np.maximum(found, 0)], -1)
    return out


def _top_operators(rt: RankTrace, events: pd.DataFrame, in_steps: np.ndarray) -> list[dict] | None:
    """The operators charged with the most bytes allocated in the counted steps (largest first)."""
    grow = in_steps & (events["bytes"].to_numpy() > 0)
    if not grow.any():
        return []
    charged = _charged_ops(rt, events["ts_ns"].to_numpy()[grow], events["thread_id"].to_numpy()[grow])
    if charged is None:
        return None
    size = events["bytes"].to_numpy()[grow]
    names = np.where(charged >= 0, rt.table.name_of(np.maximum(charged, 0)), "(outside any operator)")
    by = pd.DataFrame({"name": names, "bytes": size}).groupby("name")["bytes"].agg(["count", "sum"])
    by = by.sort_values(["sum", "count"], ascending=False).head(TOP_OPERATORS)
    total = float(size.sum())
    return [TraceMemoryOperator(name=str(n), allocations=int(r["count"]), bytes=int(r["sum"]),
                                share=float(r["sum"]) / total) for n, r in by.iterrows()]


def _device_view(rt: RankTrace, device: str, events: pd.DataFrame, steps: np.ndarray, lo: np.ndarray,
                 hi: np.ndarray) -> TraceMemoryDevice:
    ts = events["ts_ns"].to_numpy()
    allocated, reserved, relative = _levels(events)
    size = events["bytes"].to_numpy()
    # the level before the first instant: 0 for a running sum, else its total less its own bytes
    start = 0.0 if relative else float(allocated[0] - size[0])
    in_steps = np.zeros(len(ts), bool)
    for a, b in zip(np.searchsorted(ts, lo), np.searchsorted(ts, hi)):
        in_steps[a:b] = True
    rows = _step_rows(ts, allocated, size, start, steps, lo, hi)
    peaks = [r.peak_allocated_bytes for r in rows if r.peak_allocated_bytes is not None]
    begin, end = float(lo.min()), float(hi.max())
    first_level = _level_before(ts, allocated, np.array([begin]), start)[0]
    last_level = _level_before(ts, allocated, np.array([end]), start)[0]
    peak_reserved = None
    if reserved is not None:
        r_in = reserved[in_steps]
        r_start = _level_before(ts, reserved, lo, np.nan)
        candidates = np.concatenate([r_in, r_start[~np.isnan(r_start)]])
        peak_reserved = int(candidates.max()) if candidates.size else None
    return TraceMemoryDevice(
        device=device, relative=relative, events=int(in_steps.sum()),
        # the profiler counts the CPU allocator's bytes from its own start: not the process's memory
        since_profiler_start=device == "cpu",
        allocations=int((in_steps & (size > 0)).sum()),
        allocated_bytes=int(size[in_steps & (size > 0)].sum()),
        peak_allocated_bytes=max(peaks) if peaks else None,
        peak_reserved_bytes=peak_reserved,
        growth_bytes=None if np.isnan(last_level - first_level) else int(last_level - first_level),
        steps=rows,
        curve=_curve(ts, allocated, reserved, begin, end, start),
        top_operators=_top_operators(rt, events, in_steps))


def trace_memory_view(rank_traces: list[RankTrace], ranks: list[int], frame: pd.DataFrame) -> list[TraceMemoryRank] | None:
    """``details.trace_memory``: per trace with ``[memory]`` instants in its counted steps, per
    device, the allocator's bytes over those steps; None when no trace has any.

    Args:
        rank_traces: Every analyzed trace.
        ranks: The rank of each trace.
        frame: The counted steps (``rank``, ``worker``, ``step`` columns).

    Returns:
        One entry per trace: ``rank``, ``worker``, ``devices[]`` with ``device`` (``cuda:0``,
        ``cpu``), ``relative`` (no totals in the trace: levels are changes since its first
        instant), ``events``, ``allocations`` and ``allocated_bytes`` (bytes of the allocations)
        in the counted steps, ``peak_allocated_bytes``, ``peak_reserved_bytes`` (None where the
        trace has no reserve), ``growth_bytes`` (allocated at the end of the last counted step
        less at the start of the first), ``steps[]`` (``step``, ``peak_allocated_bytes``,
        ``growth_bytes``, ``allocations``), ``curve`` (``[ms since the first counted step began,
        allocated, reserved]``, per-bucket highs, at most :data:`CURVE_POINTS`), and
        ``top_operators[]`` (``name``, ``allocations``, ``bytes``, ``share`` of the bytes
        allocated; charged to the innermost operator that is not in :data:`ALLOCATOR_OPS`; None
        when the trace has too many operators to sweep).
    """
    out = []
    for rt, rank in zip(rank_traces, ranks):
        memory = rt.table.memory
        if memory is None or not len(frame):
            continue
        counted = set(frame.loc[(frame["rank"] == rank) & (frame["worker"] == rt.table.worker), "step"].tolist())
        w = rt.windows
        sel = np.isin(w.step, list(counted))
        if not sel.any():
            continue
        order = np.argsort(w.start[sel], kind="stable")
        steps, lo, hi = w.step[sel][order], w.start[sel][order], w.end[sel][order]
        devices = []
        for device, events in memory.groupby("device", sort=True):
            view = _device_view(rt, str(device), events.reset_index(drop=True), steps, lo, hi)
            if view.events:
                devices.append(view)
        if devices:
            # the device with most allocated first: the GPU of a GPU trace, the host of a CPU one
            devices.sort(key=lambda d: -d.allocated_bytes)
            out.append(TraceMemoryRank(rank=int(rank), worker=rt.table.worker, devices=devices))
    return out or None
