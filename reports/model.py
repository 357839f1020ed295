"""Numbers the report derives from a summary record: counted steps, what-if estimates, per-rank figures.

Where the summary carries the analysis's own ``details`` section those figures are used as they
are; otherwise the same quantities are computed from the per-step rows, so a summary written
before ``details`` existed still renders.
"""

from __future__ import annotations

import statistics

from reports.html import num

REMOVABLE = ("io", "comm", "launch")


def steps_of(summary: dict) -> list[dict]:
    return [s for s in summary.get("steps") or [] if isinstance(s, dict)]


def is_counted(step: dict) -> bool:
    """Whether a step enters the run's verdict: ``counted`` (schema 2), else ``complete`` (schema 1)."""
    return bool(step.get("counted", step.get("complete", True)))


def counted_steps(summary: dict) -> list[dict]:
    """The steps the run's verdict is taken over (schema 1 summaries: all, if none is complete)."""
    steps = steps_of(summary)
    counted = [s for s in steps if is_counted(s)]
    if "counted" in (steps[0] if steps else {}):
        return counted  # schema 2: no counted step means no verdict, never the others instead
    return counted or steps


def details(summary: dict) -> dict:
    d = summary.get("details")
    return d if isinstance(d, dict) else {}


def _median(values) -> float | None:
    values = [v for v in (num(x) for x in values) if v is not None]
    return statistics.median(values) if values else None


def what_if(summary: dict) -> dict[str, dict]:
    """Per removable class: ``median_step_us``, ``median_step_without_us``, ``speedup``.

    From ``details.what_if`` when present; otherwise the median over the counted steps of
    (step time - the class's cost). An upper bound either way: it assumes the removed time is not
    replaced by another wait.
    """
    given = details(summary).get("what_if")
    if isinstance(given, list):
        out = {}
        for w in given:
            if isinstance(w, dict) and w.get("class") in REMOVABLE and num(w.get("median_step_without_us")) is not None:
                out[w["class"]] = w
        return out
    steps = counted_steps(summary)
    median = _median(s.get("step_time_us") for s in steps)
    out = {}
    if not median:
        return out
    for c in REMOVABLE:
        without = []
        for s in steps:
            t, f = num(s.get("step_time_us")), num(s.get(f"{c}_cost_frac"))
            if t is not None:
                without.append(t - t * (f or 0.0))
        m = _median(without)
        if m is not None and m < median and m > 0:
            out[c] = {"class": c, "median_step_us": median, "median_step_without_us": m, "speedup": median / m}
    return out


def median_step_index(steps: list[dict]) -> int | None:
    """Index (into ``steps``) of the median step by step time, among complete steps if any."""
    pool = [i for i, s in enumerate(steps) if is_counted(s)] or list(range(len(steps)))
    pool = [i for i in pool if num(steps[i].get("step_time_us")) is not None]
    if not pool:
        return None
    pool.sort(key=lambda i: num(steps[i]["step_time_us"]))
    return pool[(len(pool) - 1) // 2]


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
        if slowest is None and rows:
            slowest = max(rows, key=lambda r: num(r.get("median_step_time_us")) or 0.0).get("rank")
        return rows, slowest
    by_rank: dict = {}
    for s in counted_steps(summary):
        by_rank.setdefault(s.get("rank"), []).append(s)
    rows = []
    for rank in sorted(by_rank, key=lambda r: (not isinstance(r, int), str(r) if not isinstance(r, int) else r)):
        ss = by_rank[rank]
        compute_col = "compute_us" if summary.get("mode") == "gpu" else "operator_us"
        rows.append({
            "rank": rank,
            "median_step_time_us": _median(s.get("step_time_us") for s in ss),
            "median_compute_us": _median(s.get(compute_col) for s in ss),
            "median_comm_us": _median(s.get("comm_us") for s in ss),
            "wait_for_slowest_us": None,
        })
    slowest = max(rows, key=lambda r: r["median_step_time_us"] or 0.0)["rank"] if len(rows) > 1 else None
    return rows, slowest
