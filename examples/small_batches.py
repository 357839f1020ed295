"""A launch-bound loop fed by a DataLoader of small batches: most of each step is per-operator
overhead that a larger batch would share among more samples.

An MLP of 24 ``Linear(64, 64) + ReLU`` layers trained with SGD (momentum) on a regression task held
in memory, 8 samples a batch. ``batch_size: 32`` (``perfscope profile --config``, a tuning trial, or
``perfscope.accelerate``) builds the loader with 32 samples a batch and scales the learning rate by
the linear rule with a warm-up, without changing this script.

Usage::

    python examples/small_batches.py [--epochs 2] [--batch-size 8]
    perfscope profile examples/small_batches.py
    perfscope tune examples/small_batches.py
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2, help="passes over the 8,192 samples (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--depth", type=int, default=24, help="Linear+ReLU layers")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    inputs = torch.randn(8192, 64)
    targets = torch.tanh(inputs @ torch.randn(64, 1) / 8)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(args.seed))
    layers: list[nn.Module] = []
    for _ in range(args.depth):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    start, steps = time.perf_counter(), 0
    for epoch in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            steps += 1
        print(f"epoch {epoch + 1}: loss {loss.item():.6f}", flush=True)
    elapsed = time.perf_counter() - start
    print(f"{steps} steps in {elapsed:.2f} s ({1000 * elapsed / steps:.1f} ms/step)")


if __name__ == "__main__":
    main()
