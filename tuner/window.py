"""A trial's measured window: its length, its throughput, and the steps a script must run for it.

The window itself is decided while the script runs (``perfscope/measure/warmup.py`` for
where it starts, ``perfscope/measure/window.py`` for where it ends); these are the rules
the tuner derives from it. See ``docs/tune.md``, "Warm-up and window".
"""

from __future__ import annotations

from collections.abc import Sequence

# The steady-state window's defaults (docs/tune.md, "Measured window", says why these values).
DEFAULT_TARGET_RSE = 0.05
DEFAULT_MEASURE_CAP_S = 20.0


def window_throughput(samples: Sequence[int | None], seconds: Sequence[float], drawn: int = 0) -> float | None:
    """Samples per second over a window of steps (steps per second when a step's batch size is unknown).

    Args:
        samples: Samples of each step over all ranks, None where unknown.
        seconds: Duration of each step (seconds, > 0).
        drawn: Samples the window took from batches its DataLoaders had ready before it began
            (the drop of their ready queues over the window): loaded earlier, so not counted.
    """
    total = sum(seconds)
    if not seconds or total <= 0:
        return None
    if all(isinstance(n, int) for n in samples):
        return max(0, sum(samples) - drawn) / total
    return len(seconds) / total


MAX_PREFILL_STEPS = 64  # bound on the extra warm-up steps that drain a DataLoader's prefetch buffer


def measure_steps_for(measure_steps: int, loader_workers: int | None) -> int:
    """Measured steps for a trial whose DataLoader has ``loader_workers`` workers: ``measure_steps``
    rounded up to a whole number of worker rounds, so the window holds as many burst-waiting steps
    as a long run does (each worker delivers one batch per round, nearly together)."""
    if not loader_workers or loader_workers <= 1:
        return measure_steps
    return -(-measure_steps // loader_workers) * loader_workers


def warmup_steps_for(warmup_steps: int, loader_workers: int | None, prefetch_factor: int | None) -> int:
    """Warm-up steps for a trial of several ranks whose DataLoader has workers: ``warmup_steps``
    plus the batches its workers can have ready before the first step (``workers *
    prefetch_factor``, at most ``MAX_PREFILL_STEPS``), which would otherwise be consumed in the
    measured window for free. Fixed, as all ranks must stop at the same step; one process instead
    runs ``perfscope.measure --drain-prefetch``, whose warm-up lasts until the buffer is
    drained (a fixed count cannot drain what the workers add while the first steps are slow)."""
    if not loader_workers:
        return warmup_steps
    return warmup_steps + min(MAX_PREFILL_STEPS, loader_workers * (prefetch_factor or 2))


def steps_needed(warmup_used: int, measure_steps: int) -> int:
    """Steps a script must run for a trial that used ``warmup_used`` warm-up steps: those, the
    measured ones, and the step whose end closes the window, with room for a longer warm-up next
    time (the drain's length varies from run to run: a quarter more)."""
    return -(-(warmup_used + measure_steps + 1) * 5 // 4)
