"""The whole run at a glance: every step's time and phases, outside the profiled window.

From the record ``perfscope profile`` writes beside each rank's trace
(:mod:`perfscope.record.run_steps`), per rank: the step time over the steady steps, the phases'
shares, how the profiled window compares with the whole run, the slow steps (and whether they
come at a regular interval: checkpointing, evaluation, logging, garbage collection) and memory
that keeps growing. Rules and their constants are documented in ``docs/metrics.md`` ("The whole
run"); every function is pure over the records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from perfscope.record.run_steps import RunRecord, RunStep, read_run_steps
from perfscope.record.schema import RunCreep, RunPeriodic, RunPhase, RunSlowStep, RunSteps, RunWindow
from perfscope.trace.quality import DROPPED, NOT_READ, DataQuality

PHASES = ("input", "forward", "backward", "optimizer", "other")
# The first steps of a run build caches, autotune, compile and fill the DataLoader's queues: they
# are shown as start-up, not as the run's pace or its slow steps.
STARTUP_STEPS = 2
# A steady step is slow when it took this many times the median *and* stands out of the run's
# spread by SLOW_MADS scaled median absolute deviations (1.4826 x MAD estimates a normal
# spread): the ratio keeps noise of a quiet run out, the spread that of a noisy one.
SLOW_RATIO = 1.5
SLOW_MADS = 5.0
# ... and at least this much longer than the median: a busy machine's scheduler takes a core from
# the training thread for a time slice or more (milliseconds), which is not the run's doing.
SLOW_MIN_EXTRA_S = 0.002
MAX_SLOW_LISTED = 20
# Slow steps are periodic when at least PERIODIC_MIN of them come and PERIODIC_SHARE of the gaps
# between them are one and the same number of steps.
PERIODIC_MIN = 3
PERIODIC_SHARE = 0.75
PERIODIC_CANDIDATES = 20
# Of the sets that pass, the one at the longest interval wins when it holds this share of the most
# any set holds: a set at half that interval holds the same steps and the strays between them, so
# it would otherwise win on a busy machine; a genuine shorter period splits its time evenly
# between the halves (about 0.5 each), well under this share.
PERIODIC_DOMINANT = 0.75
# The window is representative when its median step is within this share of the run's.
REPRESENTATIVE_SHARE = 0.10
# Memory creep: the Theil-Sen slope of memory against step number is above zero at 95% confidence,
# and the growth it fits over the steady steps is at least CREEP_MIN_BYTES and CREEP_MIN_SHARE of
# the level; at least CREEP_MIN_POINTS readings.
CREEP_MIN_BYTES = 32 << 20
CREEP_MIN_SHARE = 0.05
CREEP_MIN_POINTS = 10
CURVE_POINTS = 480
# Steady step times kept for `perfscope check --all-steps`: every k-th step, so the sample is the
# run's steps thinned evenly (not the slowest of each stretch, as the curve).
SAMPLE_STEPS = 2000


# Fewer untraced steady steps than this (a run perfscope ended with its window) and the steps the
# profiler traced stand in for the run's pace; the window then has nothing to be compared with.
MIN_UNTRACED = 3


def _after_startup(steps: Sequence[RunStep]) -> Sequence[RunStep]:
    return steps[STARTUP_STEPS:] if len(steps) > STARTUP_STEPS else steps


def _untraced(steps: Sequence[RunStep]) -> list[RunStep]:
    return [s for s in _after_startup(steps) if not s.traced]


def steady_steps(steps: Sequence[RunStep]) -> Sequence[RunStep]:
    """The steps that give the run's pace: after start-up and outside the profiler's trace (the
    profiler slows the steps it traces), unless too few are."""
    untraced = _untraced(steps)
    return untraced if len(untraced) >= MIN_UNTRACED else _after_startup(steps)


def phase_shares(steady: Sequence[RunStep]) -> dict[str, float] | None:
    """Each phase's share of the steps' own time (:data:`PHASES`), or None where they took none."""
    total = float(np.array([s.own for s in steady]).sum())  # as the median's seconds are summed
    return {p: float(v.sum()) / total for p, v in phase_seconds(steady).items()} if total > 0 else None


def phase_seconds(steps: Sequence[RunStep]) -> dict[str, np.ndarray]:
    return {"input": np.array([s.input for s in steps]), "forward": np.array([s.forward for s in steps]),
            "backward": np.array([s.backward for s in steps]), "optimizer": np.array([s.optimizer for s in steps]),
            "other": np.array([s.other for s in steps])}


def slow_steps(steps: Sequence[RunStep]) -> tuple[list[RunSlowStep], float]:
    """The steady steps that took much longer than the run's pace, slowest first, and the
    threshold (seconds) they passed (:data:`SLOW_RATIO`, :data:`SLOW_MADS`, :data:`SLOW_MIN_EXTRA_S`).

    Each: ``step``, ``seconds``, ``ratio`` (to the median step), ``phase`` (the phase whose time
    grew the most over its median, one of :data:`PHASES`) and ``extra_s`` (that growth).
    """
    steady = steady_steps(steps)
    seconds = np.array([s.own for s in steady])
    if len(seconds) < 3:
        return [], float("inf")
    median = float(np.median(seconds))
    spread = 1.4826 * float(np.median(np.abs(seconds - median)))
    threshold = max(SLOW_RATIO * median, median + SLOW_MADS * spread, median + SLOW_MIN_EXTRA_S)
    phases = phase_seconds(steady)
    medians = {p: float(np.median(v)) for p, v in phases.items()}
    out = []
    for i in np.flatnonzero(seconds > threshold):
        extra = {p: float(phases[p][i]) - medians[p] for p in PHASES}
        phase = max(extra, key=extra.get)
        out.append(RunSlowStep(step=steady[i].step, seconds=float(seconds[i]),
                               ratio=float(seconds[i]) / median if median else None, phase=phase, extra_s=extra[phase]))
    out.sort(key=lambda r: -r.seconds)
    return out, threshold


def _best_progression(extra: dict[int, float]) -> list[int]:
    """The slow steps (step -> extra seconds) in one arithmetic progression that pass the rules of
    :func:`periodic`; [] when none does."""
    numbers = sorted(extra)
    total = sum(extra.values())
    longest = sorted(sorted(extra, key=extra.get, reverse=True)[:PERIODIC_CANDIDATES])
    gaps = {b - a for i, a in enumerate(longest) for b in longest[i + 1:]}
    passing: list[tuple[int, float, list[int]]] = []
    for every in sorted(g for g in gaps if g >= 2):
        for residue in sorted({n % every for n in longest}):
            members = [n for n in numbers if n % every == residue]
            held = sum(extra[n] for n in members)
            fills = len(members) >= max(PERIODIC_MIN, PERIODIC_SHARE * ((members[-1] - members[0]) // every + 1))
            if fills and held >= 0.5 * total:
                passing.append((every, held, members))
    if not passing:
        return []
    most = max(held for _, held, _ in passing)
    _, _, best = max((p for p in passing if p[1] >= PERIODIC_DOMINANT * most), key=lambda p: (p[0], p[1]))
    return best


def periodic(slow: list[RunSlowStep]) -> RunPeriodic | None:
    """The period (``every`` steps, ``steps``, ``phase``) when the slow steps' time comes mostly at
    one interval, else None.

    The candidate sets are the slow steps spaced by one number of steps (the gaps between any two
    of the :data:`PERIODIC_CANDIDATES` slow steps with the most extra time, so that stray slow
    steps between them do not hide the period); a set counts with at least :data:`PERIODIC_MIN` members filling
    :data:`PERIODIC_SHARE` of its slots and holding at least half of the slow steps' extra time (on
    a busy machine stray slow steps are many and short, a periodic task's few and long). Of those,
    the one at the longest interval holding :data:`PERIODIC_DOMINANT` of the most any set holds
    wins, so strays that fill the slots between a task's steps do not halve its interval.
    ``phase`` is the one most of its steps grew in.
    """
    if len(slow) < PERIODIC_MIN:
        return None
    extra = {int(r.step): max(float(r.extra_s or 0.0), 0.0) or float(r.seconds or 0.0) for r in slow[:1000]}
    best = _best_progression(extra)
    if not best:
        return None
    every = min(b - a for a, b in zip(best, best[1:]))
    members = set(best)
    phase = Counter(r.phase for r in slow if r.step in members).most_common(1)[0][0]
    return RunPeriodic(every=every, steps=best[:MAX_SLOW_LISTED], phase=phase)


def memory_creep(steps: Sequence[RunStep]) -> list[RunCreep]:
    """Memory that keeps growing over the steps after start-up that the profiler did not trace, per
    kind read (``rss``, ``device_allocated``).

    Each: ``memory`` (the kind), ``bytes_per_step`` (Theil-Sen slope), ``growth_bytes`` (the slope
    over the steps read), ``from_bytes`` and ``to_bytes`` (the fitted line's ends), ``first_step``,
    ``last_step``. Only growth above :data:`CREEP_MIN_BYTES` and :data:`CREEP_MIN_SHARE` of the
    level whose slope's 95% interval lies above zero is reported.
    """
    from scipy.stats import theilslopes

    out = []
    for kind in ("rss", "device_allocated"):
        # outside the profiler's trace only: the profiler's own buffers grow while it traces
        points = [(s.step, getattr(s, kind)) for s in _untraced(steps) if getattr(s, kind) is not None]
        if len(points) < CREEP_MIN_POINTS:
            continue
        x = np.array([p[0] for p in points], dtype=float)
        y = np.array([p[1] for p in points], dtype=float)
        if np.ptp(y) == 0:
            continue
        slope, intercept, low, _high = theilslopes(y, x, alpha=0.95)
        growth = slope * (x[-1] - x[0])
        level = float(np.median(y))
        if low <= 0 or growth < max(CREEP_MIN_BYTES, CREEP_MIN_SHARE * level):
            continue
        out.append(RunCreep(memory=kind, bytes_per_step=float(slope), growth_bytes=float(growth),
                            from_bytes=float(intercept + slope * x[0]), to_bytes=float(intercept + slope * x[-1]),
                            first_step=int(x[0]), last_step=int(x[-1])))
    return out


def window_view(steps: Sequence[RunStep], window: Sequence[int]) -> RunWindow | None:
    """How the profiled window's steps compare with the whole run's steady steps.

    ``first``/``last``/``steps`` (the window's recorded step numbers found in the record),
    ``median_s``, ``ratio`` (its median step over the run's), ``percentile`` (share of the run's
    steady steps faster than the window's median), ``representative`` (``ratio`` within
    :data:`REPRESENTATIVE_SHARE` of 1). None when no window step is in the record.
    """
    wanted = set(int(w) for w in window)
    inside = np.array([s.own for s in steps if s.step in wanted])
    if not len(inside):
        return None
    median = float(np.median(inside))
    found = sorted(s.step for s in steps if s.step in wanted)
    out = RunWindow(first=found[0], last=found[-1], steps=len(found), median_s=median)
    run = np.array([s.own for s in _untraced(steps)])
    if len(run) >= MIN_UNTRACED and float(np.median(run)) > 0:
        out.ratio = median / float(np.median(run))
        out.percentile = float(np.mean(run < median))
        out.representative = abs(out.ratio - 1.0) <= REPRESENTATIVE_SHARE
    return out


def _own_cost_us(steps: Sequence[RunStep]) -> float | None:
    """perfscope's own work at a step boundary outside the trace (the profiler's step, the timer's
    line), the median over those steps, in µs; None where fewer than :data:`MIN_UNTRACED` were."""
    untraced = _untraced(steps)
    return float(np.median([s.profiler for s in untraced])) * 1e6 if len(untraced) >= MIN_UNTRACED else None


def curve(steps: Sequence[RunStep]) -> list[list]:
    """At most :data:`CURVE_POINTS` steps to draw: the slowest of each run of consecutive steps,
    as ``[step, seconds, input, forward, backward, optimizer, rss, device_allocated]`` (seconds
    without the profiler's own work, :attr:`RunStep.own`)."""
    n = len(steps)
    buckets = np.array_split(np.arange(n), min(n, CURVE_POINTS)) if n else []
    out = []
    for b in buckets:
        s = max((steps[i] for i in b), key=lambda r: r.own)
        rss = next((steps[i].rss for i in b if steps[i].rss is not None), None)
        dev = next((steps[i].device_allocated for i in b if steps[i].device_allocated is not None), None)
        out.append([s.step, s.own, s.input, s.forward, s.backward, s.optimizer, rss, dev])
    return out


def rank_run_view(steps: Sequence[RunStep], window: Sequence[int], *, rank: int | None = None,
                  worker: str | None = None) -> RunSteps | None:
    """``details.run_steps[]`` of one rank (``docs/summary.md``); None for an empty record.

    Args:
        steps: The rank's record, in step order.
        window: The step numbers its trace holds (the profiled window).
        rank, worker: The trace's rank and worker name.
    """
    if not steps:
        return None
    steady = steady_steps(steps)
    seconds = np.array([s.own for s in steady])
    phases, shares = phase_seconds(steady), phase_shares(steady)
    slow, threshold = slow_steps(steps)
    start = steps[:STARTUP_STEPS] if len(steps) > STARTUP_STEPS else []
    return RunSteps(
        rank=rank, worker=worker, steps=len(steps), first_step=steps[0].step, last_step=steps[-1].step,
        truncated=steps[-1].last, total_s=float(sum(s.seconds for s in steps)),
        startup_s=float(sum(s.seconds for s in start)), traced_steps=sum(1 for s in steps if s.traced),
        steady_steps=len(steady),
        steady_untraced=len(steady) == len(_untraced(steps)) and not any(s.traced for s in steady),
        profiler_s=float(sum(s.profiler for s in steps)), own_cost_us=_own_cost_us(steps),
        median_s=float(np.median(seconds)), mean_s=float(seconds.mean()), p90_s=float(np.percentile(seconds, 90)),
        max_s=float(seconds.max()),
        phases={p: RunPhase(median_s=float(np.median(v)), share=shares[p] if shares else None)
                for p, v in phases.items()},
        window=window_view(steps, window),
        slow_threshold_s=threshold if np.isfinite(threshold) else None,
        slow_steps=slow[:MAX_SLOW_LISTED], slow_count=len(slow), periodic=periodic(slow),
        memory_creep=memory_creep(steps), curve=curve(steps),
        sample_s=[float(v) for v in seconds[:: max(1, -(-len(seconds) // SAMPLE_STEPS))]])


MALFORMED_LINES = "torn or malformed lines of the whole-run record (*.run.jsonl), left out"
RECORD_NOT_READ = "a whole-run record (*.run.jsonl) that could not be read"


def read_run_records(rank_traces) -> list[RunRecord | None]:
    """The whole-run record beside each trace (read here, where the trace's path is this
    machine's); None for a trace without a path. Lines left out and a record not read are
    entered in the trace's data-quality record (examples: the record's file name) and warnings.

    Args:
        rank_traces: Every analyzed trace (:class:`perfscope.analysis.rank_trace.RankTrace`); their
            ``quality`` and ``warnings`` are extended.
    """
    out: list[RunRecord | None] = []
    for rt in rank_traces:
        path = rt.table.path
        record = read_run_steps(path) if path is not None else None
        out.append(record)
        if record is None or not (record.dropped or record.problem):
            continue
        found = DataQuality()
        found.add(DROPPED, MALFORMED_LINES, record.dropped, [record.path.name] * record.dropped, unit="line")
        if record.problem is not None:
            found.add(NOT_READ, RECORD_NOT_READ, 1, {f"{record.path.name}: {record.problem}": 1}, unit="file")
        rt.quality.entries.extend(found.entries)
        rt.warnings.extend(found.warnings(path.name))
    return out


def run_steps_view(rank_traces, ranks: list[int], records: list[RunRecord | None]) -> list[RunSteps] | None:
    """``details.run_steps``: per trace with a whole-run record beside it, :func:`rank_run_view`
    with ``rank`` and ``worker``; None when no trace has one.

    Args:
        rank_traces: Every analyzed trace (:class:`perfscope.analysis.rank_trace.RankTrace`).
        ranks: The rank of each.
        records: The record of each (:func:`read_run_records`).
    """
    out = []
    for rt, rank, record in zip(rank_traces, ranks, records):
        steps = record.steps if record is not None else None
        view = rank_run_view(steps or [], [int(s) for s in rt.steps], rank=rank, worker=rt.table.worker)
        if view is not None:
            out.append(view)
    return out or None


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


_CREEP_WHAT = {"rss": "host memory (resident set)", "device_allocated": "device memory allocated"}


def _window_finding(w: RunWindow) -> str:
    """The profiled window beside the run's other steps, as a sentence."""
    if w.ratio is None:
        return (f"the run ended with the profiled window (steps {w.first}-{w.last}): "
                "`--max-steps 0` times every step to the script's end")
    where = f"the profiled window (steps {w.first}-{w.last}) ran at {w.ratio:.2f}x the run's other steps"
    if w.representative:
        return where + ": representative"
    if w.ratio > 1:
        return where + ": slower, by the profiler's own cost or a slower stretch of the run"
    return where + ": faster; the run has slower stretches the window missed"


def run_findings(view: RunSteps) -> list[str]:
    """What the record's ``details.run_steps[]`` of one rank says, as sentences: the window beside
    the run, slow steps and their period, memory creep. The console and the report print these."""
    out = [_window_finding(view.window)] if view.window is not None else []
    slow = view.slow_steps or []
    period = view.periodic
    if period is not None:
        steps = period.steps or []
        listed = ", ".join(str(s) for s in steps[:6]) + (", ..." if len(steps) > 6 else "")
        out.append(f"a slow step every {period.every} steps ({listed}), mostly in {period.phase}: a periodic "
                   "task (checkpoint, evaluation, logging, garbage collection)")
    elif slow:
        top = slow[0]
        count = view.slow_count if view.slow_count is not None else len(slow)
        out.append(f"{count} slow step(s) above {_ms(view.slow_threshold_s or 0.0)}; the slowest, "
                   f"step {top.step}: {_ms(top.seconds or 0.0)} ({top.phase} +{_ms(top.extra_s or 0.0)})")
    for c in view.memory_creep or []:
        out.append(f"memory creep: {_CREEP_WHAT.get(c.memory, c.memory)} grew {(c.growth_bytes or 0.0) / 2**20:,.0f} "
                   f"MiB over steps {c.first_step}-{c.last_step} ({(c.bytes_per_step or 0.0) / 2**10:,.0f} KiB a step)")
    return out


def run_headline(view: RunSteps) -> str:
    """``N steps, median X ms (input a%, forward b%, ...)`` of one rank's ``details.run_steps[]``."""
    phases = view.phases or {}
    shares = ", ".join(f"{p} {phases[p].share:.0%}" for p in PHASES if p in phases and phases[p].share is not None)
    cost = (f"; perfscope's own work {view.own_cost_us:.0f} µs a step outside the window"
            if view.own_cost_us is not None else "")
    return f"{view.steps} steps, median {_ms(view.median_s or 0.0)}" + (f" ({shares})" if shares else "") + cost
