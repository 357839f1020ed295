"""Whether each step's evidence is whole enough for a verdict.

A verdict is only as good as the trace behind it, so every step gets a ``status`` before it gets a
verdict, and only ``ok`` steps are classified and counted in the run's verdict:

==================  ==========================================================================
status              when (first that applies; the reason says which and by how much)
==================  ==========================================================================
``incomplete``      the profiler did not record all of the step: cut off by the end of profiling
                    (``steps.py``), cut by a truncated file (it ends after the last event the
                    file kept), zero length, a range overlapping another step's (a nested or
                    interleaved marker), no event inside it, a range running mostly past the
                    trace's last event (more than :data:`UNOBSERVED_SHARE` of the step after it),
                    kernel launches whose kernels were lost (:data:`LOST_LAUNCH_SHARE` of them or
                    more; the last few launches of the capture, whose kernels ran after it stopped,
                    are not lost), or GPU activity missing altogether from a trace full of launches; a
                    step the GPU spent :data:`QUEUED_SHARE` or more of still running work launched
                    before the profiler's window (a stream whose first events have no launch
                    record: the host ran ahead of the GPU, and what ran beside the step's copies
                    and idle time was not recorded); and a step whose verdict hangs on GPU events
                    without a launch record (the idle time before them could be launch wait or a
                    dependency wait, and the two choices give different verdicts)
``initialisation``  one-time device set-up (context creation, module load, the first
                    ``cudaFree`` / stream-priority query) covers :data:`INIT_SHARE` of the step
                    or more
``host-contended``  the training thread waited for a core (runnable, not running) for
                    :data:`RUN_QUEUE_SHARE` of the step or more; where the kernel does not report
                    that wait, it got a CPU for less than :data:`HOST_CPU_SHARE` of the step time
                    that no data wait, collective or GPU synchronisation explains: descheduled
                    time, not the program, set the step's length; or its intra-op workers
                    waited for cores that long (:func:`perfscope.record.host_steps.workers_waited`).
                    Such steps still get a *provisional* verdict when no step is ``ok``
                    (:mod:`perfscope.analysis.provisional`); where intra-op workers waited, only
                    if its class holds with and without their spinning taken out
``ok``              none of the above
==================  ==========================================================================

A step after the last one the host record holds, in a trace that has one (the script ended inside
it, before its record was written), is ``incomplete``: whether it waited for cores is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from perfscope.analysis.chunked import max_of, row_chunks, select_rows
from perfscope.analysis.intervals import locate, union, window_segments
from perfscope.analysis.steps import Launches, StepWindows
from perfscope.analysis.trace_counts import count_quality, events_inside
from perfscope.analysis.classify import classify, cost_fractions
from perfscope.text import named, plural
from perfscope.record.host_steps import RUN_QUEUE_SHARE, HostStep, core_wait_us, spin_us
from perfscope.trace.kinds import (
    GPU_KINDS, EventKind, is_gpu_work_call, is_init_call, is_kernel_launch, is_sync_call, profiler_step_numbers,
)
from perfscope.trace.quality import NOTED, DataQuality
from perfscope.trace.table import TraceTable

OK, INCOMPLETE, INITIALISATION, HOST_CONTENDED = "ok", "incomplete", "initialisation", "host-contended"
STATUSES = (OK, INCOMPLETE, INITIALISATION, HOST_CONTENDED)

# The smallest verdict threshold (io and comm, 10%): set-up taking that much could decide a verdict alone.
INIT_SHARE = 0.10
# Nine tenths of the step after the trace's last recorded event: the step ran on long after the
# profiler stopped seeing anything (a range left open), not a quiet end of an iteration.
UNOBSERVED_SHARE = 0.9
# The GPU still running work from before the window for this share of a step: as much as the
# smallest verdict threshold (io and comm), enough for the unrecorded work to decide a verdict.
QUEUED_SHARE = 0.10
QUEUED_MARK = "launched before the profiler's window"  # in the reason, so that the advice can follow it
# A kernel lost now and then at a buffer's end is noise; one launch in a hundred is a failure of the
# profiler, and the GPU then looks idle where it worked.
LOST_LAUNCH_SHARE = 0.01
# Descheduling: RUN_QUEUE_SHARE (perfscope.record.host_steps, shared with the collector). Without the
# run-queue figure, the thread running less than half of the time nothing else explains.
HOST_CPU_SHARE = 0.5
_NS_PER_US = 1000.0


@dataclass
class Evidence:
    """The judgement of one trace's steps.

    Attributes:
        status: Per step, one of :data:`STATUSES` (object array).
        reason: Per step, why it is not ``ok`` (object array of str or None).
        run_reason: A reason that concerns the whole trace (all GPU activity lost), else None.
        quality: Analysis-level data-quality entries (events outside every step, GPU events
            without a launch record, ...).
    """

    status: np.ndarray
    reason: np.ndarray
    run_reason: str | None = None
    quality: DataQuality = field(default_factory=DataQuality)
    core_wait_us: np.ndarray | None = None
    """Per step, the training thread's time waiting for a core (µs,
    :func:`perfscope.record.host_steps.core_wait_us`); NaN
    where the step has no host record, None where the trace has none at all."""
    spin_us: np.ndarray | None = None
    """Per step, the most the training thread may have spun at the end of parallel operators for
    intra-op workers that waited for cores (µs: their longest wait, where
    :func:`perfscope.record.host_steps.workers_waited`), else 0; None where the trace has no host record."""


def _set(ev: Evidence, mask: np.ndarray, status: str, reasons) -> None:
    """Give ``status`` to the steps in ``mask`` that are still ``ok`` (earlier rules win)."""
    for i in np.flatnonzero(mask & (ev.status == OK)):
        ev.status[i] = status
        ev.reason[i] = reasons(i) if callable(reasons) else reasons


def _ms(ns) -> str:
    return f"{ns / 1e6:,.1f} ms" if abs(ns) < 1e9 else f"{ns / 1e9:,.2f} s"


def judge(table: TraceTable, steps: StepWindows, launches: Launches, metrics: pd.DataFrame, mode: str) -> Evidence:
    """The status of every step of one trace (see the module docstring).

    Args:
        table: The trace.
        steps: Its steps.
        launches: Launch call of every GPU event.
        metrics: Per-step metrics of ``mode`` (``*_us``).
        mode: ``"gpu"`` or ``"cpu"``.
    """
    n = len(steps)
    ev = Evidence(np.full(n, OK, dtype=object), np.full(n, None, dtype=object))
    length = steps.end - steps.start
    kinds = table.kind
    marker = profiler_step_numbers(table.names)[table.name_id] != -1
    # Activity: what the profiler recorded that is not a step marker or an unread category.
    active = (kinds != EventKind.OTHER) & ~marker

    _set(ev, ~steps.complete, INCOMPLETE, "cut off by the end of profiling (a partial last iteration)")
    _set(ev, length <= 0, INCOMPLETE, "zero length")
    _set(ev, steps.overlapping, INCOMPLETE, "its range overlaps another step's: the step markers contradict each other")
    if table.truncated and table.n_events:
        last_kept = int(table.ts_ns[-1])  # rows keep the file's order: the last complete event
        _set(ev, steps.end > last_kept, INCOMPLETE,
             f"the file is truncated: events after {_ms(last_kept)} into the trace may be lost")
        devices = table.device_properties
        if devices and not table.mask(*GPU_KINDS).any():
            # Writers put GPU activity after the CPU events: a cut there loses all of it.
            _set(ev, np.ones(n, bool), INCOMPLETE, f"the file is truncated and holds no GPU event although its "
                 f"header lists {plural(len(devices), 'GPU')}: they were in the part that was lost")
    inside = events_inside(table, active, steps)
    _set(ev, inside == 0, INCOMPLETE, "no event recorded inside the step (only its marker)")
    if active.any():
        last_end = int(max_of(active, table.end_of))
        tail = steps.end - np.maximum(steps.start, last_end)
        _set(ev, (tail > UNOBSERVED_SHARE * length) & (length > 0), INCOMPLETE,
             lambda i: f"its range runs {_ms(tail[i])} past the last event the trace recorded")
    if mode == "cpu":
        ev.run_reason = _lost_gpu_activity(table)
        if ev.run_reason:
            _set(ev, np.ones(n, bool), INCOMPLETE, ev.run_reason)
    else:
        _lost_kernels(table, steps, launches, ev)
        _queued_before_window(table, steps, launches, ev)
        _unlinked_decides(metrics, ev)
    _initialisation(table, steps, ev)
    _host_contended(table, steps, metrics, mode, ev)
    count_quality(table, steps, launches, marker, active, ev.quality)
    return ev


def _launch_rows(table: TraceTable, predicate) -> np.ndarray:
    return np.flatnonzero((table.kind == EventKind.RUNTIME) & table.name_flag(predicate))


def _lost_gpu_activity(table: TraceTable) -> str | None:
    """The reason when a trace holds device work calls but no GPU event at all."""
    calls = _launch_rows(table, is_gpu_work_call)
    if calls.size == 0 or table.mask(*GPU_KINDS).any():
        return None
    names = pd.Series(table.name_of(calls)).value_counts().head(3).to_dict()
    return (f"{plural(int(calls.size), 'runtime call')} that put work on the GPU ({named(names, 3)}), "
            "no GPU activity recorded: the profiler lost the GPU events")


def _lost_kernels(table: TraceTable, steps: StepWindows, launches: Launches, ev: Evidence) -> None:
    launch_rows = _launch_rows(table, is_kernel_launch)
    if launch_rows.size == 0:
        return
    # the device recorded what the call queued: work, or a wait on an event (MTIA queues waits as launches)
    gpu_rows = np.flatnonzero(table.mask(*GPU_KINDS, EventKind.SYNC))
    found = np.isin(table.correlation[launch_rows], table.correlation[gpu_rows]) & (table.correlation[launch_rows] >= 0)
    cut = _cut_off_at_the_end(table.ts_ns[launch_rows], found)
    ours = ~found & np.isin(table.correlation[launch_rows], table.dropped_correlations)  # dropped as corrupt
    gone = ~found & ~cut & ~ours
    where = locate(table.ts_ns[launch_rows], steps.cpu_start, steps.cpu_end)
    ok = where >= 0
    total = np.bincount(where[ok & ~cut], minlength=len(steps))
    lost = np.bincount(where[ok & gone], minlength=len(steps))
    dropped = np.bincount(where[ok & ours], minlength=len(steps))
    ev.quality.add(NOTED, "kernel launch calls without a kernel (lost by the profiler)", int(gone.sum()),
                   table.name_of(launch_rows[gone]), unit="event")
    ev.quality.add(NOTED, "kernel launch calls at the end of the capture (their kernels ran after it stopped)",
                   int(cut.sum()), table.name_of(launch_rows[cut]), unit="event")
    missing = lost + dropped
    share = np.divide(missing, total, out=np.zeros(len(steps)), where=total > 0)

    def reason(i: int) -> str:
        head = f"{missing[i]:,} of its {total[i]:,} kernel launches have no kernel"
        if not dropped[i]:
            return head + " in the trace: the profiler lost them"
        ours_part = f"perfscope dropped {dropped[i]:,} as corrupt (Data quality says why)"
        return head + (f": {ours_part}" if not lost[i] else f": the profiler lost {lost[i]:,}, {ours_part}")

    _set(ev, (missing > 0) & (share >= LOST_LAUNCH_SHARE), INCOMPLETE, reason)


def _cut_off_at_the_end(launch_ts: np.ndarray, found: np.ndarray) -> np.ndarray:
    """Per launch call, whether it is one of the last ones of the capture whose kernels would have
    run after the profiler stopped: the calls after the last one whose kernel the trace holds, as
    long as they are at most :data:`LOST_LAUNCH_SHARE` of all calls. More than that is the
    profiler losing kernels, wherever they fall."""
    cut = np.zeros(len(found), bool)
    if not len(found) or found.all():
        return cut
    order = np.argsort(launch_ts, kind="stable")
    held = np.flatnonzero(found[order])
    tail = order[held[-1] + 1:] if len(held) else order
    if len(tail) <= LOST_LAUNCH_SHARE * len(found):
        cut[tail] = True
    return cut


def queued_before_window(table: TraceTable, launches: Launches) -> list[tuple[int, int, int, int]]:
    """Streams that start the trace behind work launched before the profiler's window.

    A stream runs its work in order. When its first recorded events have no launch record (their
    launch calls came before the window) and the first of them starts at ``t``, the stream was
    held until ``t`` by still earlier work that the trace does not hold, or by a wait: the host had
    run ahead of the GPU when profiling began, and nothing says what ran on the GPU before ``t``.
    The recorded events themselves are counted as they are. A stream with no launch record at all
    (a trace without correlation ids), or without a stream id, says nothing either way.

    Returns:
        ``(device, stream, first_ns, events)`` per such stream: the trace time (ns) its first
        event without a launch record starts, and how many such events come before its first
        event launched inside the window.
    """
    gpu = table.mask(*GPU_KINDS)
    # a chunk of rows at a time (perfscope.analysis.chunked): GPU events are most of a large trace
    unlinked = select_rows(gpu, lambda r: launches.start_of(r) < 0)
    if unlinked.size == 0:
        return []
    device, stream = table.device[unlinked].astype(np.int64), table.stream[unlinked].astype(np.int64)
    out = []
    for d, s_ in np.unique(np.stack([device, stream]), axis=1).T.tolist():  # a few streams
        if s_ < 0:
            continue
        on = gpu & (table.device == d) & (table.stream == s_)
        first = None  # start of the stream's first event launched inside the window
        for rows in row_chunks(on):
            rows = rows[launches.start_of(rows) >= 0]
            if rows.size:
                m = int(table.ts_ns[rows].min())
                first = m if first is None else min(first, m)
        if first is None:
            continue
        ts = table.ts_ns[unlinked[(device == d) & (stream == s_)]]
        lead = ts[ts < first]
        if lead.size:
            out.append((int(d), int(s_), int(lead.min()), int(lead.size)))
    return out


def _queued_before_window(table: TraceTable, steps: StepWindows, launches: Launches, ev: Evidence) -> None:
    queued = queued_before_window(table, launches)
    if not queued:
        return
    start = int(table.ts_ns.min())
    share = _share_of_steps(union(np.full(len(queued), start, np.int64), np.array([q[2] for q in queued], np.int64)),
                            steps)
    device, stream, first, events = max(queued, key=lambda q: q[2])
    _set(ev, share >= QUEUED_SHARE, INCOMPLETE, lambda i: (
        f"for {100 * share[i]:.0f}% of the step the GPU was still busy with work {QUEUED_MARK} "
        f"(stream {stream} of GPU {device} began with {plural(events, 'event')} without a launch record, the first "
        f"{_ms(first - start)} into the trace): the host ran ahead of the GPU, and what ran beside the step's "
        "copies and idle time until then is not in the trace"))


def _unlinked_decides(metrics: pd.DataFrame, ev: Evidence) -> None:
    """No verdict where the idle time before GPU events without a launch record decides it.

    That time counts as a dependency wait (``other_idle_us``) since nothing says the host held it
    back; read as launch wait instead, it may give another verdict -- then the trace cannot tell.
    """
    if "unlinked_idle_us" not in metrics or not (metrics["unlinked_idle_us"] > 0).any():
        return
    as_is = cost_fractions(metrics, "gpu")
    step = metrics["step_time_us"].to_numpy(dtype=float)
    share = metrics["unlinked_idle_us"].to_numpy(dtype=float) / np.where(step > 0, step, 1.0)
    moved = as_is.copy()
    moved["launch_cost_frac"] += share
    moved["other_cost_frac"] -= share
    v0, v1 = classify(as_is)[0], classify(moved)[0]
    _set(ev, (share > 0) & (v0 != v1), INCOMPLETE, lambda i: (
        f"{100 * share[i]:.0f}% of the step is GPU idle before GPU events without a launch record: read as launch "
        f"wait the step is {v1[i]}, as a dependency wait {v0[i]}, and the trace cannot tell which"))


def _share_of_steps(iv, steps: StepWindows) -> np.ndarray:
    """Per step, the share of its window that the interval set ``iv`` covers (0 for an empty step)."""
    seg = window_segments([iv], steps.start, steps.end)
    length = (steps.end - steps.start).astype(float)
    return np.divide(seg.per_window(seg.member[0]), length, out=np.zeros(len(steps)), where=length > 0)


def _initialisation(table: TraceTable, steps: StepWindows, ev: Evidence) -> None:
    rows = np.flatnonzero((table.kind == EventKind.RUNTIME) & table.name_flag(is_init_call))
    if rows.size == 0:
        return
    share = _share_of_steps(union(table.ts_ns[rows], table.end_of(rows)), steps)
    owner = locate(table.ts_ns[rows], steps.start, steps.end)

    def reason(i):
        mine = rows[owner == i]
        top = (pd.Series(table.dur_ns[mine], index=table.name_of(mine)).groupby(level=0).sum()
               .sort_values(ascending=False).head(3))
        calls = ", ".join(f"{k} {_ms(v)}" for k, v in top.items())
        return f"one-time device initialisation ({calls}) takes {100 * share[i]:.0f}% of the step"

    _set(ev, share >= INIT_SHARE, INITIALISATION, reason)


def _host_contended(table: TraceTable, steps: StepWindows, metrics: pd.DataFrame, mode: str, ev: Evidence) -> None:
    host = table.host_steps
    if not host:
        return
    explained = metrics["dataloader_us"].to_numpy(dtype=float) + metrics["exposed_comm_us"].to_numpy(dtype=float)
    if mode == "gpu":
        explained = explained + _sync_us(table, steps)
    ev.core_wait_us = np.full(len(steps), np.nan)
    ev.spin_us = np.zeros(len(steps))
    last_recorded = max(host)
    for i, number in enumerate(steps.step):
        rec = host.get(int(number))
        if rec is None and int(number) > last_recorded:  # the record ends before it: its waits are unknown
            _set(ev, np.arange(len(steps)) == i, INCOMPLETE,
                 "it has no host record (CPU time, waits for a core), which the run's other steps have: the "
                 "script ended inside it")
            continue
        if rec is None:  # before the record's first step (its cap keeps the last ones)
            continue
        wall = rec.wall_us
        if wall <= 0:
            continue
        ev.core_wait_us[i] = core_wait_us(rec, float(explained[i]))
        # CPU time its own wait does not show: the provisional verdict must hold without it too
        ev.spin_us[i] = spin_us(rec, cpu_step=mode == "cpu")
        if ev.status[i] == OK:
            why = _contended_why(rec, float(ev.core_wait_us[i]), float(explained[i]), spun=ev.spin_us[i] > 0)
            if why is not None:
                ev.status[i], ev.reason[i] = HOST_CONTENDED, why


def _contended_why(rec: HostStep, wait: float, explained: float, *, spun: bool) -> str | None:
    """Why a step is host-contended, in words; None where it is not. With the kernel's run-queue
    figure: its training thread's wait for a core (``wait``, µs) is :data:`RUN_QUEUE_SHARE` of the
    step or more, or its intra-op workers waited (``spun``). Without it: the thread ran less than
    :data:`HOST_CPU_SHARE` of the time nothing else explains (``explained``: data waits, exposed
    collectives, GPU synchronisation; µs)."""
    wall, cpu = rec.wall_us, rec.thread_cpu_us
    if rec.run_queue_us is not None:
        if wait < RUN_QUEUE_SHARE * wall and not spun:
            return None
        why = (f"of the step's {wall / 1000:.1f} ms the training thread waited {100 * wait / wall:.0f}% "
               f"for a core, ran {100 * cpu / wall:.0f}% and slept or waited for data the rest")
        if spun:
            why += (f"; its {int(rec.intra_op_threads)} intra-op threads waited up to "
                    f"{100 * rec.sibling_run_queue_us / wall:.0f}% for cores, while it may have "
                    "spun for them in CPU time its own wait does not show")
        return why
    unexplained = wall - min(explained, wall)
    if unexplained > 0 and cpu < HOST_CPU_SHARE * unexplained:
        return (f"the training thread ran on a CPU for {100 * cpu / wall:.0f}% of the step's {wall / 1000:.1f} ms, "
                "less than half of the time no data wait, collective or GPU synchronisation explains (this kernel "
                "does not report waits for a core)")
    return None


def _sync_us(table: TraceTable, steps: StepWindows) -> np.ndarray:
    """Per step, time the main thread spent in calls that wait for the GPU (us)."""
    rows = np.flatnonzero(table.mask(EventKind.RUNTIME, EventKind.CPU_OP) & (table.thread_id == steps.main_thread)
                          & table.name_flag(is_sync_call))
    seg = window_segments([union(table.ts_ns[rows], table.end_of(rows))], steps.start, steps.end)
    return seg.per_window(seg.member[0]) / _NS_PER_US
