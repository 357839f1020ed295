"""perfscope on real Kineto traces, run by run: invariants every run must keep, nanosecond
timestamps, and facts of single traces (communication, ranks, CPU-only, no step markers, the
ResNet-50 input pipelines, the oldest format, a folder as its files together)."""

from __future__ import annotations

import json
from decimal import Decimal

import numpy as np
import pytest
from rawtrace import (
    A100,
    ALEXNET,
    CPU_ONLY,
    CPU_PARTITION,
    CPU_STEP_CATS,
    GPU_CATS,
    GPU_PARTITION,
    NW0_A,
    NW0_B,
    NW4,
    OLD_FORMAT,
    RANK0,
    RANK1,
    RUNS,
    STEP_NAME,
    TOL_US,
    V100_NS,
    analysis,
    cat,
    cpu_step_markers,
    interval,
    open_raw,
    raw_json,
    raw_model,
    union_length,
    x_events,
)

from perfscope.trace import build_table, read_trace

# ---------------------------------------------------------------------------------------------
# Invariants on every run


@pytest.mark.parametrize("rel", RUNS)
def test_partition_adds_up_to_step_time(shared_traces, rel):
    steps = analysis(shared_traces / rel).steps
    for mode, cols in (("gpu", GPU_PARTITION), ("cpu", CPU_PARTITION)):
        s = steps[steps["mode"] == mode]
        if len(s):
            total = s[list(cols)].sum(axis=1).to_numpy()
            np.testing.assert_allclose(total, s["step_time_us"].to_numpy(), rtol=1e-9, atol=1e-3)
            cost = s[[c for c in s.columns if c.endswith("_cost_frac")]].sum(axis=1).to_numpy()
            np.testing.assert_allclose(cost[s["step_time_us"].to_numpy() > 0], 1.0, atol=1e-9)


@pytest.mark.parametrize("rel", RUNS)
def test_no_negative_values_and_busy_within_step(shared_traces, rel):
    steps = analysis(shared_traces / rel).steps
    numeric = [c for c in steps.columns if c.endswith(("_us", "_frac", "_count"))]
    values = steps[numeric].to_numpy(dtype=float)
    assert np.isfinite(values).all()
    assert (values >= 0).all(), steps[numeric].min()[steps[numeric].min() < 0]
    assert (steps["step_time_us"] > 0).all()
    if "gpu_busy_us" in steps:
        g = steps[steps["mode"] == "gpu"]
        assert (g["gpu_busy_us"] <= g["step_time_us"] + 1e-6).all()
        assert (g["compute_us"] <= g["gpu_busy_us"] + 1e-6).all()


# ---------------------------------------------------------------------------------------------
# Nanosecond timestamps


def test_ns_timestamps_keep_sub_microsecond_durations(shared_traces):
    path = shared_traces / V100_NS
    with open_raw(path) as f:
        exact = json.load(f, parse_float=Decimal)  # the digits as written, no float rounding
    xs = x_events(exact)
    table = build_table(read_trace(path))
    assert table.n_events == len(xs)  # one row per duration event, in file order

    exact_dur_ns = np.array([int(Decimal(e.get("dur", 0)) * 1000) for e in xs], dtype=np.int64)
    fractional = [i for i, e in enumerate(xs) if cat(e) == "kernel" and exact_dur_ns[i] % 1000]
    assert len(fractional) > 1000  # most kernels last a fractional number of microseconds
    np.testing.assert_array_equal(table.dur_ns, exact_dur_ns)
    assert (table.dur_ns >= 0).all()

    # Starts: a float64 holds ~1.7e15 us only to 0.25 us, so they are exact to that, not to 1 ns.
    origin = min(Decimal(e["ts"]) for e in xs)
    exact_ts_ns = np.array([int((Decimal(e["ts"]) - origin) * 1000) for e in xs], dtype=np.int64)
    assert np.abs(table.ts_ns - exact_ts_ns).max() <= 250

    steps = analysis(path).steps
    # Sub-microsecond resolution reaches the output.
    assert (steps["step_time_us"] % 1 != 0).any()
    assert (steps["median_kernel_us"] % 1 != 0).any()


# ---------------------------------------------------------------------------------------------
# Per-trace facts


def test_a100_communication(shared_traces):
    path = shared_traces / A100
    xs = x_events(raw_json(path))
    nccl = [e for e in xs if cat(e) == "kernel" and "nccl" in e["name"].lower()]
    assert len(nccl) == 60
    steps = analysis(path).steps
    assert (steps["comm_us"] > 0).all()
    assert steps["comm_kernel_count"].sum() == sum(g["comm"] for s in raw_model(path).steps for g in s.launched)
    # comm_us is the union of the NCCL kernels inside each window.
    for st in raw_model(path).steps:
        comm = union_length([interval(e) for e in nccl], st.start, st.end)
        assert steps.set_index("step").loc[st.number, "comm_us"] == pytest.approx(comm, abs=TOL_US)


def test_two_ranks_are_one_run(shared_traces):
    a = analysis(shared_traces / "hta/two_ranks")
    expected_ranks = sorted(raw_json(shared_traces / f)["distributedInfo"]["rank"] for f in (RANK0, RANK1))
    assert expected_ranks == [0, 1]
    assert sorted(a.steps["rank"].unique()) == expected_ranks
    assert a.ranks_analyzed == 2
    # the job's world size is what the traces record (a 128-rank job), not the ranks analyzed
    assert a.world_size == raw_json(shared_traces / RANK0)["distributedInfo"]["world_size"]
    for rel in (RANK0, RANK1):
        rank = raw_json(shared_traces / rel)["distributedInfo"]["rank"]
        assert a.steps[a.steps["rank"] == rank]["step"].tolist() == sorted(cpu_step_markers(raw_json(shared_traces / rel)))
    assert (a.steps["comm_us"] > 0).all()


def test_cpu_only_trace(shared_traces):
    path = shared_traces / CPU_ONLY
    a = analysis(path)
    assert a.mode == "cpu"
    assert set(a.steps["mode"]) == {"cpu"}
    xs = x_events(raw_json(path))
    assert not [e for e in xs if cat(e) in GPU_CATS]
    (n, (lo, hi)), = cpu_step_markers(raw_json(path)).items()
    gloo = [interval(e) for e in xs if e["name"].startswith("gloo:")]
    comm = union_length(gloo, lo, hi)
    assert comm > 0
    row = a.steps.iloc[0]
    assert row["step"] == n
    assert row["step_time_us"] == pytest.approx(hi - lo, abs=TOL_US)
    assert row["comm_us"] == pytest.approx(comm, abs=TOL_US)


def test_trace_without_step_markers_is_one_window(shared_traces):
    path = shared_traces / ALEXNET
    data = raw_json(path)
    assert not cpu_step_markers(data)
    a = analysis(path)
    assert len(a.steps) == 1 and a.steps["step"].iloc[0] == 0
    assert any("ProfilerStep" in note and "one window" in note for note in a.notes)
    # The window spans the recorded activity, not the profiler's own "Trace" span event.
    xs = [e for e in x_events(data) if cat(e) != "trace"]
    first = min(e["_s"] for e in xs)
    last = max(e["_e"] for e in xs)
    row = a.steps.iloc[0]
    assert row["step_time_us"] == pytest.approx(last - first, abs=TOL_US)
    busy = union_length([interval(e) for e in xs if cat(e) in GPU_CATS], first, last)
    assert row["gpu_busy_us"] == pytest.approx(busy, abs=TOL_US)
    assert row["kernel_count"] == sum(cat(e) == "kernel" for e in xs)


def _io_bound_share(steps) -> float:
    return float((steps["verdict"] == "io-bound").mean())


@pytest.mark.parametrize("rel", ["tb_plugin/resnet50_num_workers_0", NW0_A, NW0_B])
def test_resnet50_without_loader_workers_is_io_bound(shared_traces, rel):
    a = analysis(shared_traces / rel)
    assert _io_bound_share(a.steps) > 0.5
    assert a.verdict.verdict == "io-bound"


def test_resnet50_with_loader_workers_is_not_io_bound(shared_traces):
    a = analysis(shared_traces / "tb_plugin/resnet50_num_workers_4")
    assert _io_bound_share(a.steps) < 0.5
    assert a.verdict.verdict != "io-bound"


@pytest.mark.parametrize("rel", [NW0_A, NW0_B, NW4])
def test_resnet50_dataloader_time_is_the_fetch_ranges(shared_traces, rel):
    """dataloader_us = union of the DataLoader __next__ ranges on the loop's thread, per window."""
    path = shared_traces / rel
    xs = x_events(raw_json(path))
    marker_tid = {e["tid"] for e in xs if STEP_NAME.match(str(e.get("name", ""))) and cat(e) in CPU_STEP_CATS}
    fetch = [interval(e) for e in xs
             if "DataLoader" in e["name"] and e["name"].endswith("__next__") and e["tid"] in marker_tid]
    assert fetch
    rows = analysis(path).steps.set_index("step")
    for st in raw_model(path).steps:
        assert rows.loc[st.number, "dataloader_us"] == pytest.approx(union_length(fetch, st.start, st.end), abs=TOL_US)


def test_old_format_trace_parses(shared_traces):
    path = shared_traces / OLD_FORMAT
    data = raw_json(path)
    assert "computeProperties" in data  # the oldest header
    a = analysis(path)
    assert a.mode == "gpu"
    assert a.steps["step"].tolist() == sorted(cpu_step_markers(data)) == [2]
    assert a.steps["kernel_count"].iloc[0] == sum(cat(e) == "kernel" for e in x_events(data))


@pytest.mark.parametrize("run, files", [
    ("hta/two_ranks", [RANK0, RANK1]),
    ("tb_plugin/resnet50_num_workers_0", [NW0_A, NW0_B]),
])
def test_a_directory_is_its_files_together(shared_traces, run, files):
    """Analyzing a directory measures each file's steps exactly as analyzing that file alone."""
    together = analysis(shared_traces / run).steps
    cols = [c for c in together.columns if c.endswith("_us") or c.endswith("_count")]
    parts = [analysis(shared_traces / f).steps for f in files]
    assert len(together) == sum(len(p) for p in parts)
    for part in parts:
        rank = int(part["rank"].iloc[0])
        mine = together[(together["rank"] == rank) & together["step"].isin(part["step"])]
        np.testing.assert_allclose(mine[cols].to_numpy(float), part[cols].to_numpy(float), rtol=0, atol=1e-6)
