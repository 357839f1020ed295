"""Memory read from the traces' allocator instants (``details.trace_memory``): per trace and device,
allocated and reserved bytes over the counted steps, each step's peak and growth, and the
operators that allocate the most. Part of the Memory section (:mod:`perfscope.reports.sections.memory`)."""

from __future__ import annotations

from perfscope.record.schema import TraceMemoryDevice
from perfscope.record.view import Record
from perfscope.reports import model
from perfscope.reports.html import count, esc, figure, num, pct, table, truncate
from perfscope.reports.palette import BLUE, ORANGE
from perfscope.reports.plots import levels

MAX_TRACES = 4  # traces drawn; summary.json holds every trace's record


def mib(value) -> str:
    v = num(value)
    return "-" if v is None else f"{v / 2**20:,.1f} MiB"


def _signed(value) -> str:
    v = num(value)
    return "-" if v is None else ("+" if v > 0 else "") + mib(v)


def _points(d: TraceMemoryDevice) -> list[list]:
    """The device's curve points ``[ms, allocated, reserved]`` that have their time."""
    return [p for p in d.curve or [] if len(p) == 3 and p[0] is not None]


def _series(d: TraceMemoryDevice) -> list[tuple]:
    """The allocated (and, where every point has it, reserved) MiB over the device's curve."""
    curve = _points(d)
    xs = [p[0] for p in curve]
    series = [("allocated", xs, [(p[1] or 0.0) / 2**20 for p in curve], BLUE)]
    reserved = [p[2] for p in curve]
    if curve and None not in reserved:
        series.append(("reserved", xs, [v / 2**20 for v in reserved], ORANGE))
    return series


def _chart(d: TraceMemoryDevice, key: str, who: str) -> str:
    device = d.device or "?"
    series = _series(d)
    basis = ("change since the trace's first allocator instant (the trace has no allocator totals)"
             if d.relative else "bytes the allocator held")
    return figure(levels(key, series, "ms since the first counted step began", "MiB",
                         f"{who} {device}: memory over the counted steps"),
                  f"{who} {device}: allocated{' and reserved' if len(series) > 1 else ''} memory over the "
                  f"counted steps, the highest level of each time bucket; {basis}.")


def _steps_table(d: TraceMemoryDevice) -> str:
    rows = [("", [esc(s.step), mib(s.peak_allocated_bytes), _signed(s.growth_bytes), count(s.allocations)])
            for s in d.steps or []]
    return table([("step", "l"), ("peak allocated", ""), ("growth", ""), ("allocations", "")], rows,
                 "Growth: allocated at the step's end less at its start. A run whose every step grows "
                 "keeps tensors alive across steps (a loss kept with its graph, a list of outputs).")


def _operators_table(d: TraceMemoryDevice) -> str:
    if d.top_operators is None:
        return '<p class="muted">Operators not swept: the trace has too many on the allocating threads.</p>'
    rows = [("", [esc(truncate(o.name, 90)), count(o.allocations), mib(o.bytes), pct(o.share, 1)])
            for o in d.top_operators]
    return table([("operator", "l"), ("allocations", ""), ("allocated", ""), ("share", "")], rows,
                 "Each allocation is charged to the innermost operator around it that does more than provide "
                 "memory (the convolution, not its aten::empty).")


def _device(d: TraceMemoryDevice, key: str, who: str) -> str:
    reserved = d.peak_reserved_bytes
    head = (f"<h3>{esc(who)} {esc(d.device or '?')}</h3><p>Peak allocated {esc(mib(d.peak_allocated_bytes))}"
            + (f", reserved {esc(mib(reserved))}" if reserved is not None else "")
            + f"; {esc(count(d.allocations))} allocations of {esc(mib(d.allocated_bytes))} in all; "
            f"growth over the counted steps {esc(_signed(d.growth_bytes))}."
            + (" Levels are changes since the trace's first allocator instant: the trace (2021 format) has no "
               "allocator totals." if d.relative else "")
            + (" The profiler counts the CPU allocator's bytes from its own start: these are bytes allocated since "
               "then, not the process's memory (its resident set is in the memory section)."
               if d.since_profiler_start else "") + "</p>")
    return head + _chart(d, key, who) + _steps_table(d) + _operators_table(d)


def render(record: Record) -> str:
    """The HTML of the traces' memory (empty when no trace holds allocator instants)."""
    traces = model.details(record).trace_memory or []
    if not traces:
        return ""
    parts = [_device(d, f"tmem{i}-{j}", f"rank {t.rank}" if len(traces) > 1 else "trace")
             for i, t in enumerate(traces[:MAX_TRACES]) for j, d in enumerate(t.devices or [])]
    more = (f'<p class="muted">{len(traces) - MAX_TRACES} more traces in summary.json '
            "(details.trace_memory).</p>" if len(traces) > MAX_TRACES else "")
    return ("<h3>From the traces' allocator records</h3><p>The profiler recorded every allocation and free "
            "(<code>profile_memory=True</code>).</p>" + "".join(parts) + more)
