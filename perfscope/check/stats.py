"""The one-sided tests of ``perfscope check`` (which one, and why: :mod:`perfscope.check`).

Samples are step times in microseconds: a run's job step times (:func:`step_sample`) or the runs'
step times, one value per run.
"""

from __future__ import annotations

import math
import statistics

from perfscope import steptime
from perfscope.record.view import Record

MIN_STEPS = 5  # Mann-Whitney U with 4 and 4 cannot go below p = 1/70


def counted_rows(record: Record) -> list[dict]:
    """The step rows the record's verdict rests on (:func:`perfscope.steptime.verdict_rows`): the
    counted ones, or for a provisional verdict those it classified, without their waits for a core."""
    return steptime.verdict_rows(record.steps or [], record.overall_or_empty().provisional)


def step_sample(record: Record) -> list[float]:
    """The job's time of each counted step (µs), in step order."""
    return list(steptime.job_step_times(counted_rows(record)).values())


def whole_run_sample(record: Record) -> list[float] | None:
    """The steady steps of the whole run (µs; ``details.run_steps[].sample_s``), of its slowest
    rank where there are several; None when the record has no whole-run record."""
    samples = [v.sample_s for v in (record.details.run_steps if record.details else None) or [] if v.sample_s]
    if not samples:
        return None
    return [t * 1e6 for t in max(samples, key=statistics.fmean)]


def detectable_steps(baseline: list[float], run_n: int, alpha: float) -> float | None:
    """The smallest slowdown a one-sided Mann-Whitney U test over ``len(baseline)`` and ``run_n``
    steps finds with :data:`POWER` power at ``alpha``, the steps' spread taken from ``baseline``:
    ``(z(1 - alpha) + z(POWER)) * cv * sqrt(1/n1 + 1/n2) * sqrt(pi/3)`` (the normal approximation,
    with the U test's efficiency of 3/pi against the t-test on normal data). None without spread."""
    from scipy.stats import norm

    if len(baseline) < 2 or not statistics.fmean(baseline) > 0:
        return None
    cv = statistics.stdev(baseline) / statistics.fmean(baseline)
    z = float(norm.ppf(1 - alpha) + norm.ppf(POWER))
    return z * cv * math.sqrt(1 / len(baseline) + 1 / run_n) * math.sqrt(math.pi / 3)


def p_steps(run: list[float], baseline: list[float]) -> float:
    """One-sided Mann-Whitney U p-value of "the run's steps are longer than the baseline's"."""
    from scipy.stats import mannwhitneyu

    if len(set(run) | set(baseline)) == 1:  # every step equal: no evidence of a difference
        return 1.0
    return float(mannwhitneyu(run, baseline, alternative="greater").pvalue)


def p_runs(run: list[float], baseline: list[float]) -> float:
    """One-sided Welch t-test p-value of "the runs' step times are larger", two or more each."""
    from scipy.stats import ttest_ind

    if statistics.pvariance(run) == 0 and statistics.pvariance(baseline) == 0:
        return 0.0 if statistics.fmean(run) > statistics.fmean(baseline) else 1.0
    p = float(ttest_ind(run, baseline, equal_var=False, alternative="greater").pvalue)
    return p if math.isfinite(p) else 1.0


def p_prediction(single: float, several: list[float], single_is_run: bool) -> float:
    """One-sided p-value of one run's step time against the mean of several runs of the other side,
    through the prediction interval of the several: Student's t with ``len(several) - 1`` degrees
    of freedom and scale ``sd * sqrt(1 + 1/n)`` (the single run is one draw from the same spread,
    the mean of the several n of them).

    Args:
        single_is_run: True when the single value is the run's (tested for being larger than the
            several baselines), False when it is the baseline's (the several runs tested for
            being larger than it).
    """
    from scipy.stats import t as student_t

    n = len(several)
    mean, sd = statistics.fmean(several), statistics.stdev(several)
    diff = single - mean if single_is_run else mean - single
    if sd == 0:
        return 0.0 if diff > 0 else 1.0
    return float(student_t.sf(diff / (sd * math.sqrt(1 + 1 / n)), n - 1))


def run_step_times(records: list[Record]) -> list[float | None]:
    """Each run's step time (µs, :func:`perfscope.steptime.step_time_us`), one value per record."""
    return [steptime.step_time_us(counted_rows(s)) for s in records]


def slowdown_p(vb: list[float], vr: list[float], baselines: list[Record], runs: list[Record],
               samples: tuple[list[float], list[float]] | None = None) -> tuple[float, str]:
    """The p-value of "the runs are slower than the baselines" and the test's name.

    Args:
        vb, vr: Each side's run step times (:func:`run_step_times`).
        baselines, runs: The summary records behind them; each has at least :data:`MIN_STEPS`
            counted steps (a single run on each side is tested step by step).
        samples: (baseline, run) step times (µs) of the whole runs to test one run each with
            (``--all-steps``), or None for the windows' counted steps.
    """
    if len(vb) >= 2 and len(vr) >= 2:
        return p_runs(vr, vb), f"Welch's t-test over {len(vb)} and {len(vr)} runs"
    if len(vb) >= 2:
        return p_prediction(vr[0], vb, True), f"prediction interval of {len(vb)} baseline runs"
    if len(vr) >= 2:
        return p_prediction(vb[0], vr, False), f"t-test of {len(vr)} runs against one baseline run"
    a, b = samples if samples is not None else (step_sample(baselines[0]), step_sample(runs[0]))
    where = " of the whole runs" if samples is not None else ""
    return p_steps(b, a), f"Mann-Whitney U over {len(a)} and {len(b)} steps{where}"


POWER = 0.8  # the power the smallest detectable regression is quoted at


def detectable_slowdown(values: list[float], n_run: int, alpha: float) -> tuple[float, float] | None:
    """(run-to-run spread, smallest detectable slowdown) from several baseline runs' step times
    (``values``) against ``n_run`` runs, or None with fewer than two baseline runs.

    The spread is the baseline runs' coefficient of variation (sd / mean of their step times);
    the smallest slowdown the test finds at ``alpha`` with :data:`POWER` power is
    ``(t(1 - alpha) + t(POWER)) * cv * sqrt(1/n_baseline + 1/n_run)`` (Student's t with
    ``n_baseline - 1`` degrees of freedom): the usual sample-size relation of a one-sided test,
    the noise taken as the baseline runs show it.
    """
    from scipy.stats import t as student_t

    if len(values) < 2 or not statistics.fmean(values) > 0:
        return None
    cv = statistics.stdev(values) / statistics.fmean(values)
    df = len(values) - 1
    factor = float(student_t.ppf(1 - alpha, df) + student_t.ppf(POWER, df))
    return cv, factor * cv * math.sqrt(1 / len(values) + 1 / n_run)
