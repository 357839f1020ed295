"""A small FSDP2 (fully_shard) training loop on gloo, for `perfscope profile --nproc-per-node 2`:
each layer sharded, the optimizer over the sharded parameters."""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        loss = model(torch.randn(32, 256)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
