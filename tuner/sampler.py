"""The profile-guided sampler: one knob at a time in the profile's order, then Optuna's TPE.

A joint space (the loader's workers with DDP buckets, compression and accumulation: 90
configurations on two cores) is too large for TPE to learn from a dozen noisy trials: measured on
such a table it needed as many trials as random search to reach 95% of the grid's best
(``docs/tune-benchmark.md``). The profile knows more: the verdict's bottleneck and the others'
shares order the knobs (:class:`perfscope.tuner.space.SearchSpace` keeps them in that order), and the knobs
of different bottlenecks mostly act apart. So the search first walks the knobs in that order, as
a coordinate search: each value of a knob not tried yet, with the other knobs at the best trial's
values, a knob done once each of its values has run; the baseline and the rule-based guess are
its first points. When every knob is done, :attr:`base` (TPE) proposes the rest from what ran.

The plan holds no state of its own: the next point follows from the study's trials, so a resumed
study or several workers sharing one go on where it stands (a point two workers draw at once runs
once: the objective skips configurations already measured).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from perfscope.runtime.config import ConfigError
from perfscope.runtime.groups.base import within
from perfscope.tuner.attrs import trial_mark

# An integer knob with a wide range (num_workers 0..16) is walked over this many values, spread
# evenly with both ends; TPE can refine between them afterwards.
MAX_VALUES_PER_KNOB = 5


def knob_values(distribution: BaseDistribution, most: int = MAX_VALUES_PER_KNOB) -> list:
    """The values the walk tries: a categorical's choices; an integer range's values, or ``most``
    of them evenly spread (both ends included) when it has more."""
    if isinstance(distribution, CategoricalDistribution):
        return list(distribution.choices)
    if isinstance(distribution, IntDistribution):
        values = list(range(distribution.low, distribution.high + 1, distribution.step))
        if len(values) <= most:
            return values
        picks = {values[round(i * (len(values) - 1) / (most - 1))] for i in range(most)}
        return sorted(picks)
    return []  # a float range: left to the base sampler


class CoordinateSampler(BaseSampler):
    """Walk the space's knobs one at a time around the best trial, then delegate to ``base``.

    Args:
        space: The :class:`perfscope.tuner.space.SearchSpace` (its knobs in the profile's order, their
            baselines, and the configuration a parameter set runs with).
        base: The sampler for the trials after the walk (and for float knobs).
        usable: Whether a finished trial may be the centre of the walk (default: complete with a
            value, and not marked infeasible by the numerics guard in ``user_attrs["feasible"]``).
    """

    def __init__(self, space, base: BaseSampler, usable=None) -> None:
        self.space = space
        self.base = base
        self.usable = usable or _usable
        self._points: dict[int, dict] = {}

    # --- the plan -------------------------------------------------------------------------------

    def next_point(self, trials: Sequence[FrozenTrial]) -> dict | None:
        """The walk's next parameter set given the study's trials, or None when it is done."""
        finished = [t for t in trials if self.usable(t)]
        if not finished:
            return None  # the baseline first (it is added to the study before any search)
        best = max(finished, key=lambda t: t.value)
        centre = self._full(best.params)
        tried = [self._full(t.params) for t in trials if t.state != TrialState.WAITING]
        seen = {self._identity(p) for p in tried}
        for knob in self.space.knobs:
            ran = {_hashable(p.get(knob.name)) for p in tried}
            for value in knob_values(knob.distribution):
                if _hashable(value) in ran:
                    continue
                point = {**centre, knob.name: value}
                identity = self._identity(point)
                if identity is None or identity in seen:
                    continue  # not expressible here (prefetch without workers) or already run
                return point
        return None

    def _full(self, params: dict) -> dict:
        return {**self.space.baseline_params, **params}

    def _identity(self, params: dict) -> str | None:
        try:
            return json.dumps(self.space.to_config(params).changes(), sort_keys=True)
        except ConfigError:
            return None

    # --- optuna.samplers.BaseSampler ------------------------------------------------------------

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        point = self.next_point(study.get_trials(deepcopy=False))
        if point is not None:
            self._points[trial.number] = point
        self.base.before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if trial.number in self._points:
            return {}
        return self.base.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial, search_space: dict) -> dict:
        if trial.number in self._points:
            return {}
        return self.base.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution):
        point = self._points.get(trial.number)
        if point is not None and param_name in point and within(param_distribution, point[param_name]):
            return point[param_name]
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values) -> None:
        self._points.pop(trial.number, None)
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()


def _usable(trial: FrozenTrial) -> bool:
    return (trial.state == TrialState.COMPLETE and trial.value is not None
            and trial_mark(trial).feasible is not False)


def _hashable(value):
    return json.dumps(value, sort_keys=True, default=str)
