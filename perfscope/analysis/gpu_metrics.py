"""Per-step metrics of a rank whose trace holds GPU activity.

Every step window is cut into an exact partition (the lengths add up to the step time):

========================  ===========================================================
``compute_us``            at least one compute kernel runs (any stream, any device)
``exposed_comm_us``       a communication kernel runs and no compute kernel
``exposed_h2d_us``        a host-to-device copy runs and no kernel
``exposed_other_mem_us``  another memcpy or a memset runs and nothing above
``input_wait_us``         GPU idle, nothing launched yet, main thread in a DataLoader fetch
``launch_wait_us``        GPU idle, nothing launched yet, host busy elsewhere
``h2d_wait_us``           GPU idle, a host-to-device copy queued next (the host stages it)
``kernel_wait_us``        GPU idle for at most 10 us with the next work already queued
``other_idle_us``         GPU idle longer with the next work already queued
========================  ===========================================================

"Nothing launched yet" uses the correlation id: for an idle gap ending when GPU event *g* starts,
the part of the gap until the runtime call that launched *g* returned is host wait; the rest is
launch latency (kernel wait) or waiting on a dependency (other). See :func:`idle_cause_intervals`.
See ``docs/metrics.md`` for every column.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfscope.analysis.intervals import EMPTY, Intervals, segments, union
from perfscope.analysis.steps import Launches, StepWindows
from perfscope.trace.kinds import (
    GPU_KINDS,
    CopyKind,
    EventKind,
    copy_kind_of_names,
    is_comm_kernel,
    is_dataloader_range,
    is_pageable_copy,
)
from perfscope.trace.table import TraceTable

_NS_PER_US = 1000.0


def _union_of(table: TraceTable, rows: np.ndarray) -> Intervals:
    return union(table.ts_ns[rows], table.end_ns[rows])


# A queued gap up to this long is the GPU's own latency between back-to-back kernels (what Holistic
# Trace Analysis calls kernel wait); a longer one waits on something else: an event on another
# stream, a synchronisation, a staged pageable copy.
KERNEL_WAIT_NS = 10_000


def idle_cause_intervals(
    table: TraceTable, launches: Launches, is_h2d: np.ndarray, busy: Intervals, horizon_ns: int
) -> tuple[Intervals, Intervals, Intervals]:
    """Split every GPU idle gap by what the GPU was waiting for.

    For a gap ending when GPU event *g* starts, the part until the runtime call that launched *g*
    returned is host wait: nothing was queued, or the host was still inside a blocking launch.
    The rest is queued time, which counts as kernel wait when no longer than
    :data:`KERNEL_WAIT_NS`. A host-to-device copy is the exception: from the start of its
    ``cudaMemcpy*`` call the wait is copy wait, since the host is staging the copy (a pageable
    copy blocks the host and the GPU alike) and the input pipeline, not launch overhead, decides it.

    Args:
        table: The trace.
        launches: Per row, the launching runtime call (from ``launch_times``).
        is_h2d: Per row, True for host-to-device memcpy events.
        busy: Union of all GPU events.
        horizon_ns: End of the trace (ns): the idle time after the last GPU event is host wait.

    Returns:
        ``(host_wait, kernel_wait, copy_wait)`` interval sets (ns).
    """
    gpu_rows = np.flatnonzero(table.mask(*GPU_KINDS))
    if len(busy) == 0:
        return union(np.array([0]), np.array([horizon_ns])), EMPTY, EMPTY
    order = np.argsort(table.ts_ns[gpu_rows], kind="stable")
    ts_sorted = table.ts_ns[gpu_rows][order]
    h2d_sorted = is_h2d[gpu_rows][order]
    # Copies wait on the host from their call's start, kernels until their launch call returned.
    host_done = np.where(is_h2d[gpu_rows], launches.start_ns[gpu_rows], launches.end_ns[gpu_rows])[order]
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
    return host_wait, kernel_wait, copy_wait


def dataloader_intervals(table: TraceTable, main_thread: int) -> Intervals:
    """Union of DataLoader fetch ranges on the training loop's thread (ns)."""
    rows = np.flatnonzero(
        table.mask(EventKind.ANNOTATION, EventKind.CPU_OP)
        & (table.thread_id == main_thread)
        & table.name_flag(is_dataloader_range)
    )
    return _union_of(table, rows)


def gpu_step_metrics(table: TraceTable, steps: StepWindows, launches: Launches) -> pd.DataFrame:
    """Per-step metrics of a GPU trace.

    Args:
        table: The trace (must hold GPU events).
        steps: Its steps from :func:`perfscope.analysis.steps.find_steps`.
        launches: Per-row launch calls from :func:`perfscope.analysis.steps.launch_times`.

    Returns:
        One row per step; time columns in microseconds (float), see ``docs/metrics.md``.
    """
    kernel = table.kind == EventKind.KERNEL
    comm = kernel & table.name_flag(is_comm_kernel)
    memcpy = table.kind == EventKind.MEMCPY
    copy_kind = copy_kind_of_names(table.names)[table.name_id]
    h2d = memcpy & (copy_kind == CopyKind.HTOD)
    other_mem = (memcpy & ~h2d) | (table.kind == EventKind.MEMSET)
    gpu = table.mask(*GPU_KINDS)

    sets = {
        "compute": _union_of(table, np.flatnonzero(kernel & ~comm)),
        "comm": _union_of(table, np.flatnonzero(comm)),
        "h2d": _union_of(table, np.flatnonzero(h2d)),
        "other_mem": _union_of(table, np.flatnonzero(other_mem)),
    }
    busy = _union_of(table, np.flatnonzero(gpu))
    horizon = int(table.end_ns.max()) if table.n_events else 0
    sets["host_wait"], sets["kernel_wait"], sets["copy_wait"] = idle_cause_intervals(table, launches, h2d, busy, horizon)
    sets["dataloader"] = dataloader_intervals(table, steps.main_thread)
    order = list(sets)
    row = {name: i for i, name in enumerate(order)}

    pageable = memcpy & table.name_flag(is_pageable_copy)
    durations_us = table.dur_ns / _NS_PER_US
    records = []
    for i in range(len(steps)):
        lo, hi = int(steps.start[i]), int(steps.end[i])
        seg = segments([sets[k] for k in order], lo, hi)
        m, length = seg.member, seg.lengths
        C, M, H, O = m[row["compute"]], m[row["comm"]], m[row["h2d"]], m[row["other_mem"]]
        HW, KW, CW, DL = m[row["host_wait"]], m[row["kernel_wait"]], m[row["copy_wait"]], m[row["dataloader"]]
        busy_mask = C | M | H | O
        idle = ~busy_mask

        def us(mask):
            return float(length[mask].sum()) / _NS_PER_US

        launched = steps.gpu_step == i
        kernels_of_step = launched & kernel
        kdur = durations_us[kernels_of_step]
        gpu_end = steps.gpu_end[i]
        records.append(
            {
                "step_time_us": (hi - lo) / _NS_PER_US,
                "cpu_span_us": (steps.cpu_end[i] - steps.cpu_start[i]) / _NS_PER_US,
                "gpu_extended_span_us": (max(steps.cpu_end[i], gpu_end) - steps.cpu_start[i]) / _NS_PER_US,
                "gpu_busy_us": us(busy_mask),
                "compute_us": us(C),
                "comm_us": us(M),
                "exposed_comm_us": us(M & ~C),
                "h2d_us": us(H),
                "exposed_h2d_us": us(H & ~C & ~M),
                "exposed_other_mem_us": us(O & ~C & ~M & ~H),
                "dataloader_us": us(DL),
                "gpu_idle_us": us(idle),
                "input_wait_us": us(idle & HW & DL),
                "launch_wait_us": us(idle & HW & ~DL),
                "h2d_wait_us": us(idle & ~HW & CW),
                "kernel_wait_us": us(idle & ~HW & KW),
                "other_idle_us": us(idle & ~HW & ~KW & ~CW),
                "kernel_count": int(kernels_of_step.sum()),
                "comm_kernel_count": int((launched & comm).sum()),
                "median_kernel_us": float(np.median(kdur)) if kdur.size else 0.0,
                "memcpy_count": int((launched & memcpy).sum()),
                "pageable_memcpy_count": int((launched & pageable).sum()),
            }
        )
    return pd.DataFrame.from_records(records)
