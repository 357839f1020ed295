"""Numbers the report derives from a summary record: counted steps, the step time and representative
step, what-if estimates, per-rank figures (definitions: :mod:`perfscope.steptime`).

Where the summary carries the analysis's own ``details`` section those figures are used as they
are; otherwise the same quantities are computed from the per-step rows, so a summary written
before ``details`` existed still renders.
"""

from __future__ import annotations

import statistics

from perfscope import steptime
from perfscope.reports.html import num

REMOVABLE = steptime.REMOVABLE


def steps_of(summary: dict) -> list[dict]:
    return [s for s in summary.get("steps") or [] if isinstance(s, dict)]


is_counted = steptime.is_counted  # the rule's one definition


def counted_steps(summary: dict) -> list[dict]:
    """The steps the run's verdict is taken over (schema 1 summaries: all, if none is complete);
    for a provisional verdict, the steps it classified, without their waits for a core
    (:func:`perfscope.steptime.verdict_rows`)."""
    steps = steps_of(summary)
    counted = steptime.verdict_rows(steps, summary.get("overall") if isinstance(summary.get("overall"), dict) else None)
    if "counted" in (steps[0] if steps else {}):
        return counted  # schema 2: no counted step means no verdict, never the others instead
    return counted or steps


def details(summary: dict) -> dict:
    d = summary.get("details")
    return d if isinstance(d, dict) else {}


def withheld_note(summary: dict) -> str:
    """The note above a detail table whose steps are outside the verdict (``details.scope``)."""
    if details(summary).get("scope") != "withheld":
        return ""
    from perfscope.reports.html import note

    return note("Over the steps the verdict leaves out: no step has the evidence for a verdict (the per-step "
                "table and Data quality say why), so these figures are shown as recorded, outside any verdict.",
                "warn")


def _median(values) -> float | None:
    values = [v for v in (num(x) for x in values) if v is not None]
    return statistics.median(values) if values else None


def step_time(summary: dict) -> float | None:
    """The run's step time (µs; :func:`perfscope.steptime.step_time_us`), from the counted steps
    themselves, so that every view of one summary agrees even where a hand-edited ``overall``
    says otherwise; ``overall.step_time_us`` only for a summary without step rows."""
    computed = steptime.step_time_us(counted_steps(summary))
    return computed if computed is not None else num((summary.get("overall") or {}).get("step_time_us"))


def representative_step(summary: dict):
    """The run's representative step number (:func:`perfscope.steptime.representative_step`),
    from the counted steps; None without one."""
    return steptime.representative_step(counted_steps(summary))


def what_if(summary: dict) -> dict[str, dict]:
    """Per removable class: ``step_time_us``, ``step_time_without_us``, ``saved_us_per_step``,
    ``speedup`` (:func:`perfscope.steptime.what_if` over the counted steps).

    Always computed from the steps, so a summary whose ``details.what_if`` was taken the older
    way (medians before and after) renders with today's definition.
    """
    return {w["class"]: w for w in steptime.what_if(counted_steps(summary))}


def representative_index(summary: dict, steps: list[dict]) -> int | None:
    """Index (into ``steps``, e.g. one rank's rows) of the run's representative step; when
    ``steps`` lacks it (no counted step), the row nearest the step time, else None."""
    rep = representative_step(summary)
    for i, s in enumerate(steps):
        if rep is not None and s.get("step") == rep:
            return i
    target = step_time(summary)
    timed = [i for i, s in enumerate(steps) if num(s.get("step_time_us")) is not None]
    if not timed:
        return None
    if target is None:
        return timed[0]
    return min(timed, key=lambda i: abs(num(steps[i]["step_time_us"]) - target))


def rank_rows(summary: dict) -> tuple[list[dict], int | None]:
    """Per-rank figures and the slowest rank.

    From ``details.ranks`` when present; otherwise medians over each rank's counted steps
    (compute: GPU compute or CPU operator time; communication: all communication, hidden or
    not). ``wait_for_slowest_us`` needs the analysis's collective matching and is None then.
    """
    d = details(summary)
    if isinstance(d.get("ranks"), list) and d["ranks"]:
        rows = [r for r in d["ranks"] if isinstance(r, dict)]
        slowest = d.get("slowest_rank")
        if slowest is None:
            slowest = steptime.slowest_rank(rows)
        return rows, slowest
    rows = _medians_by_rank(counted_steps(summary), "compute_us" if summary.get("mode") == "gpu" else "operator_us")
    return rows, steptime.slowest_rank(rows)


def _medians_by_rank(steps: list[dict], compute_col: str) -> list[dict]:
    """Per-rank medians of the counted steps' step time, compute (``compute_col``) and
    communication, ranks in order (integers first)."""
    by_rank: dict = {}
    for s in steps:
        by_rank.setdefault(s.get("rank"), []).append(s)
    rows = []
    for rank in sorted(by_rank, key=lambda r: (not isinstance(r, int), str(r) if not isinstance(r, int) else r)):
        ss = by_rank[rank]
        rows.append({
            "rank": rank,
            "median_step_time_us": _median(s.get("step_time_us") for s in ss),
            "median_compute_us": _median(s.get(compute_col) for s in ss),
            "median_comm_us": _median(s.get("comm_us") for s in ss),
            "wait_for_slowest_us": None,
        })
    return rows
