"""The knob-group contract (perfscope/testing/knob_groups.py), run against every group on every
sample run, and the space the groups make together: every key owned once, the guess inside the
space, groups passed as instances, a stored space of the old format read back.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from perfscope.analysis.verdict import CLASSES, VERDICTS
from perfscope.runtime.config import KEYS
from perfscope.runtime.groups import GROUPS, InputGroup, owner
from perfscope.runtime.groups.base import within
from perfscope.testing import ContractError
from perfscope.testing.knob_groups import SAMPLE_RUNS as RUNS
from perfscope.testing.knob_groups import check_applied, check_baseline, check_names, check_search
from runtimekit import clean_state  # noqa: F401 (autouse fixture)
from perfscope.tuner.space import SearchSpace, build_space, rule_based_guess

FRACTIONS = {"io": 0.3, "comm": 0.2, "launch": 0.2, "compute": 0.3}  # every bottleneck searched

group_ids = [g.name for g in GROUPS]
cases = list(itertools.product(GROUPS, RUNS))
case_ids = [f"{g.name}-{run}" for g, run in cases]


def test_every_configuration_key_is_owned_by_exactly_one_group():
    owned = [k for g in GROUPS for k in g.keys]
    assert sorted(owned) == sorted(KEYS), "a key with no group, or with two"
    assert all(owner(k).name == next(g.name for g in GROUPS if k in g.keys) for k in KEYS)
    with pytest.raises(KeyError):
        owner("no_such_key")


@pytest.mark.parametrize("group", GROUPS, ids=group_ids)
def test_a_group_names_itself_and_its_keys(group):
    check_names(group, GROUPS)


@pytest.mark.parametrize(("group", "run"), cases, ids=case_ids)
def test_search_puts_every_key_among_the_knobs_or_the_exclusions_with_a_reason(group, run):
    check_search(group, RUNS[run], CLASSES)


@pytest.mark.parametrize(("group", "run"), cases, ids=case_ids)
def test_a_knobs_baseline_is_the_scripts_own_value_and_a_point_of_its_distribution(group, run):
    check_baseline(group, RUNS[run])


@pytest.mark.parametrize(("group", "run"), cases, ids=case_ids)
def test_every_other_value_is_applied_or_named_by_accelerate_and_at_launch(group, run):
    check_applied(group, RUNS[run])


def test_the_suite_catches_a_group_that_breaks_the_contract():
    class Forgetful(InputGroup):  # searches nothing and gives no reason
        def search(self, facts, cpu):
            part = super().search(facts, cpu)
            part.knobs, part.excluded = [], {}
            return part

    with pytest.raises(ContractError, match="neither searched nor left out"):
        check_search(Forgetful(), RUNS["cpu-loader"], CLASSES)

    class Presumptuous(InputGroup):  # starts from a value of its own, not the script's
        def search(self, facts, cpu):
            part = super().search(facts, cpu)
            part.knobs = [dataclasses.replace(k, baseline=2) if k.name == "num_workers" else k for k in part.knobs]
            return part

    with pytest.raises(ContractError, match="num_workers: baseline is not the script's"):
        check_baseline(Presumptuous(), RUNS["cpu-loader"])


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("verdict", VERDICTS.values())
def test_the_guess_stays_within_the_space_and_is_a_valid_configuration(verdict, run):
    facts = RUNS[run]
    space = build_space(facts, FRACTIONS, verdict)
    guess = rule_based_guess(space, facts, fractions=FRACTIONS)
    if guess is None:
        return
    assert set(guess) == set(space.baseline_params)
    for name, value in guess.items():
        assert within(space.distributions[name], value), (name, value)
    space.to_config(guess)  # raises ConfigError for an impossible combination


def test_groups_are_passed_as_instances():
    class NoWorkers(InputGroup):
        def search(self, facts, cpu):
            part = super().search(facts, cpu)
            part.knobs = [k for k in part.knobs if k.name not in ("num_workers", "prefetch_factor")]
            part.exclude(("num_workers", "prefetch_factor"), "this site forbids worker processes")
            return part

    facts = RUNS["cpu-loader"]
    groups = tuple(NoWorkers() if g.name == "input" else g for g in GROUPS)
    space = build_space(facts, {"io": 0.9}, "io-bound", groups=groups)
    assert "num_workers" not in [k.name for k in space.knobs]
    assert space.excluded["num_workers"] == "this site forbids worker processes"
    only_input = build_space(facts, FRACTIONS, "io-bound", groups=(InputGroup(),))
    assert {k.group for k in only_input.knobs} == {"input"} and set(only_input.titles) == {"input"}


def test_a_stored_space_of_the_old_format_reads_back():
    # Spaces stored in a study before the groups named bottlenecks "input", "precision" ...
    space = build_space(RUNS["cpu-loader"], {"io": 0.9, "compute": 0.1}, "io-bound")
    import json

    # the old format had the input and precision groups of this run only
    space = dataclasses.replace(space, knobs=[k for k in space.knobs if k.group in ("input", "precision")])
    stored = json.loads(space.to_json())
    for knob in stored["knobs"]:
        knob["groups"] = ["input" if "io" in knob.pop("serves") else "precision"]
        knob.pop("group")
    stored["order"] = ["input", "precision", "communication", "launch"]
    back = SearchSpace.from_json(json.dumps(stored))
    # the old format named the group only: the input group's knobs (intra_op_threads, which now also
    # serves compute on a CPU, included) read back as serving io
    assert [k.serves for k in back.knobs] == [("io",) if "io" in k.serves else k.serves for k in space.knobs]
    assert back.order == ["io", "compute", "comm", "launch"]
    assert dataclasses.replace(back.knobs[0], group="input") == space.knobs[0]


def test_the_advice_names_only_keys_that_serve_its_class():
    # perfscope.classes.KNOBS (what an answer's advice item lists) against the groups' searches:
    # each listed key is searched for that class on at least one sample run, in either mode.
    from perfscope.classes import KNOBS

    serves: dict[str, set[str]] = {}
    for group, run in itertools.product(GROUPS, RUNS.values()):
        for knob in group.search_part(run, run.get("cpu_count") or 2).knobs:
            serves.setdefault(knob.name, set()).update(knob.serves)
    for (cls, mode), keys in KNOBS.items():
        for key in keys:
            assert key in KEYS, f"{cls}/{mode}: {key} is not a configuration key"
            assert cls in serves.get(key, set()), f"{cls}/{mode}: {key} serves {sorted(serves.get(key, ()))}"


def test_within_tells_the_points_of_each_kind_of_distribution():
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    assert within(CategoricalDistribution([None, "bf16"]), None) and not within(CategoricalDistribution(["a"]), "b")
    stepped = IntDistribution(0, 8, step=2)
    assert [v for v in range(-1, 10) if within(stepped, v)] == [0, 2, 4, 6, 8]
    assert not within(stepped, "4") and not within(stepped, True)
    assert within(FloatDistribution(0.0, 1.0), 0.5) and not within(FloatDistribution(0.0, 1.0), 1.5)
    assert within(FloatDistribution(0.0, 1.0, step=0.25), 0.75) and not within(FloatDistribution(0.0, 1.0, step=0.25), 0.3)
