"""Proving a winner: re-measure a candidate configuration interleaved with the baseline.

A tuning search ranks configurations on single, noisy measurements, so its best trial is biased
upwards (the winner's curse). Before recommending anything, the candidate and the user's current
configuration are measured again in alternation -- A B A B ... -- so that slow drifts of a shared
machine hit both alike, and the speed-up is stated with a confidence interval. A candidate is
called faster only when the whole interval lies above 1 + ``min_gain``.

The interval is Student's t on the logarithms of the paired ratios: with the handful of rounds a
tuner can afford (5 or so), a bootstrap interval is too narrow and would pass a candidate that is
no faster more often than its confidence level promises.

Throughputs are samples (or steps) per second; the speed-up of round ``i`` is
``candidate_i / baseline_i`` of the two measurements taken side by side.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

DEFAULT_ROUNDS = 5
DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class Confirmation:
    """The outcome of :func:`confirm`.

    Attributes:
        baseline, candidate: Throughput of each round (samples/s), in measurement order.
        speedup: Geometric mean of the per-round speed-ups (candidate / baseline).
        ci_low, ci_high: Interval of the speed-up at ``confidence`` (t interval of the mean log
            ratio, exponentiated).
        confidence: The interval's level (e.g. 0.95).
        min_gain: The smallest gain that counts (0.02 = 2%).
        faster: True when ``ci_low > 1 + min_gain``: faster beyond the measured noise.
    """

    baseline: tuple[float, ...]
    candidate: tuple[float, ...]
    speedup: float
    ci_low: float
    ci_high: float
    confidence: float
    min_gain: float
    faster: bool

    def describe(self) -> str:
        """One line for people, e.g. ``1.42x faster (95% interval 1.31x-1.55x, 5 rounds)``."""
        interval = f"{self.confidence:.0%} interval {self.ci_low:.2f}x-{self.ci_high:.2f}x, {len(self.baseline)} rounds"
        if self.faster:
            return f"{self.speedup:.2f}x faster ({interval})"
        return f"not faster beyond the noise: {self.speedup:.2f}x ({interval}); keep your current settings"


def speedup_interval(
    baseline: list[float], candidate: list[float], *, confidence: float = DEFAULT_CONFIDENCE
) -> tuple[float, float, float]:
    """Point estimate and confidence interval of the paired speed-up.

    Args:
        baseline, candidate: Throughputs of the same rounds (equal length >= 2, all > 0).
        confidence: Interval level in (0, 1).

    Returns:
        ``(speedup, low, high)``: geometric mean of the round ratios and its interval.

    Raises:
        ValueError: lengths differ, fewer than 2 rounds, a non-positive throughput, or a
            confidence outside (0, 1).
    """
    from scipy import stats

    a, b = np.asarray(baseline, dtype=float), np.asarray(candidate, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ValueError(f"need two equal-length series of at least 2 rounds, got {a.size} and {b.size}")
    if not (np.all(a > 0) and np.all(b > 0) and np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("throughputs must be finite and > 0")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    # Ratios multiply, so average their logarithms: a 2x gain and a 2x loss cancel.
    log_ratio = np.log(b / a)
    mean = float(log_ratio.mean())
    half = float(stats.t.ppf(0.5 + confidence / 2, df=log_ratio.size - 1)) * float(log_ratio.std(ddof=1)) / math.sqrt(log_ratio.size)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def confirm(
    measure_baseline: Callable[[], float],
    measure_candidate: Callable[[], float],
    *,
    rounds: int = DEFAULT_ROUNDS,
    confidence: float = DEFAULT_CONFIDENCE,
    min_gain: float = 0.0,
) -> Confirmation:
    """Measure baseline and candidate alternately and decide whether the candidate is faster.

    Args:
        measure_baseline, measure_candidate: Each call runs one measurement and returns its
            throughput (samples/s, > 0). Calls alternate, baseline first.
        rounds: Pairs of measurements (>= 2).
        confidence: Level of the speed-up's interval.
        min_gain: Gain the interval must clear (0.0: any gain beyond the noise).

    Returns:
        The :class:`Confirmation`.

    Raises:
        ValueError: fewer than 2 rounds, a negative ``min_gain``, or a measurement that is not a
            positive number.
    """
    if rounds < 2:
        raise ValueError(f"rounds must be at least 2, got {rounds}")
    if min_gain < 0:
        raise ValueError(f"min_gain must be >= 0, got {min_gain}")
    baseline, candidate = [], []
    for _ in range(rounds):
        baseline.append(float(measure_baseline()))
        candidate.append(float(measure_candidate()))
    speedup, low, high = speedup_interval(baseline, candidate, confidence=confidence)
    return Confirmation(
        baseline=tuple(baseline),
        candidate=tuple(candidate),
        speedup=speedup,
        ci_low=low,
        ci_high=high,
        confidence=confidence,
        min_gain=min_gain,
        faster=low > 1 + min_gain,
    )


def confirm_candidates(
    measure_baseline: Callable[[], float],
    candidates: dict,
    *,
    rounds: int = DEFAULT_ROUNDS,
    confidence: float = DEFAULT_CONFIDENCE,
    min_gain: float = 0.0,
) -> dict:
    """Confirm several candidates against one baseline: rounds of B C1 C2 ... in that order.

    Each candidate is paired with the baseline measured at the start of the same round, so all
    candidates share the baseline runs (fewer runs than confirming them one by one).

    Args:
        measure_baseline: Runs the baseline once; returns its throughput (> 0).
        candidates: key -> callable running that candidate once, returning its throughput, or
            None when the run failed (the candidate is then dropped from later rounds).
        rounds, confidence, min_gain: As for :func:`confirm`.

    Returns:
        key -> :class:`Confirmation` for every candidate that completed all rounds; a dropped
        candidate maps to None.

    Raises:
        ValueError: fewer than 2 rounds, a negative ``min_gain``, or a baseline measurement that
            is not a positive number.
    """
    if rounds < 2:
        raise ValueError(f"rounds must be at least 2, got {rounds}")
    if min_gain < 0:
        raise ValueError(f"min_gain must be >= 0, got {min_gain}")
    baseline: list[float] = []
    measured: dict = {key: [] for key in candidates}
    alive = list(candidates)
    for _ in range(rounds):
        value = float(measure_baseline())
        if not value > 0:
            raise ValueError(f"baseline measurement must be > 0, got {value}")
        baseline.append(value)
        for key in list(alive):
            result = candidates[key]()
            if result is None or not float(result) > 0:
                alive.remove(key)
                measured[key] = None
                continue
            measured[key].append(float(result))
    out: dict = {}
    for key, values in measured.items():
        if values is None:
            out[key] = None
            continue
        speedup, low, high = speedup_interval(baseline, values, confidence=confidence)
        out[key] = Confirmation(baseline=tuple(baseline), candidate=tuple(values), speedup=speedup, ci_low=low,
                                ci_high=high, confidence=confidence, min_gain=min_gain, faster=low > 1 + min_gain)
    return out
