"""Steady-state measured window of ``perfscope.measure --target-rse R --measure-cap S``.

A fixed count of measured steps is too few on a busy machine (other work takes the cores in bursts,
so a handful of steps can be 3x off either way) and more than needed on a quiet one. With a target,
the window is K steps at least and then goes on, a step at a time, while the relative standard
error (RSE) of its throughput is above R, until the measured steps have taken S seconds, or the
script ends. The record of the window (:meth:`SteadyWindow.summary`) says which of these ended it,
so a trial's noise is known, not assumed.

The RSE is estimated by **batch means**, the standard method for the mean of a correlated
steady-state series (Law, *Simulation Modeling and Analysis*, 5th ed., section 9.5.3): the window
is cut into consecutive batches of ``round_steps`` steps -- one round of the DataLoader's workers,
so that each batch holds a burst of ready batches and the wait for the next one -- the throughput
of each batch (its samples over its seconds) is one observation, and

    RSE = stdev(batch throughputs) / sqrt(batches) / window throughput.

At least :data:`MIN_BATCHES` batches are needed for an estimate; below that the window goes on
(within the caps). Decisions are taken at whole rounds only, so the window always holds whole
rounds.

One process only: ranks of a distributed run must stop at the same step (a rank that stops early
leaves the others waiting in a collective), so their window stays fixed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MIN_BATCHES = 4  # batch means with fewer batches give a standard error with 2 degrees of freedom or less


def window_rse(samples: Sequence[int | None], seconds: Sequence[float], round_steps: int = 1) -> float | None:
    """Relative standard error of a window's throughput by batch means (module docstring).

    Args:
        samples: Samples of each step (None where unknown: then steps are counted instead).
        seconds: Duration of each step (seconds).
        round_steps: Steps per batch (>= 1); a partial batch at the end is left out.

    Returns:
        The RSE (a fraction: 0.05 = 5%), or None with fewer than :data:`MIN_BATCHES` whole batches
        or a window of no time.
    """
    size = max(1, int(round_steps))
    counts = [n if isinstance(n, int) else None for n in samples]
    if any(n is None for n in counts):
        counts = [1] * len(seconds)
    whole = (len(seconds) // size) * size
    if whole // size < MIN_BATCHES:
        return None
    rates = []
    for i in range(0, whole, size):
        t = sum(seconds[i:i + size])
        if t <= 0:
            return None
        rates.append(sum(counts[i:i + size]) / t)
    total = sum(seconds[:whole])
    overall = sum(counts[:whole]) / total if total > 0 else 0.0
    if overall <= 0:
        return None
    mean = sum(rates) / len(rates)
    var = sum((r - mean) ** 2 for r in rates) / (len(rates) - 1)
    return math.sqrt(var) / math.sqrt(len(rates)) / overall


class SteadyWindow:
    """Decides, at the boundary that would end the measured window, whether one more step is measured.

    Args:
        target_rse: R, the relative standard error to reach (> 0).
        cap_s: S, seconds of measured steps after which the window ends whatever its RSE (> 0).

    Attributes:
        extra: Steps added to the window so far.
        ended_by: ``"target"``, ``"time cap"``, ``"step cap"``, or None while the window is open
            (the script then ended it: :meth:`summary` says ``"script ended"``).
        rse: The RSE at the latest decision (None: not enough batches yet).
    """

    def __init__(self, *, target_rse: float, cap_s: float, max_steps: int) -> None:
        if not target_rse > 0 or not cap_s > 0:
            raise ValueError(f"target_rse and cap_s must be > 0, got {target_rse!r} and {cap_s!r}")
        self.target_rse = float(target_rse)
        self.cap_s = float(cap_s)
        self.max_steps = int(max_steps)
        self.extra = 0
        self.ended_by: str | None = None
        self.rse: float | None = None
        self.round_steps = 1
        self._steps = 0
        self._seconds = 0.0

    def extends(self, samples: Sequence[int | None], seconds: Sequence[float], round_steps: int) -> bool:
        """Whether the step starting now is measured too, given the measured steps so far.

        Args:
            samples, seconds: Of each measured step so far, in order.
            round_steps: Steps per round of the DataLoader's workers (1 without workers).
        """
        if self.ended_by is not None:
            return False
        self.round_steps = max(1, int(round_steps))
        self._steps, self._seconds = len(seconds), float(sum(seconds))
        if len(seconds) % self.round_steps:  # finish the round first: the window holds whole rounds
            if len(seconds) < self.max_steps:
                self.extra += 1
                return True
        self.rse = window_rse(samples, seconds, self.round_steps)
        if self.rse is not None and self.rse <= self.target_rse:
            self.ended_by = "target"
        elif self._seconds >= self.cap_s:
            self.ended_by = "time cap"
        elif len(seconds) >= self.max_steps:
            self.ended_by = "step cap"
        if self.ended_by is not None:
            return False
        self.extra += 1
        return True

    def summary(self, samples: Sequence[int | None] | None = None, seconds: Sequence[float] | None = None) -> dict:
        """The window's record: ``{target_rse, cap_s, rse, steps, seconds, extra_steps, round_steps,
        ended_by}`` (seconds of measured steps; ``rse`` recomputed over ``samples``/``seconds`` when
        given, the whole measured window as the script left it)."""
        rse = self.rse
        steps, total = self._steps, self._seconds
        if seconds is not None:
            rse = window_rse(samples or [None] * len(seconds), seconds, self.round_steps)
            steps, total = len(seconds), float(sum(seconds))
        return {"target_rse": self.target_rse, "cap_s": self.cap_s, "rse": rse, "steps": steps, "seconds": total,
                "extra_steps": self.extra, "round_steps": self.round_steps,
                "ended_by": self.ended_by or "script ended"}
