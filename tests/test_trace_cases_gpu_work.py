"""Hand-written trace cases: which GPU work counts as what. NCCL and gloo collectives as
communication, sub-microsecond kernels and copies, busy time as the union over streams and
devices, and the memcpy / memset variants in current and 2021 spellings (see tracekit.py)."""

from __future__ import annotations

import pandas as pd
import pytest
from tracegen import cpu_op, event, kernel, launch, memcpy, memset, runtime, step
from tracekit import APPROX, NCCL_NEW, NCCL_OLD, analyze, only_row

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


def test_operators_too_short_to_do_more_than_their_dispatch_count_as_framework_overhead(tmp_path):
    from perfscope.analysis.partition import DISPATCH_OP_US

    # a CPU step of 10 ms: 1,000 operators of 4 us with 1 us between them (5 ms), then one of 5 ms
    events = [step(1, 0, 10_000), *[cpu_op("aten::add", 5 * k, 4) for k in range(1000)], cpu_op("aten::mm", 5000, 5000)]
    assert 4 < DISPATCH_OP_US <= 5_000
    row = only_row(analyze(tmp_path, events))
    # before this rule the adds' 4,000 us were operator time: 90% of the step, compute-bound
    assert row["operator_us"] == pytest.approx(5000) and row["framework_overhead_us"] == pytest.approx(5000)
    assert row["operator_count"] == 1001  # still counted as operators
    assert row["verdict"] == "launch-bound"
