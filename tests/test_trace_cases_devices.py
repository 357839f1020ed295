"""Hand-written trace cases: device activity perfscope must read or must say it lost -- MTIA
devices, categories it does not know, CUDA launches whose GPU events were lost, CUDA graphs (see
tracekit.py for the conventions)."""

from __future__ import annotations

import pytest
from tracegen import cpu_op, event, kernel, launch, runtime, step
from tracekit import analyze, check_partition, only_row

MTIA_LAUNCH = "runFunction - job_prep_and_submit_for_execution"


def _mtia(name, ts, dur, correlation, stream=1):
    return event("mtia_ccp_events", name, ts, dur, pid=0, tid=stream, correlation=correlation, device=0, stream=stream)


def test_mtia_device_activity_is_device_work(tmp_path):
    # step [0, 1000): two MTIA kernels [100, 500) and [520, 900), a DMA copy [900, 950),
    # each launched by the MTIA runtime a little earlier on the main thread
    events = [
        step(1, 0, 1000), cpu_op("aten::mm", 0, 90),
        event("mtia_runtime", MTIA_LAUNCH, 10, 5, correlation=1), _mtia("fused_mm_kernel", 100, 400, 1),
        event("mtia_runtime", MTIA_LAUNCH, 20, 5, correlation=2), _mtia("softmax_kernel", 520, 380, 2),
        event("mtia_runtime", MTIA_LAUNCH, 30, 5, correlation=3), _mtia("dma_h2d_transfer", 900, 50, 3),
    ]
    a = analyze(tmp_path, events)
    row = only_row(a)
    assert row["mode"] == "gpu"  # device work, not a CPU-only analysis
    assert row["kernel_count"] == 2 and row["memcpy_count"] == 1
    assert row["compute_us"] == pytest.approx(400 + 380)
    assert row["exposed_h2d_us"] == pytest.approx(50)  # a DMA named h2d: a host-to-device copy
    assert row["gpu_busy_us"] == pytest.approx(830)
    assert a.verdict.verdict == "compute-bound"  # busy 83% of the step
    assert not a.warnings


def test_a_category_perfscope_does_not_know_is_counted_and_named(tmp_path):
    events = [step(1, 0, 100), cpu_op("aten::mm", 0, 90),
              event("npu_kernel", "conv", 10, 50), event("npu_kernel", "relu", 60, 5), event("weird", "x", 1, 1)]
    a = analyze(tmp_path, events)
    (e,) = [x for x in a.summary()["data_quality"] if x["action"] == "not read"]
    assert e["count"] == 3 and e["examples"] == {"npu_kernel": 2, "weird": 1}
    assert any("3 events not read: category perfscope does not know (npu_kernel (2), weird (1))" in w for w in a.warnings)


def test_launches_without_any_gpu_activity_give_no_verdict(tmp_path):
    # a CUDA run whose kernels CUPTI lost: 1,862 launches, no kernel, memcpy or memset
    events = [step(1, 0, 100_000)]
    for i in range(1862):
        events.append(runtime("cudaLaunchKernel", 10 + 50 * i, 5, correlation=i + 1))
    a = analyze(tmp_path, events)
    assert a.verdict.verdict is None
    assert a.verdict.reason.startswith("1,862 runtime calls that put work on the GPU (cudaLaunchKernel (1,862)), "
                                       "no GPU activity recorded: the profiler lost the GPU events")
    assert a.steps["status"].tolist() == ["incomplete"]
    assert a.summary()["overall"]["verdict"] is None
    assert "CPU" not in a.verdict.advice  # no CPU advice for a GPU run


def test_a_step_whose_kernels_were_lost_gets_no_verdict(tmp_path):
    # step 1: 3 launches, 3 kernels; step 2: 100 launches, 2 kernels recorded (98 lost)
    events = [step(1, 0, 1000), step(2, 1000, 1000)]
    for i in range(3):
        events += launch("k", 10 + 100 * i, 20 + 100 * i, 80, correlation=i + 1)
    for i in range(100):
        events.append(runtime("cudaLaunchKernel", 1010 + 9 * i, 2, correlation=100 + i))
    events += [kernel("k", 1100, 50, correlation=100), kernel("k", 1200, 50, correlation=101)]
    a = analyze(tmp_path, events)
    check_partition(a.steps)
    assert a.steps["status"].tolist() == ["ok", "incomplete"]
    assert a.steps["status_reason"].iloc[1] == "98 of its 100 kernel launches have no kernel in the trace: the profiler lost them"


def test_kernels_of_one_cuda_graph_launch_are_not_late_launches(tmp_path):
    # one cudaGraphLaunch [1, 6) replays 50 kernels of 2 us back to back from 10: they share its
    # correlation id. The host then runs Python until 600: GPU busy [10, 110), idle waiting for the
    # host [0, 10) and [110, 600) = 500 of 600 us: launch-bound.
    events = [step(1, 0, 600), cpu_op("aten::graph_replay", 0, 8), cpu_op("aten::add", 8, 590),
              runtime("cudaGraphLaunch", 1, 5, correlation=7)]
    events += [kernel(f"graph_k{i}", 10 + 2 * i, 2, correlation=7) for i in range(50)]
    a = analyze(tmp_path, events)
    ls = a.details["launch_stats"]
    assert ls["kernels"] == 50 and ls["graph_kernels"] == 50
    # 49 of them start 14..108 us after the call ended: without the graph rule, 49 late launches
    assert ls["long_delay_kernels"] == 0 and ls["median_launch_delay_us"] is None
    assert a.verdict.verdict == "launch-bound"
    assert "CUDA graphs (torch.compile" not in a.verdict.advice
    assert "CUDA graphs it already replays" in a.verdict.advice
    assert a.details["advice"]["launch"] == a.verdict.advice


def test_a_run_without_graphs_is_told_about_them(tmp_path):
    events = [step(1, 0, 600), cpu_op("aten::add", 0, 598), *launch("k", 1, 10, 10, correlation=1)]
    a = analyze(tmp_path, events)
    assert a.verdict.verdict == "launch-bound"
    assert "CUDA graphs (torch.compile mode='reduce-overhead')" in a.verdict.advice
