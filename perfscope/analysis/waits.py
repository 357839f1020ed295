"""What the GPU waited on when it sat idle with work already queued (``other_idle``).

``other`` names no verdict (no single knob removes it), so when it is large the report must say
what it was, where the trace shows it. Each piece of ``other_idle`` time is given to the first of:

1. **host synchronisation** -- the host was inside a call that waits for the GPU
   (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, a synchronous
   ``cudaMemcpy``, ``aten::item`` / ``_local_scalar_dense``), or the GPU side records a stream,
   event or context sync (``cuda_sync`` events);
2. **cross-stream wait** -- the GPU event that ends the gap was launched right after a
   ``cudaStreamWaitEvent`` on the same thread (no other launch between), or a ``cuda_sync`` wait
   event overlaps the gap: the stream waited for another stream's work;
3. **not shown in the trace** -- nothing recorded explains it.

Times are microseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from perfscope.analysis.chunked import row_chunks
from perfscope.analysis.intervals import Intervals, union, window_segments
from perfscope.analysis.partition import gpu_parts, gpu_sets
from perfscope.record.schema import OtherWaits, WaitCause
from perfscope.trace.kinds import GPU_KINDS, EventKind, is_gpu_work_call, is_stream_wait, is_sync_call

if TYPE_CHECKING:
    from perfscope.analysis.rank_trace import RankTrace

SYNC, CROSS_STREAM, UNSHOWN = "host synchronisation", "cross-stream wait", "not shown in the trace"
CAUSES = (SYNC, CROSS_STREAM, UNSHOWN)
_TOP = 5


def _overlap_us(iv: Intervals, pieces: Intervals) -> float:
    if len(iv) == 0 or len(pieces) == 0:
        return 0.0
    seg = window_segments([iv], pieces.starts, pieces.ends)
    return float(seg.lengths[seg.member[0]].sum()) / 1000.0


def _waited_launches(t) -> np.ndarray:
    """Runtime rows that launch GPU work right after a ``cudaStreamWaitEvent`` on their thread."""
    # the few wait and launch calls are picked first: every runtime row's index, flags and sort
    # keys at once were the largest allocation of a large trace's analysis
    wait_name = np.asarray(is_stream_wait(t.names), dtype=bool)
    work_name = np.asarray(is_gpu_work_call(t.names), dtype=bool)
    rows = np.flatnonzero((t.kind == EventKind.RUNTIME) & (wait_name | work_name)[t.name_id])
    rows = rows[np.lexsort((t.ts_ns[rows], t.thread_id[rows]))]
    wait, work = wait_name[t.name_id[rows]], work_name[t.name_id[rows]]
    thread = t.thread_id[rows]
    prev_is_wait = np.concatenate([[False], wait[:-1] & (thread[1:] == thread[:-1])])
    return rows[work & prev_is_wait]


def _next_gpu_rows(t, times: np.ndarray) -> np.ndarray:
    """For each time (ns), the row of the GPU event that starts first at or after it (the lowest
    row among equal starts), or of the one that starts last where none does (ties: the highest
    row). Requires GPU events.

    Found a chunk of rows at a time: sorting every GPU row's start with its row index took four
    8-byte arrays of them at once.
    """
    best_ts = np.full(times.size, np.iinfo(np.int64).max, np.int64)
    best = np.full(times.size, -1, np.int64)
    last_ts, last = None, -1
    for rows in row_chunks(t.mask(*GPU_KINDS)):
        ts = t.ts_ns[rows]
        order = np.argsort(ts, kind="stable")
        ts, rows = ts[order], rows[order]
        at = np.minimum(np.searchsorted(ts, times, side="left"), ts.size - 1)
        better = (ts[at] >= times) & (ts[at] < best_ts)  # earlier chunks hold the lower rows: strict
        best_ts[better], best[better] = ts[at[better]], rows[at[better]]
        if last_ts is None or ts[-1] >= last_ts:
            last_ts, last = ts[-1], rows[-1]
    best[best < 0] = last
    return best


def _other_idle(rt: RankTrace, lo: np.ndarray, hi: np.ndarray) -> Intervals:
    """The ``other_idle`` pieces of the windows, as one interval set (ns)."""
    # its own function so that the segments of every partition set are freed before the causes
    sets = rt.partition_sets if rt.partition_sets is not None else gpu_sets(rt.table, rt.launches, rt.windows.main_thread)
    seg = window_segments(sets, lo, hi)
    return seg.pieces(gpu_parts(seg.member)["other_idle"])


def other_waits(rt: RankTrace, lo: np.ndarray, hi: np.ndarray) -> dict | None:
    """The ``other_idle`` time of the windows ``[lo, hi)`` (sorted, disjoint) by cause.

    Returns:
        ``{"other_idle_us": total, "causes": {cause: {"us": ..., "calls": {name: us}}}}``, or
        None for a CPU-only trace.
    """
    if rt.mode != "gpu":
        return None
    t = rt.table
    pieces = _other_idle(rt, lo, hi)
    out = {"other_idle_us": pieces.total / 1000.0, "causes": {c: {"us": 0.0, "calls": {}} for c in CAUSES}}
    if len(pieces) == 0:
        return out
    # 1. host synchronisation, named by call
    sync_rows = np.flatnonzero(t.mask(EventKind.RUNTIME, EventKind.CPU_OP) & t.name_flag(is_sync_call))
    gpu_sync = t.kind == EventKind.SYNC
    waits_on_gpu = np.array(["wait" in n.lower() for n in t.names], bool)  # per name
    sync_rows = np.concatenate([sync_rows, np.flatnonzero(gpu_sync & ~waits_on_gpu[t.name_id])])
    sync = union(t.ts_ns[sync_rows], t.end_of(sync_rows))
    by_name = {}
    for nid in np.unique(t.name_id[sync_rows]):
        mine = sync_rows[t.name_id[sync_rows] == nid]
        by_name[str(t.names[nid])] = _overlap_us(union(t.ts_ns[mine], t.end_of(mine)), pieces)
    out["causes"][SYNC] = {"us": _overlap_us(sync, pieces), "calls": _top(by_name)}
    rest = _minus(pieces, sync)
    # 2. cross-stream waits: the gap's next GPU event was launched right after a stream wait
    nxt = _next_gpu_rows(t, rest.ends)
    waited = _waited_launches(t)
    crossed = np.isin(t.correlation[nxt], t.correlation[waited]) & (t.correlation[nxt] >= 0)
    wait_events = np.flatnonzero(gpu_sync & waits_on_gpu[t.name_id])
    by_wait = union(t.ts_ns[wait_events], t.end_of(wait_events))
    crossed_iv = union(rest.starts[crossed], rest.ends[crossed])
    crossed_all = union(np.concatenate([crossed_iv.starts, by_wait.starts]), np.concatenate([crossed_iv.ends, by_wait.ends]))
    cross_us = _overlap_us(crossed_all, rest)
    calls = {"cudaStreamWaitEvent before the next launch": _overlap_us(crossed_iv, rest)} if len(crossed_iv) else {}
    if len(by_wait):
        calls["GPU-side wait events"] = _overlap_us(by_wait, rest)
    out["causes"][CROSS_STREAM] = {"us": cross_us, "calls": _top(calls)}
    out["causes"][UNSHOWN] = {"us": max(0.0, out["other_idle_us"] - out["causes"][SYNC]["us"] - cross_us), "calls": {}}
    return out


def _minus(a: Intervals, b: Intervals) -> Intervals:
    """``a`` without ``b``."""
    if len(a) == 0 or len(b) == 0:
        return a
    seg = window_segments([b], a.starts, a.ends)
    return seg.pieces(~seg.member[0])


def _top(calls: dict) -> dict:
    return {k: v for k, v in sorted(calls.items(), key=lambda kv: -kv[1])[:_TOP] if v > 0}


def wait_shares(waits: OtherWaits) -> list[tuple[str, float, list[tuple[str, object]]]]:
    """Each cause of the GPU's waits that has time of its own, in the record's order:
    ``(cause, share of other_idle_us, [(call, µs), ...])``, its calls as the record lists them
    (largest first). The one reading of ``details.other_waits`` that the console line and the
    report's list both render; ``[]`` without idle time.
    """
    total = waits.other_idle_us or 0.0
    if total <= 0:
        return []
    out = []
    for cause, c in (waits.causes or {}).items():
        if (c.us or 0.0) > 0:
            out.append((cause, c.us / total, list(c.calls.items()) if isinstance(c.calls, dict) else []))
    return out


def merge_waits(parts: list[dict | None]) -> OtherWaits | None:
    """Sum :func:`other_waits` over traces into the record's ``details.other_waits`` (None when
    none is a GPU trace)."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    causes = {}
    for c in CAUSES:
        calls: dict = {}
        for p in parts:
            for k, v in p["causes"][c]["calls"].items():
                calls[k] = calls.get(k, 0.0) + v
        causes[c] = WaitCause(us=sum(p["causes"][c]["us"] for p in parts), calls=_top(calls))
    return OtherWaits(other_idle_us=sum(p["other_idle_us"] for p in parts), causes=causes)
