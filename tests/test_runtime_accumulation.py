"""The acceleration runtime on CPU, gradient accumulation and synchronisation: k micro-steps match
one step on a k-times batch, a scheduler takes the accelerated optimizer, and DDP in one gloo
process syncs only on the last micro-step (its knobs skipped without a process group)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from runtimekit import (
    clean_state,  # noqa: F401 (autouse fixture)
    data,
    mlp,
)
from torch import nn

import perfscope

# --- gradient accumulation ------------------------------------------------------------------------


def test_accumulation_matches_one_step_on_a_k_times_batch():
    k = 4
    x, y = data(n=32).tensors
    big = mlp()
    opt = torch.optim.SGD(big.parameters(), lr=0.1)
    nn.functional.mse_loss(big(x), y).backward()
    opt.step()

    model = mlp()
    model, opt, _ = perfscope.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                         config={"grad_accum_steps": k})
    start = [p.detach().clone() for p in model.parameters()]
    for i, (xs, ys) in enumerate(zip(x.chunk(k), y.chunk(k))):
        opt.zero_grad()  # ignored inside the window
        perfscope.backward(nn.functional.mse_loss(model(xs), ys))
        stepped = opt.step()
        if i < k - 1:
            assert stepped is None and all(torch.equal(a, b) for a, b in zip(start, model.parameters()))
    for a, b in zip(big.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    opt.zero_grad()  # the window is over: now it clears
    assert all(p.grad is None for p in model.parameters())


def test_scheduler_accepts_the_accelerated_optimizer():
    model = mlp()
    _, opt, _ = perfscope.accelerate(model, torch.optim.SGD(model.parameters(), lr=1.0),
                                     config={"grad_accum_steps": 2})
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.5 and opt.optimizer.param_groups[0]["lr"] == 0.5


# --- data parallel (one gloo process) -------------------------------------------------------------


@pytest.fixture
def gloo_group(tmp_path):
    import torch.distributed as dist

    pytest.importorskip("perfscope.runtime.parallel")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ddp_wrap_bucket_and_no_sync_on_micro_steps(gloo_group):
    from torch.nn.parallel import DistributedDataParallel

    from perfscope.runtime.parallel import bucket_cap_mb_of

    model = mlp()
    ddp, opt, _ = perfscope.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                       config={"bucket_cap_mb": 2, "grad_accum_steps": 3})
    assert isinstance(ddp, DistributedDataParallel) and bucket_cap_mb_of(ddp) == pytest.approx(2)
    synced = []
    next(ddp.parameters()).register_hook(lambda g: synced.append(ddp.require_backward_grad_sync) or g)
    x, y = data(n=12).tensors
    for xs, ys in zip(x.chunk(3), y.chunk(3)):
        perfscope.backward(nn.functional.mse_loss(ddp(xs), ys))
        opt.step()
    assert synced == [False, False, True]


def test_parallel_knobs_skipped_without_process_group():
    perfscope.accelerate(mlp(), config={"bucket_cap_mb": 50, "static_graph": True})
    assert set(perfscope.accelerator().skipped) == {"bucket_cap_mb", "static_graph"}
