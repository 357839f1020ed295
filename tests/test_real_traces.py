"""perfscope on real Kineto traces recorded by public projects (``../shared/traces``).

Every expectation is computed here from the raw JSON (gzip + json, plain Python loops): step
markers, step windows, GPU busy time as a hand-written sorted-merge union, kernel counts through
correlation ids. Nothing is copied from perfscope's output. Times are microseconds unless a name
says ``_ns``.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

import perfscope
from perfscope.analysis.steps import find_steps, launch_times
from perfscope.trace import build_table, read_trace

# ---------------------------------------------------------------------------------------------
# The traces

A100 = "hta/a100_rank3_of8_train.json.gz"
V100_NS = "hta/v100_single_gpu_ns_timestamps.pt.trace.json.gz"
RANK0 = "hta/two_ranks/rank-0.json.gz"
RANK1 = "hta/two_ranks/rank-1.json.gz"
ALEXNET = "hta/a100_alexnet_no_profiler_steps.json.gz"
CPU_ONLY = "hta/cpu_only_rank34.pt.trace.json.gz"
AMD = "hta/amd_mi250_rocm_train.json.gz"
NW0_A = "tb_plugin/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
NW0_B = "tb_plugin/resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz"
NW4 = "tb_plugin/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz"
OLD_FORMAT = "tb_plugin/test/gpu_metrics_input.json"

FILES = [A100, V100_NS, RANK0, RANK1, ALEXNET, CPU_ONLY, AMD, NW0_A, NW0_B, NW4, OLD_FORMAT]
GPU_FILES = [f for f in FILES if f != CPU_ONLY]
GPU_FILES_WITH_STEPS = [f for f in GPU_FILES if f != ALEXNET]
# What `perfscope analyze` is pointed at: every file alone, and the directories as one run.
RUNS = FILES + [
    "hta/two_ranks",
    "tb_plugin/resnet50_num_workers_0",
    "tb_plugin/resnet50_num_workers_4",
]

GPU_PARTITION = (
    "compute_us",
    "exposed_comm_us",
    "exposed_h2d_us",
    "exposed_other_mem_us",
    "input_wait_us",
    "launch_wait_us",
    "h2d_wait_us",
    "kernel_wait_us",
    "other_idle_us",
)
CPU_PARTITION = ("dataloader_us", "operator_us", "exposed_comm_us", "framework_overhead_us")

TOL_US = 1.0

# ---------------------------------------------------------------------------------------------
# Reading the raw JSON, independently of perfscope


def _open(path: Path):
    return gzip.open(path, "rt") if path.name.endswith(".gz") else open(path)


@functools.lru_cache(maxsize=None)
def raw_json(path: Path) -> dict:
    with _open(path) as f:
        data = json.load(f)
    return {"traceEvents": data} if isinstance(data, list) else data


@functools.lru_cache(maxsize=None)
def analysis(path: Path):
    return perfscope.analyze(path)


STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
# Where a training loop's ProfilerStep# range is recorded: current Kineto writes it as a
# user_annotation (record_function), 2021 traces file it under Operator; gpu_user_annotation is
# its projection onto a GPU stream and is not a step of the loop.
CPU_STEP_CATS = {"user_annotation", "cpu_op", "operator"}
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime"}


def cat(e: dict) -> str:
    return str(e.get("cat", "")).lower()


def x_events(data: dict) -> list[dict]:
    """The duration events, each given ``_s`` and ``_e``: start and end relative to the first one.

    ``ts`` is ~1.7e15 us, where a float64 is exact only to 0.25 us; adding ``dur`` at that
    magnitude would round every end. The difference of two such floats is exact, so the first
    timestamp is subtracted before ``dur`` is added.
    """
    xs = [e for e in data["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
    if xs and "_s" not in xs[0]:
        origin = min(float(e["ts"]) for e in xs)
        for e in xs:
            e["_s"] = float(e["ts"]) - origin
            e["_e"] = e["_s"] + float(e.get("dur", 0) or 0)
    return xs


def interval(e: dict) -> tuple[float, float]:
    return e["_s"], e["_e"]


def cpu_step_markers(data: dict) -> dict[int, tuple[float, float]]:
    """Step number -> (start, end) of its CPU-side ProfilerStep# range (the earliest if repeated)."""
    steps: dict[int, tuple[float, float]] = {}
    for e in x_events(data):
        m = STEP_NAME.match(str(e.get("name", "")))
        if m and cat(e) in CPU_STEP_CATS:
            n = int(m.group(1))
            if n not in steps or e["_s"] < steps[n][0]:
                steps[n] = interval(e)
    return steps


@dataclass
class RawStep:
    number: int
    cpu_start: float
    cpu_end: float
    gpu_end: float = float("-inf")  # end of the GPU work launched in the step
    start: float = 0.0  # the step window
    end: float = 0.0
    launched: list = field(default_factory=list)  # GPU events (dicts below) launched in the step


@dataclass
class RawModel:
    steps: list[RawStep]
    gpu: list[dict]  # every kernel / memcpy / memset: s, e, launch (None if unlinked), kind, name
    main_thread: tuple | None  # (pid, tid) of the ProfilerStep ranges
    horizon: float  # end of the last event of the trace

    def spans(self, predicate=lambda g: True) -> list[tuple[float, float]]:
        return [(g["s"], g["e"]) for g in self.gpu if predicate(g)]


def _gpu_kind(e: dict) -> str:
    c = cat(e)
    return "kernel" if c == "kernel" else "memset" if c in ("gpu_memset", "memset") else "memcpy"


def build_raw_model(data: dict) -> RawModel:
    """Steps and their windows as perfscope's steps.py docstring defines them, from first principles.

    A GPU event belongs to the step whose CPU span holds the start of the runtime call with the
    same correlation id (or, without one, the event's own start). The window starts with the CPU
    span and ends at max(CPU end, end of the step's GPU work), but not after the next step starts.
    """
    xs = x_events(data)
    markers = sorted(cpu_step_markers(data).items(), key=lambda kv: kv[1][0])
    steps = [RawStep(n, s, e) for n, (s, e) in markers]
    launch_ts, launch_end = {}, {}
    for e in xs:
        corr = (e.get("args") or {}).get("correlation")
        if cat(e) in RUNTIME_CATS and corr is not None:
            launch_ts[corr] = e["_s"]
            launch_end[corr] = e["_e"]
    gpu = []
    for e in xs:
        if cat(e) not in GPU_CATS:
            continue
        name = str(e.get("name", ""))
        g = {
            "s": e["_s"],
            "e": e["_e"],
            "launch": launch_ts.get((e.get("args") or {}).get("correlation")),
            "launch_end": launch_end.get((e.get("args") or {}).get("correlation")),
            "kind": _gpu_kind(e),
            "name": name,
            "comm": _gpu_kind(e) == "kernel" and bool(re.search("nccl|rccl", name, re.I)),
            "h2d": _gpu_kind(e) == "memcpy" and "htod" in name.lower().replace(" ", ""),
        }
        gpu.append(g)
        anchor = g["launch"] if g["launch"] is not None else g["s"]
        for st in steps:
            if st.cpu_start <= anchor < st.cpu_end:
                st.gpu_end = max(st.gpu_end, g["e"])
                st.launched.append(g)
                break
    for i, st in enumerate(steps):
        nxt = steps[i + 1].cpu_start if i + 1 < len(steps) else float("inf")
        st.start = st.cpu_start
        st.end = min(max(st.cpu_end, st.gpu_end), nxt)
    threads = Counter((e.get("pid"), e.get("tid")) for e in xs
                      if STEP_NAME.match(str(e.get("name", ""))) and cat(e) in CPU_STEP_CATS)
    main = threads.most_common(1)[0][0] if threads else None
    return RawModel(steps, gpu, main, max(e["_e"] for e in xs))


def merged(intervals) -> list[tuple[float, float]]:
    """Union of intervals as a sorted list of disjoint ones: a plain sorted-merge loop."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def intersect(a, b) -> list[tuple[float, float]]:
    """Intersection of two sorted disjoint interval lists (two pointers)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def union_length(intervals, lo: float, hi: float) -> float:
    """Length of the union of ``intervals`` clipped to [lo, hi)."""
    return sum(min(e, hi) - max(s, lo) for s, e in merged(intervals) if min(e, hi) > max(s, lo))


@functools.lru_cache(maxsize=None)
def raw_model(path: Path) -> RawModel:
    return build_raw_model(raw_json(path))


# ---------------------------------------------------------------------------------------------
# Steps


@pytest.mark.parametrize("rel", FILES)
def test_steps_are_the_cpu_side_profiler_steps(shared_traces, rel):
    path = shared_traces / rel
    expected = sorted(cpu_step_markers(raw_json(path)))
    a = analysis(path)
    got = a.steps["step"].tolist()
    if expected:
        assert got == expected
        assert len(a.steps) == len(set(expected))
    else:  # no markers: the whole trace is one window, numbered 0
        assert got == [0]


def test_amd_repeated_gpu_side_step_is_not_a_second_row(shared_traces):
    path = shared_traces / AMD
    xs = x_events(raw_json(path))
    gpu_side = [int(STEP_NAME.match(e["name"]).group(1)) for e in xs
                if cat(e) == "gpu_user_annotation" and STEP_NAME.match(str(e.get("name", "")))]
    cpu_side = sorted(cpu_step_markers(raw_json(path)))
    assert gpu_side and set(gpu_side) <= set(cpu_side)  # the case this test is about
    all_markers = len(cpu_side) + len(gpu_side)
    a = analysis(path)
    assert len(a.steps) == len(cpu_side) < all_markers
    assert a.steps["step"].tolist() == cpu_side


@pytest.mark.parametrize("rel", GPU_FILES_WITH_STEPS)
def test_step_windows_and_gpu_busy_match_raw_union(shared_traces, rel):
    path = shared_traces / rel
    model = raw_model(path)
    rows = analysis(path).steps.set_index("step")
    assert len(rows) == len(model.steps)
    for st in model.steps:
        r = rows.loc[st.number]
        assert r["cpu_span_us"] == pytest.approx(st.cpu_end - st.cpu_start, abs=TOL_US)
        assert r["step_time_us"] == pytest.approx(st.end - st.start, abs=TOL_US), st.number
        extended = max(st.cpu_end, st.gpu_end) - st.cpu_start
        assert r["gpu_extended_span_us"] == pytest.approx(extended, abs=TOL_US), st.number
        busy = union_length(model.spans(), st.start, st.end)
        assert r["gpu_busy_us"] == pytest.approx(busy, abs=TOL_US), st.number
        assert r["gpu_idle_us"] == pytest.approx((st.end - st.start) - busy, abs=TOL_US)


def test_a100_middle_step_window_bounds(shared_traces):
    """Step 1011 of the A100 trace: the window bounds themselves, and a busy union on a slice."""
    path = shared_traces / A100
    model = raw_model(path)
    i = [s.number for s in model.steps].index(1011)
    st, nxt = model.steps[i], model.steps[i + 1]
    # Its GPU work outlasts its CPU span and the next step starts later: the GPU end is the bound.
    assert st.cpu_end < st.gpu_end < nxt.cpu_start
    assert st.end == st.gpu_end

    table = build_table(read_trace(path))
    windows = find_steps(table, launch_times(table))
    j = list(windows.step).index(1011)
    # Both sides relative to the trace's first duration event (integer microseconds here).
    origin = min(float(e["ts"]) for e in x_events(raw_json(path)))
    start_us = table.origin_us - origin + windows.start[j] / 1000
    end_us = table.origin_us - origin + windows.end[j] / 1000
    assert start_us == pytest.approx(st.cpu_start, abs=TOL_US)
    assert end_us == pytest.approx(st.gpu_end, abs=TOL_US)

    # The GPU events on the slice; several streams overlap, so a plain sum overcounts.
    inside = [(s, e) for s, e in model.spans() if e > st.start and s < st.end]
    clipped_sum = sum(min(e, st.end) - max(s, st.start) for s, e in inside)
    busy = union_length(inside, st.start, st.end)
    assert busy < clipped_sum - 1000  # streams overlap by over a millisecond in this step
    assert analysis(path).steps.set_index("step").loc[1011, "gpu_busy_us"] == pytest.approx(busy, abs=TOL_US)


@pytest.mark.parametrize("rel", GPU_FILES_WITH_STEPS)
def test_kernel_and_memcpy_counts_follow_the_launching_call(shared_traces, rel):
    path = shared_traces / rel
    model = raw_model(path)
    rows = analysis(path).steps.set_index("step")
    for st in model.steps:
        kernels = [g for g in st.launched if g["kind"] == "kernel"]
        copies = [g for g in st.launched if g["kind"] == "memcpy"]
        r = rows.loc[st.number]
        assert r["kernel_count"] == len(kernels), st.number
        assert r["comm_kernel_count"] == sum(g["comm"] for g in kernels), st.number
        assert r["memcpy_count"] == len(copies), st.number
        assert r["pageable_memcpy_count"] == sum("pageable" in g["name"].lower() for g in copies), st.number
        median = float(np.median([g["e"] - g["s"] for g in kernels])) if kernels else 0.0
        assert r["median_kernel_us"] == pytest.approx(median, abs=0.01), st.number


@pytest.mark.parametrize("rel", GPU_FILES_WITH_STEPS)
def test_class_times_match_raw_unions(shared_traces, rel):
    """compute / comm / h2d and their exposed parts, per window, from unions and intersections."""
    path = shared_traces / rel
    model = raw_model(path)
    C = merged(model.spans(lambda g: g["kind"] == "kernel" and not g["comm"]))
    M = merged(model.spans(lambda g: g["comm"]))
    H = merged(model.spans(lambda g: g["h2d"]))
    O = merged(model.spans(lambda g: g["kind"] != "kernel" and not g["h2d"]))
    CM = merged(C + M)
    CMH = merged(CM + H)
    rows = analysis(path).steps.set_index("step")
    for st in model.steps:
        r = rows.loc[st.number]

        def length(iv):
            return union_length(iv, st.start, st.end)

        assert r["compute_us"] == pytest.approx(length(C), abs=TOL_US), st.number
        assert r["comm_us"] == pytest.approx(length(M), abs=TOL_US), st.number
        assert r["exposed_comm_us"] == pytest.approx(length(M) - length(intersect(M, C)), abs=TOL_US)
        assert r["h2d_us"] == pytest.approx(length(H), abs=TOL_US), st.number
        assert r["exposed_h2d_us"] == pytest.approx(length(H) - length(intersect(H, CM)), abs=TOL_US)
        assert r["exposed_other_mem_us"] == pytest.approx(length(O) - length(intersect(O, CMH)), abs=TOL_US)


KERNEL_WAIT_US = 10.0  # steps.py / gpu_metrics.py: a queued gap up to 10 us is launch latency


def raw_idle_split(model: RawModel) -> dict[str, list[tuple[float, float]]]:
    """Every GPU idle gap cut as gpu_metrics.py's docstring says.

    A gap runs from the end of one busy stretch (the trace's start for the first) to the start of
    the next; the GPU event that opens the next stretch was launched by a runtime call [L0, L1).
    Host wait runs until L1 for a kernel (the host was inside a blocking launch) and until L0 for
    a host-to-device copy; the rest is queued: h2d wait if that event is a host-to-device copy,
    else kernel wait if at most 10 us, else other. After the last GPU event: host wait.
    Where several events open a stretch together, the earliest launch counts.
    """
    busy = merged(model.spans())
    opening: dict[float, list[dict]] = {}
    for g in model.gpu:
        opening.setdefault(g["s"], []).append(g)
    host, kernel_wait, copy_wait = [], [], []
    prev_end = 0.0
    for s, e in busy:
        launched = [g for g in opening[s] if g["launch"] is not None]
        nxt = min(launched, key=lambda g: g["launch"]) if launched else opening[s][0]
        done = nxt["launch"] if nxt["h2d"] else nxt["launch_end"]
        host_end = min(max(done, prev_end), s) if nxt["launch"] is not None else prev_end
        host.append((prev_end, host_end))
        if nxt["h2d"]:
            copy_wait.append((host_end, s))
        elif s - host_end <= KERNEL_WAIT_US:
            kernel_wait.append((host_end, s))
        prev_end = e
    host.append((prev_end, max(model.horizon, prev_end)))
    return {"host": merged(host), "kernel": merged(kernel_wait), "copy": merged(copy_wait)}


@pytest.mark.parametrize("rel", GPU_FILES_WITH_STEPS)
def test_idle_split_matches_raw_gaps(shared_traces, rel):
    path = shared_traces / rel
    model = raw_model(path)
    split = raw_idle_split(model)
    xs = x_events(raw_json(path))
    fetch = merged([interval(e) for e in xs if cat(e) in CPU_STEP_CATS
                    and re.search(r"DataLoader.*__next__", str(e.get("name", "")))
                    and (e.get("pid"), e.get("tid")) == model.main_thread])
    rows = analysis(path).steps.set_index("step")
    for st in model.steps:
        r = rows.loc[st.number]

        def length(iv):
            return union_length(iv, st.start, st.end)

        host = length(split["host"])
        input_wait = length(intersect(split["host"], fetch))
        assert r["input_wait_us"] == pytest.approx(input_wait, abs=TOL_US), st.number
        assert r["launch_wait_us"] == pytest.approx(host - input_wait, abs=TOL_US), st.number
        assert r["h2d_wait_us"] == pytest.approx(length(split["copy"]), abs=TOL_US), st.number
        assert r["kernel_wait_us"] == pytest.approx(length(split["kernel"]), abs=TOL_US), st.number


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
    with _open(path) as f:
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
