"""How one thread's operators nest, and which operator a moment falls in.

The profiler writes each operator as one complete event; on a thread they nest (an ``aten::linear``
holds its ``aten::addmm``). Sorted by start, the longer first on a tie, an operator comes before
those nested in it, and one sweep with a stack of the open operators finds every parent and the
innermost operator around any moment. The sweep is a Python loop (about a second per million
operators on this project's machines): callers bound how many they pass (:data:`MAX_SWEPT`).
"""

from __future__ import annotations

import numpy as np

from perfscope.trace.table import TraceTable

MAX_SWEPT = 2_000_000  # operators per call; above it callers skip what needs the sweep and say so


def by_start(t: TraceTable, rows: np.ndarray) -> np.ndarray:
    """``rows`` (operator rows of one thread) by start, the longer first on a tie."""
    return rows[np.lexsort((-t.dur_ns[rows].astype(np.int64), t.ts_ns[rows]))]


def parents(starts: list, ends: list) -> np.ndarray:
    """Per interval (sorted as :func:`by_start` sorts) the index of the innermost earlier one that
    holds it whole, or -1 (int64 array). One that overlaps another without fitting in it (damaged
    nesting) is not its child."""
    out = np.full(len(starts), -1, np.int64)
    stack: list[int] = []
    for i, (start, end) in enumerate(zip(starts, ends)):
        while stack and end > ends[stack[-1]]:  # the open one ended first: not a parent
            stack.pop()
        if stack:
            out[i] = stack[-1]
        stack.append(i)
    return out


def innermost(starts: list, ends: list, skip: list, times: list) -> np.ndarray:
    """Per time (ascending) the index of the innermost interval (sorted as :func:`by_start` sorts)
    around it whose ``skip`` is False, or -1 (int64 array). Ends are inclusive: a launch at the
    last microsecond of an operator is still its."""
    out = np.full(len(times), -1, np.int64)
    stack: list[int] = []
    i = 0
    for j, at in enumerate(times):
        while i < len(starts) and starts[i] <= at:
            while stack and ends[stack[-1]] < starts[i]:
                stack.pop()
            stack.append(i)
            i += 1
        while stack and ends[stack[-1]] < at:
            stack.pop()
        out[j] = next((k for k in reversed(stack) if not skip[k]), -1)
    return out
