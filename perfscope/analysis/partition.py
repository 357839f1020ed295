"""The step partition, defined once: the interval sets it is cut from, and the boolean formula of
each part. The per-step metrics (``gpu_metrics``, ``cpu_metrics``) and the report's timeline both
derive from here, so a timeline always draws what the numbers count.

GPU traces (unions over every stream and device of the rank):

========================  ===========================================================
``compute``               at least one compute kernel runs
``exposed_comm``          a communication kernel runs and no compute kernel
``exposed_h2d``           a host-to-device copy runs and no kernel (a copy without a launch
                          record, queued before the window, counts as another memcpy)
``exposed_other_mem``     another memcpy or a memset runs and nothing above
``input_wait``            GPU idle, nothing launched yet, main thread in a DataLoader fetch
``launch_wait``           GPU idle, nothing launched yet, host busy elsewhere
``h2d_wait``              GPU idle, a host-to-device copy queued next (the host stages it)
``kernel_wait``           GPU idle for at most 10 us with the next work already queued
``other_idle``            GPU idle longer with the next work already queued
========================  ===========================================================

"Nothing launched yet" uses the correlation id: for an idle gap ending when GPU event *g* starts,
the part of the gap until the runtime call that launched *g* returned is host wait; the rest is
launch latency (kernel wait) or waiting on a dependency (other). See :func:`idle_cause_intervals`.

CPU-only traces (the training loop's thread):

==========================  ======================================================
``dataloader``              the main thread is inside a DataLoader fetch
``operator``                the main thread runs an operator (``cpu_op``) of at least
                            ``DISPATCH_OP_US``, outside a fetch
``exposed_comm``            a collective runs (``gloo:*`` ranges, on any thread) while
                            the main thread runs no operator and fetches no data
``framework_overhead``      none of the above: Python, dispatch and framework code (and
                            operators too short to do more than their dispatch)
==========================  ======================================================
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from perfscope.analysis.intervals import EMPTY, Intervals, union
from perfscope.analysis.steps import Launches
from perfscope.trace.kinds import (
    GPU_KINDS,
    CopyKind,
    EventKind,
    copy_kind_of_names,
    is_collective_range,
    is_comm_kernel,
    is_dataloader_range,
    is_comm_wait_range,
    profiler_step_numbers,
)
from perfscope.trace.table import TraceTable

# The parts, in the order the metrics and the charts list them; each adds ``_us`` as a metric.
GPU_PARTS = ("compute", "exposed_comm", "exposed_h2d", "exposed_other_mem", "input_wait", "launch_wait",
             "h2d_wait", "kernel_wait", "other_idle")
CPU_PARTS = ("dataloader", "operator", "exposed_comm", "framework_overhead")
GPU_SETS = ("compute", "comm", "h2d", "other_mem", "host_wait", "kernel_wait", "copy_wait", "dataloader", "unlinked")
CPU_SETS = ("dataloader", "ops", "comm", "comm_wait")


def _union_of(table: TraceTable, rows: np.ndarray) -> Intervals:
    return union(table.ts_ns[rows], table.end_of(rows))


# A queued gap up to this long is the GPU's own latency between back-to-back kernels (what Holistic
# Trace Analysis calls kernel wait); a longer one waits on something else: an event on another
# stream, a synchronisation, a staged pageable copy.
KERNEL_WAIT_NS = 10_000


class IdleCauses(NamedTuple):
    """GPU idle time by what it waited for (interval sets, ns); see :func:`idle_cause_intervals`."""

    host_wait: Intervals
    kernel_wait: Intervals
    copy_wait: Intervals
    unlinked: Intervals  # idle before a GPU event whose launch was not recorded (queued or not: unknown)


def idle_cause_intervals(
    table: TraceTable, launches: Launches, is_h2d: np.ndarray, busy: Intervals, horizon_ns: int
) -> IdleCauses:
    """Split every GPU idle gap by what the GPU was waiting for.

    For a gap ending when GPU event *g* starts, the part until the runtime call that launched *g*
    returned is host wait: nothing was queued, or the host was still inside a blocking launch.
    The rest is queued time, which counts as kernel wait when no longer than
    :data:`KERNEL_WAIT_NS`. A host-to-device copy is the exception: from the start of its
    ``cudaMemcpy*`` call the wait is copy wait, since the host is staging the copy (a pageable
    copy blocks the host and the GPU alike) and the input pipeline, not launch overhead, decides it.
    When *g*'s launch was not recorded, the whole gap counts as queued, and is also returned as
    ``unlinked`` so that the verdict can tell whether that guess decides it.

    Args:
        table: The trace.
        launches: Per row, the launching runtime call (from ``launch_times``).
        is_h2d: Per row, True for host-to-device memcpy events.
        busy: Union of all GPU events.
        horizon_ns: End of the trace (ns): the idle time after the last GPU event is host wait.

    Returns:
        The :class:`IdleCauses` interval sets (ns).
    """
    gpu_rows = np.flatnonzero(table.mask(*GPU_KINDS))
    if len(busy) == 0:
        return IdleCauses(union(np.array([0]), np.array([horizon_ns])), EMPTY, EMPTY, EMPTY)
    order = np.argsort(table.ts_ns[gpu_rows], kind="stable")
    ts_sorted = table.ts_ns[gpu_rows][order]
    h2d_sorted = is_h2d[gpu_rows][order]
    # Copies wait on the host from their call's start, kernels until their launch call returned.
    host_done = np.where(is_h2d[gpu_rows], launches.start_of(gpu_rows), launches.end_of(gpu_rows))[order]
    # The GPU event that ends each gap: the first one starting at each busy interval's start.
    first = np.searchsorted(ts_sorted, busy.starts, side="left")
    next_launch = host_done[first]
    next_is_copy = h2d_sorted[first]
    gap_start = np.concatenate([[min(0, int(busy.starts[0]))], busy.ends[:-1]])
    gap_end = busy.starts
    host_end = np.where(next_launch >= 0, np.minimum(np.maximum(next_launch, gap_start), gap_end), gap_start)
    host_wait = union(np.append(gap_start, busy.ends[-1]), np.append(host_end, max(horizon_ns, int(busy.ends[-1]))))
    short = ((gap_end - host_end) <= KERNEL_WAIT_NS) & ~next_is_copy
    kernel_wait = union(host_end[short], gap_end[short])
    copy_wait = union(host_end[next_is_copy], gap_end[next_is_copy])
    unlinked = next_launch < 0
    return IdleCauses(host_wait, kernel_wait, copy_wait, union(gap_start[unlinked], gap_end[unlinked]))


def dataloader_intervals(table: TraceTable, main_thread: int) -> Intervals:
    """Union of DataLoader fetch ranges on the training loop's thread (ns)."""
    rows = np.flatnonzero(
        table.mask(EventKind.ANNOTATION, EventKind.CPU_OP)
        & (table.thread_id == main_thread)
        & table.name_flag(is_dataloader_range)
    )
    return _union_of(table, rows)



def _queued_before(launches: Launches, h2d: np.ndarray) -> np.ndarray:
    """Rows of host-to-device copies with no launch record in a trace whose other GPU work has
    them: copies queued before the profiler's window, whose purpose is unknown. They count as other
    copies, not as input: without them a trace with no DataLoader read io-bound from its first
    steps' catch-up. A trace with no launch record at all (correlation ids not written) keeps its
    copies as they are."""
    rows = np.flatnonzero(h2d)
    if not rows.size or not (launches.call_start_ns >= 0).any():
        return np.zeros(0, np.int64)
    return rows[launches.start_of(rows) < 0]


def gpu_sets(table: TraceTable, launches: Launches, main_thread: int) -> list[Intervals]:
    """The interval sets of a GPU trace's partition, in :data:`GPU_SETS` order (ns)."""
    kernel = table.kind == EventKind.KERNEL
    comm = kernel & table.name_flag(is_comm_kernel)
    memcpy = table.kind == EventKind.MEMCPY
    h2d = memcpy & (copy_kind_of_names(table.names)[table.name_id] == CopyKind.HTOD)
    h2d[_queued_before(launches, h2d)] = False
    other_mem = (memcpy & ~h2d) | (table.kind == EventKind.MEMSET)
    busy = _union_of(table, np.flatnonzero(table.mask(*GPU_KINDS)))
    horizon = int(table.end_ns.max()) if table.n_events else 0
    causes = idle_cause_intervals(table, launches, h2d, busy, horizon)
    return [
        _union_of(table, np.flatnonzero(kernel & ~comm)), _union_of(table, np.flatnonzero(comm)),
        _union_of(table, np.flatnonzero(h2d)), _union_of(table, np.flatnonzero(other_mem)),
        causes.host_wait, causes.kernel_wait, causes.copy_wait, dataloader_intervals(table, main_thread),
        causes.unlinked,
    ]


def gpu_parts(member: np.ndarray) -> dict[str, np.ndarray]:
    """Boolean masks over segments (``member`` rows in :data:`GPU_SETS` order): every part of
    :data:`GPU_PARTS`, plus the overlays ``gpu_busy``, ``comm``, ``h2d``, ``dataloader``,
    ``gpu_idle`` and ``unlinked_idle`` (the part of ``other_idle`` before GPU events without a
    launch record)."""
    C, M, H, O, HW, KW, CW, DL, UL = member
    busy = C | M | H | O
    idle = ~busy
    return {
        "compute": C, "exposed_comm": M & ~C, "exposed_h2d": H & ~C & ~M, "exposed_other_mem": O & ~C & ~M & ~H,
        "input_wait": idle & HW & DL, "launch_wait": idle & HW & ~DL, "h2d_wait": idle & ~HW & CW,
        "kernel_wait": idle & ~HW & KW, "other_idle": idle & ~HW & ~KW & ~CW,
        "gpu_busy": busy, "comm": M, "h2d": H, "dataloader": DL, "gpu_idle": idle,
        "unlinked_idle": idle & ~HW & ~KW & ~CW & UL,
    }


def is_labelled_range(names: np.ndarray) -> np.ndarray:
    """record_function labels that old traces file as ``Operator``: ``ProfilerStep#5``,
    ``Optimizer.step#SGD.step``, ``enumerate(DataLoader)#...``; they hold operators, not work."""
    return np.array(["#" in n for n in names], dtype=bool) | (profiler_step_numbers(names) != -1)


def cpu_rows(table: TraceTable, main_thread: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of the CPU partition: DataLoader fetches and operators on the main thread, collective
    ranges on any thread, and the main thread's waits for communication (perfscope's
    ``perfscope.comm_wait`` range), in :data:`CPU_SETS` order."""
    main = table.thread_id == main_thread
    ranges = table.mask(EventKind.CPU_OP, EventKind.ANNOTATION)
    comm_flag = table.name_flag(is_collective_range)
    wait_flag = table.name_flag(is_comm_wait_range)
    dl = np.flatnonzero(ranges & main & table.name_flag(is_dataloader_range))
    ops = np.flatnonzero((table.kind == EventKind.CPU_OP) & main & ~comm_flag & ~wait_flag
                         & ~table.name_flag(is_labelled_range))
    return dl, ops, np.flatnonzero(ranges & comm_flag), np.flatnonzero(ranges & main & wait_flag)


# An operator shorter than this is its own dispatch: the work it does is lost in the framework's
# per-operator cost (an add of 4 elements records 2.4 us at the median, 4.3 us at the 90th
# percentile, on this project's 2-core machines with torch 2.13), so its time counts as framework
# overhead, not operator time. Without it a loop of thousands of tiny operators reads compute-bound.
DISPATCH_OP_US = 5.0


def working_ops(table: TraceTable, ops: np.ndarray) -> np.ndarray:
    """The operator rows of ``ops`` at least :data:`DISPATCH_OP_US` long: those whose time is work."""
    return ops[table.dur_ns[ops] >= DISPATCH_OP_US * 1000]


def cpu_sets(table: TraceTable, main_thread: int) -> list[Intervals]:
    """The interval sets of a CPU-only trace's partition, in :data:`CPU_SETS` order (ns)."""
    dl, ops, comm, wait = cpu_rows(table, main_thread)
    return [_union_of(table, rows) for rows in (dl, working_ops(table, ops), comm, wait)]


def cpu_parts(member: np.ndarray) -> dict[str, np.ndarray]:
    """Boolean masks over segments (rows in :data:`CPU_SETS` order): every part of
    :data:`CPU_PARTS`, plus the overlay ``comm``."""
    DL, OP, CM, WT = member
    # A wait for communication is exposed communication even inside an operator (the hook that
    # waits runs inside autograd's AccumulateGrad): the thread computes nothing then.
    return {"dataloader": DL, "operator": OP & ~DL & ~WT, "exposed_comm": (CM & ~OP | WT) & ~DL,
            "framework_overhead": ~DL & ~OP & ~CM & ~WT, "comm": CM | WT}
