"""The host record of a profiled run: CPU time beside wall time per step, kept in the trace header.

``perfscope profile`` writes it (:mod:`perfscope.collect.host`); the trace reader reads it back
(:mod:`perfscope.trace.header`), so ``perfscope analyze`` of the same trace later sees it too. This
module owns the format, so both sides agree. It imports nothing heavy (msgspec, as the telemetry
record does: 16-22 ms once, measured on this 2-core machine under load): it is loaded into
the profiled script's process.

The header key :data:`HOST_STEPS_KEY` holds ``{"version": 1, "steps": [...]}``, one entry per step
with its ``ProfilerStep#`` number ``step`` and, in microseconds (trace units):

- ``wall_us``: wall-clock time of the step;
- ``thread_cpu_us``: CPU time the training thread got (CLOCK_THREAD_CPUTIME_ID);
- ``process_cpu_us``: CPU time of the whole process, every thread;
- ``run_queue_us``: time the training thread was runnable but waited for a core (Linux
  ``schedstat`` ``run_delay``); null where the kernel does not report it;
- ``machine_busy_us``: CPU time all of the machine's cores spent busy during the step (Linux
  ``/proc/stat``, in clock ticks of 10 ms: meaningful summed over steps); null where not read;
- ``workers_cpu_us``: CPU time of the training thread's child processes (DataLoader workers)
  during the step (their ``/proc/<pid>/stat``, the same ticks); null where not read;
- ``cores``: the machine's online cores the busy time is counted over;
- ``sibling_run_queue_us``: the longest run-queue wait of any other thread of the process during
  the step (the intra-op workers among them); null where not read;
- ``intra_op_threads``: the process's intra-op threads (``torch.get_num_threads()``) at the step's end;
- ``start_unix_ns``: when the step started, ns since the epoch (``time.time_ns``): the anchor
  that aligns the telemetry samples (:mod:`perfscope.record.telemetry_format`) to the trace's clock;

and in bytes (:mod:`perfscope.collect.memory`; null where not measured, absent in records of
earlier perfscope versions):

- ``peak_rss_bytes``: the process's peak resident set during the step;
- ``device_peak_allocated_bytes``, ``device_peak_reserved_bytes``: the CUDA caching allocator's
  peaks during the step (tensors, and what the allocator holds from the driver).

The record's ``memory`` object holds the capacities: ``host_total_bytes``, and on CUDA
``device_total_bytes`` and ``device``.

``energy_j`` (joules; null where not measured) is the energy counter's rise over the step
(:mod:`perfscope.collect.energy`); the record's ``energy`` object names the counter --
``source`` (``NVML`` or ``RAPL``), ``unit`` (``GPU`` or ``machine``: what it covers), ``machine``
(the host name, so that a machine's counter is counted once) -- or, with ``source`` null, ``why``.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from perfscope.record.lenient import lenient

HOST_STEPS_KEY = "perfscope_host_steps"
VERSION = 1
FIELDS = ("wall_us", "thread_cpu_us", "process_cpu_us", "run_queue_us")  # in every version's entries
MEMORY_FIELDS = ("peak_rss_bytes", "device_peak_allocated_bytes", "device_peak_reserved_bytes")
# Joules above this in one step are not a measurement (a megawatt for a quarter of an hour).
MAX_J = 1e9
# Sizes above this are not memory a step can hold (a hand-edited or damaged record): left out.
MAX_BYTES = 2**60
# Entries kept in the header: the profiled window is a few steps; a cap keeps a long warm-up
# from growing the header.
MAX_STEPS = 256


# A step of more than this many microseconds (115 days) is not a measurement: the entry is refused.
MAX_US = 1e13

# Descheduling: a quarter of the step spent runnable but off the CPU (as much as the launch
# threshold, the largest of the verdict thresholds: enough to make or unmake any verdict). Measured
# on a 2-core machine: quiet, under 10% of a step; with 3 busy processes beside the script, 40-70%.
# The analysis (perfscope.analysis.evidence, status ``host-contended``) and the collector's window
# extension (perfscope.collect.window) both judge a step by this one rule.
RUN_QUEUE_SHARE = 0.25


def queue_wait_us(wall: float, cpu: float, queue: float) -> float:
    """The time (µs) a step's training thread waited for a core, from the kernel's run-queue
    figure (``schedstat`` ``run_delay``), bounded by the time the thread was off the CPU: the
    kernel books a wait when the thread next runs, so a step's figure can hold some of the
    previous step's.

    Args:
        wall, cpu, queue: The step's wall time, the thread's CPU time and its run-queue wait (µs).
    """
    return min(queue, max(wall - cpu, 0.0))


# The range each figure can take; outside it the figure is not a measurement (a damaged or
# hand-edited record) and reads as absent.
_Us = Annotated[float, msgspec.Meta(ge=0, le=MAX_US)]
_Bytes = Annotated[int, msgspec.Meta(ge=0, le=MAX_BYTES)]
_Joules = Annotated[float, msgspec.Meta(ge=0, le=MAX_J)]


class HostStep(msgspec.Struct, kw_only=True, frozen=True):
    """One step's entry of the host record (the module docstring names each figure), read
    leniently (:mod:`perfscope.record.lenient`): a figure of the wrong type or out of its range
    is None, as one the record lacks."""

    step: int | None = None
    wall_us: _Us | None = None
    thread_cpu_us: _Us | None = None
    process_cpu_us: _Us | None = None
    run_queue_us: _Us | None = None
    # Who held the cores (absent in records of earlier versions): perfscope.analysis.host_cpu.
    machine_busy_us: _Us | None = None
    workers_cpu_us: _Us | None = None
    cores: _Us | None = None
    # The intra-op workers (absent in records of earlier versions): a training thread's CPU time
    # holds its spinning at the end of each parallel operator while a worker waits for a core.
    sibling_run_queue_us: _Us | None = None
    intra_op_threads: _Us | None = None
    peak_rss_bytes: _Bytes | None = None
    device_peak_allocated_bytes: _Bytes | None = None
    device_peak_reserved_bytes: _Bytes | None = None
    energy_j: _Joules | None = None
    start_unix_ns: Annotated[int, msgspec.Meta(gt=0)] | None = None


def host_step(entry) -> HostStep:
    """An entry of the host record (any JSON value; the collector's own entries too) as :class:`HostStep`."""
    return lenient(entry, HostStep)


def waited_for_core(entry: HostStep, *, workers: bool = True) -> bool | None:
    """Whether a host record entry's step waited for a core :data:`RUN_QUEUE_SHARE` of its wall
    time or more; None where its entry cannot tell (no run-queue figure, no wall time). The trace
    can still decide those (the analysis's rule without the run-queue figure needs it).

    ``workers``: whether its intra-op workers' waits count too (:func:`workers_waited`): on a CPU
    step, where the math runs on them; not on a GPU step, whose math does not (as the analysis's
    rule, :mod:`perfscope.analysis.evidence`)."""
    wall, cpu, queue = entry.wall_us, entry.thread_cpu_us, entry.run_queue_us
    if queue is None or cpu is None or not wall or wall <= 0:
        return None
    return queue_wait_us(wall, cpu, queue) >= RUN_QUEUE_SHARE * wall or (workers and workers_waited(entry))


def workers_waited(entry: HostStep) -> bool:
    """Whether a step's intra-op workers (more than one intra-op thread) waited for a core
    :data:`RUN_QUEUE_SHARE` of its wall time or more (the longest wait of the process's other
    threads). The training thread then spun at the end of each parallel operator until they
    came, and that spinning is CPU time: its own run-queue figure does not show it, and it cannot
    be taken out of the step (measured on 2 cores beside 4 busy processes: 5-30x the quiet CPU
    time of the thread, against a run-queue figure of 2-3x)."""
    wall, threads, wait = entry.wall_us, entry.intra_op_threads, entry.sibling_run_queue_us
    return bool(threads and threads > 1 and wait is not None and wall and wall > 0 and wait >= RUN_QUEUE_SHARE * wall)


def core_wait_us(entry: HostStep, explained: float) -> float:
    """The time (µs) a step's training thread waited for a core: the kernel's run-queue figure
    where it reports one (:func:`queue_wait_us`); else the time the thread neither ran nor spent in
    waits that ``explained`` covers (data, collectives, GPU synchronisation, as the trace shows
    them; µs): descheduled, as far as the trace can tell. ``entry`` has its wall and CPU time
    (:func:`parse` keeps no entry without them)."""
    wall, cpu = entry.wall_us, entry.thread_cpu_us
    if entry.run_queue_us is not None:
        return queue_wait_us(wall, cpu, entry.run_queue_us)
    return max(wall - min(explained, wall) - cpu, 0.0)


def spin_us(entry: HostStep, *, cpu_step: bool) -> float:
    """How long a step's training thread may have spun for its intra-op workers (µs): their
    longest wait where they waited (:func:`workers_waited`) on a CPU step, else 0 -- a GPU
    step's math does not run on them."""
    return min(entry.sibling_run_queue_us, entry.wall_us) if cpu_step and workers_waited(entry) else 0.0


def _number(v, high: float = MAX_US) -> bool:
    return type(v) in (int, float) and v == v and 0 <= v <= high


def parse(value) -> tuple[dict[int, HostStep], int]:
    """The host record by step number, and how many entries were unusable (not an object, no
    step number, no wall or thread CPU time; a step number given twice keeps its last entry).

    Args:
        value: The header value under :data:`HOST_STEPS_KEY` (any JSON value).

    Returns:
        ``({step: HostStep}, unusable)``; ``({}, -1)`` when ``value`` is not such a record at all.
    """
    steps = value.get("steps") if isinstance(value, dict) else None
    if not isinstance(steps, list):
        return {}, -1
    read = (host_step(s) for s in steps if isinstance(s, dict))
    out = {s.step: s for s in read if s.step is not None and s.wall_us is not None and s.thread_cpu_us is not None}
    return out, len(steps) - len(out)


def parse_capacity(value) -> dict:
    """The capacities of a host record (``memory``: ``host_total_bytes``, ``device_total_bytes``
    as ints, ``device`` as text), each left out where absent or unusable; ``{}`` for no record."""
    memory = value.get("memory") if isinstance(value, dict) else None
    if not isinstance(memory, dict):
        return {}
    out: dict = {k: int(memory[k]) for k in ("host_total_bytes", "device_total_bytes")
                 if _number(memory.get(k), MAX_BYTES) and memory[k] > 0}
    if isinstance(memory.get("device"), str) and len(memory["device"]) <= 32:
        out["device"] = memory["device"]
    return out


def parse_energy(value) -> dict:
    """The energy counter of a host record: ``{"source", "unit", "machine"}`` (text), or
    ``{"why"}`` where none was read; ``{}`` for a record without one (or not a record)."""
    energy = value.get("energy") if isinstance(value, dict) else None
    if not isinstance(energy, dict):
        return {}

    def text(key: str) -> str | None:
        v = energy.get(key)
        return v[:200] if isinstance(v, str) and v else None

    if energy.get("source") in ("NVML", "RAPL") and energy.get("unit") in ("GPU", "machine"):
        return {"source": energy["source"], "unit": energy["unit"], "machine": text("machine")}
    return {"why": text("why") or "the record names no usable energy counter"}
