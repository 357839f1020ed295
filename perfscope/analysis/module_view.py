"""Time per ``nn.Module``: which layer the forward pass spends its time in.

From the module ranges a trace holds (``docs/metrics.md``, Modules): those ``perfscope profile``
records around every module call of the traced steps (``nn.Module: <path> (<class>)``,
:mod:`perfscope.collect.modules`), or the profiler's own ``nn.Module: <class>_<n>`` events of a
trace recorded with ``with_stack=True``. Each range is nested among the module ranges of its
thread, so a module's self time is its time outside its child modules; the device time is that of
the GPU work launched inside it (:func:`perfscope.analysis.operator_view.nested_steps`). The
forward pass only: the backward runs in autograd's engine, outside any module call.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfscope.analysis.operator_view import nested_steps
from perfscope.record.schema import ModuleRow, Modules
from perfscope.trace.kinds import EventKind

PREFIX = "nn.Module: "
TOP_MODULES = 40
_COLUMNS = ("calls", "host_us", "host_self_us", "device_us", "device_self_us")


def module_rows(t) -> np.ndarray:
    """Rows of ``t`` that are module ranges (annotations, or Python events of ``with_stack``)."""
    named = np.fromiter((str(n).startswith(PREFIX) for n in t.names), bool, len(t.names))
    if not named.any():
        return np.zeros(0, np.int64)
    return np.flatnonzero(np.isin(t.kind, (EventKind.ANNOTATION, EventKind.PYTHON)) & named[t.name_id])


def module_steps(t, windows, launches) -> pd.DataFrame | None:
    """Per step and module of one trace, the calls and four times (µs) (as
    :func:`~perfscope.analysis.operator_view.operator_steps`); None without module ranges."""
    rows = module_rows(t)
    if not rows.size:
        return None
    return nested_steps(t, windows, launches, rows)


def _tree_key(module: str) -> list:
    """Depth-first order of module paths, numbered children in number order (``blocks.2`` before ``blocks.10``)."""
    path = module.split(" (", 1)[0]
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.split(".")]


def module_view(rank_traces, ranks: list[int], frame: pd.DataFrame, mode: str) -> Modules | None:
    """``details.modules``: time per module over the counted steps of every trace.

    Args:
        rank_traces: Every analyzed trace (:class:`perfscope.analysis.rank_trace.RankTrace`).
        ranks: Their ranks.
        frame: The counted steps (``rank``, ``worker``, ``step``).
        mode: ``gpu`` (modules by device time) or ``cpu`` (by host time).

    Returns:
        None when no trace holds module ranges; else ``rows[]`` (the :data:`TOP_MODULES` with
        most inclusive time, in depth-first order of their paths): ``module`` (its path, or the profiler's name), ``depth``
        (dots in the path), ``calls``, ``host_us``, ``host_self_us``, ``device_us``,
        ``device_self_us`` (µs over the counted steps, all ranks), ``modules`` (distinct), and
        ``source`` (``perfscope`` or ``with_stack``).
    """
    frames = []
    for rt, rank in zip(rank_traces, ranks):
        mods = getattr(rt, "modules", None)
        if mods is None:
            continue
        counted = set(frame.loc[(frame["rank"] == rank) & (frame["worker"] == rt.table.worker), "step"].tolist())
        frames.append(mods[mods["step"].isin(counted)])
    mods = pd.concat(frames, ignore_index=True) if frames else None
    if mods is None or not len(mods):
        return None
    by = mods.groupby("name", sort=False)[list(_COLUMNS)].sum()
    key = ["device_us", "host_us"] if mode == "gpu" else ["host_us"]
    rows = []
    for name, r in by.sort_values(key, ascending=False).head(TOP_MODULES).iterrows():
        module = str(name)[len(PREFIX):]
        path = module.split(" (", 1)[0]
        rows.append(ModuleRow(module=module, depth=path.count("."), calls=int(r["calls"]),
                              **{c: float(r[c]) for c in _COLUMNS[1:]}))
    rows.sort(key=lambda r: _tree_key(r.module))  # each module under its parent, as the model nests them
    source = "perfscope" if any(" (" in r.module for r in rows) else "with_stack"
    return Modules(rows=rows, modules=int(len(by)), source=source)
