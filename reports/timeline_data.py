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
from reports.palette import BLUE, DARK, GREEN, GREY, ORANGE, PURPLE, SKY, VERMILLION, YELLOW

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
    """One trace, ready to draw any of its steps."""

    table: TraceTable
    windows: StepWindows
    mode: str
    lanes: list
    partition: list  # interval sets, one per partition category
    partition_cats: tuple

    _index: dict | None = field(default=None, init=False, repr=False)
    _telemetry: object = field(default=False, init=False, repr=False)  # False: not aligned yet

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


def _lane(table, label, categories, noun, rows, cats) -> Lane:
    return Lane(label, categories, noun, table.ts_ns[rows], table.end_of(rows), np.asarray(cats, np.int64), table.name_id[rows],
                table.names)


def _top_level(table: TraceTable, rows: np.ndarray) -> np.ndarray:
    """Rows not nested in another of ``rows`` (outermost first when two start together)."""
    rows = rows[np.lexsort((-table.dur_ns[rows], table.ts_ns[rows]))]
    if rows.size == 0:
        return rows
    reach = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(table.end_of(rows))[:-1]])
    return rows[table.ts_ns[rows] >= reach]


def _stream_lanes(table: TraceTable, gpu_rows: np.ndarray, cat: np.ndarray) -> list[Lane]:
    """One lane per GPU stream, the :data:`MAX_STREAM_LANES` busiest of them; any others share
    one last lane (a trace with thousands of streams must not draw thousands of lanes)."""
    pairs = np.stack([table.device[gpu_rows].astype(np.int64), table.stream[gpu_rows]], axis=1)
    keys, which = np.unique(pairs, axis=0, return_inverse=True) if gpu_rows.size else (np.zeros((0, 2), np.int64), None)
    if not len(keys):
        return []
    which = which.reshape(-1)
    busy = np.bincount(which, weights=table.dur_ns[gpu_rows], minlength=len(keys))
    top = set(np.argsort(-busy, kind="stable")[:MAX_STREAM_LANES].tolist())
    lanes = []
    for k, (dev, stream) in enumerate(keys.tolist()):
        if k in top:
            rows = gpu_rows[which == k]
            lanes.append(_lane(table, f"GPU {dev} · stream {stream}", STREAM_CATS, "GPU events", rows, cat[rows]))
    rest = np.flatnonzero(~np.isin(which, list(top)))
    if rest.size:
        rows = gpu_rows[rest]
        n = len(keys) - len(top)
        lanes.append(_lane(table, f"{n} other streams", STREAM_CATS, "GPU events", rows, cat[rows]))
    return lanes


def prepare(table: TraceTable) -> Prepared:
    launches = launch_times(table)
    windows = find_steps(table, launches)
    main = windows.main_thread
    ranges = table.mask(EventKind.CPU_OP, EventKind.ANNOTATION)
    on_main = table.thread_id == main
    dl_flag = table.name_flag(is_dataloader_range)
    coll_flag = table.name_flag(is_collective_range)
    step_flag = (profiler_step_numbers(table.names) != -1)[table.name_id]
    lanes = []
    main_rows = _top_level(table, np.flatnonzero(ranges & on_main & ~step_flag & ~dl_flag))
    lanes.append(_lane(table, "main thread", (("operator", DARK),), "operators", main_rows, np.zeros(main_rows.size)))
    dl_rows = np.flatnonzero(ranges & on_main & dl_flag)
    if dl_rows.size:
        lanes.append(_lane(table, "DataLoader", (("DataLoader fetch", ORANGE),), "fetches", dl_rows, np.zeros(dl_rows.size)))
    coll_rows = _top_level(table, np.flatnonzero(ranges & coll_flag))
    if coll_rows.size:
        lanes.append(_lane(table, "collectives (CPU)", (("collective", PURPLE),), "collectives", coll_rows, np.zeros(coll_rows.size)))

    gpu = table.mask(*GPU_KINDS)
    mode = "gpu" if gpu.any() else "cpu"
    kernel = table.kind == EventKind.KERNEL
    comm = kernel & table.name_flag(is_comm_kernel)
    memcpy = table.kind == EventKind.MEMCPY
    h2d = memcpy & (copy_kind_of_names(table.names)[table.name_id] == CopyKind.HTOD)
    cat = np.where(comm, 1, np.where(kernel, 0, np.where(h2d, 2, 3)))
    gpu_rows = np.flatnonzero(gpu)
    lanes += _stream_lanes(table, gpu_rows, cat)

    if mode == "gpu":
        return Prepared(table, windows, mode, lanes, gpu_sets(table, launches, main), GPU_PARTITION)
    return Prepared(table, windows, mode, lanes, cpu_sets(table, main), CPU_PARTITION)


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
    for lane in prep.lanes:
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
