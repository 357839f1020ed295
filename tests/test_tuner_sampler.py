"""The profile-guided sampler (tuner/sampler.py): the walk in the profile's order around the best
trial, on seeded synthetic objectives (no script runs)."""

from __future__ import annotations

import json

import optuna
import pytest

from perfscope.tuner.sampler import CoordinateSampler, knob_values
from perfscope.tuner.space import build_space

FACTS = {"cuda": False, "cpu_count": 2, "world_size": 2, "local_world_size": 2,
         "dataloader": {"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "iterable": False},
         "accelerate": {"called": True, "optimizer": True, "loader": True},
         "ddp": {"bucket_cap_mb": 25.0, "static_graph": False}, "threads": {"intra_op_threads": 1}}
FRACTIONS = {"io": 0.3, "comm": 0.28, "launch": 0.02, "compute": 0.4}
WORKERS = {0: 1.0, 1: 1.6, 2: 2.2, 3: 2.5, 4: 2.4}  # the loading: the largest effect
ACCUM = {1: 1.0, 2: 1.15, 4: 1.2}
BUCKET = {1.0: 1.1, 5.0: 1.05, 10.0: 1.02, 25.0: 1.0, 50.0: 0.98, 100.0: 0.97, 200.0: 0.95}


def space():
    s = build_space(FACTS, FRACTIONS, "io-bound")
    assert [k.name for k in s.knobs][:2] == ["num_workers", "prefetch_factor"]  # the profile's order
    return s


def throughput(params: dict) -> float:
    """Separable: each bottleneck's knobs act apart (what the walk relies on)."""
    value = 100 * WORKERS[params["num_workers"]] * ACCUM[params["grad_accum_steps"]] * BUCKET[params["bucket_cap_mb"]]
    return value * (0.9 if params.get("grad_compression", "none") != "none" else 1.0)


def run(s, sampler, trials: int, study=None, infeasible=()):
    study = study or optuna.create_study(direction="maximize", sampler=sampler)
    if not study.trials:
        study.add_trial(optuna.trial.create_trial(params=s.baseline_params, distributions=s.distributions,
                                                  value=throughput(s.baseline_params)))
    while len(study.trials) < trials:
        trial = study.ask()
        params = s.suggest(trial)
        if trial.number in infeasible:
            trial.set_user_attr("feasible", False)
        study.tell(trial, throughput(params) * (3.0 if trial.number in infeasible else 1.0))
    return study


def configs(s, study) -> list[str]:
    return [json.dumps(s.to_config({**s.baseline_params, **t.params}).changes(), sort_keys=True) for t in study.trials]


@pytest.fixture(autouse=True)
def quiet():
    optuna.logging.set_verbosity(optuna.logging.ERROR)


def test_the_walk_finds_the_best_of_a_separable_objective_without_running_a_configuration_twice():
    s = space()
    walk = 1 + sum(len(knob_values(k.distribution)) - 1 for k in s.knobs)  # baseline + each other value
    study = run(s, CoordinateSampler(s, optuna.samplers.RandomSampler(seed=0)), walk)
    best = max(throughput(p) for p in _grid(s))
    assert study.best_value == pytest.approx(best)
    done = configs(s, study)
    assert len(done) - len(set(done)) <= 1  # prefetch_factor without workers is the one repeat it cannot express
    # The first knob walked is the verdict's: the workers, around the baseline.
    assert [t.params["num_workers"] for t in study.trials[1:5]] == [1, 2, 3, 4]


def test_the_next_point_follows_from_the_trials_alone_so_a_resumed_study_goes_on_the_same_way():
    s = space()
    whole = run(s, CoordinateSampler(s, optuna.samplers.RandomSampler(seed=0)), 9)
    half = run(s, CoordinateSampler(s, optuna.samplers.RandomSampler(seed=0)), 5)
    resumed = run(s, CoordinateSampler(s, optuna.samplers.RandomSampler(seed=0)), 9, study=half)
    assert [t.params for t in resumed.trials] == [t.params for t in whole.trials]


def test_after_the_walk_the_base_sampler_proposes():
    s = space()
    sampler = CoordinateSampler(s, optuna.samplers.RandomSampler(seed=0))
    walk = 1 + sum(len(knob_values(k.distribution)) - 1 for k in s.knobs)
    study = run(s, sampler, walk + 1)
    assert sampler.next_point(study.trials[:walk + 1]) is None


def test_an_infeasible_trial_is_never_the_centre_of_the_walk():
    s = space()
    # Trial 2 (num_workers=2) "measures" 3x but broke the numerics guard: the walk must not centre on it.
    study = run(s, CoordinateSampler(s, optuna.samplers.RandomSampler(seed=0)), 8, infeasible={2})
    centre = [t for t in study.trials[5:8]]
    assert all(t.params["num_workers"] != 2 for t in centre), [t.params for t in centre]


def test_a_wide_integer_range_is_walked_over_a_few_spread_values():
    d = optuna.distributions.IntDistribution(0, 16)
    assert knob_values(d) == [0, 4, 8, 12, 16]
    assert knob_values(optuna.distributions.IntDistribution(0, 4)) == [0, 1, 2, 3, 4]


def _grid(s):
    import itertools

    names = [k.name for k in s.knobs]
    for combo in itertools.product(*(knob_values(k.distribution) for k in s.knobs)):
        yield dict(zip(names, combo))
