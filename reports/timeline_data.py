"""The events of one step, reduced to what a timeline of ``COLUMNS`` pixels can show.

Each lane (the main thread, the DataLoader, collectives, each GPU stream, and the step partition
"counted as") is rasterised: per pixel column, the fraction of the column each category covers.
Neighbouring columns with the same dominant category and the same coverage level (quarters) become
one rectangle. A step with thousands of kernels thus draws at most a few hundred rectangles per
lane, and a dense stretch of tiny kernels shows as a paler block (busy part of the time) rather
than a solid one. Times are integer nanoseconds relative to the trace origin, as in the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfscope.analysis.chunked import row_chunks, select_rows
from perfscope.analysis.intervals import Intervals, clip, segments, union
from perfscope.analysis.partition import cpu_parts, cpu_sets, gpu_parts, gpu_sets
from perfscope.analysis.steps import StepWindows, find_steps, launch_times
from perfscope.trace.kinds import (
    GPU_KINDS,
    CopyKind,
    EventKind,
    copy_kind_of_names,
    is_collective_range,
    is_comm_kernel,
    is_dataloader_range,
    profiler_step_numbers,
)
from perfscope.trace.table import TraceTable
from perfscope.reports.palette import BLUE, DARK, GREEN, GREY, ORANGE, PURPLE, SKY, VERMILLION, YELLOW

COLUMNS = 1000
MAX_STREAM_LANES = 16  # GPU streams drawn as lanes of their own; the others share one lane

# Category tables: (name, colour). A lane's categories index into its table.
STREAM_CATS = (("compute kernel", GREEN), ("communication kernel", PURPLE), ("host-to-device copy", VERMILLION),
               ("other copy / memset", BLUE))
# The partition's parts (perfscope.analysis.partition) as the timeline draws them: (part, label, colour).
GPU_PARTITION_PARTS = (("compute", "compute", GREEN), ("exposed_other_mem", "other copies / memset", BLUE),
                       ("exposed_comm", "exposed communication", PURPLE), ("exposed_h2d", "exposed H2D copy", VERMILLION),
                       ("h2d_wait", "H2D wait", VERMILLION), ("input_wait", "input wait", ORANGE),
                       ("launch_wait", "launch wait", SKY), ("kernel_wait", "kernel wait", YELLOW),
                       ("other_idle", "other idle", GREY))
CPU_PARTITION_PARTS = (("operator", "operators", GREEN), ("exposed_comm", "exposed communication", PURPLE),
                       ("dataloader", "DataLoader", ORANGE), ("framework_overhead", "framework overhead", SKY))
GPU_PARTITION = tuple((label, colour) for _, label, colour in GPU_PARTITION_PARTS)
CPU_PARTITION = tuple((label, colour) for _, label, colour in CPU_PARTITION_PARTS)
GPU_IDLE = (4, 5, 6, 7, 8)
CPU_LABELLED = (1, 2, 3)


@dataclass
class Lane:
    """Events of one lane, sorted by start: ``cats`` index into ``categories``."""

    label: str
    categories: tuple
    noun: str
    starts: np.ndarray
    ends: np.ndarray
    cats: np.ndarray
    name_id: np.ndarray
    names: np.ndarray  # the table's name list

    def __post_init__(self):
        order = np.argsort(self.starts, kind="stable")
        self.starts, self.ends = self.starts[order], self.ends[order]
        self.cats, self.name_id = self.cats[order], self.name_id[order]
        self.reach = np.maximum.accumulate(self.ends) if self.ends.size else self.ends


@dataclass
class Prepared:
    """One trace, ready to draw any of its steps.

    The lanes of a step are built when it is drawn (:meth:`lanes_at`), from the rows inside its
    window only: a report draws a dozen steps, and lanes of every event of a large trace would
    hold some 40 bytes per event of memory.
    """

    table: TraceTable
    windows: StepWindows
    mode: str
    partition: list  # interval sets, one per partition category
    partition_cats: tuple
    lane_kinds: tuple  # the category tables of the lanes every step shows, in lane order (the legend's)
    streams: np.ndarray  # (device, stream) of the GPU streams that get a lane of their own, shape (k, 2)
    other_streams: int  # GPU streams that share the last lane

    _index: dict | None = field(default=None, init=False, repr=False)
    _telemetry: object = field(default=False, init=False, repr=False)  # False: not aligned yet

    def lanes_at(self, i: int) -> list[Lane]:
        """The lanes of window ``i``: every event that overlaps it, the same lanes for every step."""
        lo, hi = int(self.windows.start[i]), int(self.windows.end[i])
        rows = select_rows(np.ones(self.table.n_events, bool), lambda r: _overlaps(self.table, r, lo, hi))
        return _lanes(self, rows)

    def telemetry_samples(self):
        """The trace's telemetry samples aligned to its clock, sorted by time
        (:func:`perfscope.analysis.telemetry.aligned_samples`), once for every step drawn; None
        without samples."""
        if self._telemetry is False:
            from perfscope.analysis.telemetry import aligned_samples

            df = aligned_samples(self.table, self.windows)
            self._telemetry = None if df is None else df.sort_values("ts_ns", kind="stable")
        return self._telemetry

    def step_index(self, step) -> int | None:
        if self._index is None:  # built once: a summary may hold 10^5 steps
            self._index = {}
            for i, s in enumerate(self.windows.step.tolist()):
                self._index.setdefault(s, i)
        return self._index.get(step) if isinstance(step, int) else None


def _overlaps(table: TraceTable, rows: np.ndarray, lo: int, hi: int) -> np.ndarray:
    ts = table.ts_ns[rows]
    return (ts < hi) & (ts + table.dur_ns[rows] > lo)


def _lane(table, label, categories, noun, rows, cats) -> Lane:
    return Lane(label, categories, noun, table.ts_ns[rows], table.end_of(rows), np.asarray(cats, np.int64), table.name_id[rows],
                table.names)


def _top_level(table: TraceTable, rows: np.ndarray) -> np.ndarray:
    """Rows not nested in another of ``rows`` (outermost first when two start together). Exact on
    the rows overlapping a window too: an event's enclosing event overlaps every window it does."""
    rows = rows[np.lexsort((-table.dur_ns[rows], table.ts_ns[rows]))]
    if rows.size == 0:
        return rows
    reach = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(table.end_of(rows))[:-1]])
    return rows[table.ts_ns[rows] >= reach]


class _Flags:
    """Per distinct name, what the lanes sort rows by (each predicate runs once per name)."""

    def __init__(self, names: np.ndarray):
        self.dataloader = np.asarray(is_dataloader_range(names), bool)
        self.collective = np.asarray(is_collective_range(names), bool)
        self.step = profiler_step_numbers(names) != -1
        self.comm = np.asarray(is_comm_kernel(names), bool)
        self.h2d = copy_kind_of_names(names) == CopyKind.HTOD


def _ranges(table: TraceTable, rows: np.ndarray, flags: _Flags, main: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of ``rows``: the main thread's operators, its DataLoader fetches, the collectives (rows)."""
    kind, name = table.kind[rows], table.name_id[rows]
    ranges = (kind == EventKind.CPU_OP) | (kind == EventKind.ANNOTATION)
    on_main = table.thread_id[rows] == main
    dl = flags.dataloader[name]
    return (rows[ranges & on_main & ~flags.step[name] & ~dl], rows[ranges & on_main & dl],
            rows[ranges & flags.collective[name]])


def _stream_keys(table: TraceTable, rows: np.ndarray) -> np.ndarray:
    """(device, stream) of each of ``rows``, shape (n, 2), int64."""
    return np.stack([table.device[rows].astype(np.int64), table.stream[rows].astype(np.int64)], axis=1)


def _busiest_streams(table: TraceTable) -> tuple[np.ndarray, int]:
    """The :data:`MAX_STREAM_LANES` GPU streams busiest over the whole trace, in (device, stream)
    order, and how many others there are (a trace with thousands of streams must not draw
    thousands of lanes). Counted a chunk of rows at a time."""
    busy: dict[tuple[int, int], float] = {}
    for rows in row_chunks(table.mask(*GPU_KINDS)):
        keys, which = np.unique(_stream_keys(table, rows), axis=0, return_inverse=True)
        sums = np.bincount(which.reshape(-1), weights=table.dur_ns[rows], minlength=len(keys))
        for k, v in zip(map(tuple, keys.tolist()), sums.tolist()):
            busy[k] = busy.get(k, 0.0) + v
    keys = sorted(busy)  # (device, stream) order, as the lanes are drawn
    top = sorted(sorted(range(len(keys)), key=lambda k: -busy[keys[k]])[:MAX_STREAM_LANES])
    return np.array([keys[k] for k in top], np.int64).reshape(-1, 2), len(keys) - len(top)


def _gpu_lanes(prep: Prepared, rows: np.ndarray, flags: _Flags) -> list[Lane]:
    """Of ``rows``: one lane per busiest stream, then one for all other streams."""
    table = prep.table
    kind = table.kind[rows]
    rows = rows[np.isin(kind, np.array(GPU_KINDS, np.int8))]
    kind, name = table.kind[rows], table.name_id[rows]
    kernel = kind == EventKind.KERNEL
    h2d = (kind == EventKind.MEMCPY) & flags.h2d[name]
    cat = np.where(kernel & flags.comm[name], 1, np.where(kernel, 0, np.where(h2d, 2, 3)))
    keys = _stream_keys(table, rows)
    own = np.zeros(rows.size, bool)
    lanes = []
    for dev, stream in prep.streams.tolist():
        here = (keys[:, 0] == dev) & (keys[:, 1] == stream)
        own |= here
        lanes.append(_lane(table, f"GPU {dev} · stream {stream}", STREAM_CATS, "GPU events", rows[here], cat[here]))
    if prep.other_streams:
        lanes.append(_lane(table, f"{prep.other_streams} other streams", STREAM_CATS, "GPU events", rows[~own], cat[~own]))
    return lanes


_MAIN = ("main thread", (("operator", DARK),), "operators")
_DATALOADER = ("DataLoader", (("DataLoader fetch", ORANGE),), "fetches")
_COLLECTIVES = ("collectives (CPU)", (("collective", PURPLE),), "collectives")


def _lanes(prep: Prepared, rows: np.ndarray) -> list[Lane]:
    table, flags = prep.table, _Flags(prep.table.names)
    main, dl, coll = _ranges(table, rows, flags, prep.windows.main_thread)
    lanes = []
    for (label, cats, noun), picked, nested in ((_MAIN, main, True), (_DATALOADER, dl, False), (_COLLECTIVES, coll, True)):
        if cats in prep.lane_kinds:
            picked = _top_level(table, picked) if nested else picked
            lanes.append(_lane(table, label, cats, noun, picked, np.zeros(picked.size)))
    return lanes + _gpu_lanes(prep, rows, flags)


def prepare(table: TraceTable, windows: StepWindows | None = None, partition_sets: list | None = None) -> Prepared:
    """The trace ready to draw: its steps, the partition's interval sets and which lanes it has.

    ``windows`` and ``partition_sets`` (a GPU trace's :func:`~perfscope.analysis.partition.gpu_sets`)
    are the analysis's when given (``Analysis.timelines``), else computed here.
    """
    launches = None
    if windows is None:
        launches = launch_times(table)
        windows = find_steps(table, launches)
    main = windows.main_thread
    mode = "gpu" if table.mask(*GPU_KINDS).any() else "cpu"
    flags = _Flags(table.names)
    has_dl = has_coll = False
    for rows in row_chunks(np.ones(table.n_events, bool)):
        _, dl, coll = _ranges(table, rows, flags, main)
        has_dl, has_coll = has_dl or dl.size > 0, has_coll or coll.size > 0
    kinds = [_MAIN[1]] + ([_DATALOADER[1]] if has_dl else []) + ([_COLLECTIVES[1]] if has_coll else [])
    streams, others = _busiest_streams(table)
    if len(streams) or others:
        kinds.append(STREAM_CATS)
    if mode == "gpu":
        if partition_sets is None:
            partition_sets = gpu_sets(table, launches if launches is not None else launch_times(table), main)
        return Prepared(table, windows, mode, partition_sets, GPU_PARTITION, tuple(kinds), streams, others)
    return Prepared(table, windows, mode, cpu_sets(table, main), CPU_PARTITION, tuple(kinds), streams, others)


def _partition(prep: Prepared, lo: int, hi: int) -> list[Intervals]:
    """The window cut into the partition's categories, as the step metrics count it."""
    seg = segments(prep.partition, lo, hi)
    edges = lo + np.concatenate([[0], np.cumsum(seg.lengths)])
    if prep.mode == "gpu":
        parts, order = gpu_parts(seg.member), GPU_PARTITION_PARTS
    else:
        parts, order = cpu_parts(seg.member), CPU_PARTITION_PARTS
    return [Intervals(edges[:-1][parts[p]], edges[1:][parts[p]]) for p, _, _ in order]


def coverage(iv: Intervals, lo: int, col_ns: float, n: int) -> np.ndarray:
    """Fraction of each of ``n`` columns from ``lo`` covered by sorted, disjoint ``iv``."""
    if len(iv) == 0:
        return np.zeros(n)
    s = (iv.starts - lo).astype(np.float64)
    lens = (iv.ends - iv.starts).astype(np.float64)
    before = np.concatenate([[0.0], np.cumsum(lens)])
    x = col_ns * np.arange(n + 1)
    idx = np.searchsorted(s, x, side="right") - 1
    k = np.clip(idx, 0, None)
    cum = np.where(idx >= 0, before[k] + np.clip(x - s[k], 0.0, lens[k]), 0.0)
    return np.clip(np.diff(cum) / col_ns, 0.0, 1.0)


def runs(cov: np.ndarray, owner: np.ndarray | None = None) -> list[tuple[int, int, int, float]]:
    """(first column, end column, dominant category, coverage level) of each run of equal columns.

    ``owner`` (per column, optional) also splits runs: two wide events that touch stay two runs.
    """
    total = np.clip(cov.sum(axis=0), 0.0, 1.0)
    dom = np.argmax(cov, axis=0)
    level = np.where(total > 0, np.maximum(np.ceil(total * 4 - 1e-6) / 4, 0.25), 0.0)
    key = np.where(level > 0, dom * 8 + level * 4, -1)
    differs = np.diff(key) != 0
    if owner is not None:
        differs |= np.diff(owner) != 0
    change = np.flatnonzero(differs) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [key.size]])
    return [(int(a), int(b), int(dom[a]), float(level[a])) for a, b in zip(starts, ends) if key[a] >= 0]


def owners(lane: "Lane", sl: slice, lo: int, col_ns: float, n: int, min_cols: float = 3.0) -> np.ndarray:
    """Per column, the index of the event at least ``min_cols`` wide covering its middle, else -1."""
    starts, ends = lane.starts[sl], lane.ends[sl]
    if starts.size == 0:
        return np.full(n, -1)
    mid = lo + (np.arange(n) + 0.5) * col_ns
    j = np.searchsorted(starts, mid, side="right") - 1
    k = np.clip(j, 0, None)
    ok = (j >= 0) & (ends[k] > mid) & (ends[k] - starts[k] >= min_cols * col_ns)
    return np.where(ok, k + sl.start, -1)


@dataclass
class StepRaster:
    lo: int
    hi: int
    col_ns: float
    lanes: list  # (Lane, runs, cov)
    partition: list  # runs of the "counted as" lane
    partition_cov: np.ndarray


def raster(prep: Prepared, i: int, n: int = COLUMNS) -> StepRaster:
    lo, hi = int(prep.windows.start[i]), int(prep.windows.end[i])
    col_ns = max(hi - lo, 1) / n
    out = []
    for lane in prep.lanes_at(i):
        j1 = np.searchsorted(lane.starts, hi, side="left")
        j0 = np.searchsorted(lane.reach, lo, side="right")
        sl = slice(j0, j1)
        cov = np.zeros((len(lane.categories), n))
        for c in range(len(lane.categories)):
            pick = lane.cats[sl] == c
            if pick.any():
                cov[c] = coverage(clip(union(lane.starts[sl][pick], lane.ends[sl][pick]), lo, hi), lo, col_ns, n)
        out.append((lane, runs(cov, owners(lane, sl, lo, col_ns, n)), cov))
    part = _partition(prep, lo, hi)
    pcov = np.stack([coverage(iv, lo, col_ns, n) for iv in part])
    return StepRaster(lo, hi, col_ns, out, runs(pcov), pcov)


def events_in(lane: Lane, t0: float, t1: float) -> np.ndarray:
    """Indices of the lane's events overlapping ``[t0, t1)`` (ns)."""
    j1 = np.searchsorted(lane.starts, t1, side="left")
    j0 = np.searchsorted(lane.reach, t0, side="right")
    idx = np.arange(j0, max(j0, j1))
    return idx[lane.ends[idx] > t0]
