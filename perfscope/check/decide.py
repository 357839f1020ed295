"""The gate's decision over two sides of one or more runs each (rules: :mod:`perfscope.check`)."""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field

from perfscope.check.changes import what_grew
from perfscope import steptime
from perfscope.record.view import Record, record_of
from perfscope.check.gate import ALPHA, DEFAULT_MAX_REGRESSION  # noqa: F401 (the API's names)
from perfscope.check.stats import (
    MIN_STEPS, POWER, detectable_slowdown, detectable_steps, run_step_times, slowdown_p, step_sample, whole_run_sample,
)

ONE_RUN_NOTE = ("one run on each side: the test sees the noise within each run, not the drift between runs "
                "(docs/check.md); give several baseline runs to have the drift in the test")


class CheckInputError(ValueError):
    """The two sides cannot be compared (different modes, too few steps); the message says why."""


@dataclass(frozen=True)
class CheckResult:
    """The outcome of :func:`compare`.

    Attributes:
        baseline_step_us, run_step_us: Each side's step time (µs): the mean over its runs of each
            run's window over its steps (:mod:`perfscope.steptime`).
        slowdown: ``run_step_us / baseline_step_us - 1`` (0.06: 6% slower; negative: faster).
        p_value: The one-sided test's p-value; ``test`` names the test (:mod:`perfscope.check`).
        runs: Runs on each side: (baseline, run).
        threshold: The slowdown a regression must reach (half of ``max_regression``).
        alpha: The significance level.
        step_regression: Whether the step time regressed (both conditions).
        verdicts: (baseline's, run's) verdict, the most common of each side; None without one.
        verdict_regression: Whether the verdict moved from compute-bound to a removable class.
        changes: Lines naming what grew (classes, kernels or operators), largest first.
        notes: What the test could not see, or what was not compared, and why.
        spread: The baseline runs' run-to-run coefficient of variation (None with one run).
        detectable: The smallest slowdown the test finds with 80% power at ``alpha`` given that
            spread (:func:`~perfscope.check.stats.detectable_slowdown`; None with one run).
    """

    baseline_step_us: float
    run_step_us: float
    slowdown: float
    p_value: float
    test: str
    runs: tuple[int, int]
    threshold: float
    alpha: float
    step_regression: bool
    verdicts: tuple[str | None, str | None]
    verdict_regression: bool
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    spread: float | None = None
    detectable: float | None = None

    @property
    def failed(self) -> bool:
        """Whether the gate fails (exit status 1)."""
        return self.step_regression or self.verdict_regression


def _side(value) -> list[Record]:
    """A side's runs: one summary record (plain data or :class:`Record`) or a list of them."""
    return [record_of(s) for s in ([value] if isinstance(value, (dict, Record)) else value)]


def _verdict(records: list[Record]) -> str | None:
    """The side's most common verdict (ties: the first run's); None when no run has one."""
    found = [s.overall.verdict for s in records if s.overall_or_empty().verdict]
    return collections.Counter(found).most_common(1)[0][0] if found else None


# The shortest step a run can have: the profiler's clock ticks in microseconds, and a training
# step (a forward, a backward and an optimizer update) takes far longer than one tick.
MIN_STEP_US = 1.0
MAX_STEP_US = 1e13  # 115 days: the host record's own bound on a step (perfscope.record.host_steps.MAX_US)


def _check_inputs(baselines: list[Record], runs: list[Record], max_regression: float, alpha: float,
                  whole: bool = False) -> None:
    """Refuse what cannot be compared; ``whole``: the whole runs' steps are (the windows may be short)."""
    if not (0 < max_regression < 10) or not (0 < alpha < 1):
        raise CheckInputError(f"max_regression {max_regression} must be in (0, 10) and alpha {alpha} in (0, 1)")
    if not baselines or not runs:
        raise CheckInputError("each side needs at least one run")
    modes = {s.mode for s in baselines + runs}
    if len(modes) > 1:
        raise CheckInputError(f"the runs are of different modes ({', '.join(sorted(map(str, modes)))}): their step "
                              "times do not compare")
    for name, side in (("baseline", baselines), ("run", runs)):
        for k, s in enumerate(side):
            _check_run(s, f"the {name}" + (f" #{k + 1}" if len(side) > 1 else ""), whole)


def _check_run(record: Record, which: str, whole: bool) -> None:
    """Refuse a run whose counted steps took no time or years, or that has too few of them
    (unless the whole runs' steps are compared)."""
    sample = step_sample(record)
    impossible = sum(1 for t in sample if not MIN_STEP_US <= t <= MAX_STEP_US)
    if impossible:  # a step takes time, and not years: a summary that says otherwise was not measured
        raise CheckInputError(f"{which} has {impossible} counted step(s) that took no time (under "
                              f"{MIN_STEP_US:g} µs) or longer than 115 days, which no run does: not compared "
                              "(was its summary edited or made by hand?)")
    if len(sample) < MIN_STEPS and not whole:
        raise CheckInputError(f"{which} has {len(sample)} counted step(s){_why_left_out(record)}; the test needs at "
                              f"least {MIN_STEPS} in each run (profile more steps: perfscope profile --active N)")


def _why_left_out(record: Record) -> str:
    """The statuses of the steps the verdict left out, e.g. ``" (18 host-contended: ...)"``."""
    counts = record.overall_or_empty().steps_by_status or {}
    out = {k: v for k, v in counts.items() if k != "ok" and v > 0}
    if not out:
        return ""
    hint = "; the machine was busy: run it again" if "host-contended" in out else ""
    return " (" + ", ".join(f"{v:.0f} {k}" for k, v in out.items()) + f" left out{hint})"


def compare(baseline, run, *, max_regression: float = DEFAULT_MAX_REGRESSION, alpha: float = ALPHA,
            all_steps: bool = False) -> CheckResult:
    """Compare ``run`` against ``baseline`` (each a summary record or a list of them, one per run).

    Args:
        max_regression: The step-time regression to catch, a fraction (0.05: 5%).
        alpha: The test's significance level, a fraction.
        all_steps: Compare every run's whole-run steps (``details.run_steps``, timed outside
            the profiler) instead of its window's counted steps, where every run has them: each
            run's step time is their mean, and one run each is tested over them (a note says what
            that does to the test's power, and that drift between runs is still not in it).

    Raises:
        CheckInputError: The runs are of different modes (GPU and CPU-only), a side is empty, a
            counted step of either side took 0 µs, or
            a run has fewer than :data:`~perfscope.check.stats.MIN_STEPS` counted steps (steps on
            a contended host are not counted: the message says so).
    """
    baselines, runs = _side(baseline), _side(run)
    whole, missing = _whole_runs(baselines + runs) if all_steps else (None, 0)
    _check_inputs(baselines, runs, max_regression, alpha, whole=all_steps and not missing)
    notes = [ONE_RUN_NOTE] if len(baselines) == 1 and len(runs) == 1 else []
    vb, vr, samples = _step_times(baselines, runs, whole, missing, alpha, notes)
    sa, sb = _means(vb, vr)
    slowdown = sb / sa - 1
    p, test = slowdown_p(vb, vr, baselines, runs, samples)
    threshold = max_regression / 2
    verdict_b, verdict_r = _verdict(baselines), _verdict(runs)
    provisional = _verdict_notes(baselines, runs, verdict_b, verdict_r, notes)
    worse = not provisional and verdict_b == "compute-bound" and verdict_r not in (None, "compute-bound")
    spread, detectable = _power(vb, len(vr), alpha, max_regression, notes)
    return CheckResult(baseline_step_us=sa, run_step_us=sb, slowdown=slowdown, p_value=p, test=test,
                       runs=(len(baselines), len(runs)), threshold=threshold, alpha=alpha,
                       step_regression=bool(p < alpha and slowdown >= threshold), verdicts=(verdict_b, verdict_r),
                       verdict_regression=worse, changes=what_grew(baselines, runs), notes=notes, spread=spread,
                       detectable=detectable)


def _whole_runs(records: list[Record]) -> tuple[list, int]:
    """Every run's whole-run sample (``--all-steps``), and how many lack one long enough."""
    whole = [whole_run_sample(s) for s in records]
    return whole, sum(1 for w in whole if w is None or len(w) < MIN_STEPS)


def _means(vb: list[float], vr: list[float]) -> tuple[float, float]:
    """Each side's mean step time (µs).

    Raises:
        CheckInputError: the baseline's is 0.
    """
    sa, sb = sum(vb) / len(vb), sum(vr) / len(vr)
    if not sa > 0:
        raise CheckInputError("the baseline's step time is 0: there is nothing to compare a slowdown with")
    return sa, sb


def _power(vb: list[float], n_runs: int, alpha: float, max_regression: float,
           notes: list[str]) -> tuple[float | None, float | None]:
    """The baseline's run-to-run spread and the smallest slowdown the test finds :data:`POWER` of
    the time; a note where that is more than the regression asked for."""
    spread, detectable = detectable_slowdown(vb, n_runs, alpha) or (None, None)
    if detectable is not None and detectable > max_regression:
        notes.append(f"the baseline runs vary {spread:.1%} from run to run: the smallest slowdown this test finds "
                     f"{POWER:.0%} of the time is about {detectable:.1%}, more than the {max_regression:.0%} asked "
                     "for; give more runs on each side or measure on a quieter machine")
    return spread, detectable


def _step_times(baselines: list[Record], runs: list[Record], whole: list | None, missing: int, alpha: float,
                notes: list[str]) -> tuple[list[float], list[float], tuple | None]:
    """Each side's run step times (µs), and the two whole runs' steps to test one run each with
    (``--all-steps``; None otherwise). ``whole``: every run's whole-run sample, or None when not
    asked for; ``missing``: how many runs lack one (the windows are compared then, said in ``notes``)."""
    vb, vr = run_step_times(baselines), run_step_times(runs)
    if whole is None:
        return vb, vr, None
    if missing:
        notes.append(f"--all-steps: {missing} run(s) have no whole-run record of {MIN_STEPS} steps or more (only "
                     "`perfscope profile` times every step): the windows' counted steps are compared")
        return vb, vr, None
    means = [statistics.fmean(w) for w in whole]
    vb, vr = means[: len(baselines)], means[len(baselines):]
    if len(baselines) == 1 and len(runs) == 1:
        notes.append(_power_note((whole[0], whole[1]), step_sample(baselines[0]), step_sample(runs[0]), alpha))
        return vb, vr, (whole[0], whole[1])
    return vb, vr, None


def _provisional(record: Record) -> bool:
    """Whether the run's verdict is provisional and rests on no counted step."""
    return record.overall_or_empty().provisional is True and not steptime.counted_rows(record.steps or [])


def _verdict_notes(baselines: list[Record], runs: list[Record], verdict_b, verdict_r, notes: list[str]) -> list[str]:
    """Notes on verdicts that cannot be compared; the sides whose verdict is provisional (a verdict
    resting on no counted step: a flag beside counted steps is a hand edit)."""
    if verdict_b is None or verdict_r is None:
        which = " and ".join(n for n, v in (("the baseline", verdict_b), ("the run", verdict_r)) if v is None)
        notes.append(f"verdict not compared: {which} has no verdict (its evidence is incomplete)")
    provisional = [name for name, side in (("the baseline", baselines), ("the run", runs)) if any(map(_provisional, side))]
    if provisional:
        notes.append(f"{' and '.join(provisional)} had no clean step (busy host): {'their' if len(provisional) > 1 else 'its'} "
                     "verdict is provisional and step times are compared without the waits for a core "
                     "(docs/metrics.md, \"Provisional verdict\"); a changed verdict is not failed on")
    return provisional


def _power_note(samples: tuple[list[float], list[float]], window_b: list[float], window_r: list[float],
                alpha: float) -> str:
    """What testing every step instead of the windows' does to the smallest slowdown found."""
    whole = detectable_steps(samples[0], len(samples[1]), alpha)
    window = detectable_steps(window_b, len(window_r), alpha)
    if whole is None:
        return f"--all-steps: {len(samples[0])} and {len(samples[1])} steps of the whole runs compared"
    than = f" (the windows' {len(window_b)} and {len(window_r)} steps: about {window:.1%})" if window is not None else ""
    return (f"--all-steps: {len(samples[0])} and {len(samples[1])} steps of the whole runs: the smallest slowdown found "
            f"{POWER:.0%} of the time is about {whole:.1%}{than}; the drift between runs is still not in the test")


def _step_line(r: CheckResult) -> str:
    """``step time A ms -> B ms (x% slower); test: one-sided p = ...: outcome``."""
    sign = "slower" if r.slowdown >= 0 else "faster"
    step = (f"step time {r.baseline_step_us / 1000:.2f} ms -> {r.run_step_us / 1000:.2f} ms ({abs(r.slowdown):.1%} "
            f"{sign}); {r.test}: one-sided p = {r.p_value:.2g}")
    if r.step_regression:
        return step + f": REGRESSION (beyond the noise: p < {r.alpha:g} and {r.slowdown:.1%} >= {r.threshold:.1%})"
    if r.slowdown >= r.threshold:
        return step + f": within the noise (p >= {r.alpha:g})"
    return step + f": ok (below the {r.threshold:.1%} threshold)"


def _verdict_line(r: CheckResult) -> str:
    """``verdict: A -> B`` and whether the change is failed on."""
    vb, vr = r.verdicts
    if vb is None or vr is None:
        return f"verdict: {vb or 'none'} -> {vr or 'none'} (not compared)"
    if vb == vr:
        return f"verdict: unchanged ({vb})"
    if r.verdict_regression:
        why = ": REGRESSION (to a removable class)"
    elif vr == "compute-bound":
        why = " (changed, not failed: the removable cause is gone)"
    else:
        why = " (changed, not failed: both are removable classes)"
    return f"verdict: {vb} -> {vr}{why}"


def report_lines(r: CheckResult) -> list[str]:
    """The terminal lines of a result: step time, verdict, what grew, notes, the outcome."""
    lines = [_step_line(r), _verdict_line(r)] + [f"grew: {c}" for c in r.changes] + [f"note: {n}" for n in r.notes]
    lines.append("result: FAIL" if r.failed else "result: pass")
    return lines
