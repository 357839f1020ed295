"""Stopping clearly slower trials early: an Optuna pruner on the throughput so far."""

from __future__ import annotations

import optuna
from optuna.pruners import BasePruner
from optuna.trial import FrozenTrial, TrialState

from perfscope.tuner.attrs import trial_mark

FEASIBLE_ATTR = "feasible"  # user attribute: the trial ran, and its loss passed the numerics guard


class SlowerThanBestPruner(BasePruner):
    """Prune a trial whose throughput so far is below ``ratio`` times the best feasible trial so far.

    A percentile pruner compares with the other trials' intermediate values, which on a short
    study are mostly bad configurations; comparing with the best feasible value only stops a
    trial that cannot win: measured step throughput varies by 10-20% on a shared machine, so the
    default ``ratio`` of 0.7 leaves that noise well alone.

    Args:
        ratio: Fraction of the best value below which a trial is pruned (0 < ratio < 1).
        warmup_steps: Measured steps reported before pruning is considered (the throughput of
            one or two steps is too noisy).
    """

    def __init__(self, ratio: float = 0.7, warmup_steps: int = 3) -> None:
        if not 0 < ratio < 1:
            raise ValueError(f"ratio must lie in (0, 1), got {ratio}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.ratio = ratio
        self.warmup_steps = warmup_steps
        self._best: dict[int, float | None] = {}  # trial number -> best at its first check

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        """True when the trial's latest intermediate value is clearly below the best so far."""
        step = trial.last_step
        if step is None or step + 1 < self.warmup_steps:
            return False
        if trial.number not in self._best:  # one storage read per trial, not per step
            self._best[trial.number] = best_feasible_value(study)
        best = self._best[trial.number]
        value = trial.intermediate_values[step]
        return best is not None and value < self.ratio * best


def best_feasible_value(study: optuna.Study) -> float | None:
    """The highest value among complete trials marked feasible, or None."""
    values = [t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if t.value is not None and trial_mark(t).feasible]
    return max(values) if values else None
