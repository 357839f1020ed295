"""Helpers of the real-trace tests (``test_real_traces_*.py``): the Kineto traces recorded by public
projects (``../shared/traces``), read independently of perfscope.

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
from pathlib import Path

import perfscope

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


def open_raw(path: Path):
    return gzip.open(path, "rt") if path.name.endswith(".gz") else open(path)


@functools.lru_cache(maxsize=None)
def raw_json(path: Path) -> dict:
    with open_raw(path) as f:
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
