"""A one-time start-up cost (``torch.compile``'s compile time) against a per-step gain.

A compiled model is faster per step only after it paid its compile time, once, in its first steps.
The confirmation measures steady steps (after the warm-up), so its speed-up ``r`` leaves that cost
out; this module puts it back for the run the user will train. With the baseline's step time
``s`` (seconds), the candidate's extra start-up ``c`` (its compile seconds less the baseline's) and
a run of ``N`` steps::

    baseline  N * s          candidate  c + N * s / r
    net speed-up over the run  = N * s / (c + N * s / r)
    break-even run length      N* = c / (s * (1 - 1 / r))   (r > 1)

The compile seconds are dynamo's own timer (:func:`perfscope.runtime.compiling.compile_seconds`)
in each confirmation run; inductor caches compiled graphs on disk, so a repeated run of the same
model compiles faster than the first one on a new machine (the figure is the one measured here).
"""

from __future__ import annotations

import dataclasses
import math
import statistics


@dataclasses.dataclass(frozen=True)
class StartUp:
    """The start-up cost weighed against a speed-up.

    Attributes:
        extra_s: The candidate's start-up seconds beyond the baseline's (compile time).
        step_s: The baseline's median step (seconds).
        speedup: The steady per-step speed-up (candidate over baseline, > 0).
        break_even_steps: Steps after which the candidate has caught up (None: never, the
            speed-up is not above 1).
        run_steps: The run length the user stated (None: not stated).
        net_speedup: Over ``run_steps`` steps, start-up included (None without ``run_steps``).
    """

    extra_s: float
    step_s: float
    speedup: float
    break_even_steps: float | None
    run_steps: int | None = None
    net_speedup: float | None = None

    def to_dict(self) -> dict:
        """JSON-able copy (``tune.json``'s ``recommendation.startup``)."""
        return dataclasses.asdict(self)

    def text(self) -> str:
        """The cost in words: ``"compiling took 22.9 s, repaid after 7,600 steps"`` (and the net
        speed-up over the stated run)."""
        repaid = (f"repaid after {self.break_even_steps:,.0f} steps" if self.break_even_steps is not None
                  else "never repaid")
        line = f"compiling took {self.extra_s:.1f} s, {repaid}"
        if self.net_speedup is not None:
            line += f"; over the {self.run_steps:,} steps of the run: {self.net_speedup:.2f}x"
        return line


def weigh(extra_s: float, step_s: float, speedup: float, run_steps: int | None = None) -> StartUp:
    """The start-up ``extra_s`` against the per-step ``speedup`` of a baseline step of ``step_s``
    seconds (module docstring), over ``run_steps`` steps when given.

    Raises:
        ValueError: a step time or speed-up that is not positive and finite, a negative
            ``extra_s`` or ``run_steps`` below 1.
    """
    for name, value in (("step_s", step_s), ("speedup", speedup)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be positive and finite, got {value!r}")
    if not (math.isfinite(extra_s) and extra_s >= 0):
        raise ValueError(f"extra_s must be >= 0, got {extra_s!r}")
    if run_steps is not None and run_steps < 1:
        raise ValueError(f"run_steps must be >= 1, got {run_steps!r}")
    saved = step_s * (1.0 - 1.0 / speedup)
    even = extra_s / saved if saved > 0 else None
    net = None
    if run_steps is not None:
        net = run_steps * step_s / (extra_s + run_steps * step_s / speedup)
    return StartUp(extra_s=extra_s, step_s=step_s, speedup=speedup, break_even_steps=even, run_steps=run_steps,
                   net_speedup=net)


def extra_seconds(candidate: list[float | None], baseline: list[float | None]) -> float | None:
    """The candidate's start-up beyond the baseline's: the medians of each one's runs (None in a
    run: nothing compiled, 0 s) subtracted, at least 0; None when neither compiled anything."""
    if not any(v for v in candidate) and not any(v for v in baseline):
        return None
    med = [statistics.median([v or 0.0 for v in runs]) if runs else 0.0 for runs in (candidate, baseline)]
    return max(0.0, med[0] - med[1])


def from_runs(candidate: list[tuple], baseline: list[tuple], speedup: float | None,
              run_steps: int | None) -> StartUp | None:
    """:func:`weigh` from confirmation runs, each ``(compile seconds or None, median step
    seconds)``: the candidate's extra compile seconds at the baseline's median step. None when
    neither compiled anything, or without a baseline run or a positive speed-up."""
    extra = extra_seconds([c for c, _ in candidate], [c for c, _ in baseline])
    if extra is None or not baseline:
        return None
    return _weighed(extra, statistics.median(s for _, s in baseline), speedup, run_steps)


def _weighed(extra: float, step_s: float, speedup: float | None, run_steps: int | None) -> StartUp | None:
    if not speedup or speedup <= 0 or step_s <= 0:
        return None
    return weigh(extra, step_s, speedup, run_steps)
