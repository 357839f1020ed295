"""The run's step time, its representative step, speed-ups and what-if estimates: one definition
that the console, the report, ``perfscope diff``, ``perfscope check`` and the tuning report derive
from (``docs/metrics.md``, "Step time").

Definitions (times in microseconds, as in the traces):

- The **job's time of step s** is the slowest rank's ``step_time_us`` of s: data-parallel ranks
  wait for each other at every gradient all-reduce, so the job moves at its slowest rank's pace.
  One rank: its own step time.
- The run's **step time** is the mean of the job's times over the counted steps: the measured
  window divided by its steps, the reciprocal of throughput. The median is not used: with
  DataLoader workers steps are bursty (a few long waits, many short steps), and the median step
  then overstates throughput by up to the number of workers.
- **Speed-up** of B over A is A's step time over B's: B's throughput over A's on the window.
- The **representative step** is the counted step whose job time is nearest to the step time
  (ties: the earlier step). Views of a single step (timeline, console) show it.
- A **what-if** removes a cost from each rank's step, step by step, recomputes the job's time of
  each step from the remainders, and only then takes the step time. Comparing the median steps
  before and after instead lets another step become the median and inflates a small cause.

The functions take step rows as mappings with ``rank``, ``step``, ``step_time_us`` and, for
what-ifs, ``<class>_cost_frac`` (fraction of that row's ``step_time_us``): the rows of
``summary.json``'s ``steps`` or ``DataFrame.to_dict("records")`` of the analysis frame. Pass the
counted rows only; rows without a finite non-negative ``step_time_us`` are left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from perfscope.classes import CLASSES, REMOVABLE  # the one table of classes

WAITFREE = "waitfree_"
"""Prefix of a step row's figures on the clock of a provisional verdict, its waits for a core
taken out: ``waitfree_step_time_us`` and ``waitfree_<class>_cost_frac`` (fractions of that
time). Set on the rows a provisional verdict classified (``docs/metrics.md``, "One clock")."""
_ON_BASIS = ("step_time_us", *(f"{c}_cost_frac" for c in (*CLASSES, "other")))
WORK_COLUMNS = {"cpu": ("framework_overhead_us", "operator_us"), "gpu": ("launch_wait_us", "kernel_wait_us")}
"""Where a thread that waits for a core spends that wait, by mode: the framework's own time and
the operators' on a CPU trace, the host launch gaps on a GPU trace -- not waits for data or
collectives, where the thread sleeps (``docs/metrics.md``, "Provisional verdict"). A provisional
verdict takes the waits out of these columns in proportion; ``waitfree_work_keep`` is the factor
they kept."""


def is_counted(row: Mapping) -> bool:
    """Whether a step row enters the run's verdict and step time: ``counted`` (schema 2), else
    ``complete`` (schema 1 summaries), else yes."""
    return bool(row.get("counted", row.get("complete", True)))


def counted_rows(rows: Iterable) -> list[dict]:
    """The step rows (mappings) that :func:`is_counted`; anything else in ``rows`` is left out."""
    return [r for r in rows if isinstance(r, Mapping) and is_counted(r)]


def provisional_rows(rows: Iterable) -> list[dict]:
    """The step rows a provisional verdict classified (``provisional_verdict`` set), on its clock:
    ``step_time_us`` and every ``<class>_cost_frac`` are the step's :data:`WAITFREE` figures --
    the time the step would take with its cores and each class's share of *that* time
    (``docs/metrics.md``, "Provisional verdict") -- and the measured time is kept as
    ``wall_step_time_us``; the partition's shares (``<part>_frac``) are of that time too. A row of a summary written before those figures were recorded takes
    ``step_time_us`` less ``core_wait_us``, with io and comm (which no wait inflates) rescaled to
    it and the rest in proportion. Rows whose wait is unknown are left out."""
    out = []
    for r in rows:
        if not isinstance(r, Mapping) or not r.get("provisional_verdict"):
            continue
        t = _finite(r.get("step_time_us"))
        free = _finite(r.get(WAITFREE + "step_time_us"))
        if t is None:
            continue
        if free is not None and free > 0:
            keep = _finite(r.get(WAITFREE + "work_keep"))
            work = {c: r[c] * keep for c in WORK_COLUMNS.get(str(r.get("mode")), ())
                    if keep is not None and _finite(r.get(c)) is not None}
            row = {**r, **{k: r.get(WAITFREE + k) for k in _ON_BASIS}, **work, "wall_step_time_us": t}
            out.append({**row, **_partition_shares(row, free)})
            continue
        wait = _finite(r.get("core_wait_us"))
        if wait is None or t - wait <= 0:
            continue
        out.append({**r, **_rescaled(r, t, t - wait), "step_time_us": t - wait, "wall_step_time_us": t})
    return out


def _partition_shares(row: Mapping, step_time: float) -> dict:
    """The row's partition shares (``<part>_frac``, beside a ``<part>_us``) as fractions of
    ``step_time``: a share and the step time it divides are always on one clock."""
    out = {}
    for key in row:
        if key.endswith("_frac") and not key.endswith("_cost_frac"):
            us = _finite(row.get(key[:-len("_frac")] + "_us"))
            if us is not None:
                out[key] = us / step_time
    return out


def measured_step_time_us(rows: Iterable[Mapping]) -> float | None:
    """The run's step time (µs) as measured, of rows on a provisional verdict's clock
    (:func:`provisional_rows`: their ``wall_step_time_us``); None without a step."""
    return step_time_us([{**r, "step_time_us": r.get("wall_step_time_us")} for r in rows])


def on_verdict_clock(rows: Iterable, provisional: bool | None) -> list[dict]:
    """Every step row (mappings), those a provisional verdict classified on its clock
    (:func:`provisional_rows`), the others as they are: what a per-step table shows beside the
    verdict. ``provisional``: ``overall.provisional``."""
    rows = [r for r in rows if isinstance(r, Mapping)]
    if provisional is not True:
        return rows
    return [(provisional_rows([r]) or [r])[0] for r in rows]


def _rescaled(row: Mapping, wall: float, free: float) -> dict:
    """A legacy row's class shares moved from its measured time ``wall`` to ``free``: io's and
    comm's time is kept (a thread waiting for data or a collective sleeps, no core wait is in it),
    the other classes share what is left in their measured proportion."""
    fracs = {c: _finite(row.get(f"{c}_cost_frac")) or 0.0 for c in (*CLASSES, "other")}
    kept = {c: min(fracs[c] * wall, free) for c in ("io", "comm")}
    left = max(free - sum(kept.values()), 0.0)
    rest = [c for c in fracs if c not in kept]
    rest_total = sum(fracs[c] for c in rest)
    out = {f"{c}_cost_frac": kept[c] / free for c in kept}
    out.update({f"{c}_cost_frac": (fracs[c] / rest_total * left / free if rest_total > 0 else 0.0) for c in rest})
    return out


def verdict_rows(rows: Iterable, provisional: bool | None = None) -> list[dict]:
    """The step rows the run's verdict and step time rest on: the counted rows; where there are
    none and the verdict is ``provisional`` (``overall.provisional``), :func:`provisional_rows`."""
    rows = list(rows)
    counted = counted_rows(rows)
    if counted or provisional is not True:
        return counted
    return provisional_rows(rows)


def _finite(value) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and f >= 0 else None


def job_step_times(rows: Iterable[Mapping], cost: str | None = None) -> dict:
    """The job's time of each step (µs): the slowest rank's step time, less ``cost`` if named.

    Args:
        rows: Counted step rows (module docstring).
        cost: A class (``"io"``, ``"comm"``, ``"launch"``) whose ``<cost>_cost_frac`` share of
            each row is removed before the slowest rank is taken; None keeps the step times.

    Returns:
        ``{step: µs}`` in step order.
    """
    out: dict = {}
    for r in rows:
        t = _finite(r.get("step_time_us"))
        if t is None:
            continue
        if cost is not None:
            frac = _finite(r.get(f"{cost}_cost_frac")) or 0.0
            t = t * (1.0 - min(frac, 1.0))
        key = r.get("step")
        out[key] = max(out.get(key, 0.0), t)
    return dict(sorted(out.items(), key=lambda kv: (not isinstance(kv[0], (int, float)), kv[0] if isinstance(kv[0], (int, float)) else str(kv[0]))))


def step_time_us(rows: Iterable[Mapping], cost: str | None = None) -> float | None:
    """The run's step time (µs): the mean of the job's step times; None without a step."""
    times = list(job_step_times(rows, cost).values())
    return sum(times) / len(times) if times else None


def representative_step(rows: Iterable[Mapping]):
    """The counted step whose job time is nearest to the run's step time (ties: the earlier step);
    None without a step."""
    times = job_step_times(rows)
    if not times:
        return None
    mean = sum(times.values()) / len(times)
    return min(times, key=lambda s: abs(times[s] - mean))


def speedup(before_us: float | None, after_us: float | None) -> float | None:
    """B's throughput over A's: A's step time over B's (above 1: B is faster); None when either is
    unknown or B's is not positive."""
    a, b = _finite(before_us), _finite(after_us)
    return a / b if a is not None and b else None


def what_if(rows: Iterable[Mapping]) -> list[dict]:
    """Upper bounds of the gain from removing each removable cause entirely (module docstring).

    Returns:
        Per class with a cost: ``class``, ``step_time_us`` (now), ``step_time_without_us``,
        ``saved_us_per_step`` and ``speedup`` (now over without); the largest saving first.
        An upper bound: it assumes nothing else takes the removed time's place.
    """
    rows = list(rows)
    now = step_time_us(rows)
    if not now:
        return []
    out = []
    for c in REMOVABLE:
        without = step_time_us(rows, cost=c)
        if without is None or without >= now:
            continue
        out.append({"class": c, "step_time_us": now, "step_time_without_us": without,
                    "saved_us_per_step": now - without, "speedup": speedup(now, without)})
    return sorted(out, key=lambda e: e["step_time_without_us"])


def slowest_rank(rows: Iterable[Mapping]):
    """The rank the others wait for: the largest ``median_compute_us`` (µs) of per-rank rows
    (``details.ranks``), its own work and not its waits -- a rank that waits for the others in
    every collective has the longest *step* without being the cause. None for fewer than two ranks
    or when no row has a number; the analysis and the report's fallback both use this rule."""
    rows = [r for r in rows if isinstance(r, Mapping) and _finite(r.get("median_compute_us")) is not None]
    if len(rows) < 2:
        return None
    return max(rows, key=lambda r: _finite(r.get("median_compute_us"))).get("rank")
