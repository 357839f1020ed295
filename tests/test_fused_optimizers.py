"""fused_ops.Lamb and fused_ops.Lars against per-parameter references written from the papers'
algorithms (one tensor at a time, plain tensor arithmetic), step by step, and their state_dict
round trip."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from perfscope.fused_ops import Lamb, Lars, optimizers
from perfscope.fused_ops.optimizer_reference import reference_lamb, reference_lars


@pytest.fixture(params=[None, 7], ids=["whole", "pieces of 7"])
def pieces(request, monkeypatch):
    """The CPU step over its default groups (whole tensors at these sizes), and over groups of at
    most 7 values: tensors cut into flat pieces, pieces of one tensor in two groups, small tensors
    sharing a group."""
    if request.param is not None:
        monkeypatch.setattr(optimizers, "CPU_GROUP_VALUES", request.param)
    return request.param


def model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 3), nn.Linear(3, 2, bias=False))
    with torch.no_grad():
        m[0].bias.zero_()  # a zero tensor with a gradient: its first trust ratio is 1 by definition
    return m


def grads(m: nn.Module, step: int, skip_last: bool = False) -> None:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(8, 6, generator=g)
    m.zero_grad(set_to_none=True)
    m(x).pow(2).sum().backward()
    if skip_last:  # a tensor without a gradient this step: it must not move, nor count a step
        m[3].bias.grad = None


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_lamb_matches_the_per_parameter_algorithm_step_by_step(wd, pieces):
    fused, ref = model(), model()
    opt = Lamb(fused.parameters(), lr=0.01, weight_decay=wd)
    state: dict = {}
    start = [p.detach().clone() for p in fused.parameters()]
    for step in range(6):
        grads(fused, step, skip_last=step == 2)
        grads(ref, step, skip_last=step == 2)
        opt.step()
        with torch.no_grad():
            reference_lamb(list(ref.parameters()), state, 0.01, (0.9, 0.999), 1e-6, wd)
        for a, b in zip(fused.parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert opt.state[fused[3].bias]["step"] == 5  # skipped once
    assert all(not torch.equal(a, b) for a, b in zip(start, fused.parameters()))  # every tensor moved


@pytest.mark.parametrize(("momentum", "wd"), [(0.9, 0.0), (0.9, 5e-4), (0.0, 1e-4)])
def test_lars_matches_the_per_parameter_algorithm_step_by_step(momentum, wd, pieces):
    fused, ref = model(), model()
    opt = Lars(fused.parameters(), lr=0.5, momentum=momentum, weight_decay=wd)
    state: dict = {}
    start = [p.detach().clone() for p in fused.parameters()]
    for step in range(6):
        grads(fused, step, skip_last=step == 3)
        grads(ref, step, skip_last=step == 3)
        opt.step()
        with torch.no_grad():
            reference_lars(list(ref.parameters()), state, 0.5, momentum, wd, 0.001, 1e-8)
        for a, b in zip(fused.parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert all(not torch.equal(a, b) for a, b in zip(start, fused.parameters()))


@pytest.mark.parametrize("make", [lambda p: Lamb(p, lr=0.01, weight_decay=0.01),
                                  lambda p: Lars(p, lr=0.5, weight_decay=1e-4)], ids=["lamb", "lars"])
def test_state_dict_round_trip_continues_the_same_trajectory(make, pieces):
    a = model()
    opt_a = make(a.parameters())
    for step in range(3):
        grads(a, step)
        opt_a.step()
    b = copy.deepcopy(a)
    opt_b = make(b.parameters())
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    for step in range(3, 6):
        for m, o in ((a, opt_a), (b, opt_b)):
            grads(m, step)
            o.step()
    for x, y in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_bad_hyper_parameters_and_sparse_gradients_are_named():
    params = list(model().parameters())
    for bad, name in ((lambda: Lamb(params, lr=0), "lr"), (lambda: Lamb(params, lr=1, betas=(0.9, 1.0)), "betas"),
                      (lambda: Lars(params, lr=1, momentum=1.0), "momentum"),
                      (lambda: Lars(params, lr=1, trust_coefficient=0), "trust_coefficient")):
        with pytest.raises(ValueError, match=name):
            bad()
    emb = nn.Embedding(10, 4, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(ValueError, match="sparse"):
        Lamb(emb.parameters(), lr=0.1).step()


def test_bf16_parameters_step_in_their_own_dtype():
    m = model().to(torch.bfloat16)
    opt = Lamb(m.parameters(), lr=0.01)
    x = torch.randn(4, 6, dtype=torch.bfloat16)
    m(x).float().pow(2).sum().backward()
    before = [p.detach().clone() for p in m.parameters()]
    opt.step()
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, m.parameters()))


def test_pieces_cover_every_value_once_within_the_limit():
    shapes = [(5, 3), (2,), (40,), (1,), (9, 9)]
    tensors = [torch.zeros(s) for s in shapes]
    groups = optimizers._pieces([tensors], 16)
    assert all(sum(tensors[i].numel() if p is None else p.stop - p.start for i, p in g) <= 16 for g in groups)
    for g in groups:
        for view in optimizers._views(tensors, g):
            view.add_(1)
    assert all(bool((t == 1).all()) for t in tensors)  # every value in exactly one piece
    channels_last = torch.zeros(2, 3, 4, 4).to(memory_format=torch.channels_last)
    (whole,) = optimizers._pieces([[channels_last]], 8)
    assert whole == [(0, None)]  # not contiguous: taken whole, never cut
    assert optimizers._pieces([tensors], None) == [[(i, None) for i in range(len(tensors))]]
