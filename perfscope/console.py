"""The short per-step table and verdict printed to the terminal after an analysis.

The table and verdict go to standard output; warnings go to standard error
(:func:`format_warnings`), so a script reading the table never gets them mixed in. Every string
that came from a trace is stripped of control characters first: a kernel name must not be able to
move the cursor or recolour the terminal.
"""

from __future__ import annotations

from perfscope import steptime
from perfscope.analysis.host_cpu import sources_line
from perfscope.analysis.verdict import CLASSES
from perfscope.analysis.waits import wait_shares
from perfscope.errors import PerfscopeError
from perfscope.record.schema import (
    ConfigApplied, Details, Oom, OomBlock, OtherWaits, Overall, Telemetry, TraceMemoryDevice,
)
from perfscope.record.view import Record, record_of
from perfscope.text import safe

MAX_ROWS = 24  # beyond this the table shows the first and last steps only
MAX_WARNINGS = 20  # beyond this stderr says how many more summary.json holds
MAX_SKIPPED_NAMED = 3  # skipped trace files named on stderr; one line counts the rest
# The cost columns add up to 100% of each step; "other" (GPU idle on dependencies) is GPU-only.
COST_COLUMNS = {"gpu": (*CLASSES, "other"), "cpu": CLASSES}


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.rjust(w) if i < len(cells) - 1 else c for i, (c, w) in enumerate(zip(cells, widths)))


def _pct(v) -> str:
    return "-" if not isinstance(v, (int, float)) else f"{100 * v:.1f}"


def _step_verdict(s: dict) -> str:
    if steptime.is_counted(s) and s.get("verdict"):
        return str(s["verdict"])
    if s.get("provisional_verdict"):
        return f"({s.get('status')}; provisional {s['provisional_verdict']})"
    return f"({s.get('status') or 'incomplete'})"


def contention_line(overall: Overall) -> str | None:
    """What a provisional verdict rests on: how long the training thread waited for cores."""
    if overall.provisional is not True:
        return None
    share = overall.core_wait_share or 0.0
    pace = ("the machine, not the program, set the pace" if share >= 0.5 else
            "a busy machine stretched every step")
    return (f"busy host: the training thread waited for a core {100 * share:.0f}% of the time of the classified steps "
            f"({pace}); the verdict classifies them with that wait taken out")


def _details(record: Record) -> Details:
    return record.details or Details()


def _waits_line(record: Record) -> str | None:
    """What the GPU waited on, when ``other`` is the largest share."""
    o = record.overall
    if o is None or not o.other_largest:
        return None
    parts = _wait_causes(_details(record).other_waits or OtherWaits())
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


def _straggler_line(record: Record) -> str | None:
    st = _details(record).straggler
    if st is None or st.rank is None:
        return None
    wait = st.median_others_wait_us or 0.0
    if st.basis == "collective waits":
        how = f"waits least in the collectives in {st.steps_last} of {st.steps} steps (the clocks disagree)"
    else:
        how = (f"arrives last at the collectives in {st.steps_last} of {st.steps} steps, "
               f"{(st.median_late_us or 0.0) / 1000:.2f} ms late per step (median)")
    return f"straggler: rank {st.rank} {how}; the other ranks wait {wait / 1000:.2f} ms per step for it"


def _nodes_line(record: Record) -> str | None:
    nv = _details(record).nodes
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


def format_summary(summary: dict | Record) -> str:
    """Plain-text rendering of a summary record: per-step table, verdict, advice, notes.

    Times are shown in milliseconds and class costs as percentages of step time. Warnings are not
    part of it (see :func:`format_warnings`).

    Raises:
        PerfscopeError: a record without its ``overall`` or ``steps``, or as :func:`~perfscope.record.view.record_of`.
    """
    record = record_of(summary)
    o = record.overall
    if o is None or record.steps is None:
        raise PerfscopeError("malformed summary: it lacks its steps or overall sections")
    costs = COST_COLUMNS[record.mode or "gpu"]
    lines = _step_table(record, costs) + [""]
    if o.verdict:
        lines += _verdict_lines(record, costs)
    else:
        lines.append(f"verdict: none ({safe(o.reason or 'no step could be classified')})")
    lines += _closing_lines(record)
    # Every line escaped as a whole: a newline inside a name, a verdict or the advice of a
    # hand-edited summary shows as "?" and cannot start a forged "verdict:" line.
    return "\n".join(safe(line) for line in lines)


def _closing_lines(record: Record) -> list[str]:
    """Under the verdict: the whole run, what held the memory at an OOM, the advice, the notes."""
    whole = run_line(record)
    lines = [whole] if whole else []
    lines += oom_lines(record.run.oom if record.run else None)
    lines.append(f"advice: {record.overall.advice}")
    return lines + [f"note: {n}" for n in record.notes or []]


def _step_row(step: dict, costs: tuple[str, ...]) -> list[str]:
    """One step's cells: rank, step (starred when not counted), ms, each class's %, verdict."""
    mark = "" if steptime.is_counted(step) else "*"
    return ([str(step["rank"]), f"{step['step']}{mark}", f"{step['step_time_us'] / 1000:.2f}"]
            + [_pct(step.get(f"{c}_cost_frac")) for c in costs] + [_step_verdict(step)])


def _step_table(record: Record, costs: tuple[str, ...]) -> list[str]:
    """The per-step table (at most :data:`MAX_ROWS` rows, the middle elided) and its footnotes."""
    head = ["rank", "step", "step ms"] + [f"{c} %" for c in costs] + ["verdict"]
    rows = [_step_row(s, costs) for s in record.steps]
    if len(rows) > MAX_ROWS:
        half = MAX_ROWS // 2
        rows = rows[:half] + [["..."] + [""] * (len(head) - 1)] + rows[-half:]
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    lines = [_row(head, widths)] + [_row(r, widths) for r in rows]
    if any(not steptime.is_counted(s) for s in record.steps):
        lines.append("(* not counted in the verdict: the step's evidence is incomplete, or it is initialisation or "
                     "host-contended; the notes say why)")
    lines.append("(% of each step: io, comm and launch are the removable causes"
                 + ("; other is GPU idle time spent waiting on dependencies)" if record.mode == "gpu" else ")"))
    return lines


def _provisional_lines(record: Record, counted: list[dict], fractions: str, per_step: float | None) -> list[str]:
    """A provisional verdict's line (step time with and without the waits for a core), the
    contention line and, where known, what took the cores."""
    o = record.overall
    wall = steptime.step_time_us([{**r, "step_time_us": r["wall_step_time_us"]} for r in counted])
    lines = [f"verdict: {o.verdict}, provisional (runner-up {o.runner_up}; share of step time without "
             f"the waits for a core: {fractions}; step time {(per_step or 0.0) / 1000:.2f} ms without them, "
             f"{(wall or 0.0) / 1000:.2f} ms as measured)", contention_line(o)]
    split = _details(record).host_cpu
    if split is not None and split.cause:
        lines.append(f"cores: {sources_line(split)}")
    return lines


def _verdict_lines(record: Record, costs: tuple[str, ...]) -> list[str]:
    """The verdict line (provisional or not) and the views' one-line summaries under it."""
    o = record.overall
    fr = ", ".join(f"{c} {100 * getattr(o.fractions, c):.0f}%" for c in costs)
    # from the steps themselves, as every view: they agree even with a hand-edited ``overall``
    counted = steptime.verdict_rows(record.steps, {"provisional": o.provisional})
    per_step, rep = steptime.step_time_us(counted), steptime.representative_step(counted)
    if o.provisional is True:
        lines = _provisional_lines(record, counted, fr, per_step)
    else:
        lines = [f"verdict: {o.verdict} (runner-up {o.runner_up}; share of step time: {fr}; "
                 f"step time {(per_step or 0.0) / 1000:.2f} ms" + (f", representative step {rep})" if rep is not None else ")")]
    return lines + [line for line in (_waits_line(record), _straggler_line(record), _nodes_line(record),
                                      memory_line(record), efficiency_line(record), mfu_console_line(record),
                                      modules_line(record), telemetry_line(record)) if line]


def format_warnings(summary: dict | Record) -> list[str]:
    """The summary's warnings as lines for standard error (``perfscope: warning: ...``).

    The warnings about skipped trace files come first; beyond :data:`MAX_SKIPPED_NAMED` of them
    one line counts the rest, so a directory of a thousand bad files does not hide the other
    warnings. Beyond :data:`MAX_WARNINGS` lines in all, one line says how many more there are.

    Args:
        summary: A summary record (``warnings`` and ``skipped`` are read).

    Returns:
        The lines, without newlines, every one escaped for the terminal.
    """
    record = record_of(summary)
    warnings = [safe(w) for w in record.warnings or []]
    n_skipped = len(record.skipped or [])
    # analysis.run puts one "skipped ..." warning per skipped file first
    n_skip_warnings = next((i for i, w in enumerate(warnings[:n_skipped]) if not w.startswith("skipped ")), n_skipped)
    skips, others = warnings[:n_skip_warnings], warnings[n_skip_warnings:]
    shown = skips[:MAX_SKIPPED_NAMED]
    if len(skips) > MAX_SKIPPED_NAMED:
        shown.append(f"... and {len(skips) - MAX_SKIPPED_NAMED:,} more trace files skipped (summary.json's skipped "
                     "list and the report's Data quality section name them all)")
    shown += others
    lines = [f"perfscope: warning: {w}" for w in shown[:MAX_WARNINGS]]
    if len(shown) > MAX_WARNINGS:
        lines.append(f"perfscope: warning: ... and {len(shown) - MAX_WARNINGS:,} more (summary.json lists them all)")
    return lines


def _unused(record: Record, report: ConfigApplied) -> dict[str, str]:
    """Knobs patched at launch that found nothing to act on in this run, and why."""
    from perfscope.runtime.groups.communication import CommunicationGroup
    from perfscope.runtime.groups.input import LOADER_KEYS

    out = {}
    if report.loaders == 0:
        out.update({k: "the script built no DataLoader" for k in LOADER_KEYS})
    if report.ddp_modules == 0:
        out.update({k: "the script built no DistributedDataParallel" for k in CommunicationGroup.keys})
    if record.mode == "cpu":  # CUDA backends' flags: set, but nothing in the run reads them
        out.update({k: "no effect: the run used no CUDA device" for k in ("tf32", "cudnn_benchmark")})
    return out


def memory_line(record: Record) -> str | None:
    """``memory: peak ... of ... (headroom)`` from ``details.memory``, or None when not measured."""
    m = _details(record).memory
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
    e = _details(record).gpu_efficiency
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

    view = _details(record).mfu
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
    view = _details(record).modules
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

    views = _details(record).run_steps or []
    if not views:
        return None
    view = max(views, key=lambda v: v.median_s or 0.0)
    who = f"rank {view.rank}: " if len(views) > 1 and view.rank is not None else ""
    return safe("whole run: " + who + "; ".join([run_headline(view), *run_findings(view)]))


def _first_device(record: Record) -> TraceMemoryDevice | None:
    """The first trace's first device of ``details.trace_memory`` (the one with the most bytes)."""
    traces = _details(record).trace_memory or []
    devices = (traces[0].devices or []) if traces else []
    return devices[0] if devices else None


def trace_memory_line(record: Record) -> str | None:
    """``memory (allocator records): ...`` for the first trace's device with the most bytes
    allocated (the first of ``details.trace_memory``); None without it."""
    d = _first_device(record)
    if d is None or d.peak_allocated_bytes is None:
        return None
    rise = " above the trace's first record" if d.relative else ""
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
    t = _details(record).telemetry
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


def config_lines(summary: dict | Record) -> list[str]:
    """What ``--config`` did in the run, a line per knob (empty without a configuration):
    patched at launch, applied by ``perfscope.accelerate`` in the script, or not applied and why
    (including knobs that were set but found nothing to act on: no DataLoader, no DDP, no CUDA)."""
    record = record_of(summary)
    report = record.run.config_applied if record.run else None
    if report is None:
        return []
    unused = _unused(record, report)
    lines = []
    for label, entries in (("applied", report.applied), ("applied by perfscope.accelerate", report.by_accelerate),
                           ("not applied", report.not_applied)):
        for knob, what in (entries or {}).items():
            if label == "applied" and knob in unused:
                lines.append(safe(f"config not used: {knob}: {unused[knob]} (set: {what})"))
            else:
                lines.append(safe(f"config {label}: {knob}: {what}"))
    return lines
