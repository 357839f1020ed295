"""A small Swin Transformer (Swin-T's stage-1 windows and heads, half its width) trained on data in memory.

Each step runs window attention in 7 x 7 windows over a 28 x 28 token grid, unshifted and shifted
blocks alternating, with Swin's relative-position bias and shift mask: about ten operators per
attention call, each a pass over the scores. ``fused_ops: true`` (``perfscope profile --config``,
a tuning trial, or ``perfscope.accelerate``) swaps the fused window attention into the blocks
without changing this script.

Usage::

    python examples/swin.py [--steps 30] [--batch-size 8] [--depth 2]
    perfscope profile examples/swin.py
    perfscope tune examples/swin.py
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from perfscope.fused_ops.swin import SwinBlock

RESOLUTION, WINDOW, PATCH = 28, 7, 4  # 112 x 112 images in 4 x 4 patches: a 28 x 28 token grid


class TinySwin(nn.Module):
    """Patch embedding, ``depth`` pairs of Swin blocks (unshifted, then shifted by half a window)
    and a linear classifier on the mean token: ``(B, 3, 112, 112) -> (B, classes)``."""

    def __init__(self, dim: int = 48, heads: int = 3, depth: int = 2, classes: int = 10):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, kernel_size=PATCH, stride=PATCH)
        self.blocks = nn.Sequential(*[
            SwinBlock(dim, (RESOLUTION, RESOLUTION), heads, WINDOW, shift=0 if i % 2 == 0 else WINDOW // 2)
            for i in range(2 * depth)
        ])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(images).flatten(2).transpose(1, 2)  # (B, 28 * 28, dim)
        return self.head(self.norm(self.blocks(tokens)).mean(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--depth", type=int, default=2, help="pairs of Swin blocks (default 2)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    size = RESOLUTION * PATCH
    batches = [(torch.randn(args.batch_size, 3, size, size), torch.randint(0, 10, (args.batch_size,)))
               for _ in range(4)]
    model = TinySwin(depth=args.depth)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        images, labels = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    elapsed = time.perf_counter() - start
    print(f"{args.steps} steps in {elapsed:.2f} s ({1000 * elapsed / args.steps:.1f} ms/step)")


if __name__ == "__main__":
    main()
