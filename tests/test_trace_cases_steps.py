"""Hand-written trace cases: step windows. Traces with no, one, repeated or overlapping
ProfilerStep# markers, a cut-off last step, GPU work assigned to the step that launched it, and
CPU-only or GPU-only traces (see tracekit.py)."""

from __future__ import annotations

import pytest
from tracegen import (
    annotation,
    cpu_op,
    dataloader,
    kernel,
    launch,
    memset,
    runtime,
    step,
)
from tracekit import analyze, check_partition, only_row

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
    # Step 3's evidence is incomplete: it gets no verdict (it would be io-bound).
    assert list(a.steps["verdict"]) == ["compute-bound", "compute-bound", None]
    assert a.steps["status"].tolist() == ["ok", "ok", "incomplete"]
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


def test_repeated_and_overlapping_step_markers_warn(tmp_path):
    events = [step(1, 0, 120), step(1, 300, 50), step(2, 100, 100), cpu_op("aten::mm", 10, 50)]
    a = analyze(tmp_path, events)
    assert list(a.steps["step"]) == [1, 2]
    assert any("repeated for step 1" in w for w in a.warnings)
    assert any("overlap" in w for w in a.warnings)
    assert a.steps.iloc[0]["step_time_us"] == pytest.approx(100)  # cut where step 2 starts


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


def test_the_partition_is_defined_once_for_the_metrics_and_the_timeline(tmp_path):
    # every part of the partition is a metric column, and the timeline draws each one
    from perfscope.analysis.partition import CPU_PARTS, GPU_PARTS
    from perfscope.reports.timeline_data import CPU_PARTITION_PARTS, GPU_PARTITION_PARTS

    gpu = analyze(tmp_path, [step(1, 0, 100), *launch("k", 1, 10, 30, correlation=1)], name="g.json")
    cpu = analyze(tmp_path, [step(1, 0, 100), cpu_op("aten::mm", 0, 50)], name="c.json")
    assert {f"{p}_us" for p in GPU_PARTS} <= set(gpu.steps.columns)
    assert {f"{p}_us" for p in CPU_PARTS} <= set(cpu.steps.columns)
    assert {p for p, _, _ in GPU_PARTITION_PARTS} == set(GPU_PARTS)
    assert {p for p, _, _ in CPU_PARTITION_PARTS} == set(CPU_PARTS)
