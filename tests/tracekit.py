"""Helpers of the hand-written trace cases (``test_trace_cases_*.py``).

Each case writes one small synthetic trace per situation; every expected number is worked out by
hand (the arithmetic is in the comments), never copied from perfscope's output. Times in the
comments are microseconds; ``[a, b)`` is a half-open interval.
"""

from __future__ import annotations

import pandas as pd
import pytest
from tracegen import write_trace

import perfscope

GPU_PARTS = ["compute_us", "exposed_comm_us", "exposed_h2d_us", "exposed_other_mem_us",
             "input_wait_us", "launch_wait_us", "h2d_wait_us", "kernel_wait_us", "other_idle_us"]
CPU_PARTS = ["dataloader_us", "operator_us", "exposed_comm_us", "framework_overhead_us"]

NCCL_NEW = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
NCCL_OLD = "ncclKernel_AllReduce_RING_LL_Sum_float"
APPROX = dict(abs=1e-6)


def analyze(tmp_path, events, name="trace.json", **meta):
    return perfscope.analyze(write_trace(tmp_path / name, events, **meta))


def check_partition(steps: pd.DataFrame) -> None:
    parts = GPU_PARTS if (steps["mode"] == "gpu").all() else CPU_PARTS
    for _, row in steps.iterrows():
        assert sum(row[c] for c in parts) == pytest.approx(row["step_time_us"], **APPROX)
        for c in steps.columns:
            if c.endswith("_us"):
                assert row[c] >= 0, c


def only_row(analysis) -> pd.Series:
    assert len(analysis.steps) == 1
    check_partition(analysis.steps)
    return analysis.steps.iloc[0]
