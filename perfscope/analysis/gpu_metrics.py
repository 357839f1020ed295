"""Per-step metrics of a rank whose trace holds GPU activity, every step in one vectorised pass.

Each step window is cut into the partition of :mod:`perfscope.analysis.partition` (the lengths add
up to the step time); see ``docs/metrics.md`` for every column.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfscope.analysis.intervals import window_segments
from perfscope.analysis.partition import gpu_parts, gpu_sets
from perfscope.analysis.steps import Launches, StepWindows
from perfscope.trace.kinds import EventKind, is_comm_kernel, is_pageable_copy
from perfscope.trace.table import TraceTable

_NS_PER_US = 1000.0


def per_step_median(values: np.ndarray, step: np.ndarray, n_steps: int) -> np.ndarray:
    """Median of ``values`` per step index (0 where a step has none); ``step`` of -1 is ignored."""
    out = np.zeros(n_steps, dtype=float)
    ok = step >= 0
    if ok.any():
        med = pd.Series(values[ok]).groupby(step[ok]).median()
        out[med.index.to_numpy()] = med.to_numpy()
    return out


def gpu_step_metrics(table: TraceTable, steps: StepWindows, launches: Launches,
                     sets: list | None = None) -> pd.DataFrame:
    """Per-step metrics of a GPU trace (linear in events and steps).

    Args:
        table: The trace (must hold GPU events).
        steps: Its steps from :func:`perfscope.analysis.steps.find_steps`.
        launches: Per-row launch calls from :func:`perfscope.analysis.steps.launch_times`.
        sets: The partition's interval sets (:func:`perfscope.analysis.partition.gpu_sets`), when
            the caller already has them.

    Returns:
        One row per step; time columns in microseconds (float), see ``docs/metrics.md``.
        ``unlinked_idle_us`` (the part of ``other_idle_us`` before GPU events without a launch
        record) is not a part of the partition.
    """
    if sets is None:
        sets = gpu_sets(table, launches, steps.main_thread)
    seg = window_segments(sets, steps.start, steps.end)
    parts = gpu_parts(seg.member)

    def us(name):
        return seg.per_window(parts[name]) / _NS_PER_US

    n = len(steps)
    owner = steps.gpu_step
    kernel = table.kind == EventKind.KERNEL
    comm = kernel & table.name_flag(is_comm_kernel)
    memcpy = table.kind == EventKind.MEMCPY
    kernel_rows = np.flatnonzero(kernel & (owner >= 0))
    count = lambda mask: np.bincount(owner[mask & (owner >= 0)], minlength=n)  # noqa: E731
    pageable = memcpy & table.name_flag(is_pageable_copy)
    out = {
        "step_time_us": (steps.end - steps.start) / _NS_PER_US,
        "cpu_span_us": (steps.cpu_end - steps.cpu_start) / _NS_PER_US,
        "gpu_extended_span_us": (np.maximum(steps.cpu_end, steps.gpu_end) - steps.cpu_start) / _NS_PER_US,
        "gpu_busy_us": us("gpu_busy"),
    }
    for name in ("compute", "comm", "exposed_comm", "h2d", "exposed_h2d", "exposed_other_mem", "dataloader",
                 "gpu_idle", "input_wait", "launch_wait", "h2d_wait", "kernel_wait", "other_idle", "unlinked_idle"):
        out[f"{name}_us"] = us(name)
    out.update({
        "kernel_count": count(kernel),
        "comm_kernel_count": count(comm),
        "median_kernel_us": per_step_median(table.dur_ns[kernel_rows] / _NS_PER_US, owner[kernel_rows], n),
        "memcpy_count": count(memcpy),
        "pageable_memcpy_count": count(pageable),
    })
    return pd.DataFrame(out)
