"""The knob-group contract (perfscope/runtime/groups/base.py), run against every group.

Each group is checked on a set of runs that differ in what the tuner can see (a CPU script with or
without a DataLoader, an IterableDataset, a GPU script calling perfscope.accelerate on two nodes, a
GPU without bf16 on one node): every key is searched or left out with a reason, a knob's baseline
is the script's own value and a point of its distribution, and every other value a knob can take
is applied (or named as skipped) by perfscope.accelerate and at launch.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from optuna.distributions import CategoricalDistribution, IntDistribution
from torch.utils.data import DataLoader

from perfscope.analysis.verdict import CLASSES, VERDICTS
from perfscope.runtime.accelerator import accelerate, active_accelerator
from perfscope.runtime.config import KEYS, config_from_dict
from perfscope.runtime.groups import GROUPS, InputGroup, SearchPart, owner
from perfscope.runtime.patching import plan
from runtimekit import clean_state, data, mlp  # noqa: F401 (clean_state: autouse fixture)
from perfscope.tuner.space import SearchSpace, build_space, rule_based_guess

LOADER = {"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "iterable": False}
RUNS = {
    "cpu-no-loader": {"cuda": False, "cpu_count": 2, "world_size": 1, "dataloader": None,
                      "accelerate": {"called": False}, "ddp": None, "threads": {"intra_op_threads": 2}},
    "cpu-loader": {"cuda": False, "cpu_count": 4, "world_size": 1, "dataloader": LOADER,
                   "accelerate": {"called": False}, "ddp": None, "threads": {"intra_op_threads": 4}},
    "cpu-iterable-accelerate": {"cuda": False, "cpu_count": 1, "world_size": 1,
                                "dataloader": dict(LOADER, iterable=True),
                                "accelerate": {"called": True, "optimizer": True, "loader": True}, "ddp": None,
                                "threads": {"intra_op_threads": 1}},
    "a100-two-nodes-accelerate": {"cuda": True, "cuda_capability": [8, 0], "bf16_supported": True, "cpu_count": 16,
                                  "world_size": 4, "local_world_size": 2, "tf32": False, "cudnn_benchmark": False,
                                  "dataloader": dict(LOADER, num_workers=2, prefetch_factor=3, pin_memory=True),
                                  "accelerate": {"called": True, "optimizer": True, "loader": True,
                                                 "optimizer_class": "SGD"},
                                  "ddp": {"bucket_cap_mb": 40.0, "static_graph": True},
                                  "threads": {"intra_op_threads": 8}},
    "v100-one-node": {"cuda": True, "cuda_capability": [7, 0], "bf16_supported": False, "cpu_count": 8,
                      "world_size": 2, "local_world_size": 2, "tf32": False, "cudnn_benchmark": True,
                      "dataloader": LOADER, "accelerate": {"called": False},
                      "ddp": {"bucket_cap_mb": None, "static_graph": False}, "threads": {}},
    "cpu-swin-adamw-accelerate": {"cuda": False, "cpu_count": 2, "world_size": 1, "dataloader": LOADER,
                                  "accelerate": {"called": True, "optimizer": True, "loader": True,
                                                 "optimizer_class": "AdamW"},
                                  "model": {"class": "Swin", "fusable": ["blocks.0.attn", "blocks.1.attn"],
                                            "not_fusable": {}},
                                  "ddp": None, "threads": {"intra_op_threads": 2}},
}
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
    assert group.name and group.title and group.keys
    assert len(set(group.keys)) == len(group.keys)
    assert [g.name for g in GROUPS].count(group.name) == 1


@pytest.mark.parametrize(("group", "run"), cases, ids=case_ids)
def test_search_puts_every_key_among_the_knobs_or_the_exclusions_with_a_reason(group, run):
    part = group.search_part(RUNS[run], int(RUNS[run]["cpu_count"]))
    searched = [k.name for k in part.knobs]
    plainly_excluded = {k for k in part.excluded if "=" not in k}
    assert len(searched) == len(set(searched))
    assert set(searched) | {k.split("=")[0] for k in part.excluded} <= set(group.keys)
    assert set(searched) | plainly_excluded == set(group.keys), "a key neither searched nor left out"
    assert not set(searched) & plainly_excluded, "a key both searched and left out"
    for key, why in part.excluded.items():
        assert isinstance(why, str) and len(why) > 5, key
        if "=" in key:  # one value of a searched knob left out
            name, value = key.split("=")
            assert name in searched and value not in map(str, _choices(part, name))
    for knob in part.knobs:
        assert knob.group == group.name
        assert knob.serves and set(knob.serves) <= set(CLASSES)
        if knob.when is not None:  # the parent: a knob of this group, or a key of another one
            parent = next((k for k in part.knobs if k.name == knob.when[0]), None)
            if parent is None:
                assert owner(knob.when[0]).name != group.name, knob.name
            else:
                d = parent.distribution
                assert all(d._contains(d.to_internal_repr(v)) for v in knob.when[1])


@pytest.mark.parametrize(("group", "run"), cases, ids=case_ids)
def test_a_knobs_baseline_is_the_scripts_own_value_and_a_point_of_its_distribution(group, run):
    facts = RUNS[run]
    part = group.search_part(facts, int(facts["cpu_count"]))
    seen = group.observed(facts)
    assert set(seen) <= set(group.keys)
    for knob in part.knobs:
        d = knob.distribution
        assert d._contains(d.to_internal_repr(knob.baseline)), (knob.name, knob.baseline)
        assert knob.name in seen and seen[knob.name] == knob.baseline, knob.name


@pytest.mark.parametrize(("group", "run"), cases, ids=case_ids)
def test_every_other_value_is_applied_or_named_by_accelerate_and_at_launch(group, run):
    facts = RUNS[run]
    part = group.search_part(facts, int(facts["cpu_count"]))
    threads = torch.get_num_threads()
    try:
        for knob in part.knobs:
            for value in _choices(part, knob.name):
                if value == knob.baseline:
                    continue
                params = {knob.name: value}
                if knob.when is not None:
                    params[knob.when[0]] = knob.when[1][0]
                config = config_from_dict(params)
                report = plan(config, groups=(group,))
                assert knob.name in {**report.applied, **report.needs_accelerate}, (knob.name, value)
                if knob.name in report.applied:  # what the plan says it patches, a patch must do
                    assert group.launch_patches(config, report), (knob.name, value)
                model = mlp()
                loader = DataLoader(data(16), batch_size=4)
                accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, config=config)
                acc = active_accelerator()
                assert knob.name in {**acc.applied, **acc.skipped}, (knob.name, value, acc.summary())
    finally:
        torch.set_num_threads(threads)


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
        d = space.distributions[name]
        assert d._contains(d.to_internal_repr(value)), (name, value)
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


def _choices(part: SearchPart, name: str) -> list:
    d = next(k for k in part.knobs if k.name == name).distribution
    if isinstance(d, CategoricalDistribution):
        return list(d.choices)
    assert isinstance(d, IntDistribution)
    return sorted({d.low, (d.low + d.high) // 2, d.high})
