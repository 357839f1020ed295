"""bf16 autocast applied at launch to an unmodified script (``perfscope/runtime/launch_amp.py``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from perfscope.runtime.launch_amp import launch_autocast  # noqa: E402
from perfscope.runtime.patching import patched  # noqa: E402


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
        self.seen: list[bool] = []

    def forward(self, x):
        self.seen.append(torch.is_autocast_enabled("cpu"))
        return self.inner(x)


class Boom(nn.Module):
    def forward(self, x):
        raise ValueError("bad batch")


def test_the_outermost_call_runs_under_bf16_autocast_and_nothing_leaks_after_it():
    net = Net()
    with launch_autocast() as hooks:
        out = net(torch.randn(2, 8))
        assert out.dtype == torch.bfloat16  # the matmuls ran in bf16
        assert not torch.is_autocast_enabled("cpu")  # left when the outermost call returned
        loss = nn.functional.cross_entropy(out.float(), torch.tensor([0, 1]))
        loss.backward()  # outside autocast, as PyTorch recommends
    assert net.seen == [True] and hooks.entered == 1
    assert net(torch.randn(2, 8)).dtype == torch.float32  # hooks removed


def test_a_forward_that_raises_leaves_autocast_off():
    with launch_autocast():
        with pytest.raises(ValueError):
            Boom()(torch.randn(1))
        assert not torch.is_autocast_enabled("cpu")
        assert Net()(torch.randn(1, 8)).dtype == torch.bfloat16  # the depth went back to 0


def test_the_scripts_own_autocast_is_left_alone():
    net = Net()
    with launch_autocast() as hooks, torch.autocast("cpu", dtype=torch.bfloat16):
        net(torch.randn(2, 8))
    assert hooks.entered == 0


def test_patched_applies_bf16_o1_at_launch_and_says_fp16_needs_accelerate():
    with patched({"amp_level": "O1"}) as report:
        assert Net()(torch.randn(2, 8)).dtype == torch.bfloat16
    assert "outermost nn.Module" in report.applied["amp_level"] and not report.needs_accelerate
    assert Net()(torch.randn(2, 8)).dtype == torch.float32
    with patched({"amp_level": "O1", "amp_dtype": "fp16"}) as report:
        assert Net()(torch.randn(2, 8)).dtype == torch.float32
    assert "amp_level" in report.needs_accelerate


def test_only_training_forwards_are_cast():
    net, frozen = Net(), Net().requires_grad_(False)
    with launch_autocast() as hooks:
        with torch.no_grad():  # evaluation, or data made with a fixed model
            assert net(torch.randn(2, 8)).dtype == torch.float32
        assert frozen(torch.randn(2, 8)).dtype == torch.float32  # nothing of it is trained
        assert nn.MSELoss()(torch.randn(3), torch.randn(3)).dtype == torch.float32  # no parameters
        assert net(torch.randn(2, 8)).dtype == torch.bfloat16
    assert hooks.entered == 1
