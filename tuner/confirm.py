"""Proving a winner: re-measure candidates interleaved with the baseline until the answer is known.

A tuning search ranks configurations on single, noisy measurements, so its best trial is biased
upwards (the winner's curse). Before recommending anything, the candidates and the user's current
configuration are measured again in alternation -- B C1 C2 B C1 C2 ... -- so that slow drifts of a
shared machine hit both alike, and each speed-up is stated with a confidence interval. A candidate
is called faster only when the whole interval lies above 1 + ``min_gain``.

**Sequential rounds.** How many rounds are needed depends on the noise, which is only known once
measured: a quiet machine proves a 1.5x gain in 3 rounds, a busy one needs 10 or more. So rounds go
on until every candidate is decided -- its interval clears 1 + ``min_gain`` (faster) or lies below
it (not faster) -- or the round or time budget ends (undecided: not faster). Looking at the data
after every round and stopping at the first clear answer would confirm a candidate that is no
faster more often than the confidence level says, so each look uses a wider interval: the
allowed error ``1 - confidence`` is split evenly over the looks (Bonferroni; Jennison & Turnbull,
*Group Sequential Methods*, ch. 2, show it bounds the overall error whatever the correlation of the
looks). With the default 95% and rounds 3 to 12 (10 looks), a candidate that is no faster is
confirmed in at most 2.5% of studies; the tests measure it on a fake objective.

The interval is Student's t on the logarithms of the paired ratios: with the handful of rounds a
tuner can afford, a bootstrap interval is too narrow and would pass a candidate that is no faster
more often than its confidence level promises.

Throughputs are samples (or steps) per second; the speed-up of round ``i`` is
``candidate_i / baseline_i`` of the two measurements taken side by side.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from perfscope.tuner.options import DEFAULT_MIN_ROUNDS, DEFAULT_ROUNDS

DEFAULT_CONFIDENCE = 0.95


# An interval wider than this factor (high / low) decides nothing: it is reported as undecided,
# with how unequal the rounds were, instead of as numbers such as 0.00x-3.6e27x.
WIDE_INTERVAL = 4.0


DRIFT = 1.5
"""Rounds of one configuration that differ by more than this factor drifted (a busy machine);
below it, a wide interval comes from too few rounds, not from the rounds."""


def interval_text(speedup: float, low: float, high: float, baseline=(), candidate=()) -> str:
    """``"1.42x (1.31x-1.55x)"``; for an interval that holds 1x and is wider than
    :data:`WIDE_INTERVAL`, what made it so, in words a person reads: ``"0.36x, undecided: the
    baseline's rounds differ 13x"`` where rounds drifted (:data:`DRIFT`), else ``"10.9x in 2 rounds,
    too few rounds to bound it"`` -- never the interval's unreadable ends (a wide interval wholly
    above or below 1x decides, and is shown as it is)."""
    if not (low <= 1.0 <= high) or (low > 0 and high / low <= WIDE_INTERVAL):
        return f"{speedup:.2f}x ({low:.2f}x-{high:.2f}x)"
    spreads = [(name, max(v) / min(v)) for name, v in (("baseline", baseline), ("candidate", candidate))
               if len(v) > 1 and min(v) > 0]
    drifted = [f"the {name}'s rounds differ {ratio:.1f}x" for name, ratio in spreads if ratio > DRIFT]
    if drifted:
        return (f"{speedup:.2f}x, undecided: {' and '.join(drifted)} (a busy machine's drift; more rounds or a "
                "quieter machine decide it)")
    rounds = max(len(baseline), len(candidate))
    return f"{speedup:.2f}x" + (f" in {rounds} rounds" if rounds else "") + ", undecided: too few rounds to bound it"


@dataclass(frozen=True)
class Confirmation:
    """The outcome of one candidate's confirmation.

    Attributes:
        baseline, candidate: Throughput of each round (samples/s), in measurement order.
        speedup: Geometric mean of the per-round speed-ups (candidate / baseline).
        ci_low, ci_high: Interval of the speed-up at ``level`` (t interval of the mean log
            ratio, exponentiated).
        confidence: The overall level asked for (e.g. 0.95).
        level: The level of this interval: ``confidence`` widened for the looks taken.
        looks: Looks the rounds allowed (``max_rounds - min_rounds + 1``).
        min_gain: The smallest gain that counts (0.02 = 2%).
        faster: True when ``ci_low > 1 + min_gain``: faster beyond the measured noise.
        decided_by: ``"cleared"`` (faster), ``"below"`` (interval under 1 + min_gain),
            ``"round budget"`` or ``"time budget"`` (undecided when the budget ended: not faster).
    """

    baseline: tuple[float, ...]
    candidate: tuple[float, ...]
    speedup: float
    ci_low: float
    ci_high: float
    confidence: float
    min_gain: float
    faster: bool
    level: float = DEFAULT_CONFIDENCE
    looks: int = 1
    decided_by: str = "round budget"

    @property
    def rounds(self) -> int:
        return len(self.baseline)

    def describe(self, better: str = "faster") -> str:
        """One line for people, e.g. ``1.42x faster (95% interval 1.31x-1.55x, 5 rounds)``;
        ``better`` names the gain (``more samples per joule`` for the energy objective)."""
        kind = "sequential interval" if self.looks > 1 else "interval"  # widened for its looks: module docstring
        interval = f"{self.confidence:.0%} {kind} {self.ci_low:.2f}x-{self.ci_high:.2f}x, {self.rounds} rounds"
        if self.faster:
            return f"{self.speedup:.2f}x {better} ({interval})"
        if self.ci_low <= 1.0 <= self.ci_high and (self.ci_low <= 0 or self.ci_high / self.ci_low > WIDE_INTERVAL):
            return (f"not shown {better}: {interval_text(self.speedup, self.ci_low, self.ci_high, self.baseline, self.candidate)}"
                    "; keep your current settings")
        return f"not {better} beyond the noise: {self.speedup:.2f}x ({interval}); keep your current settings"

    def to_dict(self) -> dict:
        return {"baseline": list(self.baseline), "candidate": list(self.candidate), "speedup": self.speedup,
                "ci_low": self.ci_low, "ci_high": self.ci_high, "faster": self.faster, "rounds": self.rounds,
                "level": self.level, "decided_by": self.decided_by}


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


def look_level(confidence: float, looks: int) -> float:
    """The level of each look's interval so that ``looks`` looks together keep ``confidence``
    (Bonferroni: the error ``1 - confidence`` split evenly)."""
    return 1.0 - (1.0 - confidence) / max(1, looks)


def confirm(
    measure_baseline: Callable[[], float],
    measure_candidate: Callable[[], float],
    *,
    rounds: int = DEFAULT_ROUNDS,
    min_rounds: int | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    min_gain: float = 0.0,
) -> Confirmation:
    """Measure baseline and candidate alternately (baseline first) until the candidate is decided.

    :func:`confirm_candidates` for one candidate whose runs never fail; ``min_rounds`` defaults
    to ``rounds`` (a fixed number of rounds, one look).

    Raises:
        ValueError: as :func:`confirm_candidates`, or a candidate measurement that is not > 0.
    """
    def candidate() -> float:
        value = float(measure_candidate())
        if not value > 0:
            raise ValueError(f"candidate measurement must be > 0, got {value}")
        return value

    return confirm_candidates(measure_baseline, {0: candidate}, rounds=rounds,
                              min_rounds=rounds if min_rounds is None else min_rounds,
                              confidence=confidence, min_gain=min_gain)[0]


def confirm_candidates(
    measure_baseline: Callable[[], float],
    candidates: dict,
    *,
    rounds: int = DEFAULT_ROUNDS,
    min_rounds: int = DEFAULT_MIN_ROUNDS,
    confidence: float = DEFAULT_CONFIDENCE,
    min_gain: float = 0.0,
    budget_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_round: Callable[[int, dict], None] | None = None,
) -> dict:
    """Confirm several candidates against one baseline in sequential rounds (module docstring).

    Each round measures the baseline, then every candidate not decided yet, in that order; each
    candidate is paired with the baseline run of the same round. After round ``min_rounds`` and
    every later one, each undecided candidate is looked at once.

    Args:
        measure_baseline: Runs the baseline once; returns its throughput (> 0).
        candidates: key -> callable running that candidate once, returning its throughput, or
            None when the run failed (the candidate is then dropped from later rounds).
        rounds: The most rounds (>= ``min_rounds``).
        min_rounds: Rounds before the first look (>= 2).
        confidence: The overall level of the decisions (each look uses :func:`look_level`).
        min_gain: Gain the interval must clear (0.0: any gain beyond the noise).
        budget_s: Seconds (of ``clock``) after which no new round starts; None: no limit.
        clock: The time source of ``budget_s`` (seconds).
        on_round: Called after each round with ``(round from 1, {key: Confirmation or None}
            of the candidates looked at in it)``, for progress lines.

    Returns:
        key -> :class:`Confirmation` for every candidate with ``min_rounds`` rounds measured (one
        stopped by the time budget before its first look has its rounds so far, when >= 2); a
        dropped candidate, or one with fewer than 2 rounds, maps to None.

    Raises:
        ValueError: bad round counts, a negative ``min_gain``, or a baseline measurement that is
            not a positive number.
    """
    _check(rounds, min_rounds, min_gain)
    looks = rounds - min_rounds + 1
    state = _Rounds(candidates, confidence, look_level(confidence, looks), looks, min_gain)
    started = clock()
    for number in range(1, rounds + 1):
        state.measure(measure_baseline)
        out_of_time = budget_s is not None and clock() - started >= budget_s
        ready = number >= min_rounds or (out_of_time and number >= 2)
        looked = state.look(number == rounds, out_of_time) if ready else {}
        if on_round is not None:
            on_round(number, looked)
        if not state.open_keys or out_of_time:
            break
    return {key: state.decided.get(key) for key in candidates}


def _check(rounds: int, min_rounds: int, min_gain: float) -> None:
    if min_rounds < 2 or rounds < min_rounds:
        raise ValueError(f"need 2 <= min_rounds <= rounds, got min_rounds {min_rounds} and rounds {rounds}")
    if min_gain < 0:
        raise ValueError(f"min_gain must be >= 0, got {min_gain}")


@dataclasses.dataclass
class _Rounds:
    """The measurements of :func:`confirm_candidates` so far, and what is decided."""

    candidates: dict
    confidence: float
    level: float
    looks: int
    min_gain: float
    baseline: list = dataclasses.field(default_factory=list)
    measured: dict = dataclasses.field(default_factory=dict)
    decided: dict = dataclasses.field(default_factory=dict)
    open_keys: list = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.measured = {key: [] for key in self.candidates}
        self.open_keys = list(self.candidates)

    def measure(self, measure_baseline: Callable[[], float]) -> None:
        """One round: the baseline, then each open candidate (one whose run fails is closed, None).

        Raises:
            ValueError: a baseline measurement that is not a positive number.
        """
        value = float(measure_baseline())
        if not value > 0:
            raise ValueError(f"baseline measurement must be > 0, got {value}")
        self.baseline.append(value)
        for key in list(self.open_keys):
            result = self.candidates[key]()
            if result is None or not float(result) > 0:
                self.open_keys.remove(key)
                self.decided[key] = None
            else:
                self.measured[key].append(float(result))

    def look(self, last_round: bool, out_of_time: bool) -> dict:
        """Each open candidate judged once; those decided are closed. Returns key -> Confirmation."""
        looked = {}
        for key in list(self.open_keys):
            c = _judge(self.baseline, self.measured[key], self.confidence, self.level, self.looks, self.min_gain)
            why = _decided_by(c, self.min_gain, last_round, out_of_time)
            if why:
                c = self.decided[key] = dataclasses.replace(c, decided_by=why)
                self.open_keys.remove(key)
            looked[key] = c
        return looked


def _decided_by(c: Confirmation, min_gain: float, last_round: bool, out_of_time: bool) -> str | None:
    """Why a look decides the candidate (its interval cleared or fell below 1 + min_gain, or the
    rounds or the time ran out), or None to go on."""
    if c.ci_low > 1 + min_gain:
        return "cleared"
    if c.ci_high < 1 + min_gain:
        return "below"
    if last_round:
        return "round budget"
    return "time budget" if out_of_time else None


def _judge(baseline: list[float], values: list[float], confidence: float, level: float, looks: int,
           min_gain: float) -> Confirmation:
    pairs = baseline[:len(values)]  # a candidate's rounds pair with the baseline runs of the same rounds
    speedup, low, high = speedup_interval(pairs, values, confidence=level)
    return Confirmation(baseline=tuple(pairs), candidate=tuple(values), speedup=speedup, ci_low=low, ci_high=high,
                        confidence=confidence, min_gain=min_gain, faster=low > 1 + min_gain, level=level,
                        looks=looks, decided_by="open")
