"""The run-level details (what-if, top kernels, launch stats, memcpy, idle gaps, ranks) on
hand-written traces whose expected values are worked out in the comments."""

from __future__ import annotations

import pytest

import perfscope
from tracegen import launch, memcpy, runtime, step, write_trace


def two_steps(tmp_path, name="t.json", rank=None, k_dur=60):
    # each step [t0, t0+100): gemm launched at t0+1 (call 2 us) runs [t0+10, t0+10+k_dur);
    # a short "tiny" kernel launched at t0+3 runs [t0+80, t0+85): 77 us after its call started;
    # a pinned H2D copy of 1e6 bytes runs [t0+90, t0+95) (launched at t0+5)
    events = []
    for i in range(2):
        t0, c = 100 * i, 10 * i
        events += [
            step(i + 1, t0, 100),
            *launch("gemm", t0 + 1, t0 + 10, k_dur, correlation=c + 1, call_dur=2),
            *launch("tiny", t0 + 3, t0 + 80, 5, correlation=c + 2, call_dur=1),
            runtime("cudaMemcpyAsync", t0 + 5, 1, correlation=c + 3),
        ]
        copy = memcpy("Memcpy HtoD (Pinned -> Device)", t0 + 90, 5, correlation=c + 3)
        copy["args"]["bytes"] = 1_000_000
        events.append(copy)
    meta = {"distributedInfo": {"rank": rank, "world_size": 2}} if rank is not None else {}
    return write_trace(tmp_path / name, events, **meta)


def test_top_kernels_and_launch_stats(tmp_path):
    d = perfscope.analyze(two_steps(tmp_path)).details
    top = {k.name: k for k in d.top_kernels}
    assert top["gemm"].count == 2 and top["gemm"].total_us == pytest.approx(120)
    assert top["tiny"].mean_us == pytest.approx(5)
    assert top["gemm"].share == pytest.approx(120 / 130)
    ls = d.launch_stats
    assert ls.kernels == 4 and ls.short_kernels == 2  # the two 5 us kernels
    # delays as HTA defines them, from the end of the launch call: gemm's call [t0+1, t0+3) and
    # kernel at t0+10 -> 7 us; tiny's call [t0+3, t0+4) and kernel at t0+80 -> 76 us;
    # median of (7, 7, 76, 76) = 41.5
    assert ls.median_launch_delay_us == pytest.approx(41.5)
    assert ls.long_delay_kernels == 0


def test_memcpy_by_kind_and_idle_histogram(tmp_path):
    d = perfscope.analyze(two_steps(tmp_path)).details
    (h2d,) = d.memcpy
    assert (h2d.direction, h2d.pageable, h2d.count) == ("HtoD", False, 2)
    assert h2d.bytes == 2_000_000
    assert h2d.gb_per_s == pytest.approx(2e6 / 1e9 / 10e-6)  # 2 MB in 10 us = 200 GB/s
    # busy per step: [10,70) [80,85) [90,95); gaps [0,10) [70,80) [85,90) [95,100): 10,10,5,5 us
    hist = d.idle_gaps
    assert hist.edges_us[2] == 10.0
    assert hist.count[1] == 4  # [1, 10): the 5 us gaps, two per step
    assert hist.count[2] == 4  # [10, 100): the 10 us gaps
    assert sum(hist.total_us) == pytest.approx(2 * 30)


def test_what_if_is_the_step_time_without_the_cost_removed_step_by_step(tmp_path):
    a = perfscope.analyze(two_steps(tmp_path))
    steps = a.steps[a.steps["counted"]]
    launch_cost = (steps["launch_cost_frac"] * steps["step_time_us"]).mean()
    entry = {e.class_: e for e in a.details.what_if}["launch"]
    assert entry.step_time_us == pytest.approx(100)
    assert entry.step_time_without_us == pytest.approx(100 - launch_cost)
    assert entry.saved_us_per_step == pytest.approx(launch_cost)
    assert entry.speedup == pytest.approx(100 / (100 - launch_cost))


def test_ranks_and_the_slowest(tmp_path):
    (tmp_path / "d").mkdir()
    two_steps(tmp_path / "d", "rank0.json", rank=0, k_dur=40)
    two_steps(tmp_path / "d", "rank1.json", rank=1, k_dur=60)
    d = perfscope.analyze(tmp_path / "d").details
    assert d.slowest_rank == 1
    by_rank = {r.rank: r for r in d.ranks}
    # compute (kernels) per step: rank 0: 40 + 5 = 45, rank 1: 60 + 5 = 65 -> rank 0 waits 20
    assert by_rank[0].median_compute_us == pytest.approx(45)
    assert by_rank[0].wait_for_slowest_us == pytest.approx(20)
    assert by_rank[1].wait_for_slowest_us == pytest.approx(0)
