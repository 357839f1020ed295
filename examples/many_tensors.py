"""A model of many small parameter tensors trained with AdamW: the optimizer's step is most of it.

96 residual blocks of ``LayerNorm(32) + Linear(32, 32)`` hold 386 parameter tensors of a few
hundred to a thousand elements. On the CPU, PyTorch's AdamW runs its for-loop implementation (a
dozen operators per tensor, each dispatched on its own), so the optimizer step costs as much as
forward and backward together; ``optimizer_impl: fused`` (``perfscope profile --config``, a tuning
trial, or ``perfscope.accelerate``) runs the same update as one kernel per group, without changing
this script.

Usage::

    python examples/many_tensors.py [--steps 30] [--blocks 96] [--batch-size 16]
    perfscope profile examples/many_tensors.py
    perfscope tune examples/many_tensors.py
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn


class Block(nn.Module):
    """``x + Linear(LayerNorm(x))``: ``(B, width) -> (B, width)``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.linear(self.norm(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--blocks", type=int, default=96, help="residual blocks (4 parameter tensors each)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = nn.Sequential(*[Block(args.width) for _ in range(args.blocks)], nn.Linear(args.width, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    inputs = torch.randn(args.batch_size, args.width)
    targets = inputs.sum(1, keepdim=True)

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
