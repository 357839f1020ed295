"""A compute-bound training loop: a wide MLP on data already in memory.

Batches are generated up front, so each step is almost only large matrix
products (``aten::addmm`` / ``aten::mm``) in the forward and backward passes.

Usage::

    python examples/compute_bound.py [--steps 30] [--width 2048] [--batch-size 256] [--delay-ms 0]
    perfscope profile examples/compute_bound.py
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
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--width", type=int, default=2048, help="hidden layer width")
    parser.add_argument("--depth", type=int, default=2, help="number of hidden layers")
    parser.add_argument("--delay-ms", type=float, default=0.0,
                        help="host time added to every step: a known regression for perfscope check (default 0)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    # A handful of pre-generated batches, reused: no input pipeline at all.
    batches = [
        (torch.randn(args.batch_size, args.width), torch.randint(0, 10, (args.batch_size,)))
        for _ in range(4)
    ]
    model = build_model(args.width, args.depth)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        inputs, labels = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()
        if args.delay_ms > 0:
            time.sleep(args.delay_ms / 1000)
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    elapsed = time.perf_counter() - start
    print(f"{args.steps} steps in {elapsed:.2f} s ({1000 * elapsed / args.steps:.1f} ms/step)")


if __name__ == "__main__":
    main()
