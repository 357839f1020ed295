"""perfscope on real Kineto traces, step by step: the steps found, their windows, GPU busy time,
kernel and copy counts, class times and the idle split, each matched against what rawtrace.py
computes from the raw JSON."""

from __future__ import annotations

import re

import numpy as np
import pytest
from rawtrace import (
    A100,
    AMD,
    CPU_STEP_CATS,
    FILES,
    GPU_FILES_WITH_STEPS,
    STEP_NAME,
    TOL_US,
    RawModel,
    analysis,
    cat,
    cpu_step_markers,
    intersect,
    interval,
    merged,
    raw_json,
    raw_model,
    union_length,
    x_events,
)

from perfscope.analysis.steps import find_steps, launch_times
from perfscope.trace import build_table, read_trace

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
