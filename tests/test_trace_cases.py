"""One small hand-written trace per situation; every expected number is worked out by hand
(the arithmetic is in the comments), never copied from perfscope's output.

Times in the comments are microseconds; ``[a, b)`` is a half-open interval.
"""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

import perfscope
from perfscope.errors import AnalysisError, TraceFormatError
from tracegen import (
    annotation,
    cpu_op,
    dataloader,
    event,
    kernel,
    launch,
    memcpy,
    memset,
    runtime,
    step,
    trace_bytes,
    write_trace,
)

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


# ---------------------------------------------------------------- communication kernels


@pytest.mark.parametrize("comm_name", [NCCL_NEW, NCCL_OLD])
def test_nccl_kernels_count_as_communication(tmp_path, comm_name):
    events = [
        step(1, 0, 100),
        *launch("volta_sgemm_128x64_nn", 1, 10, 30, correlation=1, stream=7),  # compute [10, 40)
        *launch(comm_name, 2, 15, 20, correlation=2, stream=20),  # comm [15, 35): inside compute
        *launch(comm_name, 3, 70, 20, correlation=3, stream=20),  # comm [70, 90): alone
    ]
    row = only_row(analyze(tmp_path, events))
    assert row["step_time_us"] == pytest.approx(100)
    assert row["compute_us"] == pytest.approx(30)  # [10, 40)
    assert row["comm_us"] == pytest.approx(40)  # 20 + 20
    # [15, 35) runs under the compute kernel on stream 7, so only [70, 90) is exposed.
    assert row["exposed_comm_us"] == pytest.approx(20)
    assert row["gpu_busy_us"] == pytest.approx(50)  # [10, 40) + [70, 90)
    assert row["kernel_count"] == 3
    assert row["comm_kernel_count"] == 2


def test_old_and_new_nccl_names_in_one_trace(tmp_path):
    events = [
        step(1, 0, 100),
        *launch("void at::native::elementwise_kernel", 1, 10, 30, correlation=1),  # compute [10, 40)
        *launch(NCCL_NEW, 2, 30, 20, correlation=2, stream=20),  # comm [30, 50): exposed [40, 50)
        *launch(NCCL_OLD, 3, 60, 25, correlation=3, stream=21),  # comm [60, 85): all exposed
    ]
    row = only_row(analyze(tmp_path, events))
    assert row["comm_us"] == pytest.approx(45)  # 20 + 25
    assert row["exposed_comm_us"] == pytest.approx(35)  # 10 + 25
    assert row["compute_us"] == pytest.approx(30)
    assert row["comm_kernel_count"] == 2


def test_gloo_collective_on_cpu_only_trace(tmp_path):
    events = [
        step(1, 0, 100),
        cpu_op("aten::mm", 10, 20),  # main thread operator [10, 30)
        cpu_op("aten::add", 60, 10),  # main thread operator [60, 70)
        cpu_op("gloo:all_reduce", 20, 60, tid=2),  # collective [20, 80) on the gloo thread
    ]
    a = analyze(tmp_path, events)
    row = only_row(a)
    assert a.mode == "cpu" and row["mode"] == "cpu"
    assert row["step_time_us"] == pytest.approx(100)
    assert row["comm_us"] == pytest.approx(60)  # [20, 80)
    # [20, 80) minus the operators [10, 30) and [60, 70): [30, 60) + [70, 80) = 30 + 10
    assert row["exposed_comm_us"] == pytest.approx(40)
    assert row["operator_us"] == pytest.approx(30)  # 20 + 10
    assert row["framework_overhead_us"] == pytest.approx(30)  # [0, 10) + [80, 100)
    assert row["dataloader_us"] == pytest.approx(0)
    assert row["operator_count"] == 2  # the collective is not an operator


# ---------------------------------------------------------------- sub-microsecond times


# Kineto timestamps are large (microseconds since boot): at 5.4e12 a float64 step is ~0.001 us.
@pytest.mark.parametrize("base, tol", [(0.0, 1e-6), (5_398_389_374_591.553, 2e-3)])
def test_sub_microsecond_events_keep_their_length(tmp_path, base, tol):
    events = [
        step(1, base + 10.0004, 20.0),  # origin: window [0, 20)
        runtime("cudaLaunchKernel", base + 10.5, 0.2, correlation=1),
        runtime("cudaLaunchKernel", base + 10.8, 0.2, correlation=2),
        runtime("cudaMemcpyAsync", base + 11.1, 0.2, correlation=3),
        kernel("tiny_a", base + 12.0004, 0.3, correlation=1),  # [2.0, 2.3) after the origin
        kernel("tiny_b", base + 12.3004, 0.3, correlation=2),  # [2.3, 2.6): touches tiny_a
        memcpy("Memcpy HtoD (Pinned -> Device)", base + 15.2502, 0.7, correlation=3),  # 0.7 us
    ]
    row = only_row(analyze(tmp_path, events))
    assert row["step_time_us"] == pytest.approx(20.0, abs=tol)
    assert row["cpu_span_us"] == pytest.approx(20.0, abs=tol)
    assert row["compute_us"] == pytest.approx(0.6, abs=tol)  # 0.3 + 0.3
    assert row["median_kernel_us"] == pytest.approx(0.3, abs=tol)
    assert row["h2d_us"] == pytest.approx(0.7, abs=tol)
    assert row["gpu_busy_us"] == pytest.approx(1.3, abs=tol)  # 0.6 + 0.7
    assert row["kernel_count"] == 2


def test_single_sub_microsecond_kernel_contributes_its_duration(tmp_path):
    events = [step(1, 0, 5), *launch("k", 0.1, 1.05, 0.3, correlation=1, call_dur=0.4)]
    row = only_row(analyze(tmp_path, events))
    assert row["compute_us"] == pytest.approx(0.3, **APPROX)
    assert row["gpu_busy_us"] == pytest.approx(0.3, **APPROX)
    assert row["median_kernel_us"] == pytest.approx(0.3, **APPROX)


# ---------------------------------------------------------------- step markers


def test_no_step_markers_is_one_window_with_a_note(tmp_path):
    events = [
        cpu_op("aten::mm", 0, 50),
        runtime("cudaLaunchKernel", 5, 2, correlation=1),
        kernel("gemm", 20, 60, correlation=1),  # [20, 80)
    ]
    a = analyze(tmp_path, events)
    row = only_row(a)
    assert row["step"] == 0
    assert row["step_time_us"] == pytest.approx(80)  # first event at 0, last end at 80
    assert row["compute_us"] == pytest.approx(60)
    assert any("no ProfilerStep# markers" in n for n in a.notes)


def test_exactly_one_step_marker(tmp_path):
    events = [step(7, 0, 100), *launch("gemm", 1, 5, 90, correlation=1)]  # [5, 95)
    a = analyze(tmp_path, events)
    row = only_row(a)
    assert row["step"] == 7
    assert bool(row["complete"])
    assert row["compute_us"] == pytest.approx(90)
    assert not any("no ProfilerStep#" in n for n in a.notes)
    # The only step counts: compute 90 %; launch 10 %: host wait [0, 1) + [95, 100), queued [1, 5).
    assert a.verdict.verdict == "compute-bound"
    assert a.verdict.step_share["compute-bound"] == pytest.approx(1.0)


def _cpu_steps_with_cut_off_last(optimizer_in_last: bool, last_dur: int = 40):
    events = []
    for n, t0 in ((1, 0), (2, 100)):
        # ops cover [t0+2, t0+99): 97 of 100 -> compute-bound (framework overhead 3 % < 25 %)
        events += [
            step(n, t0, 100),
            cpu_op("aten::mm", t0 + 2, 88),
            annotation("Optimizer.step#SGD.step", t0 + 90, 9),
            cpu_op("aten::add_", t0 + 90, 9),
        ]
    # Step 3 spends 24 of its first 40 us in a DataLoader fetch: io-bound if it were counted.
    # Cut off at 40 us it is a partial iteration (< half the shortest other step, 100 us).
    events += [step(3, 200, last_dur), dataloader(200, 24), cpu_op("aten::mm", 224, 12)]
    if optimizer_in_last:
        events += [annotation("Optimizer.step#SGD.step", 237, 2), cpu_op("aten::add_", 237, 2)]
    return events


def test_last_step_without_optimizer_is_cut_off(tmp_path):
    a = analyze(tmp_path, _cpu_steps_with_cut_off_last(optimizer_in_last=False))
    check_partition(a.steps)
    assert list(a.steps["step"]) == [1, 2, 3]
    assert list(a.steps["complete"]) == [True, True, False]
    assert list(a.steps["verdict"]) == ["compute-bound", "compute-bound", "io-bound"]
    # Only steps 1 and 2 count: both compute-bound (with step 3 the share would be 2/3).
    assert a.verdict.verdict == "compute-bound"
    assert a.verdict.step_share["compute-bound"] == pytest.approx(1.0)
    assert a.verdict.step_share["io-bound"] == pytest.approx(0.0)
    assert any("step 3" in n and "cut off" in n for n in a.notes)
    s3 = a.steps.iloc[2]
    assert s3["dataloader_us"] == pytest.approx(24)
    assert s3["operator_us"] == pytest.approx(12)


def test_whole_last_step_without_optimizer_is_complete(tmp_path):
    # e.g. GradScaler skipped the update: no Optimizer.step# range, but a whole-length step
    a = analyze(tmp_path, _cpu_steps_with_cut_off_last(optimizer_in_last=False, last_dur=100))
    assert list(a.steps["complete"]) == [True, True, True]


def test_last_step_with_optimizer_is_complete(tmp_path):
    a = analyze(tmp_path, _cpu_steps_with_cut_off_last(optimizer_in_last=True))
    assert list(a.steps["complete"]) == [True, True, True]
    # 2 of 3 steps compute-bound
    assert a.verdict.step_share["compute-bound"] == pytest.approx(2 / 3)
    assert a.verdict.step_share["io-bound"] == pytest.approx(1 / 3)


def test_short_last_step_alone_is_not_cut_off(tmp_path):
    # Step length is no evidence (a step that finds its batch ready is short): without
    # Optimizer.step# ranges a 30 us last step after two 100 us ones still counts.
    events = [step(1, 0, 100), cpu_op("aten::mm", 0, 90),
              step(2, 100, 100), cpu_op("aten::mm", 100, 90),
              step(3, 200, 30), cpu_op("aten::mm", 200, 30)]
    a = analyze(tmp_path, events)
    assert list(a.steps["complete"]) == [True, True, True]
    assert list(a.steps["step_time_us"]) == pytest.approx([100, 100, 30])


def test_gpu_work_belongs_to_the_step_that_launched_it(tmp_path):
    events = [
        step(1, 0, 100),  # CPU span [0, 100)
        *launch("k1", 10, 20, 40, correlation=1),  # [20, 60)
        *launch("k2", 90, 125, 25, correlation=2),  # launched in step 1, runs [125, 150)
        step(2, 120, 100),  # CPU span [120, 220): k2 starts inside it
        *launch("k3", 125, 150, 20, correlation=3),  # [150, 170)
        *launch("k4", 130, 170, 10, correlation=4),  # [170, 180)
        *launch("k5", 135, 180, 10, correlation=5),  # [180, 190)
    ]
    a = analyze(tmp_path, events)
    check_partition(a.steps)
    s1, s2 = a.steps.iloc[0], a.steps.iloc[1]
    assert list(a.steps["kernel_count"]) == [2, 3]
    assert s1["cpu_span_us"] == pytest.approx(100)
    assert s1["gpu_extended_span_us"] == pytest.approx(150)  # k2 ends at 150
    assert s1["gpu_extended_span_us"] > s1["cpu_span_us"]
    # The window of step 1 stops where step 2 starts: [0, 120).
    assert s1["step_time_us"] == pytest.approx(120)
    assert s2["step_time_us"] == pytest.approx(100)  # [120, 220)
    assert s2["gpu_extended_span_us"] == pytest.approx(100)  # GPU work ends at 190 < 220
    assert s1["median_kernel_us"] == pytest.approx(32.5)  # median(40, 25)
    assert s2["median_kernel_us"] == pytest.approx(10)  # median(20, 10, 10)


def test_gpu_events_without_launch_record_belong_to_the_step_holding_their_start(tmp_path):
    events = [
        step(1, 0, 100),
        *launch("k1", 1, 10, 20, correlation=1),  # [10, 30), launched in step 1
        kernel("orphan_a", 50, 10),  # no correlation: starts in step 1
        step(2, 100, 100),
        kernel("orphan_b", 120, 10),  # starts in step 2
        kernel("orphan_c", 150, 10),  # starts in step 2
        memset("Memset (Device)", 170, 5),  # not a kernel
    ]
    a = analyze(tmp_path, events)
    check_partition(a.steps)
    assert list(a.steps["kernel_count"]) == [2, 2]
    assert list(a.steps["compute_us"]) == pytest.approx([30, 20])  # 20 + 10; 10 + 10
    assert list(a.steps["exposed_other_mem_us"]) == pytest.approx([0, 5])


# ---------------------------------------------------------------- streams and devices


def test_busy_time_is_the_union_of_streams_and_devices(tmp_path):
    events = [
        step(1, 0, 100),
        # A GPU-side copy of the step marker is no GPU work.
        event("gpu_user_annotation", "ProfilerStep#1", 0, 100, pid=0, tid=7, device=0, stream=7),
        *launch("a", 1, 10, 40, correlation=1, stream=7, device=0),  # [10, 50)
        *launch("b", 2, 30, 40, correlation=2, stream=8, device=0),  # [30, 70)
        *launch("c", 3, 40, 50, correlation=3, stream=7, device=1),  # [40, 90)
    ]
    row = only_row(analyze(tmp_path, events))
    # union [10, 90) = 80, where the sum would be 40 + 40 + 50 = 130 > 100
    assert row["gpu_busy_us"] == pytest.approx(80)
    assert row["compute_us"] == pytest.approx(80)
    assert row["gpu_busy_us"] <= row["step_time_us"]
    assert row["kernel_count"] == 3


def test_same_stream_id_on_two_devices(tmp_path):
    events = [
        step(1, 0, 100),
        *launch("a", 1, 10, 40, correlation=1, stream=7, device=0),  # [10, 50)
        *launch("b", 2, 30, 40, correlation=2, stream=7, device=1),  # [30, 70), another GPU
    ]
    row = only_row(analyze(tmp_path, events))
    assert row["gpu_busy_us"] == pytest.approx(60)  # [10, 70)
    assert row["kernel_count"] == 2
    assert row["median_kernel_us"] == pytest.approx(40)


# ---------------------------------------------------------------- trace shapes


def test_cpu_only_trace(tmp_path):
    events = [
        step(1, 0, 100),
        dataloader(0, 40),  # [0, 40)
        cpu_op("aten::to", 10, 5),  # inside the fetch: data loading, not an operator
        cpu_op("aten::mm", 50, 30),  # [50, 80)
    ]
    a = analyze(tmp_path, events)
    row = only_row(a)
    assert a.mode == "cpu"
    assert row["dataloader_us"] == pytest.approx(40)
    assert row["operator_us"] == pytest.approx(30)
    assert row["framework_overhead_us"] == pytest.approx(30)  # [40, 50) + [80, 100)
    assert row["verdict"] == "io-bound"  # 0.40 >= 0.10, and the largest removable cost


def test_gpu_only_trace_is_one_window_of_other_idle(tmp_path):
    events = [kernel("a", 0, 20), kernel("b", 50, 20)]  # [0, 20), [50, 70); no launches known
    a = analyze(tmp_path, events)
    row = only_row(a)
    assert a.mode == "gpu"
    assert row["step"] == 0
    assert row["step_time_us"] == pytest.approx(70)
    assert row["compute_us"] == pytest.approx(40)
    assert row["other_idle_us"] == pytest.approx(30)  # the gap [20, 50) > 10 us
    assert row["launch_wait_us"] == 0 and row["input_wait_us"] == 0
    assert any("no ProfilerStep# markers" in n for n in a.notes)


def test_metadata_only_trace_is_a_clear_error(tmp_path):
    events = [
        {"ph": "M", "name": "process_name", "pid": 100, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 1, "args": {"name": "main"}},
    ]
    with pytest.raises(TraceFormatError, match="no events"):
        analyze(tmp_path, events)


def test_empty_trace_is_a_clear_error(tmp_path):
    (tmp_path / "empty.json").write_text('{"traceEvents": []}')
    with pytest.raises(TraceFormatError, match="no events"):
        perfscope.analyze(tmp_path / "empty.json")


# ---------------------------------------------------------------- memcpy / memset


def _copies_trace(spelling: str):
    """The same trace in current (``new``) or 2021 (``old``) categories."""
    old = spelling == "old"
    cat = {
        "annotation": "Operator" if old else "user_annotation",
        "cpu": "Operator" if old else "cpu_op",
        "runtime": "Runtime" if old else "cuda_runtime",
        "kernel": "Kernel" if old else "kernel",
        "memcpy": "Memcpy" if old else "gpu_memcpy",
        "memset": "Memset" if old else "gpu_memset",
    }
    gpu = dict(with_args=not old)  # 2021: no args.device/stream; pid 0, tid "stream 7"
    events = [step(1, 0, 200, cat=cat["annotation"]), cpu_op("aten::copy_", 0, 8, cat=cat["cpu"])]
    events += [runtime("cudaMemcpyAsync", i, 1, correlation=i, cat=cat["runtime"]) for i in range(1, 7)]
    events += [
        memcpy("Memcpy HtoD (Pageable -> Device)", 10, 20, 1, cat=cat["memcpy"], **gpu),  # [10, 30)
        memcpy("Memcpy HtoD (Pinned -> Device)", 40, 10, 2, cat=cat["memcpy"], **gpu),  # [40, 50)
        memcpy("Memcpy HtoD (Host -> Device)", 60, 5, 3, cat=cat["memcpy"], **gpu),  # ROCm [60, 65)
        memset("Memset (Device)", 70, 10, 4, cat=cat["memset"], **gpu),  # [70, 80)
        memcpy("Memcpy DtoH (Device -> Pageable)", 90, 10, 5, cat=cat["memcpy"], **gpu),  # [90, 100)
        kernel("gemm", 110, 20, 6, cat=cat["kernel"], **gpu),  # [110, 130)
    ]
    return events


@pytest.mark.parametrize("spelling", ["new", "old"])
def test_memcpy_and_memset_variants(tmp_path, spelling):
    row = only_row(analyze(tmp_path, _copies_trace(spelling)))
    assert row["h2d_us"] == pytest.approx(35)  # 20 + 10 + 5; the memset is no copy
    assert row["exposed_h2d_us"] == pytest.approx(35)  # no kernel runs meanwhile
    assert row["exposed_other_mem_us"] == pytest.approx(20)  # memset 10 + DtoH 10
    assert row["compute_us"] == pytest.approx(20)
    assert row["memcpy_count"] == 4  # three HtoD + one DtoH
    assert row["pageable_memcpy_count"] == 2  # Pageable -> Device, Device -> Pageable
    assert row["kernel_count"] == 1
    assert row["gpu_busy_us"] == pytest.approx(75)  # 35 + 20 + 20


def test_old_capitalised_categories_parse_like_new_ones(tmp_path):
    new = analyze(tmp_path, _copies_trace("new"), name="new.json").steps
    old = analyze(tmp_path, _copies_trace("old"), name="old.json").steps
    metric_cols = [c for c in new.columns if c not in ("worker",)]
    pd.testing.assert_frame_equal(new[metric_cols], old[metric_cols])


# ---------------------------------------------------------------- idle gap causes

# Common layout: step [0, 100); k1's launch call runs [0, 2), k1 runs [2, 20) (first gap [0, 2):
# host wait, the call had not returned); k2 (launch call 2 us long) ends the step at 100. Only the
# gap before k2 differs between the cases.


def _gap_trace(k2_launch, k2_start, extra=()):
    return [
        step(1, 0, 100),
        *launch("k1", 0, 2, 18, correlation=1, call_dur=2),
        *launch("k2", k2_launch, k2_start, 100 - k2_start, correlation=2, call_dur=2),
        *extra,
    ]


def test_gap_before_a_late_launch_is_launch_wait(tmp_path):
    # gap [20, 55); k2's launch call [50, 52): host wait [20, 52) = 32, then queued [52, 55) = 3
    row = only_row(analyze(tmp_path, _gap_trace(50, 55, [cpu_op("aten::item", 20, 28)])))
    assert row["launch_wait_us"] == pytest.approx(34)  # 2 (first gap) + 32
    assert row["kernel_wait_us"] == pytest.approx(3)
    assert row["input_wait_us"] == pytest.approx(0)
    assert row["other_idle_us"] == pytest.approx(0)
    assert row["compute_us"] == pytest.approx(63)  # 18 + 45


def test_gap_during_a_dataloader_fetch_is_input_wait(tmp_path):
    # same gap, the main thread in a DataLoader fetch for [20, 50)
    row = only_row(analyze(tmp_path, _gap_trace(50, 55, [dataloader(20, 30)])))
    assert row["input_wait_us"] == pytest.approx(30)
    assert row["launch_wait_us"] == pytest.approx(4)  # first gap [0, 2) + [50, 52) in the call
    assert row["kernel_wait_us"] == pytest.approx(3)
    assert row["compute_us"] == pytest.approx(63)


def test_partly_in_dataloader_splits_input_and_launch_wait(tmp_path):
    # host wait [20, 52): fetch [20, 45) -> input 25, rest [45, 52) -> launch 7 (+ 2 first gap)
    row = only_row(analyze(tmp_path, _gap_trace(50, 55, [dataloader(20, 25)])))
    assert row["input_wait_us"] == pytest.approx(25)
    assert row["launch_wait_us"] == pytest.approx(9)


@pytest.mark.parametrize(
    "k2_start, kernel_wait, other_idle",
    [
        (55, 0, 35),  # queued gap [20, 55) = 35 > 10: other idle
        (31, 0, 11),  # 11 > 10: other idle
        (30, 10, 0),  # exactly 10: kernel wait
        (28, 8, 0),  # 8: kernel wait
    ],
)
def test_gap_with_work_already_queued(tmp_path, k2_start, kernel_wait, other_idle):
    # k2's launch call [5, 7) returned long before the gap [20, k2_start) begins: the whole gap is
    # queued; only the first gap [0, 2) (inside k1's launch call) is host wait
    row = only_row(analyze(tmp_path, _gap_trace(5, k2_start)))
    assert row["kernel_wait_us"] == pytest.approx(kernel_wait)
    assert row["other_idle_us"] == pytest.approx(other_idle)
    assert row["launch_wait_us"] == pytest.approx(2)
    assert row["input_wait_us"] == pytest.approx(0)
    assert row["compute_us"] == pytest.approx(18 + 100 - k2_start)


def test_blocking_launch_call_is_host_wait(tmp_path):
    # k2's launch call blocks the host for [20, 60); k2 runs [62, 100): gap [20, 62) is host wait
    # until the call returned (60), then queued 2 us
    row = only_row(analyze(tmp_path, [
        step(1, 0, 100),
        *launch("k1", 0, 2, 18, correlation=1, call_dur=2),
        *launch("k2", 20, 62, 38, correlation=2, call_dur=40),
    ]))
    assert row["launch_wait_us"] == pytest.approx(2 + 40)  # first gap [0, 2) + [20, 60)
    assert row["kernel_wait_us"] == pytest.approx(2)
    assert row["other_idle_us"] == pytest.approx(0)


def test_pageable_copy_staging_is_h2d_wait(tmp_path):
    # cudaMemcpyAsync from pageable memory blocks the host [20, 60); its copy runs [55, 60) on the
    # GPU: from the call's start the GPU waits on the staging -> h2d wait [20, 55) = 35, io class
    row = only_row(analyze(tmp_path, [
        step(1, 0, 100),
        *launch("k1", 0, 2, 18, correlation=1, call_dur=2),
        runtime("cudaMemcpyAsync", 20, 40, correlation=2),
        memcpy("Memcpy HtoD (Pageable -> Device)", 55, 5, correlation=2),
        *launch("k2", 60, 62, 38, correlation=3, call_dur=1),
    ]))
    assert row["h2d_wait_us"] == pytest.approx(35)
    assert row["h2d_us"] == pytest.approx(5)
    assert row["exposed_h2d_us"] == pytest.approx(5)
    assert row["launch_wait_us"] == pytest.approx(2 + 1)  # [0, 2) and [60, 61) in k2's call
    assert row["kernel_wait_us"] == pytest.approx(1)  # [61, 62)
    assert row["io_cost_frac"] == pytest.approx((35 + 5) / 100)


# ---------------------------------------------------------------- truncated and garbage files


def _many_steps(n_steps=40):
    events = []
    for n in range(n_steps):
        t0 = 100 * n
        events += [step(n + 1, t0, 100), cpu_op("aten::mm", t0 + 5, 80), cpu_op("aten::add", t0 + 90, 5)]
    return events


def test_truncated_json_keeps_complete_events(tmp_path):
    events = _many_steps(3)  # 9 events, one per line
    data = trace_bytes(events, schemaVersion=1)
    last = data.rfind(b'"name"')  # inside the last event: aten::add of step 3
    path = tmp_path / "cut.json"
    path.write_bytes(data[:last + 3])
    a = perfscope.analyze(path)
    assert a.traces[0]["events"] == 8  # the last event is lost
    assert any("truncated" in w for w in a.warnings)
    assert list(a.steps["step"]) == [1, 2, 3]
    assert a.steps.iloc[0]["operator_us"] == pytest.approx(85)  # 80 + 5
    assert a.steps.iloc[2]["operator_us"] == pytest.approx(80)  # aten::add of step 3 is gone


def test_truncated_gzip_keeps_complete_events(tmp_path):
    events = _many_steps(200)
    data = gzip.compress(trace_bytes(events, schemaVersion=1))
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) * 3 // 5])
    a = perfscope.analyze(path)
    assert any("truncated" in w for w in a.warnings)
    assert 0 < a.traces[0]["events"] < len(events)
    check_partition(a.steps)


@pytest.mark.parametrize("content", [b"\x00\x01\x02 not a trace \xff", b"<html>oops</html>", b"\x1f\x8b\x08\x00garbage"])
def test_garbage_is_a_trace_format_error(tmp_path, content):
    path = tmp_path / ("bad.json.gz" if content.startswith(b"\x1f\x8b") else "bad.json")
    path.write_bytes(content)
    with pytest.raises(TraceFormatError):
        perfscope.analyze(path)


# ---------------------------------------------------------------- classification

# Each trace is one step [0, 100); the comments give its cost fractions
# (io = input_wait + exposed_h2d, comm = exposed_comm, launch = launch_wait + kernel_wait,
# compute = compute + exposed_other_mem). Thresholds: io 0.10, comm 0.10, launch 0.20.

CLASS_CASES = {
    # k1 [2, 20), fetch [20, 50), k2 launched 50 runs [55, 100):
    # io 30/100 = 0.30, launch (2 + 5)/100 = 0.07, compute 63/100 -> io-bound, runner-up compute
    "io": (_gap_trace(50, 55, [dataloader(20, 30)]), "io-bound", "compute-bound",
           dict(io=0.30, comm=0.0, launch=0.07, compute=0.63)),
    # gemm [2, 40); all-reduce queued, [40, 90); after 90 the host launches nothing (host wait)
    # comm 0.50, compute 0.38, launch (2 + 10)/100 = 0.12 -> comm-bound, runner-up compute
    "comm": ([step(1, 0, 100), *launch("gemm", 0, 2, 38, 1),
              *launch(NCCL_NEW, 1, 40, 50, 2, stream=20)], "comm-bound", "compute-bound",
             dict(io=0.0, comm=0.50, launch=0.12, compute=0.38)),
    # four 10 us kernels each launched 2 us before it runs, 30 us apart:
    # [2, 12) [32, 42) [62, 72) [92, 100) -> compute 38; host wait 3 * 18 = 54; queued 4 * 2 = 8
    # launch 0.62 -> launch-bound, runner-up compute
    "launch": ([step(1, 0, 100), *launch("k", 0, 2, 10, 1), *launch("k", 30, 32, 10, 2),
                *launch("k", 60, 62, 10, 3), *launch("k", 90, 92, 8, 4)], "launch-bound", "compute-bound",
               dict(io=0.0, comm=0.0, launch=0.62, compute=0.38)),
    # k1 [1, 41), k2 launched at 55 runs [57, 100): launch 1 + 14 + 2 = 17 -> 0.17, above the io
    # threshold but below launch's 0.20 -> compute-bound (0.83), runner-up launch
    "compute": ([step(1, 0, 100), *launch("k", 0, 1, 40, 1), *launch("k", 55, 57, 43, 2)],
                "compute-bound", "launch-bound", dict(io=0.0, comm=0.0, launch=0.17, compute=0.83)),
}


@pytest.mark.parametrize("case", list(CLASS_CASES))
def test_classification(tmp_path, case):
    events, verdict, runner_up, costs = CLASS_CASES[case]
    a = analyze(tmp_path, events)
    row = only_row(a)
    for cls, frac in costs.items():
        assert row[f"{cls}_cost_frac"] == pytest.approx(frac, **APPROX), cls
    assert row["verdict"] == verdict
    assert row["runner_up"] == runner_up
    assert row["runner_up"] != row["verdict"]
    assert a.verdict.verdict == verdict
    assert a.verdict.runner_up == runner_up


def test_thresholds_are_inclusive(tmp_path):
    # k1 launched at 0 runs [1, 20): queued [0, 1) -> kernel wait 1. Fetch [20, 30), k2 launched
    # at 30 runs [30, 100): host wait [20, 30) inside the fetch -> input wait 10.
    # io = 10/100 = 0.10 exactly (the io threshold), launch 0.01, compute (19 + 70)/100 = 0.89
    events = [step(1, 0, 100), *launch("k", 0, 1, 19, 1), dataloader(20, 10),
              *launch("k", 30, 30, 70, 2)]
    row = only_row(analyze(tmp_path, events))
    assert row["io_cost_frac"] == pytest.approx(0.10, **APPROX)
    assert row["compute_cost_frac"] == pytest.approx(0.89, **APPROX)
    assert row["verdict"] == "io-bound"
    assert row["runner_up"] == "compute-bound"


def test_cost_just_below_threshold_is_compute_bound(tmp_path):
    # as above with the fetch [20, 29.9): input wait 9.9 -> io 0.099 < 0.10; launch 0.1 + 1 -> 0.011
    events = [step(1, 0, 100), *launch("k", 0, 1, 19, 1), dataloader(20, 9.9),
              *launch("k", 30, 30, 70, 2)]
    row = only_row(analyze(tmp_path, events))
    assert row["io_cost_frac"] == pytest.approx(0.099, **APPROX)
    assert row["launch_cost_frac"] == pytest.approx(0.011, **APPROX)
    assert row["verdict"] == "compute-bound"
    assert row["runner_up"] == "io-bound"


# ---------------------------------------------------------------- ranks


def _rank_trace(tmp_path, rank, first_step):
    events = []
    for i in range(2):
        n, t0 = first_step + i, 100 * i
        events += [step(n, t0, 100), *launch("gemm", t0 + 1, t0 + 5, 90, correlation=10 * n)]
    return write_trace(tmp_path / f"worker{'ab'[rank]}.pt.trace.json", events,
                       distributedInfo={"backend": "nccl", "rank": rank, "world_size": 2})


def test_two_ranks(tmp_path):
    _rank_trace(tmp_path, 0, 1)
    _rank_trace(tmp_path, 1, 1)
    a = perfscope.analyze(tmp_path)
    assert list(a.steps["rank"]) == [0, 0, 1, 1]
    assert list(a.steps["step"]) == [1, 2, 1, 2]
    assert a.world_size == 2
    check_partition(a.steps)
    assert list(a.steps["compute_us"]) == pytest.approx([90] * 4)  # [t0+5, t0+95) in every step


def test_ranks_with_different_steps_are_an_error(tmp_path):
    _rank_trace(tmp_path, 0, 1)
    _rank_trace(tmp_path, 1, 5)
    with pytest.raises(AnalysisError, match="step"):
        perfscope.analyze(tmp_path)


# ---------------------------------------------------------------- malformed events and layouts


@pytest.mark.parametrize(
    "bad",
    [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 1, "ts": "abc", "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 1, "ts": None, "dur": 5},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 20, "dur": 5, "args": "oops"},
    ],
    ids=["ts-string", "ts-null", "args-string"],
)
def test_malformed_event_is_an_error_or_skipped(tmp_path, bad):
    events = [step(1, 0, 100), *launch("k", 1, 10, 30, correlation=1), bad]
    try:
        a = analyze(tmp_path, events)
    except TraceFormatError:
        return  # a clear error is fine
    # ...and so is leaving the bad event out: the step is still [0, 100) with compute [10, 40)
    row = only_row(a)
    assert row["step_time_us"] == pytest.approx(100)
    assert row["compute_us"] == pytest.approx(30)


def test_directory_with_a_previous_summary_analyzes_its_traces(tmp_path):
    # `perfscope profile --out D` leaves D/traces/*.pt.trace.json.gz next to D/summary.json
    (tmp_path / "traces").mkdir()
    write_trace(tmp_path / "traces" / "rank0.pt.trace.json.gz", [step(1, 0, 100), *launch("k", 1, 5, 90, 1)])
    first = perfscope.analyze(tmp_path / "traces")
    (tmp_path / "summary.json").write_text(json.dumps(first.summary()))
    a = perfscope.analyze(tmp_path)
    assert len(a.steps) == 1
    assert a.steps.iloc[0]["compute_us"] == pytest.approx(90)


def test_two_windows_of_one_worker_are_one_rank(tmp_path):
    # TensorBoard layout <worker>.<span>.pt.trace.json: no distributedInfo, same worker name
    for span, first in ((1, 1), (2, 3)):
        events = []
        for i in range(2):
            n, t0 = first + i, 100 * i
            events += [step(n, t0, 100), *launch("gemm", t0 + 1, t0 + 5, 90, correlation=n)]
        write_trace(tmp_path / f"host_123.{span}.pt.trace.json", events)
    a = perfscope.analyze(tmp_path)
    assert list(a.steps["rank"]) == [0, 0, 0, 0]
    assert list(a.steps["step"]) == [1, 2, 3, 4]
    assert a.world_size == 1


def test_one_step_in_two_traces_of_a_rank_is_an_error(tmp_path):
    _rank_trace(tmp_path, 0, 1)
    write_trace(tmp_path / "again.json", [step(2, 0, 100), *launch("gemm", 1, 5, 90, correlation=1)],
                distributedInfo={"rank": 0, "world_size": 2})
    with pytest.raises(AnalysisError, match="step 2"):
        perfscope.analyze(tmp_path)


def test_rank_without_markers_next_to_marked_rank_is_an_error(tmp_path):
    _rank_trace(tmp_path, 0, 1)  # steps 1, 2
    write_trace(tmp_path / "workerb.pt.trace.json",  # same work, no ProfilerStep# markers
                [*launch("gemm", 1, 5, 90, correlation=1), *launch("gemm", 101, 105, 90, correlation=2)],
                distributedInfo={"backend": "nccl", "rank": 1, "world_size": 2})
    with pytest.raises(AnalysisError):
        perfscope.analyze(tmp_path)


# ---------------------------------------------------------------- odd markers and values


def test_repeated_and_overlapping_step_markers_warn(tmp_path):
    events = [step(1, 0, 120), step(1, 300, 50), step(2, 100, 100), cpu_op("aten::mm", 10, 50)]
    a = analyze(tmp_path, events)
    assert list(a.steps["step"]) == [1, 2]
    assert any("repeated for step 1" in w for w in a.warnings)
    assert any("overlap" in w for w in a.warnings)
    assert a.steps.iloc[0]["step_time_us"] == pytest.approx(100)  # cut where step 2 starts


def test_out_of_range_values_are_skipped_not_overflowed(tmp_path):
    events = [
        step(1, 0, 100), cpu_op("aten::mm", 10, 50),
        cpu_op("aten::huge_dur", 20, 1e17), cpu_op("aten::far_future", 1e16, 5),
        annotation("ProfilerStep#99999999999999999999", 0, 10),  # not an int64 step number
        {"ph": "X", "cat": ["odd"], "name": ["odd"], "pid": 100, "tid": 1, "ts": 30, "dur": 5},
    ]
    a = analyze(tmp_path, events)
    row = only_row(a)
    assert row["step"] == 1
    assert row["step_time_us"] == pytest.approx(100)
    assert any("skipped 2 events" in w for w in a.warnings)


@pytest.mark.parametrize(
    "name, rank",
    [("trace_rank1_20240101.json", 1), ("rank-3.json", 3), ("rank_12.pt.trace.json", 12), ("frankfurt-node3_1234.json", None)],
)
def test_rank_from_file_name(tmp_path, name, rank):
    from perfscope.trace import build_table, read_trace

    table = build_table(read_trace(write_trace(tmp_path / name, [step(1, 0, 10)])))
    assert table.rank == rank


def test_ranks_that_stopped_at_different_steps_keep_the_common_ones(tmp_path):
    from perfscope.analysis.run import analyze_files

    def rank_trace(rank, steps):
        events = [e for n in steps for e in (step(n, 100 * n, 100), cpu_op("aten::mm", 100 * n + 5, 90))]
        return write_trace(tmp_path / f"rank{rank}.json", events, distributedInfo={"rank": rank, "world_size": 2})

    files = [rank_trace(0, [6, 7, 8, 9]), rank_trace(1, [6, 7, 8])]
    with pytest.raises(AnalysisError):
        analyze_files(files)
    a = analyze_files(files, common_steps_only=True)
    assert sorted(set(a.steps["step"])) == [6, 7, 8]
    assert len(a.steps) == 6
    assert any("different steps" in n for n in a.notes)
