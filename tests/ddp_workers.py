"""Multi-process workers for tests/test_runtime_parallel.py (gloo, CPU).

Each worker joins a gloo group, runs every scenario on the same process group (one spawn of
four processes is much cheaper than one per test), and saves its observations to
``<out_dir>/rank<r>.pt``; the tests assert on them. Collective calls happen in the same order on
every rank, so a scenario may only branch on values that agree across ranks.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from perfscope.runtime.hierarchical import HierarchicalAllReduce
from perfscope.runtime.parallel import bucket_cap_mb_of, sync_context, wrap_ddp

STEPS = 20
LR = 0.1
TINY_BUCKET_MB = 1e-4  # ~26 floats: every parameter gets its own bucket, some of odd size


def make_model() -> torch.nn.Module:
    """The same small MLP on every rank: 671 parameters, an odd count, so the hierarchical
    hook pads its first (single) bucket; after DDP rebuilds buckets, tiny caps give odd ones too."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 37), torch.nn.Tanh(), torch.nn.Linear(37, 5))


def batches(rank: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` batches of 8 samples, different on every rank so the average is non-trivial.

    Targets are a fixed linear map of the inputs plus noise, so training lowers the loss.
    """
    teacher = torch.randn(12, 5, generator=torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(1000 + rank)
    out = []
    for _ in range(count):
        x = torch.randn(8, 12, generator=gen)
        out.append((x, x @ teacher + 0.1 * torch.randn(8, 5, generator=gen)))
    return out


def loss_of(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def gathered(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every rank's copy of ``tensors``, stacked along a new first dimension (world, ...)."""
    out = []
    for t in tensors:
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, t.contiguous())
        out.append(torch.stack(parts))
    return out


def train(model: torch.nn.Module, data: list) -> tuple[list[torch.Tensor], list[float]]:
    """SGD over ``data``: the gradients after the first backward and the loss of every step."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    first, losses = None, []
    for batch in data:
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, batch)
        loss.backward()
        first = first if first is not None else grads(model)
        losses.append(loss.item())
        opt.step()
    return first, losses


def expected_first_grads(rank: int) -> list[torch.Tensor]:
    """The world average of the local gradients, computed without DDP (independent reference)."""
    model = make_model()
    loss_of(model, batches(rank, 1)[0]).backward()
    return [g.mean(0) for g in gathered(grads(model))]


def comm_hook_name(ddp: DistributedDataParallel) -> str | None:
    return ddp._get_ddp_logging_data().get("comm_hook")


def scenario_allreduce(rank: int) -> dict:
    """Flat DDP vs the hierarchical hook (and compression), one backward and 20 SGD steps."""
    data = batches(rank, STEPS)
    res = {"expected": expected_first_grads(rank)}
    runs = {
        "flat": lambda: DistributedDataParallel(make_model()),
        "hier": lambda: wrap_ddp(make_model(), bucket_cap_mb=TINY_BUCKET_MB, static_graph=False,
                                 hierarchical_allreduce=True),  # local world size from the env
        "hier_one_bucket": lambda: wrap_ddp(make_model(), bucket_cap_mb=25, static_graph=True,
                                            hierarchical_allreduce=True, local_world_size=2),
        "hier_one_node": lambda: wrap_ddp(make_model(), bucket_cap_mb=25, static_graph=False,
                                          hierarchical_allreduce=True, local_world_size=4),
        "hier_rank_per_node": lambda: wrap_ddp(make_model(), bucket_cap_mb=25, static_graph=False,
                                               hierarchical_allreduce=True, local_world_size=1),
    }
    for comp in ("fp16", "bf16"):
        runs[comp] = lambda c=comp: wrap_ddp(make_model(), bucket_cap_mb=25, static_graph=False, grad_compression=c)
        runs[f"hier_{comp}"] = lambda c=comp: wrap_ddp(
            make_model(), bucket_cap_mb=TINY_BUCKET_MB, static_graph=False, grad_compression=c,
            hierarchical_allreduce=True)
    for name, build in runs.items():
        ddp = build()
        res[f"hook_{name}"] = comm_hook_name(ddp)
        res[f"grads_{name}"], res[f"losses_{name}"] = train(ddp, data)
    return res


def scenario_flags() -> dict:
    """The DDP knobs as the reducer and the module report them, for two opposite settings."""
    res = {}
    for name, kw in {
        "a": {"bucket_cap_mb": 0.25, "static_graph": True, "gradient_as_bucket_view": True},
        "b": {"bucket_cap_mb": 3, "static_graph": False, "gradient_as_bucket_view": False},
    }.items():
        ddp = wrap_ddp(make_model(), **kw)
        loss_of(ddp, batches(0, 1)[0]).backward()  # the flags must survive a real iteration
        log = ddp._get_ddp_logging_data()
        res[name] = {
            "bucket_cap_mb": bucket_cap_mb_of(ddp),
            "static_graph": ddp.static_graph,
            "log_static_graph": bool(log.get("static_graph")),
            "gradient_as_bucket_view": ddp.gradient_as_bucket_view,
            "log_gradient_as_bucket_view": bool(log.get("gradient_as_bucket_view")),
        }
    return res


def scenario_sync(rank: int, accum: int = 3, windows: int = 2) -> dict:
    """Accumulation: hook calls per micro-step, and whether gradients agree across ranks."""
    data = batches(rank, accum * windows)
    # (1) A counting hook on a plain DDP: calls happen only on the last micro-step of a window.
    calls = {"n": 0}

    def counting_hook(state, bucket):  # unannotated: string annotations would be refused
        state["n"] += 1
        return allreduce_hook(None, bucket)

    ddp = DistributedDataParallel(make_model(), bucket_cap_mb=TINY_BUCKET_MB)
    ddp.register_comm_hook(calls, counting_hook)
    counts = []
    for step, batch in enumerate(data):
        with sync_context(ddp, step, accum):
            loss_of(ddp, batch).backward()
        counts.append(calls["n"])
    # (2) wrap_ddp with the hierarchical hook, dynamic and static graph: after each micro-step,
    # do the ranks agree, and does each window's result equal the average of the summed
    # local gradients (``ref`` accumulates locally, without communication)?
    res = {"counts": counts}
    for static in (False, True):
        ddp = wrap_ddp(make_model(), bucket_cap_mb=TINY_BUCKET_MB, static_graph=static, hierarchical_allreduce=True)
        ref = make_model()
        agree, errors = [], []
        for step, batch in enumerate(data):
            with sync_context(ddp, step, accum):
                loss_of(ddp, batch).backward()
            loss_of(ref, batch).backward()
            everyone = gathered(grads(ddp))
            agree.append(all(torch.equal(g[0], g[i]) for g in everyone for i in range(1, len(g))))
            if (step + 1) % accum == 0:
                expected = [g.mean(0) for g in gathered(grads(ref))]
                errors.append(max((a - b).abs().max().item() for a, b in zip(grads(ddp), expected)))
                ddp.zero_grad()
                ref.zero_grad()
        res[f"agree_static_{static}"], res[f"error_static_{static}"] = agree, errors
    return res


def scenario_errors() -> dict:
    """The 2 x 2 layout's groups, and the messages of the errors every rank must raise
    (``None``: nothing was raised)."""
    def message(fn) -> str | None:
        try:
            fn()
        except ValueError as exc:
            return str(exc)
        return None

    ddp = wrap_ddp(make_model(), bucket_cap_mb=25, static_graph=False)
    state = HierarchicalAllReduce()
    return {
        "layout": {
            "flat": state.flat, "node": state.node, "local_rank": state.local_rank,
            "intra": dist.get_process_group_ranks(state.intra_group),
            "inter": dist.get_process_group_ranks(state.inter_group),
        },
        "not_multiple": message(lambda: wrap_ddp(make_model(), bucket_cap_mb=25, static_graph=False,
                                                 hierarchical_allreduce=True, local_world_size=3)),
        "not_multiple_state": message(lambda: HierarchicalAllReduce(3)),
        "double_wrap": message(lambda: wrap_ddp(ddp, bucket_cap_mb=25, static_graph=False)),
        "bad_local_rank": message(_bad_local_rank),
    }


def _bad_local_rank() -> None:
    """Ranks numbered across nodes instead of node by node must be refused."""
    saved = os.environ["LOCAL_RANK"]
    os.environ["LOCAL_RANK"] = str((int(saved) + 1) % 2)
    try:
        HierarchicalAllReduce(2)
    finally:
        os.environ["LOCAL_RANK"] = saved


def run_all(rank: int, world_size: int, local_world_size: int, port: int, out_dir: str) -> None:
    """Entry point for ``torch.multiprocessing``: rank ``rank`` of ``world_size``."""
    torch.set_num_threads(1)  # four processes share two cores
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        LOCAL_WORLD_SIZE=str(local_world_size), LOCAL_RANK=str(rank % local_world_size),
    )
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    try:
        res = {"rank": rank}
        res["allreduce"] = scenario_allreduce(rank)
        res["flags"] = scenario_flags()
        res["sync"] = scenario_sync(rank)
        res["layout_errors"] = scenario_errors()
        dist.barrier()
        torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()

