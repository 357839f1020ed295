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
from perfscope.console_views import details, oom_lines, run_line, view_lines
from perfscope.errors import PerfscopeError
from perfscope.record.schema import ConfigApplied, Overall
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
    provisional = record.overall.provisional is True
    rows = [_step_row(s, costs) for s in steptime.on_verdict_clock(record.steps, provisional)]
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
    if provisional:
        lines.append("(the provisional verdict's steps are shown on its clock, without their waits for a core; "
                     "summary.json keeps them as measured too)")
    return lines


def _provisional_lines(record: Record, counted: list[dict], fractions: str, per_step: float | None) -> list[str]:
    """A provisional verdict's line (step time with and without the waits for a core), the
    contention line and, where known, what took the cores."""
    o = record.overall
    wall = steptime.measured_step_time_us(counted)
    lines = [f"verdict: {o.verdict}, provisional (runner-up {o.runner_up or 'none'}; share of step time without "
             f"the waits for a core: {fractions}; step time {(per_step or 0.0) / 1000:.2f} ms without them, "
             f"{(wall or 0.0) / 1000:.2f} ms as measured)", contention_line(o)]
    split = details(record).host_cpu
    if split is not None and split.cause:
        lines.append(f"cores: {sources_line(split)}")
    return lines


def _verdict_lines(record: Record, costs: tuple[str, ...]) -> list[str]:
    """The verdict line (provisional or not) and the views' one-line summaries under it."""
    o = record.overall
    fr = ", ".join(f"{c} {100 * (getattr(o.fractions, c, None) or 0.0):.0f}%" for c in costs)
    # from the steps themselves, as every view: they agree even with a hand-edited ``overall``
    counted = steptime.verdict_rows(record.steps, o.provisional)
    per_step, rep = steptime.step_time_us(counted), steptime.representative_step(counted)
    if o.provisional is True:
        lines = _provisional_lines(record, counted, fr, per_step)
    else:
        lines = [f"verdict: {o.verdict} (runner-up {o.runner_up or 'none'}; share of step time: {fr}; "
                 f"step time {(per_step or 0.0) / 1000:.2f} ms" + (f", representative step {rep})" if rep is not None else ")")]
    return lines + view_lines(record)


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
