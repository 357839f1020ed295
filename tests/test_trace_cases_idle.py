"""Hand-written trace cases: why the GPU sits idle and what a step is bound by. Each idle gap is
split into input, launch, h2d and kernel wait or other idle; the cost fractions then give the
verdict and the runner-up, thresholds included (see tracekit.py)."""

from __future__ import annotations

import pytest
from tracegen import cpu_op, dataloader, launch, memcpy, runtime, step
from tracekit import APPROX, NCCL_NEW, analyze, only_row

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
