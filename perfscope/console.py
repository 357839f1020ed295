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


def contention_line(overall: dict) -> str | None:
    """What a provisional verdict rests on: how long the training thread waited for cores."""
    if overall.get("provisional") is not True:
        return None
    share = overall.get("core_wait_share") or 0.0
    pace = ("the machine, not the program, set the pace" if share >= 0.5 else
            "a busy machine stretched every step")
    return (f"busy host: the training thread waited for a core {100 * share:.0f}% of the time of the classified steps "
            f"({pace}); the verdict classifies them with that wait taken out")


def _waits_line(summary: dict) -> str | None:
    """What the GPU waited on, when ``other`` is the largest share."""
    o = summary.get("overall") or {}
    if not o.get("other_largest"):
        return None
    parts = _wait_causes((summary.get("details") or {}).get("other_waits") or {})
    share = 100 * (o.get("fractions") or {}).get("other", 0.0)
    unshown = parts == [] or all(p.startswith("not shown") for p in parts)
    what = ("; the trace does not show what it waited on" if unshown else f"; the GPU waited on: {'; '.join(parts)}")
    return (f"largest share: other {share:.0f}% (GPU idle with work already queued, waiting on a dependency; no "
            f"single knob removes it){what}")


def _wait_causes(waits: dict) -> list[str]:
    """``cause N% (call, call)`` for each cause of the GPU's waits with time of its own."""
    parts = []
    for cause, share, calls in wait_shares(waits):
        names = ", ".join(safe(k) for k, _ in calls[:2])
        parts.append(f"{cause} {100 * share:.0f}%" + (f" ({names})" if names else ""))
    return parts


def _straggler_line(summary: dict) -> str | None:
    st = (summary.get("details") or {}).get("straggler")
    if not isinstance(st, dict) or st.get("rank") is None:
        return None
    wait = st.get("median_others_wait_us") or 0.0
    if st.get("basis") == "collective waits":
        how = f"waits least in the collectives in {st.get('steps_last')} of {st.get('steps')} steps (the clocks disagree)"
    else:
        how = (f"arrives last at the collectives in {st.get('steps_last')} of {st.get('steps')} steps, "
               f"{(st.get('median_late_us') or 0.0) / 1000:.2f} ms late per step (median)")
    return f"straggler: rank {st['rank']} {how}; the other ranks wait {wait / 1000:.2f} ms per step for it"


def _nodes_line(summary: dict) -> str | None:
    nv = (summary.get("details") or {}).get("nodes")
    if not isinstance(nv, dict) or not isinstance(nv.get("nodes"), list):
        return None
    where = "; ".join(f"node {n.get('node')}: ranks {_ranks_text(n.get('ranks'))}" for n in nv["nodes"][:8]
                      if isinstance(n, dict))
    line = f"nodes: {nv.get('count')} ({safe(where)})"
    slow = nv.get("straggler_node")
    if isinstance(slow, dict):
        line += f"; node {slow.get('node')} is the one the others wait for (rank {slow.get('rank')})"
    return line + _link_text(nv.get("link"))


def _link_text(link) -> str:
    """``; <algorithm> all-reduce puts N MiB per step on each node's link, carried at R or more``."""
    rates = link.get("achieved_bits_per_s") if isinstance(link, dict) else None
    if not isinstance(rates, dict) or not rates:
        return ""
    slowest = min(v for v in rates.values() if isinstance(v, (int, float)))
    return (f"; {link.get('algorithm')} all-reduce puts {link['inter_node_bytes_per_step'] / 2**20:.1f} MiB per "
            f"step on each node's link, carried at {slowest / 1e6:.0f} Mbit/s or more")


def _ranks_text(ranks) -> str:
    if not isinstance(ranks, list) or not ranks:
        return "none"
    if ranks == list(range(ranks[0], ranks[0] + len(ranks))) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks[:16]) + ("..." if len(ranks) > 16 else "")


def format_summary(summary: dict) -> str:
    """Plain-text rendering of a summary record: per-step table, verdict, advice, notes.

    Times are shown in milliseconds and class costs as percentages of step time. Warnings are not
    part of it (see :func:`format_warnings`).
    """
    costs = COST_COLUMNS[summary.get("mode", "gpu")]
    lines = _step_table(summary, costs) + [""]
    o = summary["overall"]
    if o.get("verdict"):
        lines += _verdict_lines(summary, costs)
    else:
        lines.append(f"verdict: none ({safe(o.get('reason') or 'no step could be classified')})")
    whole = run_line(summary)
    if whole:
        lines.append(whole)
    lines += oom_lines((summary.get("run") or {}).get("oom"))
    lines.append(f"advice: {o['advice']}")
    lines += [f"note: {n}" for n in summary.get("notes", [])]
    # Every line escaped as a whole: a newline inside a name, a verdict or the advice of a
    # hand-edited summary shows as "?" and cannot start a forged "verdict:" line.
    return "\n".join(safe(line) for line in lines)


def _step_row(step: dict, costs: tuple[str, ...]) -> list[str]:
    """One step's cells: rank, step (starred when not counted), ms, each class's %, verdict."""
    mark = "" if steptime.is_counted(step) else "*"
    return ([str(step["rank"]), f"{step['step']}{mark}", f"{step['step_time_us'] / 1000:.2f}"]
            + [_pct(step.get(f"{c}_cost_frac")) for c in costs] + [_step_verdict(step)])


def _step_table(summary: dict, costs: tuple[str, ...]) -> list[str]:
    """The per-step table (at most :data:`MAX_ROWS` rows, the middle elided) and its footnotes."""
    head = ["rank", "step", "step ms"] + [f"{c} %" for c in costs] + ["verdict"]
    rows = [_step_row(s, costs) for s in summary["steps"]]
    if len(rows) > MAX_ROWS:
        half = MAX_ROWS // 2
        rows = rows[:half] + [["..."] + [""] * (len(head) - 1)] + rows[-half:]
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    lines = [_row(head, widths)] + [_row(r, widths) for r in rows]
    if any(not steptime.is_counted(s) for s in summary["steps"]):
        lines.append("(* not counted in the verdict: the step's evidence is incomplete, or it is initialisation or "
                     "host-contended; the notes say why)")
    lines.append("(% of each step: io, comm and launch are the removable causes"
                 + ("; other is GPU idle time spent waiting on dependencies)" if summary.get("mode") == "gpu" else ")"))
    return lines


def _provisional_lines(summary: dict, counted: list[dict], fractions: str, per_step: float | None) -> list[str]:
    """A provisional verdict's line (step time with and without the waits for a core), the
    contention line and, where known, what took the cores."""
    o = summary["overall"]
    wall = steptime.step_time_us([{**r, "step_time_us": r["wall_step_time_us"]} for r in counted])
    lines = [f"verdict: {o['verdict']}, provisional (runner-up {o['runner_up']}; share of step time without "
             f"the waits for a core: {fractions}; step time {(per_step or 0.0) / 1000:.2f} ms without them, "
             f"{(wall or 0.0) / 1000:.2f} ms as measured)", contention_line(o)]
    split = (summary.get("details") or {}).get("host_cpu")
    if isinstance(split, dict) and split.get("cause"):
        lines.append(f"cores: {sources_line(split)}")
    return lines


def _verdict_lines(summary: dict, costs: tuple[str, ...]) -> list[str]:
    """The verdict line (provisional or not) and the views' one-line summaries under it."""
    o = summary["overall"]
    fr = ", ".join(f"{c} {100 * o['fractions'][c]:.0f}%" for c in costs)
    # from the steps themselves, as every view: they agree even with a hand-edited ``overall``
    counted = steptime.verdict_rows(summary["steps"], o)
    per_step, rep = steptime.step_time_us(counted), steptime.representative_step(counted)
    if o.get("provisional") is True:
        lines = _provisional_lines(summary, counted, fr, per_step)
    else:
        lines = [f"verdict: {o['verdict']} (runner-up {o['runner_up']}; share of step time: {fr}; "
                 f"step time {(per_step or 0.0) / 1000:.2f} ms" + (f", representative step {rep})" if rep is not None else ")")]
    return lines + [line for line in (_waits_line(summary), _straggler_line(summary), _nodes_line(summary),
                                      memory_line(summary), efficiency_line(summary), mfu_console_line(summary),
                                      modules_line(summary), telemetry_line(summary)) if line]


def format_warnings(summary: dict) -> list[str]:
    """The summary's warnings as lines for standard error (``perfscope: warning: ...``).

    The warnings about skipped trace files come first; beyond :data:`MAX_SKIPPED_NAMED` of them
    one line counts the rest, so a directory of a thousand bad files does not hide the other
    warnings. Beyond :data:`MAX_WARNINGS` lines in all, one line says how many more there are.

    Args:
        summary: A summary record (``warnings`` and ``skipped`` are read).

    Returns:
        The lines, without newlines, every one escaped for the terminal.
    """
    warnings = [safe(w) for w in summary.get("warnings") or []]
    n_skipped = len(summary.get("skipped") or [])
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


def _unused(summary: dict, report: dict) -> dict[str, str]:
    """Knobs patched at launch that found nothing to act on in this run, and why."""
    from perfscope.runtime.groups.communication import CommunicationGroup
    from perfscope.runtime.groups.input import LOADER_KEYS

    out = {}
    if report.get("loaders") == 0:
        out.update({k: "the script built no DataLoader" for k in LOADER_KEYS})
    if report.get("ddp_modules") == 0:
        out.update({k: "the script built no DistributedDataParallel" for k in CommunicationGroup.keys})
    if summary.get("mode") == "cpu":  # CUDA backends' flags: set, but nothing in the run reads them
        out.update({k: "no effect: the run used no CUDA device" for k in ("tf32", "cudnn_benchmark")})
    return out


def memory_line(summary: dict) -> str | None:
    """``memory: peak ... of ... (headroom)`` from ``details.memory``, or None when not measured."""
    m = (summary.get("details") or {}).get("memory")
    if not isinstance(m, dict) or not isinstance(m.get("peak_bytes"), (int, float)):
        return trace_memory_line(summary)
    what = "reserved on the device" if m.get("kind") == "device" else "resident on the host"
    line = f"memory: peak {m['peak_bytes'] / 2**30:.2f} GiB {what}"
    if isinstance(m.get("capacity_bytes"), (int, float)) and isinstance(m.get("headroom_share"), (int, float)):
        if m["headroom_share"] < 0:
            line += f" of {m['capacity_bytes'] / 2**30:.1f} GiB (the ranks' peaks add up to more than the machine has)"
        else:
            line += f" of {m['capacity_bytes'] / 2**30:.1f} GiB ({m['headroom_share']:.0%} headroom"
            line += ", near the limit)" if m.get("near_limit") else ")"
    return line


def efficiency_line(summary: dict) -> str | None:
    """``gpu efficiency: ...`` from ``details.gpu_efficiency``; None without it."""
    e = (summary.get("details") or {}).get("gpu_efficiency")
    if not isinstance(e, dict) or not isinstance(e.get("tensor_core_share"), (int, float)):
        return None
    parts = [f"{label} {e[key]:.0%}" for key, label in (("sm_efficiency", "est. SM efficiency"),
                                                         ("achieved_occupancy", "est. achieved occupancy"))
             if isinstance(e.get(key), (int, float))]
    parts.append(f"Tensor Cores {e['tensor_core_share']:.0%} of kernel time"
                 + (" (the GPU has them: none used)" if e.get("no_tensor_cores") else ""))
    return "gpu efficiency: " + ", ".join(parts)


def mfu_console_line(summary: dict) -> str | None:
    """``mfu: ...`` from ``details.mfu``; None without it."""
    from perfscope.analysis.mfu import mfu_line

    view = (summary.get("details") or {}).get("mfu")
    return safe("mfu: " + mfu_line(view)) if isinstance(view, dict) and view.get("flops_per_step") else None


def oom_lines(oom) -> list[str]:
    """What held the GPU's memory when the script ran out of it (``run.oom``), a few lines; [] without it."""
    if not isinstance(oom, dict) or not isinstance(oom.get("requested_bytes"), (int, float)):
        return []
    mib = 2**20
    lines = [f"out of memory on cuda:{oom.get('device')}: {oom['requested_bytes'] / mib:,.0f} MiB asked for, "
             f"{(oom.get('allocated_bytes') or 0) / mib:,.0f} MiB allocated, {(oom.get('free_bytes') or 0) / mib:,.0f} MiB "
             "free; the largest live allocations:"]
    lines += [_block_line(b) for b in (oom.get("largest") or [])[:5] if isinstance(b, dict)]
    return [safe(line) for line in lines]


def _block_line(b: dict) -> str:
    """``"  512.0 MiB  model.py:42 forward"``: a live allocation and its innermost frame."""
    frames = [f for f in b.get("frames") or [] if isinstance(f, str)]
    return f"  {(b.get('bytes') or 0) / 2**20:,.1f} MiB  {frames[0] if frames else '(no stack recorded)'}"


def modules_line(summary: dict) -> str | None:
    """``modules: ...``: the leaf modules with most self time in the forward pass; None without them."""
    view = (summary.get("details") or {}).get("modules") or {}
    rows = [r for r in view.get("rows") or [] if isinstance(r, dict)]
    if not rows:
        return None
    key = "device_self_us" if summary.get("mode") == "gpu" else "host_self_us"

    def self_us(r: dict) -> float:
        return r.get(key) or 0.0

    total = sum(map(self_us, rows)) or 1.0
    top = sorted(rows, key=lambda r: -self_us(r))[:3]
    return safe("modules (forward, self time): " + ", ".join(f"{r['module']} {self_us(r) / total:.0%}" for r in top))


def run_line(summary: dict) -> str | None:
    """``whole run: ...`` of the slowest rank's ``details.run_steps`` entry; None without one."""
    from perfscope.analysis.run_view import run_findings, run_headline

    views = [v for v in (summary.get("details") or {}).get("run_steps") or [] if isinstance(v, dict)]
    if not views:
        return None
    view = max(views, key=lambda v: v.get("median_s") or 0.0)
    who = f"rank {view['rank']}: " if len(views) > 1 and view.get("rank") is not None else ""
    return safe("whole run: " + who + "; ".join([run_headline(view), *run_findings(view)]))


def _first_device(summary: dict) -> dict | None:
    """The first trace's first device of ``details.trace_memory`` (the one with the most bytes)."""
    traces = (summary.get("details") or {}).get("trace_memory") or []
    devices = traces[0].get("devices") or [] if traces and isinstance(traces[0], dict) else []
    return devices[0] if devices and isinstance(devices[0], dict) else None


def trace_memory_line(summary: dict) -> str | None:
    """``memory (allocator records): ...`` for the first trace's device with the most bytes
    allocated, from ``details.trace_memory``; None without it."""
    d = _first_device(summary)
    if d is None or not isinstance(d.get("peak_allocated_bytes"), (int, float)):
        return None
    rise = " above the trace's first record" if d.get("relative") else ""
    line = f"memory (allocator records): {d.get('device')} peak {d['peak_allocated_bytes'] / 2**30:.2f} GiB allocated{rise}"
    if isinstance(d.get("growth_bytes"), (int, float)):
        line += f", {d['growth_bytes'] / 2**20:+,.1f} MiB over the counted steps"
    ops = d.get("top_operators") or []
    if ops and isinstance(ops[0], dict) and isinstance(ops[0].get("share"), (int, float)):
        line += f"; most allocated by {ops[0].get('name')} ({ops[0]['share']:.0%})"
    return safe(line)


def telemetry_line(summary: dict) -> str | None:
    """``gpu: utilisation ..., SM clock ..., power ...`` from ``details.telemetry``; on a GPU run
    without samples, why; None on a CPU run."""
    t = (summary.get("details") or {}).get("telemetry")
    if not isinstance(t, dict) or summary.get("mode") != "gpu":
        return None
    if t.get("skipped"):
        return safe(f"gpu telemetry: not sampled ({t['skipped']})")
    line = _utilisation(t)
    if line is None:
        return None
    return safe(line + _clocks_and_power(t))


def _clocks_and_power(t: dict) -> str:
    """``, SM clock A-B MHz, power W mean, clocks throttled in N% of samples``, what is known of it."""
    clocks, power, text = t.get("sm_clock_mhz") or {}, t.get("power_w") or {}, ""
    if isinstance(clocks.get("min"), (int, float)) and isinstance(clocks.get("max"), (int, float)):
        text += f", SM clock {clocks['min']:.0f}-{clocks['max']:.0f} MHz"
    if isinstance(power.get("mean"), (int, float)):
        text += f", power {power['mean']:.0f} W mean"
    if (t.get("throttled_share") or 0) > 0:
        text += f", clocks throttled in {t['throttled_share']:.0%} of samples"
    return text


def _utilisation(t: dict) -> str | None:
    """``gpu: utilisation N% (source...)``, or why it was not measured; None when neither is known."""
    if isinstance(t.get("gpu_util_pct"), (int, float)):
        source, settled, samples = t.get("source") or "NVML", t.get("settled_samples"), t.get("samples")
        # say so when utilisation and power rest on fewer samples than the clocks beside them
        part = (f", {settled} of {samples} samples: the others hold time before the window"
                if isinstance(settled, int) and isinstance(samples, int) and settled < samples else "")
        return f"gpu: utilisation {t['gpu_util_pct']:.0f}% ({source}{part})"
    if isinstance(t.get("unsettled"), str):
        return f"gpu: utilisation not measured ({t['unsettled']})"
    return None


def config_lines(summary: dict) -> list[str]:
    """What ``--config`` did in the run, a line per knob (empty without a configuration):
    patched at launch, applied by ``perfscope.accelerate`` in the script, or not applied and why
    (including knobs that were set but found nothing to act on: no DataLoader, no DDP, no CUDA)."""
    report = (summary.get("run") or {}).get("config_applied")
    if not isinstance(report, dict):
        return []
    unused = _unused(summary, report)
    lines = []
    for label, key in (("applied", "applied"), ("applied by perfscope.accelerate", "by_accelerate"),
                       ("not applied", "not_applied")):
        entries = report.get(key)
        if isinstance(entries, dict):
            for knob, what in entries.items():
                if key == "applied" and knob in unused:
                    lines.append(safe(f"config not used: {knob}: {unused[knob]} (set: {what})"))
                else:
                    lines.append(safe(f"config {label}: {knob}: {what}"))
    return lines
