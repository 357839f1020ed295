"""A data-parallel script whose speed depends on knobs of several groups at once, for the
joint-space search benchmark (``bench_tune_joint.py``).

Two ranks (``torchrun --nproc-per-node 2``, gloo) train an MLP of ``--depth`` ``--width``-square
layers wrapped in DistributedDataParallel; each sample takes ``--latency-ms`` to load (a sleep: a
remote store, not CPU work) and the DataLoader has no workers unless told. So the input knobs
(``num_workers``) hide the loading, the all-reduce of the gradients costs a visible share of the
step (bucket size, compression), and accumulation (the script calls ``perfscope.accelerate`` and
``perfscope.backward``) all-reduces once per k micro-batches.

    torchrun --nproc-per-node 2 bench/joint_ddp.py [--steps 60] [--num-workers 0]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

import perfscope


class LatencyDataset(Dataset):
    def __init__(self, size: int, width: int, latency_s: float) -> None:
        self.size, self.width, self.latency_s = size, width, latency_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        time.sleep(self.latency_s)
        g = torch.Generator().manual_seed(index)
        return torch.randn(self.width, generator=g), index % 10


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=8, help="per rank")
    ap.add_argument("--latency-ms", type=float, default=4.0)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--num-workers", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)  # two ranks share the cores
    rank = int(os.environ.get("RANK", "0"))
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = DistributedDataParallel(nn.Sequential(*layers, nn.Linear(args.width, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    size = args.steps * args.batch_size
    # Every rank reads the same synthetic samples: the benchmark measures speed, not learning.
    loader = DataLoader(LatencyDataset(size, args.width, args.latency_ms / 1000), batch_size=args.batch_size,
                        num_workers=args.num_workers)
    model, optimizer, loader = perfscope.accelerate(model, optimizer, loader)
    for step, (x, y) in enumerate(loader, 1):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        perfscope.backward(loss)
        optimizer.step()
        if rank == 0 and step % 20 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
