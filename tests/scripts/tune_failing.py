"""A training script whose DataLoader settings decide its fate, for the tuner's failure tests.

With ``prefetch_factor`` at least ``--oom-prefetch`` it allocates far more memory than any machine
has (as a real pipeline with deep prefetch of large batches would) and fails with the allocator's
out-of-memory error; with exactly ``--hang-workers`` workers it hangs (a deadlocked pipeline).
Any other setting trains normally.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--oom-prefetch", type=int, default=8)
    parser.add_argument("--hang-workers", type=int, default=1)
    args = parser.parse_args()

    data = TensorDataset(torch.randn(args.steps * 8, 16), torch.randint(0, 4, (args.steps * 8,)))
    loader = DataLoader(data, batch_size=8, shuffle=True)  # perfscope may patch its settings
    model = nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(loader, 1):
        if step == 2 and loader.num_workers and (loader.prefetch_factor or 0) >= args.oom_prefetch:
            torch.empty(1 << 60, dtype=torch.uint8)  # "DefaultCPUAllocator: can't allocate memory"
        if step == 2 and loader.num_workers == args.hang_workers:
            time.sleep(3600)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


if __name__ == "__main__":
    main()
