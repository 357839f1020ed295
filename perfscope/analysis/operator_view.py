"""Operators of the counted steps: calls, host time and the device time of what they launched,
by name and by input shape (``details.operators``, ``docs/metrics.md`` Operators).

Every CPU operator that starts in a counted step's window, on every thread (the training loop's and
autograd's), is placed in its thread's nesting (:mod:`perfscope.analysis.nesting`):

* host time: the operator's duration; host self time: less the operators nested in it;
* device time: the GPU events (kernels, copies, memsets) whose launching runtime call (matched by
  correlation id, :func:`perfscope.analysis.steps.launch_times`) falls in the operator or those nested in it; device self time: those whose call
  falls in it and in none nested in it.

Totals by name add up calls of the name. An operator that is the only one nested in another of its
own name is a redispatch of that call (the dispatcher entering the same operator again): it is
folded into it -- one call, its self times added to the outer one's -- as the profiler's own
tables do (``torch.autograd.profiler_util.EventList._remove_dup_nodes``, under ``key_averages``).
Nested beside others, an operator of the same name is a call of its own and counts in both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.analysis.nesting import MAX_SWEPT, by_start, innermost, parents
from perfscope.analysis.steps import Launches, StepWindows
from perfscope.record.schema import OperatorRow, Operators, OperatorShape
from perfscope.trace.kinds import EventKind
from perfscope.trace.table import TraceTable

if TYPE_CHECKING:
    from perfscope.analysis.rank_trace import RankTrace

TOP_OPERATORS = 30
TOP_SHAPES = 3  # input shapes shown per operator
_COLUMNS = ("host_us", "host_self_us", "device_us", "device_self_us")


def _thread_frame(t: TraceTable, ops: np.ndarray, gpu: np.ndarray, calls: np.ndarray) -> pd.DataFrame:
    """Per operator of one thread (``ops``): row, name code, shape code and the four times (µs),
    with the GPU events ``gpu`` whose launch calls ``calls`` lie on this thread."""
    ops = by_start(t, ops)
    starts, ends = t.ts_ns[ops].tolist(), t.end_of(ops).tolist()
    dur = t.dur_ns[ops].astype(np.float64) / 1000.0
    parent = parents(starts, ends)
    child = parent >= 0
    self_host = dur - np.bincount(parent[child], weights=dur[child], minlength=len(ops))
    device_self = np.zeros(len(ops))
    device = np.zeros(len(ops))
    if gpu.size:
        order = np.argsort(t.ts_ns[calls], kind="stable")
        gpu, calls = gpu[order], calls[order]
        owner = innermost(starts, ends, [False] * len(ops), t.ts_ns[calls].tolist())
        g_dur = t.dur_ns[gpu].astype(np.float64) / 1000.0
        mine = owner >= 0
        device_self = np.bincount(owner[mine], weights=g_dur[mine], minlength=len(ops))
        device = _inclusive(device_self, parent)
    keep = _fold_redispatches(t.name_id[ops], parent, self_host, device_self)
    return pd.DataFrame({"row": ops, "name": t.name_id[ops], "shape": _shapes(t, ops), "host_us": dur,
                         "host_self_us": np.maximum(self_host, 0.0), "device_us": device,
                         "device_self_us": device_self})[keep]


def _fold_redispatches(names: np.ndarray, parent: np.ndarray, *self_times: np.ndarray) -> np.ndarray:
    """Which operators to keep: an operator that is the only child of one of its own name (a
    redispatch, module docstring) is not, and its ``self_times`` (arrays changed in place) go to
    that parent; a chain of them folds into its outermost."""
    child = parent >= 0
    children = np.bincount(parent[child], minlength=len(parent))
    fold = np.zeros(len(parent), bool)
    fold[child] = (names[child] == names[parent[child]]) & (children[parent[child]] == 1)
    for i in np.flatnonzero(fold)[::-1].tolist():  # innermost first: a chain adds up outwards
        for values in self_times:
            values[parent[i]] += values[i]
    return ~fold


def _shapes(t: TraceTable, ops: np.ndarray) -> np.ndarray:
    if t.shape_id is None or t.shapes is None:
        return np.zeros(len(ops), np.int64)
    return t.shape_id[ops]


def _inclusive(own: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Each interval's own value plus all its descendants' (``parent``: -1 for a root), added up
    one nesting level at a time from the deepest."""
    depth = np.zeros(len(parent), np.int64)
    for i in np.flatnonzero(parent >= 0).tolist():  # parents come first: their depth is known
        depth[i] = depth[parent[i]] + 1
    total = own.astype(np.float64, copy=True)
    for level in range(int(depth.max(initial=0)), 0, -1):
        at = np.flatnonzero(depth == level)
        np.add.at(total, parent[at], total[at])
    return total


def operator_steps(t: TraceTable, windows: StepWindows, launches: Launches) -> pd.DataFrame | None:
    """Per step, operator name and input shape of one trace: ``calls`` and the four times (µs);
    columns ``step``, ``name``, ``shape`` (texts), ``calls``, ``host_us``, ``host_self_us``,
    ``device_us``, ``device_self_us``. An operator belongs to the step whose window it starts in.
    None when the trace has more than :data:`MAX_SWEPT` operators in its steps (not placed).
    Computed where the trace is analyzed: the run's view only adds up the counted steps."""
    return nested_steps(t, windows, launches, np.flatnonzero(t.kind == EventKind.CPU_OP))


def nested_steps(t: TraceTable, windows: StepWindows, launches: Launches, ops: np.ndarray) -> pd.DataFrame | None:
    """:func:`operator_steps` over the ranges ``ops`` (rows of one kind of nested CPU range:
    operators, or module calls), each nested only among its own kind."""
    order = np.argsort(windows.start, kind="stable")
    lo, hi, steps = windows.start[order], windows.end[order], windows.step[order]
    where = np.searchsorted(lo, t.ts_ns[ops], side="right") - 1
    inside = (where >= 0) & (t.ts_ns[ops] < hi[np.maximum(where, 0)])
    ops, where = ops[inside], where[inside]
    if ops.size > MAX_SWEPT:
        return None
    step_of = dict(zip(ops.tolist(), steps[where].tolist()))
    calls = launches.call_rows if launches.call_rows is not None else np.full(launches.rows.size, -1, np.int64)
    gpu, calls = launches.rows[calls >= 0], calls[calls >= 0]
    frames = [_thread_frame(t, ops[t.thread_id[ops] == th], gpu[t.thread_id[calls] == th], calls[t.thread_id[calls] == th])
              for th in np.unique(t.thread_id[ops])]
    if not frames:
        return pd.DataFrame(columns=["step", "name", "shape", "calls", *_COLUMNS])
    ops_frame = pd.concat(frames, ignore_index=True)
    ops_frame["step"] = ops_frame["row"].map(step_of)
    ops_frame["calls"] = 1
    out = ops_frame.groupby(["step", "name", "shape"], sort=False)[["calls", *_COLUMNS]].sum().reset_index()
    out["name"] = t.names[out["name"].to_numpy()]
    shapes = t.shapes if t.shapes is not None else np.array([""], dtype=object)
    out["shape"] = shapes[out["shape"].to_numpy()]
    return out


def _figures(r) -> dict:
    return {"calls": int(r["calls"]), **{c: float(r[c]) for c in _COLUMNS}}


def _rows(frame: pd.DataFrame, gpu: bool) -> list[OperatorRow]:
    """The :data:`TOP_OPERATORS` names with most self time, each with its top input shapes."""
    pairs = frame.groupby(["name", "shape"], sort=False)[["calls", *_COLUMNS]].sum()  # few: one per name and shape
    names = pairs.groupby(level="name", sort=False).sum()
    # by self time, as the profiler's tables sort: inclusive time puts every wrapper on top
    key = ["device_self_us", "device_us", "host_self_us"] if gpu else ["host_self_us", "host_us"]
    out = []
    for name, r in names.sort_values(key, ascending=False).head(TOP_OPERATORS).iterrows():
        shapes = pairs.loc[name]
        shapes = shapes[shapes.index != ""].sort_values(key, ascending=False).head(TOP_SHAPES)
        out.append(OperatorRow(name=str(name), **_figures(r),
                               shapes=[OperatorShape(input_dims=str(k), **_figures(v)) for k, v in shapes.iterrows()]))
    return out


def operator_view(rank_traces: list[RankTrace], ranks: list[int], frame: pd.DataFrame, mode: str) -> Operators | None:
    """``details.operators``: the operators of the counted steps of every trace, by name.

    Args:
        rank_traces: Every analyzed trace.
        ranks: The rank of each trace.
        frame: The counted steps (``rank``, ``worker``, ``step`` columns).
        mode: ``"gpu"`` (rows by device self time) or ``"cpu"`` (by host self time).

    Returns:
        None without operators; else ``rows[]`` (at most :data:`TOP_OPERATORS`): ``name``,
        ``calls``, ``host_us``, ``host_self_us``, ``device_us``, ``device_self_us`` (µs, all
        ranks) and ``shapes[]`` (the :data:`TOP_SHAPES` input shapes with most time, each with
        ``input_dims`` as compact JSON and the same figures; empty when the trace has no shapes);
        ``operators`` (distinct names), ``calls``, ``with_shapes`` (any operator recorded its
        input shapes) and ``skipped`` (traces with too many operators to place: left out).
    """
    frames, skipped = [], 0
    for rt, rank in zip(rank_traces, ranks):
        counted = set(frame.loc[(frame["rank"] == rank) & (frame["worker"] == rt.table.worker), "step"].tolist())
        if not counted:
            continue
        if rt.operators is None:
            skipped += 1
        else:
            frames.append(rt.operators[rt.operators["step"].isin(counted)])
    ops = pd.concat(frames, ignore_index=True) if frames else None
    if ops is None or not len(ops):
        return None if not skipped else Operators(rows=[], operators=0, calls=0, with_shapes=False, skipped=skipped)
    return Operators(rows=_rows(ops, mode == "gpu"), operators=int(ops["name"].nunique()), calls=int(ops["calls"].sum()),
                     with_shapes=bool((ops["shape"] != "").any()), skipped=skipped)
