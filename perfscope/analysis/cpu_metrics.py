"""Per-step metrics of a rank whose trace holds no GPU activity (CPU training, gloo).

The step window on the training loop's thread is cut into an exact partition:

==========================  ======================================================
``dataloader_us``           the main thread is inside a DataLoader fetch
``operator_us``             the main thread runs an operator (``cpu_op``), outside a fetch
``exposed_comm_us``         a collective runs (``gloo:*`` ranges, on any thread) while
                            the main thread runs no operator and fetches no data
``framework_overhead_us``   none of the above: Python, dispatch and framework code
                            between operators
==========================  ======================================================

With gloo, DDP's all-reduce runs on a ``pt_gloo_runloop`` thread while the main thread goes on
with the backward pass, so summing ``gloo:*`` durations over-counts: only the time the main thread
sits without work while a collective runs is exposed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfscope.analysis.intervals import segments, union
from perfscope.analysis.steps import StepWindows
from perfscope.trace.kinds import (
    EventKind,
    is_collective_range,
    is_dataloader_range,
    profiler_step_numbers,
)
from perfscope.trace.table import TraceTable

_NS_PER_US = 1000.0


def _is_labelled_range(names: np.ndarray) -> np.ndarray:
    """record_function labels that old traces file as ``Operator``: ``ProfilerStep#5``,
    ``Optimizer.step#SGD.step``, ``enumerate(DataLoader)#...``; they hold operators, not work."""
    return np.array(["#" in n for n in names], dtype=bool) | (profiler_step_numbers(names) >= 0)


def cpu_step_metrics(table: TraceTable, steps: StepWindows) -> pd.DataFrame:
    """Per-step metrics of a CPU-only trace.

    Args:
        table: The trace.
        steps: Its steps from :func:`perfscope.analysis.steps.find_steps`.

    Returns:
        One row per step; time columns in microseconds (float), see ``docs/metrics.md``.
    """
    main = table.thread_id == steps.main_thread
    ranges = table.mask(EventKind.CPU_OP, EventKind.ANNOTATION)
    dl_rows = np.flatnonzero(ranges & main & table.name_flag(is_dataloader_range))
    comm_flag = table.name_flag(is_collective_range)
    comm_rows = np.flatnonzero(ranges & comm_flag)
    op_rows = np.flatnonzero(
        (table.kind == EventKind.CPU_OP) & main & ~comm_flag & ~table.name_flag(_is_labelled_range)
    )
    dataloader = union(table.ts_ns[dl_rows], table.end_ns[dl_rows])
    ops = union(table.ts_ns[op_rows], table.end_ns[op_rows])
    comm = union(table.ts_ns[comm_rows], table.end_ns[comm_rows])

    op_durations = table.dur_ns[op_rows]
    op_starts = table.ts_ns[op_rows]
    records = []
    for i in range(len(steps)):
        lo, hi = int(steps.start[i]), int(steps.end[i])
        seg = segments([dataloader, ops, comm], lo, hi)
        DL, OP, CM = seg.member
        length = seg.lengths

        def us(mask):
            return float(length[mask].sum()) / _NS_PER_US

        in_step = (op_starts >= lo) & (op_starts < hi)
        records.append(
            {
                "step_time_us": (hi - lo) / _NS_PER_US,
                "cpu_span_us": (steps.cpu_end[i] - steps.cpu_start[i]) / _NS_PER_US,
                "dataloader_us": us(DL),
                "operator_us": us(OP & ~DL),
                "comm_us": us(CM),
                "exposed_comm_us": us(CM & ~OP & ~DL),
                "framework_overhead_us": us(~DL & ~OP & ~CM),
                "operator_count": int(in_step.sum()),
                "median_operator_us": float(np.median(op_durations[in_step])) / _NS_PER_US if in_step.any() else 0.0,
            }
        )
    return pd.DataFrame.from_records(records)
