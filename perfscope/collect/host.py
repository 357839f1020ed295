"""What the host gave the training thread in each profiled step: CPU time beside wall time.

On a loaded machine the training thread is descheduled while it runs an operator, so the trace
shows long operators and the step looks compute-bound. The trace cannot tell; the operating
system can. At the boundaries of the steps the profiler traces, :class:`HostStepRecorder` reads the wall clock
(``time.perf_counter_ns``), the thread's and the process's CPU clocks (``time.thread_time_ns``,
``time.process_time_ns``), the thread's run-queue wait (the second field, ``run_delay``, of
Linux's ``/proc/thread-self/schedstat``) and the step's memory peaks (:mod:`perfscope.collect.memory`),
and writes the step's record (format:
:mod:`perfscope.record.host_steps`) into the trace header with
``torch.profiler.profile.add_metadata_json``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from perfscope.collect.energy import EnergyProbe
from perfscope.collect.memory import MemoryProbe
from perfscope.record.host_steps import HOST_STEPS_KEY, MAX_STEPS, VERSION

_SCHEDSTAT = "/proc/thread-self/schedstat"
# Profiler actions (torch.profiler.ProfilerAction names) of the steps the trace keeps: only then is the
# profiler's session live to take metadata (a warm-up step is traced and thrown away).
_RECORDING = frozenset({"RECORD", "RECORD_AND_SAVE"})
_TRACED = _RECORDING | {"WARMUP"}  # steps the profiler traces (the warm-up's are thrown away)


def tracing(profiler) -> bool:
    """The torch profiler traces its current step (warm-up or recording)."""
    return getattr(getattr(profiler, "current_action", None), "name", None) in _TRACED


def _run_delay_ns(path: str) -> int | None:
    """The ``run_delay`` (second field, ns) of a ``schedstat`` file, or None where unreadable."""
    try:
        with open(path, "rb") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _run_queue_ns() -> int | None:
    return _run_delay_ns(_SCHEDSTAT)


def _siblings_run_queue_ns() -> dict[str, int] | None:
    """The run-queue wait (ns, ``schedstat`` ``run_delay``) of each of the process's other threads
    (the intra-op workers among them), by thread id; None where ``/proc`` does not list them."""
    own = str(threading.get_native_id())
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    waits = {tid: _run_delay_ns(f"/proc/self/task/{tid}/schedstat") for tid in tids if tid != own}
    return {tid: ns for tid, ns in waits.items() if ns is not None}


def _intra_op_threads() -> int | None:
    torch = sys.modules.get("torch")
    try:
        return int(torch.get_num_threads()) if torch is not None else None
    except Exception:  # noqa: BLE001 - a torch without it: unknown
        return None


_TICK_US = 1e6 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
# Below this between two reads the 10 ms ticks say nothing: the step gets no CPU split, and the
# next one covers both (reading /proc costs tens of microseconds: not on every 1 ms step).
_CPU_READ_MIN_NS = 20_000_000


def _machine_busy_ticks() -> int | None:
    """Clock ticks every core spent busy since boot (``/proc/stat``'s ``cpu`` line, less idle and iowait)."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields[:8]) - fields[3] - fields[4] if len(fields) >= 8 else None


def _children_ticks() -> dict[int, int]:
    """CPU ticks (user + system) of each child process of the calling thread (DataLoader workers)."""
    try:
        with open("/proc/thread-self/children", "rb") as f:
            pids = [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return {}
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
            out[pid] = int(rest[11]) + int(rest[12])  # utime, stime: fields 14 and 15
        except (OSError, ValueError, IndexError):
            continue
    return out


class CpuSources:
    """Per step, the machine's busy CPU time and the training thread's children's, for the split
    of a busy host by who held the cores (:mod:`perfscope.analysis.host_cpu`)."""

    def __init__(self) -> None:
        self._at: int | None = None
        self._busy: int | None = None
        self._children: dict[int, int] = {}

    def begin(self) -> None:
        self._at, self._busy, self._children = time.perf_counter_ns(), _machine_busy_ticks(), _children_ticks()

    def end(self) -> dict:
        """The step's ``machine_busy_us``, ``workers_cpu_us`` and ``cores`` (None where not read,
        or where the step was too short to read: the next step then covers it)."""
        if self._at is None or self._busy is None or time.perf_counter_ns() - self._at < _CPU_READ_MIN_NS:
            return {"machine_busy_us": None, "workers_cpu_us": None, "cores": os.cpu_count()}
        busy, children = _machine_busy_ticks(), _children_ticks()
        if busy is None:
            return {"machine_busy_us": None, "workers_cpu_us": None, "cores": os.cpu_count()}
        workers = sum(max(0, t - self._children.get(pid, 0)) for pid, t in children.items())
        out = {"machine_busy_us": max(0, busy - self._busy) * _TICK_US, "workers_cpu_us": workers * _TICK_US,
               "cores": os.cpu_count()}
        self._at, self._busy, self._children = time.perf_counter_ns(), busy, children
        return out


def snapshot() -> tuple:
    """(wall, thread CPU, process CPU, run-queue wait) now, in nanoseconds of their clocks, the
    thread they were read on, the time since the epoch (ns: what aligns telemetry samples), and
    the other threads' run-queue waits (:func:`_siblings_run_queue_ns`)."""
    return (time.perf_counter_ns(), time.thread_time_ns(), time.process_time_ns(), _run_queue_ns(),
            threading.get_ident(), time.time_ns(), _siblings_run_queue_ns())


class HostStepRecorder:
    """The ``prof`` a :class:`~perfscope.collect.steps.StepTracker` drives, wrapping the torch
    profiler: at each ``step()`` it closes the host record of the step ending there (the
    profiler's ``step_num`` before the call is that step's ``ProfilerStep#`` number).

    Args:
        inner: A ``torch.profiler.profile``.
        extra: Called at each recorded step for one more header entry ``(key, JSON text)``, or
            None (e.g. :meth:`perfscope.collect.job_watch.JobWatch.header`).
        memory: The per-step memory probe (default :class:`~perfscope.collect.memory.MemoryProbe`).
        telemetry: A :class:`~perfscope.collect.telemetry.TelemetrySampler` bound to the training
            thread's device at the step boundaries and written into the header, or None.
        sync: Called once, at the boundary where the profiler's recording window opens (default:
            wait for the GPU where the process uses CUDA). A loop that never waits for the GPU
            runs ahead of it; the window would then open on work launched before it, which the
            trace cannot show beside the window's own copies and idle time
            (``docs/metrics.md``, "Work from before the window").
        flops: A :class:`~perfscope.collect.flops.FlopStep` told of every boundary, whose record
            goes into the header, or None.
        modules: A :class:`~perfscope.collect.modules.ModuleRanges` switched on for the steps
            the profiler traces, or None.
        oom: A :class:`~perfscope.collect.oom.OomWatch` armed at each boundary (it acts once the
            script uses CUDA), or None.
        energy: The per-step energy probe (default :class:`~perfscope.collect.energy.EnergyProbe`).
    """

    def __init__(self, inner: Any, extra: Callable[[], tuple[str, str] | None] | None = None,
                 memory: MemoryProbe | None = None, telemetry=None, sync: Callable[[], None] | None = None,
                 flops=None, modules=None, oom=None, energy: EnergyProbe | None = None) -> None:
        self._inner = inner
        self._energy = energy if energy is not None else EnergyProbe()
        self._oom = oom
        self._flops = flops
        self._modules = modules
        self._sync = sync if sync is not None else sync_cuda
        self._extra = extra
        self._telemetry = telemetry
        self._memory = memory if memory is not None else MemoryProbe()
        self._cpu = CpuSources()
        self._start: tuple | None = None
        self.steps: deque[dict] = deque(maxlen=MAX_STEPS)
        # The torch profiler is entered at the boundary before its first traced step: before it,
        # its step() (schedule, ProfilerStep# range) is all cost and no trace, so the steps are
        # counted here (docs/collection.md, the profiler outside the window).
        self._entered = False
        self._step_num = 0

    @property
    def step_num(self) -> int:
        """The profiler's step number (counted here until the profiler is entered)."""
        return self._inner.step_num if self._entered else self._step_num

    def _action(self, step: int) -> str | None:
        """The name of the profiler schedule's action for ``step`` (None: no schedule)."""
        schedule = getattr(self._inner, "schedule", None)
        return None if schedule is None else getattr(schedule(step), "name", None)

    def _next_action(self) -> str | None:
        return self._action(self.step_num + 1)

    def _enter(self) -> None:
        """Enter the torch profiler at the step counted so far (its schedule's action there)."""
        if self._step_num:
            # Public attributes of torch.profiler.profile, read by its start() (checked against torch 2.13).
            self._inner.step_num = self._step_num
            self._inner.current_action = self._inner.schedule(self._step_num)
        self._inner.__enter__()
        self._entered = True

    def __enter__(self) -> HostStepRecorder:  # noqa: PYI034 - typing.Self needs Python 3.11
        if self._action(0) != "NONE" or self._next_action() != "NONE":  # no schedule, or a window from the start
            self._enter()
        if self._entered and tracing(self._inner):  # a window from the first step
            self._memory.begin()
            self._energy.begin()
            self._cpu.begin()
            self._start = snapshot()
        return self

    def __exit__(self, *exc: object) -> Any:
        if self._modules is not None:
            self._modules.switch(False)
        if self._flops is not None:
            self._flops.close()
        if not self._entered:
            return None  # the window never came: nothing was traced
        return self._inner.__exit__(*exc)

    def step(self) -> None:
        # Only the steps the profiler traces are read (their record is all the trace can use):
        # outside the window a boundary costs no file read or write.
        if self._start is not None:
            self._close_step()
        if self._telemetry is not None:
            self._telemetry.bind()  # on the training thread: its CUDA device, once initialised
        if self._oom is not None:
            self._oom.arm()
        if not self._entered:
            if self._next_action() == "NONE":
                self._step_num += 1  # still before the window: no profiler work at this boundary
                if self._flops is not None:
                    self._flops.boundary(self._step_num)
                return
            self._enter()
        if self._window_opens_next():
            self._sync()  # in the last warm-up step, which the trace drops: no recorded step pays
        self._inner.step()
        if self._flops is not None:
            self._flops.boundary(self._inner.step_num)  # the step now starting
        traced = tracing(self._inner)
        if self._modules is not None:
            self._modules.switch(traced)
        if traced:
            self._memory.begin()
            self._energy.begin()
            if self._start is None:
                self._cpu.begin()  # the machine's and the workers' CPU from this step on
            self._start = snapshot()  # after the profiler's own work at the boundary
        else:
            self._start = None

    def _close_step(self) -> None:
        """The host record of the traced step ending now; into the header while recording."""
        now = snapshot()
        # A thread's clocks compare only on that thread: a loop training in a thread of its own
        # ends its first step there, after the profiler was entered on the main thread.
        memory = self._memory.end()
        energy = self._energy.end()
        cpu = self._cpu.end()
        if self._start is not None and self._start[4] == now[4]:
            self.steps.append({**_record(self._inner.step_num, self._start, now), **memory, **energy, **cpu})
            action = getattr(getattr(self._inner, "current_action", None), "name", None)
            if action in _RECORDING:
                # Overwrites the key: the header holds every step recorded so far.
                record = {"version": VERSION, "steps": list(self.steps), "memory": self._memory.capacity(),
                          "energy": self._energy.record()}
                self._inner.add_metadata_json(HOST_STEPS_KEY, json.dumps(record))
                entry = self._extra() if self._extra is not None else None
                if entry is not None:
                    self._inner.add_metadata_json(*entry)
                if self._telemetry is not None:
                    self._inner.add_metadata_json(*self._telemetry.header())
                counted = self._flops.header() if self._flops is not None else None
                if counted is not None:
                    self._inner.add_metadata_json(*counted)

    def _window_opens_next(self) -> bool:
        """The profiler's next step is its first recorded one (its schedule says so)."""
        now = getattr(getattr(self._inner, "current_action", None), "name", None)
        return now not in _RECORDING and self._next_action() in _RECORDING


def sync_cuda() -> None:
    """Wait for the current CUDA device where this process already uses CUDA (never initialise it)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and cuda_in_use(torch.cuda):
        torch.cuda.synchronize()


def cuda_in_use(cuda) -> bool:
    """Whether this process already uses CUDA (``cuda``: ``torch.cuda``); never initialises it."""
    return cuda.is_available() and cuda.is_initialized()


def _record(step: int, a: tuple, b: tuple) -> dict:
    run_queue = (b[3] - a[3]) / 1000.0 if a[3] is not None and b[3] is not None else None
    return {"step": int(step), "wall_us": (b[0] - a[0]) / 1000.0, "thread_cpu_us": (b[1] - a[1]) / 1000.0,
            "process_cpu_us": (b[2] - a[2]) / 1000.0, "run_queue_us": run_queue, "start_unix_ns": a[5],
            "sibling_run_queue_us": _largest_wait(a[6], b[6]), "intra_op_threads": _intra_op_threads()}


def _largest_wait(a: dict[str, int] | None, b: dict[str, int] | None) -> float | None:
    """The longest run-queue wait (µs) any other thread of the process had between two snapshots
    (threads that started in between count from zero)."""
    if a is None or b is None:
        return None
    return max((b[t] - a.get(t, 0) for t in b), default=0) / 1000.0
