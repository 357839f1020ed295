"""A launch-bound training loop: a deep, narrow model of tiny operators.

200 ``Linear(16, 16) + ReLU`` blocks on a batch of 4: every operator does a
few hundred floating-point operations, so the step time is per-operator
dispatch and Python overhead, not arithmetic.

Usage::

    python examples/launch_bound.py [--steps 30] [--depth 200] [--batch-size 4]
    perfscope profile examples/launch_bound.py
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn


def build_model(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--depth", type=int, default=200, help="number of Linear+ReLU blocks")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    inputs = torch.randn(args.batch_size, args.width)
    targets = torch.randn(args.batch_size, args.width)
    model = build_model(args.width, args.depth)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.6f}", flush=True)
    elapsed = time.perf_counter() - start
    print(f"{args.steps} steps in {elapsed:.2f} s ({1000 * elapsed / args.steps:.1f} ms/step)")


if __name__ == "__main__":
    main()
