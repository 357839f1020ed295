"""One line per view of the summary record, printed under the verdict by the console
(:mod:`perfscope.console`): what the GPU waited on, the straggler, the nodes, memory, the GPU's
efficiency, MFU, modules, the whole run, telemetry; and what held the memory at an out-of-memory
error. Each is None (or []) where the record has no such view; every string that came from a trace
is passed through :func:`perfscope.text.safe` by the caller or here.
"""

from __future__ import annotations

from perfscope.analysis.waits import wait_shares
from perfscope.record.schema import Details, Oom, OomBlock, OtherWaits, Telemetry, TraceMemoryDevice
from perfscope.record.view import Record, record_of
from perfscope.text import safe


def details(record: Record) -> Details:
    """``details``, empty where the record has none."""
    return record.details_or_empty()


def waits_line(record: Record) -> str | None:
    """What the GPU waited on, when ``other`` is the largest share."""
    o = record.overall
    if o is None or not o.other_largest:
        return None
    parts = _wait_causes(details(record).other_waits or OtherWaits())
    share = 100 * ((o.fractions.other if o.fractions else None) or 0.0)
    unshown = parts == [] or all(p.startswith("not shown") for p in parts)
    what = ("; the trace does not show what it waited on" if unshown else f"; the GPU waited on: {'; '.join(parts)}")
    return (f"largest share: other {share:.0f}% (GPU idle with work already queued, waiting on a dependency; no "
            f"single knob removes it){what}")


def _wait_causes(waits: OtherWaits) -> list[str]:
    """``cause N% (call, call)`` for each cause of the GPU's waits with time of its own."""
    parts = []
    for cause, share, calls in wait_shares(waits):
        names = ", ".join(safe(k) for k, _ in calls[:2])
        parts.append(f"{cause} {100 * share:.0f}%" + (f" ({names})" if names else ""))
    return parts


def straggler_line(record: Record) -> str | None:
    st = details(record).straggler
    if st is None or st.rank is None:
        return None
    wait = st.median_others_wait_us or 0.0
    if st.basis == "collective waits":
        how = f"waits least in the collectives in {st.steps_last} of {st.steps} steps (the clocks disagree)"
    else:
        how = (f"arrives last at the collectives in {st.steps_last} of {st.steps} steps, "
               f"{(st.median_late_us or 0.0) / 1000:.2f} ms late per step (median)")
    return f"straggler: rank {st.rank} {how}; the other ranks wait {wait / 1000:.2f} ms per step for it"


def nodes_line(record: Record) -> str | None:
    nv = details(record).nodes
    if nv is None or nv.nodes is None:
        return None
    where = "; ".join(f"node {n.node}: ranks {_ranks_text(n.ranks)}" for n in nv.nodes[:8])
    line = f"nodes: {nv.count} ({safe(where)})"
    slow = nv.straggler_node
    if slow is not None:
        line += f"; node {slow.node} is the one the others wait for (rank {slow.rank})"
    rates = nv.link.achieved_bits_per_s if nv.link else None
    if not rates:
        return line
    return (line + f"; {nv.link.algorithm} all-reduce puts {(nv.link.inter_node_bytes_per_step or 0.0) / 2**20:.1f} "
            f"MiB per step on each node's link, carried at {min(rates.values()) / 1e6:.0f} Mbit/s or more")


def _ranks_text(ranks: list | None) -> str:
    if not ranks:
        return "none"
    if ranks == list(range(ranks[0], ranks[0] + len(ranks))) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks[:16]) + ("..." if len(ranks) > 16 else "")


def memory_line(record: Record) -> str | None:
    """``memory: peak ... of ... (headroom)`` from ``details.memory``, or None when not measured."""
    m = details(record).memory
    if m is None or m.peak_bytes is None:
        return trace_memory_line(record)
    what = "reserved on the device" if m.kind == "device" else "resident on the host"
    line = f"memory: peak {m.peak_bytes / 2**30:.2f} GiB {what}"
    if m.capacity_bytes is not None and m.headroom_share is not None:
        if m.headroom_share < 0:
            line += f" of {m.capacity_bytes / 2**30:.1f} GiB (the ranks' peaks add up to more than the machine has)"
        else:
            line += f" of {m.capacity_bytes / 2**30:.1f} GiB ({m.headroom_share:.0%} headroom"
            line += ", near the limit)" if m.near_limit else ")"
    return line


def efficiency_line(record: Record) -> str | None:
    """``gpu efficiency: ...`` from ``details.gpu_efficiency``; None without it."""
    e = details(record).gpu_efficiency
    if e is None or e.tensor_core_share is None:
        return None
    parts = [f"{label} {share:.0%}" for share, label in ((e.sm_efficiency, "est. SM efficiency"),
                                                         (e.achieved_occupancy, "est. achieved occupancy"))
             if share is not None]
    parts.append(f"Tensor Cores {e.tensor_core_share:.0%} of kernel time"
                 + (" (the GPU has them: none used)" if e.no_tensor_cores else ""))
    return "gpu efficiency: " + ", ".join(parts)


def mfu_console_line(record: Record) -> str | None:
    """``mfu: ...`` from ``details.mfu``; None without it."""
    from perfscope.analysis.mfu import mfu_line

    view = details(record).mfu
    return safe("mfu: " + mfu_line(view)) if view is not None and view.flops_per_step else None


def oom_lines(oom: Oom | dict | None) -> list[str]:
    """What held the GPU's memory when the script ran out of it (``run.oom``, or the run's record of
    it as plain data), a few lines; [] without it."""
    if isinstance(oom, dict):
        oom = record_of({"run": {"oom": oom}}).run.oom
    if oom is None or oom.requested_bytes is None:
        return []
    mib = 2**20
    lines = [f"out of memory on cuda:{oom.device}: {oom.requested_bytes / mib:,.0f} MiB asked for, "
             f"{(oom.allocated_bytes or 0) / mib:,.0f} MiB allocated, {(oom.free_bytes or 0) / mib:,.0f} MiB "
             "free; the largest live allocations:"]
    lines += [_block_line(b) for b in (oom.largest or [])[:5]]
    return [safe(line) for line in lines]


def _block_line(b: OomBlock) -> str:
    """``"  512.0 MiB  model.py:42 forward"``: a live allocation and its innermost frame."""
    frames = b.frames or []
    return f"  {(b.bytes or 0) / 2**20:,.1f} MiB  {frames[0] if frames else '(no stack recorded)'}"


def modules_line(record: Record) -> str | None:
    """``modules: ...``: the leaf modules with most self time in the forward pass; None without them."""
    view = details(record).modules
    rows = (view.rows if view else None) or []
    if not rows:
        return None
    key = "device_self_us" if record.mode == "gpu" else "host_self_us"

    def self_us(r) -> float:
        return getattr(r, key) or 0.0

    total = sum(map(self_us, rows)) or 1.0
    top = sorted(rows, key=lambda r: -self_us(r))[:3]
    return safe("modules (forward, self time): " + ", ".join(f"{r.module} {self_us(r) / total:.0%}" for r in top))


def run_line(record: Record) -> str | None:
    """``whole run: ...`` of the slowest rank's ``details.run_steps`` entry; None without one."""
    from perfscope.analysis.run_view import run_findings, run_headline

    views = details(record).run_steps or []
    if not views:
        return None
    view = max(views, key=lambda v: v.median_s or 0.0)
    who = f"rank {view.rank}: " if len(views) > 1 and view.rank is not None else ""
    return safe("whole run: " + who + "; ".join([run_headline(view), *run_findings(view)]))


def _first_device(record: Record) -> TraceMemoryDevice | None:
    """The first trace's first device of ``details.trace_memory`` (the one with the most bytes)."""
    traces = details(record).trace_memory or []
    devices = (traces[0].devices or []) if traces else []
    return devices[0] if devices else None


def trace_memory_line(record: Record) -> str | None:
    """``memory (allocator records): ...`` for the first trace's device with the most bytes
    allocated (the first of ``details.trace_memory``); None without it."""
    d = _first_device(record)
    if d is None or d.peak_allocated_bytes is None:
        return None
    rise = " above the trace's first record" if d.relative else ""
    if d.since_profiler_start:
        rise += " since the profiler started (its count, not the process's memory)"
    line = f"memory (allocator records): {d.device} peak {d.peak_allocated_bytes / 2**30:.2f} GiB allocated{rise}"
    if d.growth_bytes is not None:
        line += f", {d.growth_bytes / 2**20:+,.1f} MiB over the counted steps"
    ops = d.top_operators or []
    if ops and ops[0].share is not None:
        line += f"; most allocated by {ops[0].name} ({ops[0].share:.0%})"
    return safe(line)


def telemetry_line(record: Record) -> str | None:
    """``gpu: utilisation ..., SM clock ..., power ...`` from ``details.telemetry``; on a GPU run
    without samples, why; None on a CPU run."""
    t = details(record).telemetry
    if t is None or record.mode != "gpu":
        return None
    if t.skipped:
        return safe(f"gpu telemetry: not sampled ({t.skipped})")
    line = _utilisation(t)
    if line is None:
        return None
    return safe(line + _clocks_and_power(t))


def _clocks_and_power(t: Telemetry) -> str:
    """``, SM clock A-B MHz, power W mean, clocks throttled in N% of samples``, what is known of it."""
    clocks, power, text = t.sm_clock_mhz or {}, t.power_w or {}, ""
    if clocks.get("min") is not None and clocks.get("max") is not None:
        text += f", SM clock {clocks['min']:.0f}-{clocks['max']:.0f} MHz"
    if power.get("mean") is not None:
        text += f", power {power['mean']:.0f} W mean"
    if (t.throttled_share or 0) > 0:
        text += f", clocks throttled in {t.throttled_share:.0%} of samples"
    return text


def _utilisation(t: Telemetry) -> str | None:
    """``gpu: utilisation N% (source...)``, or why it was not measured; None when neither is known."""
    if t.gpu_util_pct is not None:
        settled, samples = t.settled_samples, t.samples
        # say so when utilisation and power rest on fewer samples than the clocks beside them
        part = (f", {settled:.0f} of {samples:.0f} samples: the others hold time before the window"
                if settled is not None and samples is not None and settled < samples else "")
        return f"gpu: utilisation {t.gpu_util_pct:.0f}% ({t.source or 'NVML'}{part})"
    if t.unsettled is not None:
        return f"gpu: utilisation not measured ({t.unsettled})"
    return None


def usd(value: float) -> str:
    """A price in USD: whole dollars from $100, cents from a cent, else three significant figures,
    never in exponent form (``$0.0000544``)."""
    import numpy as np

    if value >= 100:
        return f"${value:,.0f}"
    if value >= 0.01:
        return f"${value:,.2f}"
    return "$" + np.format_float_positional(value, precision=3, unique=False, fractional=False, trim="-")


def cost_line(record: Record) -> str | None:
    """``cost: ...``: the run's cost per step, per 1,000 samples and per run, and what its
    removable and idle shares cost a step (``details.cost``); None without ``--price-per-hour``."""
    c = details(record).cost
    if c is None:
        return None
    devices = f"{c.devices} {c.unit}{'s' if c.devices != 1 else ''} at ${c.price_per_hour:,.2f}/h"
    if c.per_step is None:
        return f"cost: none a step ({c.per_step_why}); {devices}"
    parts = [f"{usd(c.per_step)} a step ({devices})",
             f"{usd(c.per_1000_samples)} per 1,000 samples" if c.per_1000_samples is not None else None,
             f"{usd(c.per_run)} for the run" if c.per_run is not None else None]
    paid = sorted(((v, k) for k, v in (c.shares or {}).items() if v > 0), reverse=True)
    waste = (f"; of each step, {', '.join(f'{k} {usd(v)}' for v, k in paid)} pay for waiting" if paid else "")
    return "cost: " + ", ".join(p for p in parts if p) + waste


def energy_line(record: Record) -> str | None:
    """``energy: ...``: joules a step (and per 1,000 samples) from the host record's counter, or
    why none; None for traces without a host record."""
    e = details(record).energy
    if e is None:
        return None
    if e.per_step_j is None:
        return f"energy: not measured ({e.why})"
    counters = f"{e.counters} {e.unit}{'s' if (e.counters or 0) != 1 else ''}, {e.source}"
    per_samples = f", {e.per_1000_samples_j:,.4g} J per 1,000 samples" if e.per_1000_samples_j is not None else ""
    return f"energy: {e.per_step_j:,.4g} J a step ({counters}){per_samples}"


def view_lines(record: Record) -> list[str]:
    """The lines of the views the record has, in the console's order (under the verdict line)."""
    lines = (waits_line(record), straggler_line(record), nodes_line(record), memory_line(record),
             efficiency_line(record), mfu_console_line(record), cost_line(record), energy_line(record),
             modules_line(record),
             telemetry_line(record))
    return [line for line in lines if line]
