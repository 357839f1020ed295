"""Ranks side by side: clocks aligned, collectives matched, and the straggler named.

Each rank's trace has its own time base. Events are placed on one clock as
``baseTimeNanoseconds + ts`` (:meth:`~perfscope.trace.table.TraceTable.absolute_ns`); comparing
raw ``ts`` across files with different bases names the wrong rank.

A *collective* is a communication kernel (``nccl*``) on GPU traces, a collective range
(``gloo:all_reduce``...) on CPU-only ones. The k-th collective of a name within a step on one rank
is matched with the k-th of that name in the same step on every other rank. For a matched
collective *c*:

- ``arrival`` of rank *r*: its start on the aligned clock;
- ``late`` of *r*: its arrival minus the earliest arrival at *c*;
- ``wait`` of *r*: its duration minus the shortest duration of *c* over the ranks -- the time it
  sat in the collective for the others (XProf's "sync time"), which needs no clock alignment.

Per rank and step these are summed over the step's collectives. The **straggler** of a step is the
rank with the largest summed lateness (the one the others wait for); the run's straggler is the
rank that is the step's straggler in more than half of the steps. When no rank is (the last one
changes from step to step), there is no straggler, and ``last_counts`` says how often each rank was
last.

The clocks are checked first: every rank is inside a collective at once at some moment, so no
rank can arrive after another has finished. When that fails for half of the matched collectives
or more (a file without its base time, nodes whose clocks drift apart), arrivals are not compared:
lateness is not reported and the straggler is the rank that waits least in the collectives (it is
the one the others wait for), which needs durations only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope import steptime
from perfscope.analysis.intervals import locate
from perfscope.analysis.nodes import node_offsets_ns
from perfscope.record.schema import RankRow, Straggler
from perfscope.trace.kinds import EventKind, is_collective_range, is_comm_kernel

if TYPE_CHECKING:
    from perfscope.analysis.rank_trace import RankTrace

_NS_PER_US = 1000.0
# How far a rank may seem to arrive after another finished before the clocks count as disagreeing:
# NTP keeps nodes within about a millisecond; plus a tenth of the collective's length.
CLOCK_SLACK_NS = 1_000_000
CLOCK_SLACK_SHARE = 0.1


def _collectives(rt: RankTrace, rank: int, counted: set) -> pd.DataFrame:
    """The collectives of one trace in counted steps: rank, step, name, k, arrival_ns, dur_ns."""
    t, w = rt.table, rt.windows
    if rt.mode == "gpu":
        rows = np.flatnonzero((t.kind == EventKind.KERNEL) & t.name_flag(is_comm_kernel))
        idx = w.gpu_step[rows]
    else:
        rows = np.flatnonzero(t.mask(EventKind.CPU_OP, EventKind.ANNOTATION) & t.name_flag(is_collective_range))
        idx = locate(t.ts_ns[rows], w.start, w.end)
    ok = idx >= 0
    rows, idx = rows[ok], idx[ok]
    steps = w.step[idx]
    keep = np.isin(steps, list(counted))
    rows, steps = rows[keep], steps[keep]
    df = pd.DataFrame({"rank": rank, "step": steps, "name": t.name_of(rows),
                       "arrival_ns": t.absolute_ns(t.ts_ns[rows]), "dur_ns": t.dur_ns[rows]})
    df = df.sort_values(["step", "arrival_ns"], kind="stable")
    df["k"] = df.groupby(["step", "name"]).cumcount()
    return df


def collective_skew(rank_traces: list[RankTrace], ranks: list[int], frame: pd.DataFrame,
                    nodes: dict[int, int] | None = None, subgroups: int = 0) -> dict:
    """Arrival lateness, collective wait and the straggler (see the module docstring).

    Args:
        rank_traces, ranks: Every analyzed trace and its rank.
        frame: The counted steps (``rank``, ``step``).
        nodes: Rank -> node of a multi-node job (:func:`perfscope.analysis.nodes.node_of_ranks`),
            or None: node clock offsets that causality proves are taken out of the arrivals
            (:func:`perfscope.analysis.nodes.node_offsets_ns`).
        subgroups: Process groups smaller than the world
            (:func:`perfscope.analysis.nodes.subgroup_count`): with any, collectives without
            their group in the trace are not matched (``unmatched`` counts them, ``why_unmatched``
            says why), since the same name and order may be different groups' collectives.

    Returns:
        ``{"per_rank_step": DataFrame (rank, step, late_us, wait_us, collectives), "straggler":
        {...} or None, "matched": int, "unmatched": int, "clocks_agree", "last_counts",
        "node_offsets_ns": {node: ns}}``; empty figures for one rank.
    """
    parts = []
    for rt, rank in zip(rank_traces, ranks):
        counted = set(frame.loc[(frame["rank"] == rank) & (frame["worker"] == rt.table.worker), "step"].tolist())
        if counted:
            parts.append(_collectives(rt, rank, counted))
    empty = {"per_rank_step": pd.DataFrame(columns=["rank", "step", "late_us", "wait_us", "collectives"]),
             "straggler": None, "matched": 0, "unmatched": 0, "clocks_agree": None, "last_counts": {},
             "node_offsets_ns": {}, "why_unmatched": None}
    if not parts:
        return empty
    df = pd.concat(parts, ignore_index=True)
    n_ranks = frame["rank"].nunique()
    if n_ranks < 2 or df.empty:
        return empty
    key = ["step", "name", "k"]
    if subgroups:
        return {**empty, "unmatched": int(df.groupby(key).ngroups),
                "why_unmatched": f"the job uses {subgroups} process group(s) smaller than the world and the traces do "
                                 "not say which group each collective ran on, so the ranks' collectives cannot be "
                                 "paired by name and order"}
    present = df.groupby(key)["rank"].transform("nunique")
    matched = df[present == n_ranks].copy()
    unmatched = int(df[present < n_ranks].groupby(key).ngroups)
    if matched.empty:
        return {**empty, "unmatched": unmatched}
    offsets = node_offsets_ns(matched, nodes) if nodes else {}
    if any(offsets.values()):
        matched["arrival_ns"] = matched["arrival_ns"] - matched["rank"].map(nodes).map(offsets).fillna(0).round()
    g = matched.groupby(key)
    matched["late_us"] = (matched["arrival_ns"] - g["arrival_ns"].transform("min")) / _NS_PER_US
    matched["wait_us"] = (matched["dur_ns"] - g["dur_ns"].transform("min")) / _NS_PER_US
    clocks_agree = _clocks_agree(matched, key)
    per = (matched.groupby(["rank", "step"])
           .agg(late_us=("late_us", "sum"), wait_us=("wait_us", "sum"), collectives=("late_us", "size"))
           .reset_index())
    if clocks_agree:
        # The step's straggler: largest summed lateness (stable: the lower rank on a tie).
        last = per.sort_values(["step", "late_us", "rank"], ascending=[True, False, True]).groupby("step").head(1)
        score = per.groupby("rank")["late_us"].sum()
    else:
        per["late_us"] = np.nan  # arrivals on clocks that disagree mean nothing
        last = per.sort_values(["step", "wait_us", "rank"], ascending=[True, True, True]).groupby("step").head(1)
        score = -per.groupby("rank")["wait_us"].sum()
    spread = per["late_us"] if clocks_agree else per["wait_us"]
    if not (spread > 0).any():  # every rank arrived together (or nobody waited): no straggler
        return {"per_rank_step": per, "straggler": None, "matched": int(g.ngroups), "unmatched": unmatched,
                "clocks_agree": clocks_agree, "last_counts": {}, "node_offsets_ns": offsets}
    times = last["rank"].value_counts()
    n_steps = int(per["step"].nunique())
    best = max(times.index, key=lambda r: (int(times[r]), float(score[r]), -int(r)))
    last_counts = {str(int(r)): int(c) for r, c in times.items()}  # JSON object keys are text
    if 2 * int(times[best]) <= n_steps:  # last in half the steps or fewer: not one rank the others wait for
        return {"per_rank_step": per, "straggler": None, "matched": int(g.ngroups), "unmatched": unmatched,
                "clocks_agree": clocks_agree, "last_counts": last_counts, "node_offsets_ns": offsets}
    mine = per[per["rank"] == best]
    others = per[per["rank"] != best]
    straggler = Straggler(
        rank=int(best), basis="arrival" if clocks_agree else "collective waits", steps_last=int(times[best]),
        steps=n_steps, median_late_us=float(mine["late_us"].median()) if clocks_agree else None,
        median_others_wait_us=float(others.groupby("step")["wait_us"].median().median()) if len(others) else 0.0)
    return {"per_rank_step": per, "straggler": straggler, "matched": int(g.ngroups), "unmatched": unmatched,
            "clocks_agree": clocks_agree, "last_counts": last_counts, "node_offsets_ns": offsets}


def _clocks_agree(matched: pd.DataFrame, key: list[str]) -> bool:
    """Whether, in most matched collectives, no rank arrives after another rank has finished."""
    ends = matched["arrival_ns"] + matched["dur_ns"]
    g = matched.assign(_end=ends).groupby(key)
    last_arrival = g["arrival_ns"].max()
    first_end = g["_end"].min()
    slack = CLOCK_SLACK_NS + CLOCK_SLACK_SHARE * g["dur_ns"].max()
    return bool((last_arrival <= first_end + slack).mean() >= 0.5)


def rank_rows(frame: pd.DataFrame, mode: str, skew: dict) -> tuple[list[RankRow], int | None]:
    """Per rank: median step, compute and communication time; the compute-based estimate of the
    wait for the slowest rank (``wait_for_slowest_us``: per step, the largest compute time of any
    rank minus this rank's); and the measured median arrival lateness and collective wait per
    step (None when collectives could not be matched).

    Returns:
        The rows and the slowest rank by median compute time (None for one rank).
    """
    compute = "compute_us" if mode == "gpu" else "operator_us"
    per = skew["per_rank_step"]
    frame = frame.assign(_wait=frame.groupby("step")[compute].transform("max") - frame[compute])
    rows = []
    for rank, g in frame.groupby("rank", sort=True):
        mine = per[per["rank"] == rank]
        rows.append(RankRow(
            rank=int(rank), median_step_time_us=float(g["step_time_us"].median()),
            median_compute_us=float(g[compute].median()),
            median_comm_us=float(g["comm_us"].median()) if "comm_us" in g else 0.0,
            wait_for_slowest_us=float(g["_wait"].median()),
            median_late_us=float(mine["late_us"].median()) if len(mine) and mine["late_us"].notna().any() else None,
            median_collective_wait_us=float(mine["wait_us"].median()) if len(mine) else None))
    return rows, steptime.slowest_rank({"rank": r.rank, "median_compute_us": r.median_compute_us} for r in rows)
