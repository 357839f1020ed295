"""Memory per step: the probe (live on this machine, CUDA through an injected torch.cuda), the
host record's memory fields read back, the run's memory view, its headroom and the near-limit flag."""

from __future__ import annotations

import sys
import types

import pytest
from tracegen import cpu_op, kernel, launch, step
from tracekit import analyze

from perfscope.collect import memory as probe_mod
from perfscope.collect.memory import MemoryProbe
from perfscope.record.host_steps import HOST_STEPS_KEY, parse, parse_capacity

GIB = 2**30


def test_the_probe_reads_this_process_peak_resident_set_per_step():
    p = MemoryProbe()
    p.begin()
    block = bytearray(64 * 2**20)  # 64 MiB touched inside the "step"
    block[::4096] = b"x" * len(block[::4096])
    got = p.end()
    del block
    if not probe_mod._status_kib("VmHWM"):
        pytest.skip("no /proc/self/status here")
    assert got["peak_rss_bytes"] >= 64 * 2**20
    assert got["device_peak_allocated_bytes"] is None  # no CUDA here, and perfscope never initialises it
    cap = p.capacity()
    assert cap["host_total_bytes"] > got["peak_rss_bytes"]
    assert "device_total_bytes" not in cap


class FakeCuda:
    """torch.cuda's memory API as the probe uses it, on a device of 80 GiB."""

    def __init__(self):
        self.resets = 0

    def is_initialized(self):
        return True

    def reset_peak_memory_stats(self):
        self.resets += 1

    def max_memory_allocated(self):
        return 30 * GIB

    def max_memory_reserved(self):
        return 34 * GIB

    def current_device(self):
        return 1

    def mem_get_info(self, index):
        return (10 * GIB, 80 * GIB)


def test_the_probe_reads_the_cuda_allocator_when_the_script_initialised_it(monkeypatch):
    cuda = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    p = MemoryProbe()
    p.begin()
    got = p.end()
    assert cuda.resets == 1
    assert (got["device_peak_allocated_bytes"], got["device_peak_reserved_bytes"]) == (30 * GIB, 34 * GIB)
    assert p.capacity()["device_total_bytes"] == 80 * GIB and p.capacity()["device"] == "cuda:1"


def test_cuda_not_initialised_is_left_alone(monkeypatch):
    cuda = FakeCuda()
    cuda.is_initialized = lambda: False
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    p = MemoryProbe()
    p.begin()
    assert p.end()["device_peak_reserved_bytes"] is None and cuda.resets == 0


def test_record_parsing_refuses_what_is_not_memory():
    steps, _ = parse({"steps": [{"step": 1, "wall_us": 10, "thread_cpu_us": 5, "peak_rss_bytes": 123,
                                 "device_peak_reserved_bytes": -4, "device_peak_allocated_bytes": 2**70}]})
    assert steps[1].peak_rss_bytes == 123
    assert steps[1].device_peak_reserved_bytes is None and steps[1].device_peak_allocated_bytes is None
    assert parse_capacity({"memory": {"host_total_bytes": 8 * GIB, "device_total_bytes": "80G", "device": 3}}) == {
        "host_total_bytes": 8 * GIB}
    assert parse_capacity({"steps": []}) == {} and parse_capacity(None) == {}


def gpu_steps(n=4):
    events = []
    for i in range(n):
        t0 = 1000 * i
        events += [step(i + 1, t0, 1000), cpu_op("aten::mm", t0 + 5, 100),
                   *launch("gemm", t0 + 10, t0 + 20, 900, correlation=i + 1)]
    return events


def record(reserved_gib, allocated_gib=None, capacity_gib=80, n=4):
    steps = [{"step": i + 1, "wall_us": 1000, "thread_cpu_us": 990, "process_cpu_us": 995, "run_queue_us": 0,
              "device_peak_allocated_bytes": int((allocated_gib or reserved_gib - 2) * GIB) + i,
              "device_peak_reserved_bytes": int(reserved_gib * GIB) - (i % 2)} for i in range(n)]
    return {HOST_STEPS_KEY: {"version": 1, "steps": steps, "memory": {"device_total_bytes": capacity_gib * GIB,
                                                                      "host_total_bytes": 64 * GIB, "device": "cuda:0"}}}


def test_device_memory_view_peak_capacity_and_headroom(tmp_path):
    a = analyze(tmp_path, gpu_steps(), **record(40))
    m = a.details.memory
    assert m["kind"] == "device" and m["peak_bytes"] == 40 * GIB
    assert m["capacity_bytes"] == 80 * GIB and m["headroom_share"] == pytest.approx(0.5)
    assert not m["near_limit"]
    (r,) = m["ranks"]
    assert r["peak_allocated_bytes"] == 38 * GIB + 3 and r["peak_reserved_bytes"] == 40 * GIB
    counted = a.steps[a.steps["counted"]]
    assert counted["device_peak_reserved_bytes"].notna().all() and "peak_rss_bytes" not in a.steps
    summary = a.summary()
    assert summary["details"]["memory"]["peak_bytes"] == 40 * GIB


def test_a_run_near_its_memory_limit_is_flagged(tmp_path):
    a = analyze(tmp_path, gpu_steps(), **record(76))
    assert a.details.memory["near_limit"]
    assert any("device memory is near its limit" in w and "5% headroom" in w for w in a.warnings)


def test_capacity_from_the_trace_device_properties_when_not_recorded(tmp_path):
    meta = record(20)
    del meta[HOST_STEPS_KEY]["memory"]
    meta["deviceProperties"] = [{"id": 0, "name": "NVIDIA A100", "totalGlobalMem": 40 * GIB}]
    m = analyze(tmp_path, gpu_steps(), **meta).details.memory
    assert m["capacity_bytes"] == 40 * GIB and m["headroom_share"] == pytest.approx(0.5)


def test_no_memory_record_no_view(tmp_path):
    a = analyze(tmp_path, gpu_steps())
    assert a.details.memory is None
    events = [step(1, 0, 1000), kernel("k", 10, 10)]
    assert analyze(tmp_path, events, name="t2.json").details.memory is None


def test_host_memory_of_ranks_on_one_machine_is_summed(tmp_path):
    import perfscope
    from tracegen import write_trace

    (tmp_path / "d").mkdir()
    for rank in (0, 1):
        steps = [{"step": i + 1, "wall_us": 1000, "thread_cpu_us": 990, "process_cpu_us": 995, "run_queue_us": 0,
                  "peak_rss_bytes": (3 + rank) * GIB} for i in range(3)]
        events = []
        for i in range(3):
            events += [step(i + 1, 1000 * i, 1000), cpu_op("aten::addmm", 1000 * i + 10, 900)]
        write_trace(tmp_path / "d" / f"rank{rank}.json", events, host_name="node-a",
                    distributedInfo={"backend": "gloo", "rank": rank, "world_size": 2},
                    **{HOST_STEPS_KEY: {"version": 1, "steps": steps, "memory": {"host_total_bytes": 8 * GIB}}})
    m = perfscope.analyze(tmp_path / "d").details.memory
    assert m["kind"] == "host" and m["peak_bytes"] == 4 * GIB
    assert [r["headroom_bytes"] for r in m["ranks"]] == [1 * GIB, 1 * GIB]  # 8 - (3 + 4)
    assert m["near_limit"] is False and m["headroom_share"] == pytest.approx(0.125)


def test_peaks_above_the_capacity_are_said_and_the_summary_stays_readable(tmp_path):
    import perfscope
    from perfscope.record import load_summary, write_summary

    a = analyze(tmp_path, gpu_steps(), **record(90, allocated_gib=85, capacity_gib=80))
    m = a.details.memory
    assert m["ranks"][0]["capacity_bytes"] is None and m["headroom_share"] is None
    assert any("above the device's capacity" in w for w in a.warnings)
    write_summary(a.summary(), tmp_path / "s.json")
    load_summary(tmp_path / "s.json")  # accepted by report, diff and check
    (tmp_path / "d").mkdir()
    from tracegen import write_trace

    for rank in (0, 1):
        steps = [{"step": i + 1, "wall_us": 1000, "thread_cpu_us": 990, "process_cpu_us": 995, "run_queue_us": 0,
                  "peak_rss_bytes": 6 * GIB} for i in range(3)]
        events = []
        for i in range(3):
            events += [step(i + 1, 1000 * i, 1000), cpu_op("aten::addmm", 1000 * i + 10, 900)]
        write_trace(tmp_path / "d" / f"rank{rank}.json", events, host_name="node-a",
                    distributedInfo={"backend": "gloo", "rank": rank, "world_size": 2},
                    **{HOST_STEPS_KEY: {"version": 1, "steps": steps, "memory": {"host_total_bytes": 8 * GIB}}})
    b = perfscope.analyze(tmp_path / "d")
    assert b.details.memory["headroom_bytes"] == -4 * GIB
    assert any("add up to 4.00 GiB more than its 8.0 GiB" in w for w in b.warnings)
    write_summary(b.summary(), tmp_path / "b.json")
    load_summary(tmp_path / "b.json")


def test_host_figures_beyond_any_measurement_are_refused():
    steps, unusable = parse({"steps": [{"step": 1, "wall_us": 10, "thread_cpu_us": 1e300}]})
    assert steps == {} and unusable == 1
