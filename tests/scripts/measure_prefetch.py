"""A training loop whose DataLoader workers prefetch while the script is still setting up.

The dataset sleeps ``--sample-ms`` per sample in the workers, so ``W`` workers deliver at most
``W * 1000 / sample-ms`` samples/s however fast the model is. After the first batch the script
sleeps ``--setup-s`` (a slow setup: loading a checkpoint, building the model), while the workers
fill their prefetch queues; then it trains on that batch and the rest. ``--width`` sets the model
(a stack of ``--layers`` square linear layers) so that the loop can be made consumer-bound.

Options:
    --steps N            batches in the loader (the loop ends after them)
    --batch-size B       samples per batch (default 8)
    --sample-ms MS       worker sleep per sample (default 10)
    --setup-s S          sleep after the first batch (default 0)
    --width D, --layers L  the model (default 16, 1: nearly free)
    --num-workers N, --prefetch-factor F  DataLoader settings (a --config may override them)
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
from torch.utils.data import DataLoader, Dataset


class SleepyDataset(Dataset):
    def __init__(self, size: int, width: int, sample_s: float) -> None:
        self.size, self.width, self.sample_s = size, width, sample_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.sample_s:
            time.sleep(self.sample_s)
        return torch.full((self.width,), float(index % 7))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sample-ms", type=float, default=10.0)
    parser.add_argument("--setup-s", type=float, default=0.0)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--prefetch-factor", type=int, default=None)
    args = parser.parse_args()

    torch.manual_seed(0)
    dataset = SleepyDataset(args.steps * args.batch_size, args.width, args.sample_ms / 1000.0)
    extra = {"prefetch_factor": args.prefetch_factor} if args.num_workers else {}
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.num_workers, **extra)
    model = torch.nn.Sequential(*(torch.nn.Linear(args.width, args.width) for _ in range(args.layers)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    it = iter(loader)
    first = next(it)
    time.sleep(args.setup_s)  # the workers keep loading meanwhile
    for x in itertools.chain([first], it):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


if __name__ == "__main__":
    main()
