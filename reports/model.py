"""Numbers the report derives from a summary record (:class:`~perfscope.record.view.Record`): counted
steps, the step time and representative step, what-if estimates, per-rank figures (definitions:
:mod:`perfscope.steptime`).

Where the record carries the analysis's own ``details`` those figures are used as they are;
otherwise the same quantities are computed from the per-step rows, so a summary written before
``details`` existed still renders.
"""

from __future__ import annotations

import statistics

from perfscope import steptime
from perfscope.record.schema import Details, Overall, RankRow
from perfscope.record.values import finite_numbers
from perfscope.record.view import Record
from perfscope.reports.html import num

REMOVABLE = steptime.REMOVABLE


is_counted = steptime.is_counted  # the rule's one definition


def mode(record: Record) -> str:
    """``gpu`` or ``cpu`` (a record without a mode reads as a CPU run)."""
    return "gpu" if record.mode == "gpu" else "cpu"


def overall(record: Record) -> Overall:
    """``overall``, empty where the record has none."""
    return record.overall_or_empty()


def details(record: Record) -> Details:
    """``details``, empty where the record has none."""
    return record.details_or_empty()


def steps_on_verdict_clock(record: Record) -> list[dict]:
    """Every step, those of a provisional verdict without their waits for a core
    (:func:`perfscope.steptime.on_verdict_clock`): what the per-step chart and table show."""
    return steptime.on_verdict_clock(record.steps or [], overall(record).provisional)


def counted_steps(record: Record) -> list[dict]:
    """The steps the run's verdict is taken over (schema 1 summaries: all, if none is complete);
    for a provisional verdict, the steps it classified, without their waits for a core
    (:func:`perfscope.steptime.verdict_rows`)."""
    steps = record.steps or []
    counted = steptime.verdict_rows(steps, overall(record).provisional)
    if "counted" in (steps[0] if steps else {}):
        return counted  # schema 2: no counted step means no verdict, never the others instead
    return counted or steps


def withheld_note(record: Record) -> str:
    """The note above a detail table whose steps are outside the verdict (``details.scope``)."""
    if details(record).scope != "withheld":
        return ""
    from perfscope.reports.html import note

    return note("Over the steps the verdict leaves out: no step has the evidence for a verdict (the per-step "
                "table and Data quality say why), so these figures are shown as recorded, outside any verdict.",
                "warn")


def _median(values) -> float | None:
    values = finite_numbers(values)
    return statistics.median(values) if values else None


def step_time(record: Record) -> float | None:
    """The run's step time (µs; :func:`perfscope.steptime.step_time_us`), from the counted steps
    themselves, so that every view of one summary agrees even where a hand-edited ``overall``
    says otherwise; ``overall.step_time_us`` only for a summary without step rows."""
    computed = steptime.step_time_us(counted_steps(record))
    return computed if computed is not None else overall(record).step_time_us


def representative_step(record: Record):
    """The run's representative step number (:func:`perfscope.steptime.representative_step`),
    from the counted steps; None without one."""
    return steptime.representative_step(counted_steps(record))


def what_if(record: Record) -> dict[str, dict]:
    """Per removable class: ``step_time_us``, ``step_time_without_us``, ``saved_us_per_step``,
    ``speedup`` (:func:`perfscope.steptime.what_if` over the counted steps).

    Always computed from the steps, so a summary whose ``details.what_if`` was taken the older
    way (medians before and after) renders with today's definition.
    """
    return {w["class"]: w for w in steptime.what_if(counted_steps(record))}


def representative_index(record: Record, steps: list[dict]) -> int | None:
    """Index (into ``steps``, e.g. one rank's rows) of the run's representative step; when
    ``steps`` lacks it (no counted step), the row nearest the step time, else None."""
    rep = representative_step(record)
    for i, s in enumerate(steps):
        if rep is not None and s.get("step") == rep:
            return i
    target = step_time(record)
    timed = [i for i, s in enumerate(steps) if num(s.get("step_time_us")) is not None]
    if not timed:
        return None
    if target is None:
        return timed[0]
    return min(timed, key=lambda i: abs(num(steps[i]["step_time_us"]) - target))


def rank_rows(record: Record) -> tuple[list[RankRow], int | None]:
    """Per-rank figures and the slowest rank.

    From ``details.ranks`` when present; otherwise medians over each rank's counted steps
    (compute: GPU compute or CPU operator time; communication: all communication, hidden or
    not). ``wait_for_slowest_us`` needs the analysis's collective matching and is None then.
    """
    d = details(record)
    if d.ranks:
        slowest = d.slowest_rank
        return d.ranks, slowest if slowest is not None else _slowest(d.ranks)
    rows = _medians_by_rank(counted_steps(record), "compute_us" if record.mode == "gpu" else "operator_us")
    return rows, _slowest(rows)


def _slowest(rows: list[RankRow]):
    """:func:`perfscope.steptime.slowest_rank`, the one rule, over typed rows."""
    return steptime.slowest_rank({"rank": r.rank, "median_compute_us": r.median_compute_us} for r in rows)


def _medians_by_rank(steps: list[dict], compute_col: str) -> list[RankRow]:
    """Per-rank medians of the counted steps' step time, compute (``compute_col``) and
    communication, ranks in order (integers first)."""
    by_rank: dict = {}
    for s in steps:
        by_rank.setdefault(s.get("rank"), []).append(s)
    rows = []
    for rank in sorted(by_rank, key=lambda r: (not isinstance(r, int), str(r) if not isinstance(r, int) else r)):
        ss = by_rank[rank]
        rows.append(RankRow(rank=rank if isinstance(rank, int) else None,
                            median_step_time_us=_median(s.get("step_time_us") for s in ss),
                            median_compute_us=_median(s.get(compute_col) for s in ss),
                            median_comm_us=_median(s.get("comm_us") for s in ss)))
    return rows
