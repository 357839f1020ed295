"""A communication-bound training loop: DistributedDataParallel over gloo.

Eight Linear(2048, 2048) layers (about 34 M parameters, 134 MB of fp32
gradients) on a batch of 2: the arithmetic per step is tiny, but every step
all-reduces all the gradients over TCP, and ``gloo:all_reduce`` takes longer
than all the step's operators together. DDP's default 25 MB buckets overlap
the all-reduce with the backward; ``--bucket-cap-mb 1024`` all-reduces
everything after the backward, which exposes all of it.

Meant for two processes::

    perfscope profile --nproc-per-node 2 examples/comm_bound.py
    torchrun --nproc-per-node 2 examples/comm_bound.py

Reads RANK / WORLD_SIZE from the environment (set by torchrun); without them
it runs as a single process (world size 1).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def build_model(width: int, depth: int) -> nn.Module:
    # Many 16 MiB weights rather than a few huge ones: glibc mmaps (and the
    # step then page-faults) every fresh gradient above 32 MiB, which would
    # show up as slow "compute" and blur the example.
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def init_distributed() -> tuple[int, int]:
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    else:
        # Plain `python comm_bound.py`: a one-rank group needs no rendezvous.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return rank, world_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=2, help="per-rank batch size")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=8, help="number of width x width layers")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket size")
    args = parser.parse_args()

    # The ranks share the machine's cores; more threads would just contend.
    torch.set_num_threads(1)
    rank, world_size = init_distributed()
    torch.manual_seed(args.seed)  # same initial weights on every rank
    model = DistributedDataParallel(
        build_model(args.width, args.depth), bucket_cap_mb=args.bucket_cap_mb
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    data_gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    inputs = torch.randn(args.batch_size, args.width, generator=data_gen)
    labels = torch.randint(0, 10, (args.batch_size,), generator=data_gen)

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), labels)
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    elapsed = time.perf_counter() - start
    if rank == 0:
        print(
            f"{args.steps} steps on {world_size} rank(s) in {elapsed:.2f} s "
            f"({1000 * elapsed / args.steps:.1f} ms/step)"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
