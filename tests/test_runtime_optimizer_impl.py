"""The optimizer's implementation knob (``optimizer_impl``): what the script's optimizer runs,
what it can run and why not, the switch by ``perfscope.accelerate`` and at launch, and that a
switched optimizer trains exactly as one built with the flag."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from perfscope import fused_ops
from perfscope.runtime.accelerator import accelerate, active_accelerator
from perfscope.runtime.config import ConfigError, config_from_dict
from perfscope.runtime.groups import GROUPS, OptimizerStepGroup
from perfscope.runtime.groups.optimizer_step import MANY_TENSORS
from perfscope.runtime.optimizer_impl import available, before_first_step, current, facts, switch, why_not
from perfscope.runtime.patching import patched
from perfscope.record.run_facts import run_facts
from runtimekit import clean_state, mlp  # noqa: F401 (autouse fixture)


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 3) -> None:
    g = torch.Generator().manual_seed(3)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()


@pytest.mark.parametrize("cls", [torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD])
def test_the_cpu_default_is_the_for_loop_and_every_implementation_is_available(cls):
    opt = cls(mlp().parameters(), lr=0.01)
    assert current(opt) == "for-loop"  # PyTorch picks foreach only where every parameter has its kernels
    assert available(opt) == ["for-loop", "foreach", "fused"]
    assert current(cls(mlp().parameters(), lr=0.01, foreach=True)) == "foreach"
    assert current(cls(mlp().parameters(), lr=0.01, fused=True)) == "fused"


@pytest.mark.parametrize("impl", ["foreach", "fused"])
@pytest.mark.parametrize("cls", [torch.optim.AdamW, torch.optim.SGD])
def test_a_switched_optimizer_trains_exactly_as_one_built_with_the_flag(cls, impl):
    kwargs = {"lr": 0.01, "weight_decay": 0.1, **({"momentum": 0.9} if cls is torch.optim.SGD else {})}
    built, switched = mlp(), mlp()
    reference = cls(built.parameters(), **kwargs, **{impl: True})
    opt = cls(switched.parameters(), **kwargs)
    done, why = switch(opt, impl)
    assert why is None and done.startswith(f"{cls.__name__}: {impl} step in place of for-loop (6 parameter tensors)")
    assert current(opt) == impl
    _train(built, reference)
    _train(switched, opt)
    for a, b in zip(built.parameters(), switched.parameters()):
        assert torch.equal(a, b)


def test_why_an_optimizer_cannot_switch():
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    _train(model, opt, steps=1)
    assert "already holds state" in why_not(opt, "fused")
    lamb = fused_ops.Lamb(mlp().parameters(), lr=0.01)
    assert why_not(lamb, "fused") == "Lamb has no 'fused' argument: its step has one implementation"
    differentiable = torch.optim.Adam(mlp().parameters(), lr=0.01, differentiable=True)
    assert why_not(differentiable, "fused").startswith("Adam refuses fused here: ")
    assert "not an optimizer implementation" in why_not(opt, "vectorised")
    assert available(differentiable)[0] == "for-loop" and "fused" not in available(differentiable)


def test_facts_name_the_class_the_implementation_and_the_tensors():
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(20)])
    seen = facts(torch.optim.SGD(model.parameters(), lr=0.1))
    assert seen == {"class": "SGD", "impl": "for-loop", "impls": ["for-loop", "foreach", "fused"],
                    "tensors": 40, "parameters": 20 * (16 + 4)}


def test_the_first_step_hook_sees_each_optimizer_once_and_goes_away():
    model = mlp()
    seen = []
    a, b = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1)
    with before_first_step(seen.append):
        _train(model, a, steps=2)
        _train(model, b, steps=1)
    _train(model, torch.optim.SGD(model.parameters(), lr=0.1), steps=1)
    assert seen == [a, b]


def test_accelerate_switches_the_scripts_optimizer_and_a_replaced_one_is_named():
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    _, wrapped, _ = accelerate(model, opt, config={"optimizer_impl": "fused"})
    assert current(opt) == "fused"  # the script's own object: its scheduler keeps driving it
    assert active_accelerator().applied["optimizer_impl"].startswith("AdamW: fused step in place of for-loop")
    model = mlp()
    accelerate(model, torch.optim.AdamW(model.parameters(), lr=0.01),
               config={"optimizer": "lamb", "optimizer_impl": "fused"})
    assert "replaced the script's optimizer" in active_accelerator().skipped["optimizer_impl"]
    model = mlp()
    accelerate(model, config={"optimizer_impl": "foreach"})
    assert active_accelerator().skipped["optimizer_impl"] == "no optimizer given to accelerate()"


def test_a_bad_value_is_refused_with_the_allowed_ones():
    with pytest.raises(ConfigError, match="config key 'optimizer_impl': got a string, allowed: for-loop, foreach, fused or null"):
        config_from_dict({"optimizer_impl": "vectorised"})


def test_launch_patching_switches_an_unmodified_loop_before_its_first_step():
    with patched({"optimizer_impl": "foreach"}) as report:
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        assert current(opt) == "for-loop"
        _train(model, opt, steps=2)
        assert current(opt) == "foreach"
        # a second optimizer that cannot switch does not hide that the first one did
        _train(model, fused_ops.Lamb(model.parameters(), lr=0.01), steps=1)
    assert report.applied["optimizer_impl"].startswith("SGD: foreach step in place of for-loop")
    assert "optimizer_impl" not in report.not_applied
    with patched({"optimizer_impl": "fused"}) as report:
        model = mlp()
        _train(model, fused_ops.Lamb(model.parameters(), lr=0.01), steps=1)
    assert "optimizer_impl" not in report.applied
    assert report.not_applied["optimizer_impl"] == "Lamb has no 'fused' argument: its step has one implementation"


def _facts(impl="for-loop", tensors=MANY_TENSORS, impls=("for-loop", "foreach", "fused")):
    return {"optimizer": {"class": "AdamW", "impl": impl, "impls": list(impls), "tensors": tensors}}


@pytest.mark.parametrize(("bottlenecks", "facts_", "expected"), [
    ({"launch"}, _facts(), "fused"),
    ({"compute"}, _facts(impls=("for-loop", "foreach")), "foreach"),
    ({"launch"}, _facts(tensors=MANY_TENSORS - 1), None),  # too few tensors to matter
    ({"io"}, _facts(), None),  # not what the verdict asks for
    ({"launch"}, _facts(impl="foreach"), None),  # already multi-tensor: left to the search
    ({"launch"}, {"optimizer": None}, None),
])
def test_the_guess_takes_the_fastest_implementation_for_many_tensors(bottlenecks, facts_, expected):
    put = {}
    OptimizerStepGroup().guess("launch-bound", frozenset(bottlenecks), run_facts(facts_), {}, 2, {}, put.__setitem__)
    assert put.get("optimizer_impl") == expected


def test_the_group_comes_after_the_optimizer_replacement():
    names = [g.name for g in GROUPS]
    assert names.index("optimizer-step") == names.index("fused") + 1
