"""The operator view (``details.operators``): nesting, self and device time, shapes, worked out by
hand on small traces; invariants on a real one."""

from __future__ import annotations

import gzip
import json

import msgspec
import pytest

from tracegen import cpu_op, event, kernel, launch, runtime, step, write_trace

import perfscope
from perfscope.analysis.nesting import innermost, parents


def _rows(analysis) -> dict:
    return {r["name"]: r for r in msgspec.to_builtins(analysis.details.operators)["rows"]}


def test_self_and_device_time_follow_the_nesting_on_every_thread(tmp_path):
    events = [
        step(1, 1000, 1000),
        cpu_op("aten::linear", 1100, 400),
        event("cpu_op", "aten::addmm", 1150, 300, **{"Input Dims": [[8, 4], [4, 4]]}),
        cpu_op("aten::empty", 1160, 10),
        *launch("gemm", 1200, 1300, 100, 1),  # launched inside aten::addmm
        cpu_op("aten::mm", 1600, 100, tid=2),  # autograd's thread
        runtime("cudaLaunchKernel", 1650, 1, 2, tid=2), kernel("gemm2", 1700, 50, 2),
        *launch("orphan", 1800, 1850, 20, 3),  # launched outside any operator: no one's
    ]
    a = perfscope.analyze(write_trace(tmp_path / "t.json", events))
    view = msgspec.to_builtins(a.details.operators)
    rows = _rows(a)
    assert view["operators"] == 4 and view["calls"] == 4 and view["with_shapes"] is True
    # linear [1100,1500) holds addmm [1150,1450), which holds empty [1160,1170) and the launch at 1200
    assert rows["aten::linear"] | {"shapes": None} == {"name": "aten::linear", "calls": 1, "host_us": 400,
                                                        "host_self_us": 100, "device_us": 100, "device_self_us": 0,
                                                        "shapes": None}
    assert (rows["aten::addmm"]["host_self_us"], rows["aten::addmm"]["device_self_us"]) == (290, 100)
    assert rows["aten::addmm"]["shapes"] == [{"input_dims": "[[8,4],[4,4]]", "calls": 1, "host_us": 300,
                                              "host_self_us": 290, "device_us": 100, "device_self_us": 100}]
    assert (rows["aten::mm"]["device_us"], rows["aten::mm"]["device_self_us"]) == (50, 50)
    assert rows["aten::empty"]["shapes"] == []  # recorded without shapes
    # a GPU run: by device self time, then device time
    assert [r["name"] for r in view["rows"]] == ["aten::addmm", "aten::mm", "aten::linear", "aten::empty"]


def test_a_cpu_run_ranks_by_host_self_time_and_damaged_nesting_is_no_parent(tmp_path):
    events = [step(1, 1000, 1000), cpu_op("aten::a", 1100, 100), cpu_op("aten::b", 1150, 200),  # b overlaps a
              cpu_op("aten::c", 1400, 300), cpu_op("aten::d", 1450, 50)]
    view = msgspec.to_builtins(perfscope.analyze(write_trace(tmp_path / "t.json", events)).details.operators)
    rows = {r["name"]: r for r in view["rows"]}
    assert rows["aten::a"]["host_self_us"] == 100 and rows["aten::b"]["host_self_us"] == 200
    assert rows["aten::c"]["host_self_us"] == 250 and rows["aten::d"]["host_self_us"] == 50
    assert [r["name"] for r in view["rows"]] == ["aten::c", "aten::b", "aten::a", "aten::d"]
    assert all(r["device_us"] == 0 for r in view["rows"])


def test_nesting_helpers():
    # [0,10) holds [2,5) and [5,9); [5,9) holds [6,7); [12,20) and [15,25) overlap: neither holds the
    # other, and a moment in both goes to the later one
    starts, ends = [0, 2, 5, 6, 12, 15], [10, 5, 9, 7, 20, 25]
    assert parents(starts, ends).tolist() == [-1, 0, 0, 2, -1, -1]
    skip = [False, False, False, True, False, False]
    assert innermost(starts, ends, skip, [1, 3, 6.5, 9.5, 11, 16]).tolist() == [0, 1, 2, 0, -1, 5]


def test_operator_steps_are_summed_over_the_counted_steps_only(tmp_path):
    events = []
    for n in (1, 2, 3):
        events += [step(n, n * 1000, 1000), cpu_op("aten::mul", n * 1000 + 100, 10 * n)]
    a = perfscope.analyze(write_trace(tmp_path / "t.json", events))
    counted = sorted(a.steps["step"].tolist())
    row = _rows(a)["aten::mul"]
    assert row["calls"] == len(counted) and row["host_us"] == sum(10 * n for n in counted)


def test_a_real_trace_keeps_its_invariants(shared_traces):
    path = shared_traces / "tb_plugin" / "resnet50_num_workers_0" / "worker0.1623143089861.pt.trace.json.gz"
    a = perfscope.analyze(path)
    view = msgspec.to_builtins(a.details.operators)
    assert view["with_shapes"] and len(view["rows"]) == 30 and view["skipped"] == 0
    for r in view["rows"]:
        assert 0 <= r["host_self_us"] <= r["host_us"] + 1e-6 and 0 <= r["device_self_us"] <= r["device_us"] + 1e-6
        assert sum(s["calls"] for s in r["shapes"]) <= r["calls"]
    selfs = [r["device_self_us"] for r in view["rows"]]
    assert selfs == sorted(selfs, reverse=True)
    # the convolutions' own kernels lead a ResNet-50's device time
    assert view["rows"][0]["name"].startswith("aten::cudnn_convolution")
    # what the operators launched is at most the GPU work of the whole file
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    gpu_us = sum(e["dur"] for e in events if e.get("ph") == "X" and e.get("cat") in ("Kernel", "Memcpy", "Memset"))
    assert 0 < sum(selfs) <= gpu_us


def test_a_redispatch_to_the_same_operator_counts_once_as_key_averages(tmp_path):
    # step 1: aten::add with one aten::add inside (a redispatch: one call), then aten::to holding two
    # aten::to calls of its own (three calls): the profiler's own table counts 1 and 3
    events = [step(1, 0, 1000), cpu_op("aten::add", 10, 100), cpu_op("aten::add", 20, 60),
              cpu_op("aten::to", 200, 300), cpu_op("aten::to", 210, 50), cpu_op("aten::to", 300, 50)]
    a = perfscope.analyze(write_trace(tmp_path / "t.json", events))
    rows = {r["name"]: r for r in msgspec.to_builtins(a.details.operators)["rows"]}
    assert rows["aten::add"]["calls"] == 1
    assert rows["aten::add"]["host_us"] == pytest.approx(100) and rows["aten::add"]["host_self_us"] == pytest.approx(100)
    assert rows["aten::to"]["calls"] == 3 and rows["aten::to"]["host_self_us"] == pytest.approx(300)
