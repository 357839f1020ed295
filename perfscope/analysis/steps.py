"""Training steps in a trace: ``ProfilerStep#N`` ranges, the GPU work each launched, and windows.

Definitions (also in ``docs/metrics.md``):

- *CPU span* of step N: its ``ProfilerStep#N`` range on the main thread.
- *GPU work of a step*: GPU events (kernels, memcpy, memset) whose runtime launch call (matched by
  correlation id) lies in the step's CPU span; GPU events without a launch record belong to the
  step whose CPU span holds their start.
- *GPU-extended span*: from the CPU span's start to the later of its end and its GPU work's end.
- *Step window*: what step time measures. It starts at the CPU span's start and ends at the
  GPU-extended end, but never after the next step starts; so windows tile the run without overlap
  and add up to the wall time of the profiled steps.
- A trace without ``ProfilerStep#`` markers is one window from its first to its last event.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from perfscope.analysis.intervals import locate, outermost
from perfscope.text import named, plural
from perfscope.trace.kinds import (
    GPU_KINDS,
    EventKind,
    is_graph_launch,
    is_optimizer_step_range,
    profiler_step_numbers,
)
from perfscope.trace.table import TraceTable
from perfscope.trace.values import smallest_int

# A last step without its optimizer update and shorter than this fraction of the shortest other
# step was cut off by the end of profiling (the TensorBoard plugin likewise drops such a step).
CUT_OFF_FRACTION = 0.5

@dataclass
class StepWindows:
    """Steps of one trace (arrays of length ``n_steps``; times in ns relative to the trace origin).

    Attributes:
        step: Step numbers (``N`` of ``ProfilerStep#N``; 0 when the trace has no markers).
        cpu_start, cpu_end: CPU span.
        gpu_end: End of the GPU work the step launched (-1 if it launched none).
        start, end: Step window (see module docstring).
        complete: False for a last step cut off by the end of profiling.
        main_thread: ``thread_id`` of the training loop's thread (-1 if the trace has no CPU events).
        gpu_step: For every event row, index of the step that launched it (GPU rows) or -1, in
            the narrowest signed integer type that holds every step index (int16 up to 32767 steps).
        has_markers: False when the trace had no ``ProfilerStep#`` markers.
        warnings: Problems with the markers: repeated step numbers, overlapping steps, markers
            whose number does not parse, markers on another thread.
        overlapping: Per step, its range overlaps another step's (its evidence is incomplete).
    """

    step: np.ndarray
    cpu_start: np.ndarray
    cpu_end: np.ndarray
    gpu_end: np.ndarray
    start: np.ndarray
    end: np.ndarray
    complete: np.ndarray
    main_thread: int
    gpu_step: np.ndarray
    has_markers: bool
    warnings: list[str] = field(default_factory=list)
    overlapping: np.ndarray | None = None

    def __post_init__(self):
        if self.overlapping is None:
            self.overlapping = np.zeros(self.step.shape[0], dtype=bool)

    def __len__(self) -> int:
        return int(self.step.shape[0])


def main_thread_of(table: TraceTable, step_rows: np.ndarray) -> int:
    """The training loop's thread: where ``ProfilerStep#`` ranges are, else the busiest CPU thread."""
    if step_rows.size:
        ids, counts = np.unique(table.thread_id[step_rows], return_counts=True)
        return int(ids[np.argmax(counts)])
    cpu = table.mask(EventKind.CPU_OP, EventKind.ANNOTATION)
    if not cpu.any():
        return -1
    busy = np.bincount(table.thread_id[cpu], weights=table.dur_ns[cpu])
    return int(np.argmax(busy))


class Launches(NamedTuple):
    """The runtime call that launched each GPU event, matched by correlation id.

    Kept over the GPU event rows only (a GPU trace's rows are mostly host events: a column per
    row would cost 16 bytes each for nothing).

    Attributes:
        rows: Every GPU event row of the table (int64, ascending), shape ``(n_gpu,)``.
        call_start_ns, call_end_ns: Per one of ``rows``, start and end (ns) of its launch call; -1
            where the launch was not recorded. Shape ``(n_gpu,)``.
        call_rows: Per one of ``rows``, the table row of its launch call, -1 where not recorded
            (shape ``(n_gpu,)``); None in a record built without them.
    """

    rows: np.ndarray
    call_start_ns: np.ndarray
    call_end_ns: np.ndarray
    call_rows: np.ndarray | None = None

    def start_of(self, rows: np.ndarray) -> np.ndarray:
        """Launch-call start (ns) of each of ``rows`` (event rows); -1 for a row that is no GPU
        event or whose launch was not recorded."""
        return self._of(self.call_start_ns, rows)

    def end_of(self, rows: np.ndarray) -> np.ndarray:
        """Launch-call end (ns) of each of ``rows``; -1 as :meth:`start_of`."""
        return self._of(self.call_end_ns, rows)

    def linked(self) -> np.ndarray:
        """The GPU event rows whose launch call is recorded (ascending)."""
        return self.rows[self.call_start_ns >= 0]

    def _of(self, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        if rows is self.rows or (rows.shape == self.rows.shape and np.array_equal(rows, self.rows)):
            return values
        if self.rows.size == 0:
            return np.full(rows.shape, -1, np.int64)
        at = np.minimum(np.searchsorted(self.rows, rows), self.rows.size - 1)
        return np.where(self.rows[at] == rows, values[at], -1)


def shared_correlation_calls(table: TraceTable) -> np.ndarray:
    """Runtime call rows whose correlation id another runtime call also has: which of them
    launched a GPU event with that id cannot be told."""
    rt = np.flatnonzero((table.kind == EventKind.RUNTIME) & (table.correlation >= 0))
    ids, counts = np.unique(table.correlation[rt], return_counts=True)
    return rt[np.isin(table.correlation[rt], ids[counts > 1])]


def graph_launched(table: TraceTable, rows: np.ndarray) -> np.ndarray:
    """Per row of ``rows``, whether a CUDA/HIP graph launch call launched it (one
    ``cudaGraphLaunch`` replays many kernels, all with its correlation id)."""
    calls = np.flatnonzero((table.kind == EventKind.RUNTIME) & table.name_flag(is_graph_launch) & (table.correlation >= 0))
    return np.isin(table.correlation[rows], table.correlation[calls]) & (table.correlation[rows] >= 0)


def launch_times(table: TraceTable) -> Launches:
    """The launching runtime call of every GPU event row (see :class:`Launches`).

    A correlation id that several runtime calls share links none of them: their GPU events count
    as having no launch record (:func:`shared_correlation_calls`).
    """
    gpu_rows = np.flatnonzero(table.mask(*GPU_KINDS))
    start = np.full(gpu_rows.size, -1, dtype=np.int64)
    end = np.full(gpu_rows.size, -1, dtype=np.int64)
    calls = np.full(gpu_rows.size, -1, dtype=np.int64)
    rt = np.flatnonzero((table.kind == EventKind.RUNTIME) & (table.correlation >= 0))
    rt = rt[~np.isin(rt, shared_correlation_calls(table))]
    if rt.size == 0 or gpu_rows.size == 0:
        return Launches(gpu_rows, start, end, calls)
    order = np.argsort(table.correlation[rt], kind="stable")
    corr_sorted, rt_sorted = table.correlation[rt][order], rt[order]
    want = table.correlation[gpu_rows]
    pos = np.clip(np.searchsorted(corr_sorted, want), 0, corr_sorted.size - 1)
    found = (corr_sorted[pos] == want) & (want >= 0)
    call = rt_sorted[pos[found]]
    start[found] = table.ts_ns[call]
    end[found] = table.end_of(call)
    calls[found] = call
    return Launches(gpu_rows, start, end, calls)


def find_steps(table: TraceTable, launches: Launches) -> StepWindows:
    """Find the steps of one trace.

    Args:
        table: The trace.
        launches: Output of :func:`launch_times` for ``table``.

    Returns:
        The step windows; a single window covering the trace when it has no ``ProfilerStep#``.
        Zero steps only when the trace has no duration events at all.
    """
    warnings: list[str] = []
    cpu_side = table.mask(EventKind.CPU_OP, EventKind.ANNOTATION)
    step_no_by_name = profiler_step_numbers(table.names)
    bad_rows = np.flatnonzero(cpu_side & (step_no_by_name[table.name_id] == -2))
    if bad_rows.size:
        warnings.append(f"{plural(int(bad_rows.size), 'ProfilerStep# marker')} with a number that is not a step number "
                        f"(1 to 18 digits 0-9, no leading zero) ignored: {named(Counter(table.name_of(bad_rows)))}; their time is outside every step")
    step_rows = np.flatnonzero(cpu_side & (step_no_by_name[table.name_id] >= 0))
    main = main_thread_of(table, step_rows)
    elsewhere = step_rows[table.thread_id[step_rows] != main]
    if elsewhere.size:
        # prof.step() runs on the training loop's thread: markers on another thread are not its steps.
        warnings.append(f"{plural(int(elsewhere.size), 'ProfilerStep# marker')} on another thread than the training "
                        f"loop's ignored: {named(Counter(table.name_of(elsewhere)))}")
        step_rows = step_rows[table.thread_id[step_rows] == main]
    if step_rows.size:
        # Keep one range per step number (a repeated marker keeps the earliest), ordered by time.
        step_rows = step_rows[np.argsort(table.ts_ns[step_rows], kind="stable")]
        nums = step_no_by_name[table.name_id[step_rows]]
        values, first, counts = np.unique(nums, return_index=True, return_counts=True)
        if (counts > 1).any():
            repeated = ", ".join(str(v) for v in values[counts > 1])
            warnings.append(f"step marker repeated for step {repeated}; kept the earliest range")
        step_rows = step_rows[np.sort(first)]
        step = step_no_by_name[table.name_id[step_rows]]
        cpu_start = table.ts_ns[step_rows]
        cpu_end = cpu_start + table.dur_ns[step_rows]
        has_markers = True
    else:
        meaningful = table.kind != EventKind.OTHER
        if not meaningful.any():
            empty = np.zeros(0, np.int64)
            return StepWindows(empty, empty, empty, empty, empty, empty, np.zeros(0, bool), main,
                               np.full(table.n_events, -1, np.int64), False)
        step = np.array([0], np.int64)
        cpu_start = np.array([table.ts_ns[meaningful].min()], np.int64)
        cpu_end = np.array([table.end_of(meaningful).max()], np.int64)
        has_markers = False

    n = step.size
    gpu_rows = np.flatnonzero(table.mask(*GPU_KINDS))
    # Attribute GPU work to the step whose CPU span holds its launch (or, unlinked, its start).
    launched_at = launches.start_of(gpu_rows)
    anchor = np.where(launched_at >= 0, launched_at, table.ts_ns[gpu_rows])
    owner = locate(anchor, cpu_start, cpu_end) if has_markers else np.zeros(gpu_rows.size, np.int64)
    # a step index per row, in the narrowest type that holds them: 2 bytes a row below 32767 steps
    gpu_step = np.full(table.n_events, -1, dtype=smallest_int(np.array([-1, n])).dtype)
    gpu_step[gpu_rows] = owner
    gpu_end = np.full(n, -1, dtype=np.int64)
    linked = owner >= 0
    np.maximum.at(gpu_end, owner[linked], table.end_of(gpu_rows[linked]))

    next_start = np.append(cpu_start[1:], np.iinfo(np.int64).max)
    overlap = cpu_end[:-1] - next_start[:-1]
    if (overlap > 0).any():
        k = int(np.argmax(overlap))
        warnings.append(f"{int((overlap > 0).sum())} step ranges overlap the next one (most: step {step[k]} by "
                        f"{overlap[k] / 1000:.1f} us); each window ends where the next step starts")
    # A step overlapping another (a nested or interleaved marker) has no window of its own to measure.
    overlapping = (cpu_end > next_start) | ~outermost(cpu_start, cpu_end)
    end = np.minimum(np.maximum(cpu_end, gpu_end), next_start)
    complete = np.ones(n, dtype=bool)
    if has_markers and n >= 2:
        complete[-1] = not _last_step_cut_off(table, cpu_start, cpu_end)
    return StepWindows(step, cpu_start, cpu_end, gpu_end, cpu_start.copy(), end, complete, main, gpu_step,
                       has_markers, warnings, overlapping)


def _last_step_cut_off(table: TraceTable, cpu_start: np.ndarray, cpu_end: np.ndarray) -> bool:
    """Whether the last step was cut off by the end of profiling.

    Both must hold: every earlier step holds an ``Optimizer.step#`` range and the last holds none
    (a loop with a skipped AMP step also lacks it, but is a whole step), and the last step is
    shorter than half the shortest earlier one (a partial iteration).
    """
    opt = table.mask(EventKind.CPU_OP, EventKind.ANNOTATION) & table.name_flag(is_optimizer_step_range)
    if not opt.any():
        return False
    where = locate(table.ts_ns[opt], cpu_start, cpu_end)
    has_opt = np.zeros(cpu_start.size, bool)
    has_opt[where[where >= 0]] = True
    durations = cpu_end - cpu_start
    return bool(has_opt[:-1].all() and not has_opt[-1] and durations[-1] < CUT_OFF_FRACTION * durations[:-1].min())
