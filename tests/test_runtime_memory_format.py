"""The channels-last knob (``channels_last``): which models it converts and why not, the same
training as a model converted by hand, by ``perfscope.accelerate`` before DDP and at launch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from perfscope.measure.facts import model_facts
from perfscope.runtime.accelerator import accelerate, active_accelerator
from perfscope.runtime.groups import LayoutGroup
from perfscope.runtime.memory_format import convert, is_channels_last, why_not
from perfscope.runtime.patching import patched
from perfscope.record.run_facts import run_facts
from runtimekit import clean_state, mlp  # noqa: F401 (autouse fixture)


def convnet() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))


def _train(model, optimizer, steps=3):
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        x = torch.randn(4, 3, 12, 12, generator=g)
        optimizer.zero_grad()
        out = model(x)
        nn.functional.cross_entropy(out, torch.tensor([0, 1, 0, 1])).backward()
        optimizer.step()


def test_a_converted_model_trains_as_one_converted_by_hand():
    by_hand, converted = convnet().to(memory_format=torch.channels_last), convnet()
    opt_a = torch.optim.SGD(by_hand.parameters(), lr=0.1, momentum=0.9)
    opt_b = torch.optim.SGD(converted.parameters(), lr=0.1, momentum=0.9)  # built before: same parameters
    done, why = convert(converted)
    assert why is None and done == ("channels-last weights in 2 convolution(s) of Sequential, "
                                    "4-D inputs converted on the way in")
    assert is_channels_last(converted) and not is_channels_last(convnet())
    seen = []
    converted[0].register_forward_pre_hook(lambda m, args: seen.append(args[0].is_contiguous()))
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        x = torch.randn(4, 3, 12, 12, generator=g)
        for model, opt, inp in ((by_hand, opt_a, x.contiguous(memory_format=torch.channels_last)), (converted, opt_b, x)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(inp), torch.tensor([0, 1, 0, 1])).backward()
            opt.step()
    assert seen == [False] * 3  # the inputs reached the first convolution channels-last
    for a, b in zip(by_hand.parameters(), converted.parameters()):
        torch.testing.assert_close(a, b)  # the same operations, the same layout
    assert convert(converted)[1] == "the model's convolutions are channels-last already"


def test_why_a_model_is_not_converted():
    assert why_not(mlp()) == "no 2-D convolution in the model (Sequential)"
    ddp = nn.parallel.DistributedDataParallel.__new__(nn.parallel.DistributedDataParallel)
    assert "already wrapped in DistributedDataParallel" in why_not(ddp)


def test_the_facts_count_convolutions_and_their_layout():
    facts = model_facts(convnet())
    assert facts["convolutions"] == 2 and facts["channels_last"] is False
    assert model_facts(convnet().to(memory_format=torch.channels_last))["channels_last"] is True
    assert model_facts(mlp())["convolutions"] == 0


def test_accelerate_converts_and_a_model_without_convolutions_is_named():
    model = convnet()
    accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), config={"channels_last": True})
    assert is_channels_last(model) and active_accelerator().applied["channels_last"].startswith("channels-last weights")
    model = mlp()
    accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), config={"channels_last": True})
    assert active_accelerator().skipped["channels_last"] == "no 2-D convolution in the model (Sequential)"


def test_launch_patching_converts_the_first_model_the_script_calls():
    with patched({"channels_last": True}) as report:
        model = convnet()
        _train(model, torch.optim.SGD(model.parameters(), lr=0.1), steps=1)
        assert is_channels_last(model)
    assert report.applied["channels_last"].startswith("channels-last weights in 2 convolution(s)")
    with patched({"channels_last": True}) as report:
        model = mlp()
        model(torch.randn(2, 8))
    assert report.not_applied["channels_last"] == "no 2-D convolution in the model (Sequential)"


@pytest.mark.parametrize(("model", "bottlenecks", "expected"), [
    ({"class": "ResNet", "convolutions": 53, "channels_last": False}, {"compute"}, True),
    ({"class": "ResNet", "convolutions": 53, "channels_last": True}, {"compute"}, None),
    ({"class": "ResNet", "convolutions": 53, "channels_last": False}, {"io"}, None),
    ({"class": "GPT", "convolutions": 0, "channels_last": False}, {"compute"}, None),
])
def test_the_guess_converts_a_compute_bound_convolutional_model(model, bottlenecks, expected):
    put = {}
    LayoutGroup().guess("compute-bound", frozenset(bottlenecks), run_facts({"model": model}), {}, 2, {}, put.__setitem__)
    assert put.get("channels_last") == expected


def test_a_script_wrapping_ddp_itself_is_told_to_use_accelerate():
    facts = {"model": {"class": "ResNet", "convolutions": 53, "channels_last": False},
             "ddp": {"bucket_cap_mb": 25.0}, "accelerate": {"called": False}}
    part = LayoutGroup().search(run_facts(facts), 2)
    assert not part.knobs and "perfscope.accelerate converts it before wrapping" in part.excluded["channels_last"]
