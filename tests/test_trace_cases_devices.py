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
    ls = a.details.launch_stats
    assert ls.kernels == 50 and ls.graph_kernels == 50
    # 49 of them start 14..108 us after the call ended: without the graph rule, 49 late launches
    assert ls.long_delay_kernels == 0 and ls.median_launch_delay_us is None
    assert a.verdict.verdict == "launch-bound"
    assert "CUDA graphs (torch.compile" not in a.verdict.advice
    assert "CUDA graphs it already replays" in a.verdict.advice
    assert a.details.advice.launch == a.verdict.advice


def test_a_run_without_graphs_is_told_about_them(tmp_path):
    events = [step(1, 0, 600), cpu_op("aten::add", 0, 598), *launch("k", 1, 10, 10, correlation=1)]
    a = analyze(tmp_path, events)
    assert a.verdict.verdict == "launch-bound"
    assert "CUDA graphs (torch.compile mode='reduce-overhead'; compile: reduce-overhead in a --config file)" in a.verdict.advice


def test_one_launch_cut_off_at_the_end_of_the_capture_does_not_cost_the_window_its_verdict(tmp_path):
    # three steps of 50 launches and kernels, the GPU busy 92% of each; the capture stops right
    # after the very last launch, before its kernel ran
    events = []
    for s in range(3):
        base = 1000 * s
        events.append(step(s + 1, base, 1000))
        for i in range(50):
            corr = 50 * s + i + 1
            events.append(runtime("cudaLaunchKernel", base + 2 + 18 * i, 2, correlation=corr))
            if (s, i) != (2, 49):
                events.append(kernel("k", base + 40 + 18 * i, 18 if i < 49 else 16, correlation=corr))
    a = analyze(tmp_path, events)
    assert a.steps["status"].tolist() == ["ok", "ok", "ok"], a.steps["status_reason"].tolist()
    assert a.verdict.verdict == "compute-bound"
    quality = {e["reason"]: e["count"] for e in a.summary()["data_quality"]}
    assert quality.get("kernel launch calls at the end of the capture (their kernels ran after it stopped)") == 1
    assert "kernel launch calls without a kernel (lost by the profiler)" not in quality


def test_an_mtia_event_wait_is_the_device_waiting_as_a_cuda_sync_event_is(tmp_path):
    # step [0, 1000): kernels [100, 400) and [700, 900); between them the device waits on an event
    # [400, 700): idle time (a cross-stream wait), not work
    events = [
        step(1, 0, 1000), cpu_op("aten::mm", 0, 90),
        event("mtia_runtime", MTIA_LAUNCH, 10, 5, correlation=1), _mtia("fused_mm_kernel", 100, 300, 1),
        event("mtia_runtime", MTIA_LAUNCH, 20, 5, correlation=2), _mtia("event_wait", 400, 300, 2),
        event("mtia_runtime", MTIA_LAUNCH, 30, 5, correlation=3), _mtia("softmax_kernel", 700, 200, 3),
    ]
    a = analyze(tmp_path, events)
    row = only_row(a)
    assert row["kernel_count"] == 2 and row["compute_us"] == pytest.approx(500)
    assert row["gpu_busy_us"] == pytest.approx(500)
    waits = a.details.other_waits.causes["cross-stream wait"]
    assert waits.us == pytest.approx(300)


def test_kernels_perfscope_dropped_as_corrupt_are_not_blamed_on_the_profiler(tmp_path):
    # step 2's 10 kernels carry negative durations: the reader drops them, and the step's evidence
    # is incomplete -- but by perfscope's hand, not the profiler's
    events = [step(1, 0, 1000), step(2, 1000, 1000)]
    for i in range(10):
        events += launch("k", 10 + 90 * i, 20 + 90 * i, 60, correlation=i + 1)
        events.append(runtime("cudaLaunchKernel", 1010 + 90 * i, 5, correlation=100 + i))
        events.append(kernel("k", 1020 + 90 * i, -60, correlation=100 + i))
    a = analyze(tmp_path, events)
    assert a.steps["status"].tolist() == ["ok", "incomplete"]
    reason = a.steps["status_reason"].iloc[1]
    assert reason == "10 of its 10 kernel launches have no kernel: perfscope dropped 10 as corrupt (Data quality says why)"
    assert "profiler lost" not in reason
    quality = {e["reason"]: e["count"] for e in a.summary()["data_quality"]}
    assert quality["negative duration"] == 10 and "kernel launch calls without a kernel (lost by the profiler)" not in quality


def test_steps_withheld_from_the_verdict_keep_their_detail_tables_marked_so(tmp_path):
    # every step loses half its kernels to corrupt durations: no verdict, yet the kernels that are
    # left, their launch delays and the idle gaps are still shown, as outside the verdict
    from perfscope.reports.bottleneck import render_report

    events = [step(1, 0, 1000), step(2, 1000, 1000)]
    for s in range(2):
        for i in range(10):
            corr = 100 * s + i + 1
            events.append(runtime("cudaLaunchKernel", 1000 * s + 10 + 90 * i, 5, correlation=corr))
            events.append(kernel("gemm_k" if i % 2 else "bad_k", 1000 * s + 20 + 90 * i, 60 if i % 2 else -60,
                                 correlation=corr))
    a = analyze(tmp_path, events)
    assert a.steps["status"].tolist() == ["incomplete", "incomplete"] and a.verdict.verdict is None
    summary = a.summary()
    d = summary["details"]
    assert d["scope"] == "withheld"
    assert [k["name"] for k in d["top_kernels"]] == ["gemm_k"] and d["top_kernels"][0]["count"] == 10
    assert d["launch_stats"]["kernels"] == 10
    html = render_report(summary, find_traces=False)
    assert html.count("Over the steps the verdict leaves out") >= 3  # kernels, launches, idle gaps
    counted = analyze(tmp_path, [step(1, 0, 100), cpu_op("aten::mm", 0, 90), *launch("k", 10, 20, 60, correlation=1)],
                      name="ok.json")
    assert counted.summary()["details"]["scope"] == "counted"
