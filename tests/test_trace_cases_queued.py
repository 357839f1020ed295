"""Work launched before the profiler's window: a host that runs ahead of the GPU leaves the window
opening on kernels launched before it. The stream runs them in order, so until its first kernel
launched inside the window it was busy with work the trace holds only in part, and the window's
copies and idle time there cannot be judged: such steps get no verdict (evidence.py)."""

from __future__ import annotations

from pathlib import Path

import perfscope
from tracegen import kernel, launch, memcpy, runtime, step
from tracekit import analyze

from perfscope.analysis.evidence import QUEUED_SHARE

TRACES = Path(__file__).parent / "traces"


def _ahead(lead_unlinked: bool) -> list[dict]:
    """Four 1 ms host steps that each launch a copy (runs at once on stream 18) and a kernel; the
    GPU's compute stream is 5 ms behind: its kernels of the window run at 5-9 ms."""
    events = []
    for i in range(4):
        t0 = 1000 * i
        events += [step(i + 1, t0, 1000), runtime("cudaMemcpyAsync", t0 + 10, 5, correlation=100 + i),
                   memcpy("Memcpy HtoD (Pinned -> Device)", t0 + 20, 600, correlation=100 + i, stream=18),
                   *launch("gemm", t0 + 30, 5000 + 1000 * i, 900, correlation=200 + i)]
    if lead_unlinked:  # the warm-up's kernels, launched before the window, run first on stream 7,
        # behind still earlier work the trace does not hold
        events += [kernel("gemm", 4000 + 240 * k, 200, correlation=900 + k) for k in range(4)]
    return events


def test_steps_the_gpu_spent_on_work_from_before_the_window_get_no_verdict(tmp_path):
    a = analyze(tmp_path, _ahead(lead_unlinked=True))
    s = a.steps.set_index("step")
    # the stream was held by unrecorded earlier work until 4.0 ms: steps 1-4 lie inside it
    assert (s["status"] == "incomplete").all()
    reason = s.loc[1, "status_reason"]
    assert reason.startswith("for 100% of the step the GPU was still busy with work launched before the profiler's window")
    assert "stream 7 of GPU 0 began with 4 events without a launch record, the first 4.0 ms into the trace" in reason
    assert a.verdict.verdict is None and "perfscope profile waits for it at the window's start" in a.verdict.advice


def test_a_stream_that_starts_with_its_own_launches_is_judged_as_ever(tmp_path):
    a = analyze(tmp_path, _ahead(lead_unlinked=False))
    assert (a.steps["status"] == "ok").all()


def test_a_little_earlier_work_at_the_start_does_not_cost_the_verdict(tmp_path):
    events = [step(1, 0, 1000), step(2, 1000, 1000), kernel("gemm", 0, 50, correlation=999),
              *launch("gemm", 10, 60, 800, correlation=1), *launch("gemm", 1010, 1020, 900, correlation=2)]
    a = analyze(tmp_path, events)
    # 60 us of the first step: under QUEUED_SHARE (10%), the rule stays quiet
    assert 60 / 1000 < QUEUED_SHARE and (a.steps["status"] == "ok").all()


def test_the_real_trace_of_a_host_running_ahead_gets_no_verdict():
    a = perfscope.analyze(TRACES / "h200_prefetch_ahead.json.gz")
    assert (a.steps["status"] == "incomplete").all() and a.verdict.verdict is None
    assert all("launched before the profiler's window" in r for r in a.steps["status_reason"])
    assert "began with 26 events without a launch record, the first 29.2 ms into the trace" in a.steps["status_reason"].iloc[0]
    synced = perfscope.analyze(TRACES / "h200_prefetch_synced.json.gz")
    assert (synced.steps["status"] == "ok").all() and synced.verdict.verdict == "compute-bound"


def test_a_trace_without_any_launch_record_says_nothing_of_work_from_before(tmp_path):
    # every kernel without a correlation (args: null writers): nothing tells earlier work from the window's
    events = [step(1, 0, 1000), step(2, 1000, 1000), *[kernel("gemm", 100 + 400 * k, 300, correlation=None, with_args=False)
                                                      for k in range(5)]]
    a = analyze(tmp_path, events)
    assert not any("before the profiler's window" in (r or "") for r in a.steps["status_reason"])


def test_recorded_earlier_work_counts_as_it_ran_and_a_late_reuse_of_its_stream_changes_nothing(tmp_path):
    # a 5 us leftover of earlier work at the start of stream 20, whose next kernel comes 2.5 ms later:
    # the leftover is in the trace, nothing before it is missing
    events = [step(i + 1, 1000 * i, 1000) for i in range(3)] + [kernel("gemm", 0, 5, correlation=990, stream=20)]
    events += [x for i in range(3) for x in launch("gemm", 1000 * i + 10, 1000 * i + 20, 900, correlation=i + 1)]
    events += launch("gemm", 2480, 2490, 100, correlation=50, stream=20)
    a = analyze(tmp_path, events)
    assert (a.steps["status"] == "ok").all()


def test_events_without_a_stream_id_are_not_taken_for_one_stream(tmp_path):
    events = [step(i + 1, 1000 * i, 1000) for i in range(4)]
    events += [kernel("gemm", 2000, 50, correlation=990, stream=-3)]
    events += [x for i in range(4) for x in launch("gemm", 1000 * i + 10, 1000 * i + 20, 900, correlation=i + 1, stream=-5)]
    a = analyze(tmp_path, events)
    assert not any("before the profiler's window" in (r or "") for r in a.steps["status_reason"])


def test_a_host_to_device_copy_without_a_launch_record_is_no_input_evidence(tmp_path):
    from tracegen import launch, memcpy, runtime, step, write_trace

    import perfscope

    def run(linked: bool):
        # one stream: a kernel, a 400 us host-to-device copy, a kernel; no DataLoader anywhere
        events = [step(1, 1000, 1000), *launch("k1", 1005, 1100, 200, 1),
                  memcpy("Memcpy HtoD (Pinned -> Device)", 1300, 400, 2), *launch("k2", 1030, 1700, 200, 3)]
        if linked:
            events.append(runtime("cudaMemcpyAsync", 1020, 5, 2))
        return perfscope.analyze(write_trace(tmp_path / f"t{linked}.json", events))

    linked, unlinked = run(True), run(False)
    row = linked.steps.iloc[0]
    assert row["exposed_h2d_us"] == 400 and linked.verdict.verdict == "io-bound"  # launched by the host: input
    row = unlinked.steps.iloc[0]
    # launched before the window (no launch record): another copy, part of the GPU's own work
    assert row["exposed_h2d_us"] == 0 and row["exposed_other_mem_us"] == 400
    assert unlinked.verdict.verdict == "compute-bound"
