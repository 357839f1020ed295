"""An io-bound training script for the busy-machine tuning benchmark (``bench_tune_busy.py``).

Each sample takes ``--latency-ms`` to load (a sleep: a remote store's latency, not CPU work), batches
of ``--batch-size`` go through a small MLP, and the DataLoader has no workers unless told. The
script measures itself -- samples per second over the steps after the first ``--skip`` -- and prints
one line, ``throughput: N samples/s``, which the benchmark's side-by-side check reads.

    python bench/io_latency.py [--steps 60] [--num-workers 0] [--threads T] [--prefetch-factor P]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class LatencyDataset(Dataset):
    def __init__(self, size: int, latency_s: float) -> None:
        self.size, self.latency_s = size, latency_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        time.sleep(self.latency_s)
        g = torch.Generator().manual_seed(index)
        return torch.randn(256, generator=g), index % 10


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--latency-ms", type=float, default=8.0)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--prefetch-factor", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--skip", type=int, default=10, help="steps not counted in the printed throughput")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    extra = {"prefetch_factor": args.prefetch_factor} if args.num_workers and args.prefetch_factor else {}
    loader = DataLoader(LatencyDataset(args.steps * args.batch_size, args.latency_ms / 1000), batch_size=args.batch_size,
                        shuffle=False, num_workers=args.num_workers, **extra)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start, counted = None, 0
    for step, (x, y) in enumerate(loader, 1):
        if step == args.skip + 1:
            start = time.perf_counter()
        if start is not None:
            counted += x.shape[0]
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if start is not None:
        print(f"throughput: {counted / (time.perf_counter() - start):.2f} samples/s")


if __name__ == "__main__":
    main()
