"""The batch-size knob (``batch_size``, ``lr_scaling``): the learning-rate rule worked by hand,
the loader rebuilt or patched at launch with the same sample order, what memory allows, and the
numerics guard's comparison at the same number of samples seen."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from perfscope.runtime.accelerator import accelerate, active_accelerator
from perfscope.runtime.batch import WARMUP_STEPS, ScaledLr, lr_factor
from perfscope.runtime.config import ConfigError, config_from_dict
from perfscope.runtime.groups import BatchGroup
from perfscope.runtime.groups.batch import allowed_factors
from perfscope.runtime.patching import patched
from perfscope.tuner.numerics import at_same_samples
from perfscope.record.run_facts import MemoryFacts, run_facts
from runtimekit import clean_state, data, mlp  # noqa: F401 (autouse fixture)

GIB = 1 << 30


def test_the_learning_rate_rules_by_hand():
    assert lr_factor("linear", 2, 0) == pytest.approx(1 + 1 / WARMUP_STEPS)  # one step into the warm-up
    assert lr_factor("linear", 4, WARMUP_STEPS // 2 - 1) == pytest.approx(2.5)  # half way from 1x to 4x
    assert lr_factor("linear", 4, 10 * WARMUP_STEPS) == 4.0
    assert lr_factor("sqrt", 4, 0) == 2.0 and lr_factor("none", 4, 0) == 1.0


def test_the_factor_rides_on_the_scripts_scheduler_and_leaves_its_rate_alone():
    model = torch.nn.Linear(2, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    ScaledLr("sqrt", 4.0).attach(opt)  # x2 on every step
    for expected_lr in (0.1, 0.05):
        before = model.weight.detach().clone()
        model.weight.grad = torch.ones_like(model.weight)
        opt.step()
        assert torch.allclose(model.weight, before - 2 * expected_lr)  # the step used lr x 2
        assert opt.param_groups[0]["lr"] == expected_lr  # and the script's rate is back
        sched.step()


def test_accelerate_rebuilds_the_loader_with_the_same_order_and_scales_the_rate():
    model = mlp()
    loader = DataLoader(data(32), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _, _, bigger = accelerate(model, opt, loader, config={"batch_size": 8})
    acc = active_accelerator()
    assert acc.applied["batch_size"] == "DataLoader rebuilt with batch_size=8 (was 4)"
    assert acc.applied["lr_scaling"] == f"learning rate x2 (linear rule, warmed up over the first {WARMUP_STEPS} steps)"
    first_big = next(iter(bigger))[0]  # the rebuilt loader keeps the script's sampler and generator
    small = iter(DataLoader(data(32), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3)))
    assert torch.equal(first_big, torch.cat([next(small)[0], next(small)[0]]))  # the same samples, in order


def test_without_an_optimizer_or_a_loader_batch_size_what_is_skipped_is_named():
    model = mlp()
    accelerate(model, None, DataLoader(data(8), batch_size=4), config={"batch_size": 8})
    assert "no optimizer given" in active_accelerator().skipped["lr_scaling"]
    model = mlp()
    sampler = torch.utils.data.BatchSampler(range(8), batch_size=2, drop_last=False)
    accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data(8), batch_sampler=sampler),
               config={"batch_size": 8})
    assert "no batch_size to change" in active_accelerator().skipped["batch_size"]


def test_launch_patching_changes_the_loader_and_every_step_takes_the_factor():
    with patched({"batch_size": 8, "lr_scaling": "sqrt"}) as report:
        loader = DataLoader(data(32), batch_size=2)
        model = torch.nn.Linear(8, 1, bias=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, _ = next(iter(loader))
        before = model.weight.detach().clone()
        model.weight.grad = torch.ones_like(model.weight)
        opt.step()
    assert x.shape[0] == 8
    assert torch.allclose(model.weight, before - 0.1 * 2.0)  # sqrt(8 / 2) = 2
    assert report.applied["batch_size"] == "DataLoader batch_size=8 (was 2)"
    assert report.applied["lr_scaling"] == "learning rate x2 (square-root rule)"
    with patched({"batch_size": 8}) as report:
        DataLoader(data(8), batch_sampler=torch.utils.data.BatchSampler(range(8), 2, False))
    assert "batch_size" not in report.applied and "no batch_size to change" in report.not_applied["batch_size"]


def test_memory_decides_how_far_the_batch_may_grow():
    assert allowed_factors(MemoryFacts(peak_bytes=GIB, capacity_bytes=16 * GIB)) == ([2, 4], None)
    # 5 GiB x 2 = 10 fits in 85% of 16 GiB (13.6), x 4 = 20 does not
    ok, why = allowed_factors(MemoryFacts(peak_bytes=5 * GIB, capacity_bytes=16 * GIB))
    assert ok == [2] and "leaves room for x2 within 85% of the capacity" in why
    assert allowed_factors(MemoryFacts(peak_bytes=10 * GIB, capacity_bytes=16 * GIB))[0] == []
    assert "not measured" in allowed_factors(None)[1]


def test_the_search_offers_the_script_batch_and_its_multiples():
    facts = {"dataloader": {"batch_size": 32}, "memory": {"peak_bytes": 5 * GIB, "capacity_bytes": 16 * GIB}}
    part = BatchGroup().search(run_facts(facts), 2)
    assert part.knobs[0].distribution.choices == (32, 64) and part.knobs[0].baseline == 32
    assert "batch_size=128" in part.excluded and "lr_scaling" in part.excluded
    assert "cannot be found" in BatchGroup().search(run_facts({"dataloader": None}), 2).excluded["batch_size"]


def test_a_larger_batch_is_compared_at_the_same_samples_seen():
    baseline = [float(i) for i in range(20)]
    trial = [100.0 + i for i in range(8)]
    # batch x2: the trial's step i has seen what the baseline's step 2(i+1)-1 saw
    b, t = at_same_samples(baseline, trial, 3, 6, 2.0)
    assert b == [7.0, 9.0, 11.0] and t == [103.0, 104.0, 105.0]
    b, t = at_same_samples(baseline, trial, 3, 8, 4.0)  # steps past the baseline's end are left out
    assert b == [15.0, 19.0] and t == [103.0, 104.0]
    assert at_same_samples(baseline, trial, 3, 6, 1.0) == (baseline[3:6], trial[3:6])


@pytest.mark.parametrize("bad", [{"batch_size": 0}, {"batch_size": 2.0}, {"lr_scaling": "cubic"}])
def test_bad_values_are_refused(bad):
    with pytest.raises(ConfigError):
        config_from_dict(bad)
