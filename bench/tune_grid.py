"""Helpers of bench/bench_tune.py: the probe run, the exhaustive grid and the simulated studies.

* :func:`probe` runs the script once as ``perfscope tune`` profiles its baseline and returns the
  facts, verdict and fractions the tuner shapes its space from.
* :func:`measure_grid` measures every configuration of the searched knobs with
  :func:`perfscope.tuner.trial.run_trial` (no profiled steps), a few repeats each, interleaved.
* :func:`simulate` replays many Optuna studies on that lookup table (no script runs): the guided
  search as ``perfscope tune`` does it, and random search with the same budget.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from perfscope.tuner.attrs import BaselineRun
from perfscope.tuner.space import SearchSpace, build_space, rule_based_guess
from perfscope.tuner.sampler import CoordinateSampler
from perfscope.tuner.study import DuplicateTrial, TuningStudy, trial_verdict
from perfscope.tuner.runner import TrialRunner
from perfscope.tuner.trial import TrialOutcome, TrialSpec, cleanup_traces, run_trial
from perfscope.tuner.tune import BASELINE_PROFILE_STEPS

TARGET_SHARE = 0.95  # "reached": a configuration worth at least this share of the grid's best


def probe(spec: TrialSpec, work: Path) -> dict:
    """The baseline as ``perfscope tune`` profiles it: ``{value, facts, verdict, fractions}``."""
    outcome = run_trial(spec, None, work, profile_steps=BASELINE_PROFILE_STEPS)
    loader = (outcome.facts.get("dataloader") or {}) if outcome.ok else {}
    if loader.get("num_workers"):  # as tuner.tune._set_up: drain the prefetch, whole worker rounds
        cleanup_traces(outcome)
        outcome = run_trial(spec, None, work, profile_steps=BASELINE_PROFILE_STEPS,
                            loader_workers=loader["num_workers"], prefetch_factor=loader.get("prefetch_factor"))
    if not outcome.ok:
        raise SystemExit(f"the baseline probe failed ({outcome.status}): {outcome.reason} (log: {work / 'output.log'})")
    verdict, fractions, _ = trial_verdict(outcome)
    cleanup_traces(outcome)
    return {"value": outcome.value, "facts": outcome.facts, "verdict": verdict or "unknown",
            "fractions": fractions or {}}


def loader_settings(facts: dict, config) -> dict:
    """``loader_workers``/``prefetch_factor`` for run_trial, from TuningStudy.loader_settings itself."""
    session = TuningStudy(None, None, Path("."))  # only .baseline is read
    session.baseline = BaselineRun(facts=facts)
    return session.loader_settings(config)


def make_space(base: dict, max_workers: int | None) -> SearchSpace:
    """The tuner's space for this baseline; ``max_workers`` lowers num_workers' upper bound."""
    space = build_space(base["facts"], base["fractions"], base["verdict"])
    names = [k.name for k in space.knobs]
    if names != ["num_workers", "prefetch_factor"]:
        raise SystemExit(f"the grid handles the io example's space (num_workers, prefetch_factor); the tuner built {names}")
    if max_workers is not None:
        nw, pf = space.knobs
        high = max(nw.baseline, min(nw.distribution.high, max_workers))
        space.knobs = [dataclasses.replace(nw, distribution=IntDistribution(nw.distribution.low, high)),
                       dataclasses.replace(pf, when=(nw.name, tuple(range(1, high + 1))))]
    return space


def key_of(space: SearchSpace, params: dict) -> str:
    """The table key of a parameter set: the configuration it runs with, e.g.
    ``num_workers=2,prefetch_factor=4`` (``baseline`` for no change; prefetch only with workers)."""
    changes = space.to_config(params).changes()
    return ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(changes.items())) or "baseline"


def knob_values(knob) -> list:
    """Every value a knob can take: a categorical's choices, an integer range's integers."""
    d = knob.distribution
    return list(d.choices) if hasattr(d, "choices") else list(range(d.low, d.high + 1, d.step))


def grid_params(space: SearchSpace) -> list[dict]:
    """Every distinct point of the space (a conditional knob keeps its baseline where its parent
    rules it out, so e.g. prefetch_factor varies only with workers), one per configuration."""
    names = [k.name for k in space.knobs]
    points: dict[str, dict] = {}
    for combo in itertools.product(*(knob_values(k) for k in space.knobs)):
        params = dict(zip(names, combo))
        for knob in space.knobs:
            if knob.when is not None and params[knob.when[0]] not in knob.when[1]:
                params[knob.name] = knob.baseline
        points.setdefault(key_of(space, params), params)
    return list(points.values())


def restrict(space: SearchSpace, choices: dict[str, list]) -> SearchSpace:
    """The space with only the knobs in ``choices``, each searched over those values (categorical;
    an integer knob keeps its range when given ``None``); the others stay at their baseline."""
    knobs = []
    for knob in space.knobs:
        if knob.name not in choices:
            continue
        values = choices[knob.name]
        if values is not None:
            values = sorted({*values, knob.baseline})
            knob = dataclasses.replace(knob, distribution=CategoricalDistribution(values))
        knobs.append(knob)
    dropped = [k.name for k in space.knobs if k.name not in choices]
    excluded = {**space.excluded, **{n: "fixed at its baseline by the benchmark" for n in dropped}}
    return SearchSpace(knobs=knobs, excluded=excluded, order=space.order, verdict=space.verdict, titles=space.titles)


def measure_grid(spec: TrialSpec, space: SearchSpace, facts: dict, repeats: int, work: Path, log=print,
                 table: dict | None = None) -> dict:
    """key -> {params, config, values: [samples/s per repeat], value: median}.

    Repeats run in rounds over the whole grid (the order reversed every other round), so slow
    drifts of a shared machine spread over all configurations instead of hitting a few. Given an
    earlier ``table`` of the same grid, only the rounds it lacks are measured.
    """
    points = grid_params(space)
    if table is None:
        table = {key_of(space, p): {"params": p, "config": space.to_config(p).changes(), "values": []} for p in points}
    done = min(len(e["values"]) for e in table.values())
    for r in range(done, repeats):
        for p in (points if r % 2 == 0 else points[::-1]):
            key = key_of(space, p)
            config = space.to_config(p)
            outcome = run_trial(spec, config, work / key, profile_steps=0, **loader_settings(facts, config))
            if not outcome.ok or outcome.value is None:
                raise SystemExit(f"grid point {key} failed ({outcome.status}): {outcome.reason}")
            table[key]["values"].append(outcome.value)
            log(f"  grid round {r + 1}/{repeats} {key}: {outcome.value:7.1f} samples/s ({outcome.duration_s:.1f} s)")
    for entry in table.values():
        entry["value"] = statistics.median(entry["values"])
    return table


def noise_sigma(table: dict) -> float:
    """Pooled standard deviation of log(repeat / its configuration's median) over the grid."""
    logs = [math.log(v / e["value"]) for e in table.values() for v in e["values"]]
    dof = sum(len(e["values"]) - 1 for e in table.values())
    return math.sqrt(sum(x * x for x in logs) / dof) if dof > 0 else 0.0


class _Replay(TrialRunner):
    """The trial runner of a simulated study: the trial's value comes from the grid table (times
    the noise), and the configurations measured are recorded."""

    def __init__(self, space: SearchSpace, table: dict, sigma: float, seed: int) -> None:
        self.space, self.table, self.sigma = space, table, sigma
        self.noise = random.Random(10_000 + seed)
        self.keys: list[str] = []  # table key of each trial run, baseline first

    def key(self, config) -> str:
        changes = config.changes() if config is not None else {}
        params = {**self.space.baseline_params, **{k: v for k, v in changes.items() if k in self.space.distributions}}
        return key_of(self.space, params)

    def observed(self, key: str) -> float:
        return self.table[key]["value"] * (math.exp(self.noise.gauss(0.0, self.sigma)) if self.sigma > 0 else 1.0)

    def run(self, spec, config, work_dir, **_ignored) -> TrialOutcome:
        key = self.key(config)
        self.keys.append(key)
        value = self.observed(key)
        return TrialOutcome(status="ok", step_samples=[16], step_seconds=[16.0 / value], step_values=[value])


def _sampler(kind: str, seed: int, space: SearchSpace | None = None):
    if kind.startswith("random"):
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid":  # the exhaustive grid, in a seeded random order
        return optuna.samplers.GridSampler({k.name: knob_values(k) for k in space.knobs}, seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=4, multivariate=True)  # as tuner.tune._open_study


def run_study(kind: str, seed: int, space: SearchSpace, facts: dict, table: dict, budget: int, sigma: float,
              fractions: dict | None = None) -> int:
    """Trials (baseline included) until a configuration worth >= 95% of the grid's best was run.

    kind: ``guided`` (as ``perfscope tune``: tuner.sampler.CoordinateSampler walking the knobs
    in the profile's order around the best trial, then the TPESampler of tuner.tune._open_study;
    the baseline as trial 0 and the rule-based guess, from ``fractions``, enqueued by
    TuningStudy.store_setup; trials by TuningStudy.objective, which skips configurations already
    measured), ``tpe-guess`` (the design before the walk: TPE with the guess), ``tpe-no-guess``
    (TPE alone), ``grid`` (Optuna's GridSampler, a seeded random order), ``random`` (RandomSampler through the same objective, no guess) or
    ``random-plain`` (RandomSampler asked directly: repeats allowed). The sampler sees table
    values times exp(N(0, sigma)) (sigma 0: none); reaching the target is judged on the table's
    medians. No pruning (the replay reports no intermediate values). Returns ``budget + 1``
    when the budget (complete trials, baseline included, as ``--trials``) ends first.
    """
    replay = _Replay(space, table, sigma, seed)
    sampler = _sampler(kind, seed, space)
    if kind == "guided":  # as tuner.tune._search
        sampler = CoordinateSampler(space, sampler)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    base_key = key_of(space, space.baseline_params)
    baseline = BaselineRun(value=replay.observed(base_key), facts=facts, verdict=space.verdict)
    replay.keys.append(base_key)
    if kind == "random-plain":
        study.add_trial(optuna.trial.create_trial(params=space.baseline_params, distributions=space.distributions,
                                                  value=baseline.value))
        while len(replay.keys) < budget:
            trial = study.ask()
            key = key_of(space, space.suggest(trial))
            replay.keys.append(key)
            study.tell(trial, replay.observed(key))
    else:
        session = TuningStudy(study, TrialSpec(script="replay", script_args=(), runner=replay), Path("."))
        guess = rule_based_guess(space, facts, fractions=fractions) if kind in ("guided", "tpe-guess") else None
        session.store_setup(space, baseline, guess)
        done = optuna.study.MaxTrialsCallback(budget, states=(TrialState.COMPLETE, TrialState.PRUNED))
        study.optimize(session.objective, callbacks=[done], catch=(DuplicateTrial,))
    target = TARGET_SHARE * max(e["value"] for e in table.values())
    return next((n for n, key in enumerate(replay.keys[:budget], 1) if table[key]["value"] >= target), budget + 1)


def simulate(space: SearchSpace, facts: dict, table: dict, *, kinds, seeds: int, budget: int, sigma: float,
             fractions: dict | None = None) -> dict:
    """kind -> {trials: [per seed], median, mean, reached (share within the budget)}."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    out = {}
    for kind in kinds:
        trials = [run_study(kind, s, space, facts, table, budget, sigma, fractions) for s in range(seeds)]
        out[kind] = {"trials": trials, "median": statistics.median(trials), "mean": statistics.fmean(trials),
                     "reached": sum(t <= budget for t in trials) / len(trials)}
    return out
