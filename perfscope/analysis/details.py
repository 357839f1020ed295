"""Run-level detail for the report: what-if estimates, top kernels, launch statistics, memcpy by
kind, the idle-gap histogram, the per-rank view with the straggler, and the advice per class.

Everything is taken over the *counted* steps (steps with status ``ok`` that every rank holds) so
that it agrees with the verdict. Times are microseconds. Definitions are in ``docs/metrics.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope import steptime
from perfscope.analysis.intervals import union, window_segments
from perfscope.analysis.gpu_efficiency import capability, gpu_efficiency, kernel_sums
from perfscope.analysis.memory import memory_view
from perfscope.analysis.module_view import module_view
from perfscope.analysis.operator_view import operator_view
from perfscope.analysis.mfu import math_of_kernels, mfu_view
from perfscope.analysis.run_view import run_steps_view
from perfscope.analysis.trace_memory import trace_memory_view
from perfscope.analysis.telemetry import telemetry_view
from perfscope.analysis.nodes import node_of_ranks, node_view, subgroup_count
from perfscope.analysis.operators import top_level_ops
from perfscope.analysis.ranks import collective_skew, rank_rows
from perfscope.analysis.steps import graph_launched
from perfscope.analysis.verdict import CLASSES, advice_for, knobs_for
from perfscope.analysis.waits import merge_waits, other_waits
from perfscope.record.schema import Advice, Details, Facts, IdleGaps, LaunchStats, MemcpyRow, TopRow, WhatIf
from perfscope.trace.kinds import GPU_KINDS, CopyKind, EventKind, copy_kind_of_names, is_pageable_copy

if TYPE_CHECKING:
    from perfscope.analysis.rank_trace import RankTrace

TOP_N = 20
SHORT_KERNEL_US = 10.0  # a kernel this short costs about what launching it does
LONG_LAUNCH_DELAY_US = 100.0  # a kernel starting this long after its launch call waited in a queue
IDLE_GAP_EDGES_US = (0.0, 1.0, 10.0, 100.0, 1_000.0, 10_000.0, 100_000.0, np.inf)
_DIRECTION = {CopyKind.HTOD: "HtoD", CopyKind.DTOH: "DtoH", CopyKind.DTOD: "DtoD", CopyKind.PTOP: "PtoP", CopyKind.OTHER: "other"}


def what_if(frame: pd.DataFrame) -> list[WhatIf]:
    """Upper bounds of the gain from removing each removable cause (:func:`perfscope.steptime.what_if`,
    the rule the report shares).

    Args:
        frame: Counted steps with ``rank``, ``step``, ``step_time_us`` and ``<class>_cost_frac``.
    """
    return [WhatIf(class_=w["class"], step_time_us=w["step_time_us"], step_time_without_us=w["step_time_without_us"],
                   saved_us_per_step=w["saved_us_per_step"], speedup=w["speedup"])
            for w in steptime.what_if(frame.to_dict(orient="records"))]


def _top(names: np.ndarray, durations_us: np.ndarray) -> list[TopRow]:
    if names.size == 0:
        return []
    df = pd.DataFrame({"name": names, "dur": durations_us})
    g = df.groupby("name", sort=False)["dur"].agg(["count", "sum"]).sort_values("sum", ascending=False)
    total = float(df["dur"].sum()) or 1.0
    return [
        TopRow(name=str(n), count=int(r["count"]), total_us=float(r["sum"]),
               mean_us=float(r["sum"]) / int(r["count"]), share=float(r["sum"]) / total)
        for n, r in g.head(TOP_N).iterrows()
    ]


def _counted_rows(rt: RankTrace, counted_steps: set) -> np.ndarray:
    """Event rows that are GPU work of a counted step."""
    idx = np.flatnonzero(np.isin(rt.windows.step, list(counted_steps)))
    return np.isin(rt.windows.gpu_step, idx) & (rt.windows.gpu_step >= 0)


def _launch_delay_us(rt: RankTrace, kernel_rows: np.ndarray, graph: np.ndarray) -> np.ndarray:
    """Launch delay of each kernel as Holistic Trace Analysis defines it: kernel start minus the
    *end* of its launch call, clipped at 0 (``hta/analyzers/cuda_kernel_analysis.py``,
    ``cuda_kernel_launch_stats``); -1 where no launch call is recorded, and for kernels replayed
    from a CUDA graph (``graph``: one ``cudaGraphLaunch`` runs many kernels, which wait in the
    graph, not in the launch queue)."""
    t = rt.table
    end = rt.launches.end_of(kernel_rows)
    delay = np.where(end >= 0, np.maximum(t.ts_ns[kernel_rows] - end, 0) / 1000.0, -1.0)
    return np.where(graph, -1.0, delay)


def _launch_stats(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> LaunchStats | None:
    dur = np.concatenate([d for d, _, _ in parts]) if parts else np.zeros(0)
    delay = np.concatenate([x for _, x, _ in parts]) if parts else np.zeros(0)
    graph = np.concatenate([g for _, _, g in parts]) if parts else np.zeros(0, bool)
    if dur.size == 0:
        return None
    known = delay[delay >= 0]
    return LaunchStats(
        kernels=int(dur.size), graph_kernels=int(graph.sum()), short_kernels=int((dur < SHORT_KERNEL_US).sum()),
        short_kernel_us=SHORT_KERNEL_US,
        median_launch_delay_us=float(np.median(known)) if known.size else None,
        p90_launch_delay_us=float(np.percentile(known, 90)) if known.size else None,
        long_delay_kernels=int((known > LONG_LAUNCH_DELAY_US).sum()), long_delay_us=LONG_LAUNCH_DELAY_US)


def _memcpy(frames: list[pd.DataFrame]) -> list[MemcpyRow]:
    """Copies per direction and memory kind; bandwidth from copies that took time and say how many
    bytes they moved (a zero-duration copy is counted, never divided by)."""
    if not frames:
        return []
    df = pd.concat(frames)
    out = []
    for (direction, pageable), g in df.groupby(["direction", "pageable"], sort=True):
        timed = g[(g["bytes"] >= 0) & (g["dur_us"] > 0)]
        known = g[g["bytes"] >= 0]
        seconds = float(timed["dur_us"].sum()) / 1e6
        timed_bytes = int(timed["bytes"].sum())
        out.append(MemcpyRow(
            direction=direction, pageable=bool(pageable), count=int(len(g)), zero_duration=int((g["dur_us"] <= 0).sum()),
            total_us=float(g["dur_us"].sum()), bytes=int(known["bytes"].sum()) if len(known) else None,
            gb_per_s=timed_bytes / 1e9 / seconds if timed_bytes and seconds > 0 else None))
    return sorted(out, key=lambda e: -e.total_us)


def _idle_histogram(gap_lengths_us: np.ndarray) -> IdleGaps:
    edges = np.array(IDLE_GAP_EDGES_US)
    which = np.digitize(gap_lengths_us, edges[1:-1])
    count = np.bincount(which, minlength=edges.size - 1)
    total = np.bincount(which, weights=gap_lengths_us, minlength=edges.size - 1)
    return IdleGaps(edges_us=[None if np.isinf(e) else float(e) for e in edges],
                    count=count.astype(int).tolist(), total_us=total.astype(float).tolist())


def _idle_gaps_us(t, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Lengths (µs) of the gaps between GPU events inside the windows ``[lo, hi)`` (sorted, ns)."""
    gpu = t.mask(*GPU_KINDS)
    seg = window_segments([union(t.ts_ns[gpu], t.end_of(gpu))], lo, hi)  # idle segments are the gaps
    return seg.lengths[~seg.member[0]] / 1000.0


def build_details(rank_traces: list[RankTrace], ranks: list[int], frame: pd.DataFrame, mode: str,
                  facts: Facts | None = None, run_records: list | None = None) -> Details:
    """The ``details`` section of the summary, without what :func:`perfscope.analysis.combine.combine`
    (``scope``, ``host_cpu``) and the summary (``cost``, ``energy``) add.

    Args:
        rank_traces: Every analyzed trace.
        ranks: The rank of each trace.
        frame: The counted steps (rows of the analysis frame that enter the verdict).
        mode: ``"gpu"`` or ``"cpu"``.
        facts: What the analysis found that changes the advice (``cuda_graphs``).
        run_records: The whole-run record beside each trace
            (:func:`perfscope.analysis.run_view.read_run_records`); None: none read.
    """
    kernels, operators, launch_parts, copies, idle, waits, efficiency, caps = [], [], [], [], [], [], [], []
    for rt, rank in zip(rank_traces, ranks):
        counted = set(frame.loc[(frame["rank"] == rank) & (frame["worker"] == rt.table.worker), "step"].tolist())
        if not counted:
            continue
        t = rt.table
        w = rt.windows
        sel = np.isin(w.step, list(counted))
        lo, hi = w.start[sel], w.end[sel]
        if rt.mode == "cpu":
            rows = top_level_ops(rt, lo, hi)
            operators.append((t.name_of(rows), t.dur_ns[rows] / 1000.0))
            continue
        mine = _counted_rows(rt, counted)
        k = np.flatnonzero(mine & (t.kind == EventKind.KERNEL))
        kernels.append((t.name_of(k), t.dur_ns[k] / 1000.0))
        efficiency.append(kernel_sums(t, k, float((hi - lo).sum()) / 1000.0))
        caps.append(capability(t))
        graph = graph_launched(t, k)
        launch_parts.append((t.dur_ns[k] / 1000.0, _launch_delay_us(rt, k, graph), graph))
        m = np.flatnonzero(mine & (t.kind == EventKind.MEMCPY))
        direction = copy_kind_of_names(t.names)[t.name_id[m]]
        copies.append(pd.DataFrame({
            "direction": [_DIRECTION[CopyKind(d)] for d in direction],
            "pageable": is_pageable_copy(t.names)[t.name_id[m]],
            "dur_us": t.dur_ns[m] / 1000.0, "bytes": t.copy_bytes[m].astype(np.int64)}))
        del mine, k, m  # per-row temporaries of a large trace: freed before the next ones
        order = np.argsort(lo, kind="stable")
        idle.append(_idle_gaps_us(t, lo[order], hi[order]))
        waits.append(other_waits(rt, lo[order], hi[order]))

    def joined(parts):
        return (np.concatenate([n for n, _ in parts]), np.concatenate([d for _, d in parts])) if parts else (np.zeros(0, object), np.zeros(0))

    nodes, node_source = node_of_ranks(rank_traces, ranks)
    skew = collective_skew(rank_traces, ranks, frame, nodes, subgroup_count(rank_traces))
    rows, slowest = rank_rows(frame, mode, skew) if len(frame) else ([], None)
    straggler = skew["straggler"]
    return Details(
        what_if=what_if(frame),
        top_kernels=_top(*joined(kernels)),
        top_operators=_top(*joined(operators)),
        launch_stats=_launch_stats(launch_parts),
        memcpy=_memcpy(copies),
        idle_gaps=_idle_histogram(np.concatenate(idle)) if idle else None,
        other_waits=merge_waits(waits),
        ranks=rows,
        straggler=straggler,
        nodes=node_view(rank_traces, ranks, nodes, node_source, rows, skew),
        memory=memory_view(rank_traces, ranks, frame),
        trace_memory=trace_memory_view(rank_traces, ranks, frame),
        run_steps=run_steps_view(rank_traces, ranks, run_records or [None] * len(rank_traces)),
        gpu_efficiency=gpu_efficiency(efficiency, caps, facts.no_tensor_cores if facts is not None else None),
        mfu=mfu_view(rank_traces, ranks, steptime.step_time_us(frame.to_dict("records")) if len(frame) else None,
                     mode, math_of_kernels(*joined(kernels))),
        operators=operator_view(rank_traces, ranks, frame, mode),
        modules=module_view(rank_traces, ranks, frame, mode),
        telemetry=telemetry_view(rank_traces, ranks, frame),
        collectives_matched=skew["matched"],
        collectives_unmatched=skew["unmatched"],
        collectives_unmatched_reason=skew.get("why_unmatched"),
        clocks_agree=skew["clocks_agree"],
        last_counts=skew["last_counts"],
        slowest_rank=slowest,
        advice=Advice(**{c: advice_for(c, mode, facts) for c in CLASSES}),
        knobs={c: list(knobs_for(c, mode, facts)) for c in CLASSES},
        facts=facts if facts is not None else Facts())
