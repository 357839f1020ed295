"""Per-step metrics of a rank whose trace holds no GPU activity (CPU training, gloo).

The step window on the training loop's thread is cut into the CPU partition of
:mod:`perfscope.analysis.partition`. With gloo, DDP's all-reduce runs on a ``pt_gloo_runloop`` thread while the main thread goes on
with the backward pass, so summing ``gloo:*`` durations over-counts: only the time the main thread
sits without work while a collective runs is exposed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfscope.analysis.gpu_metrics import per_step_median
from perfscope.analysis.intervals import locate, union, window_segments
from perfscope.analysis.partition import cpu_parts, cpu_rows, working_ops
from perfscope.analysis.steps import StepWindows
from perfscope.trace.table import TraceTable

_NS_PER_US = 1000.0


def cpu_step_metrics(table: TraceTable, steps: StepWindows) -> pd.DataFrame:
    """Per-step metrics of a CPU-only trace.

    Args:
        table: The trace.
        steps: Its steps from :func:`perfscope.analysis.steps.find_steps`.

    Returns:
        One row per step; time columns in microseconds (float), see ``docs/metrics.md``.
    """
    rows = cpu_rows(table, steps.main_thread)
    op_rows = rows[1]
    sets = [union(table.ts_ns[r], table.end_of(r)) for r in (rows[0], working_ops(table, op_rows), *rows[2:])]
    seg = window_segments(sets, steps.start, steps.end)
    parts = cpu_parts(seg.member)

    def us(name):
        return seg.per_window(parts[name]) / _NS_PER_US

    n = len(steps)
    in_step = locate(table.ts_ns[op_rows], steps.start, steps.end)
    return pd.DataFrame({
        "step_time_us": (steps.end - steps.start) / _NS_PER_US,
        "cpu_span_us": (steps.cpu_end - steps.cpu_start) / _NS_PER_US,
        "dataloader_us": us("dataloader"),
        "operator_us": us("operator"),
        "comm_us": us("comm"),
        "exposed_comm_us": us("exposed_comm"),
        "framework_overhead_us": us("framework_overhead"),
        "operator_count": np.bincount(in_step[in_step >= 0], minlength=n),
        "median_operator_us": per_step_median(table.dur_ns[op_rows] / _NS_PER_US, in_step, n),
    })
