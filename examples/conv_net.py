"""A small convolutional network (ResNet-style stem and stages, no residuals) on 64 x 64 images.

Four 3 x 3 convolutions with batch norm and ReLU, two of them strided, then global pooling and a
linear classifier: the step is convolution arithmetic (compute-bound). PyTorch keeps the weights
and images in NCHW order, which the convolution kernels reorder on the way in and out;
``channels_last: true`` (``perfscope profile --config``, a tuning trial, or
``perfscope.accelerate``) stores them channels-last without changing this script.

Usage::

    python examples/conv_net.py [--steps 30] [--batch-size 16] [--size 64]
    perfscope profile examples/conv_net.py
    perfscope tune examples/conv_net.py
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn


def conv_block(cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
    """``3 x 3`` convolution (no bias: batch norm follows), batch norm, ReLU."""
    return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


def build_model(classes: int = 10) -> nn.Module:
    """``(B, 3, H, W) -> (B, classes)``."""
    return nn.Sequential(*conv_block(3, 32), *conv_block(32, 64, 2), *conv_block(64, 64), *conv_block(64, 128, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, classes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--size", type=int, default=64, help="image side in pixels (default 64)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    images = torch.randn(args.batch_size, 3, args.size, args.size)
    labels = torch.randint(0, 10, (args.batch_size,))

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.6f}", flush=True)
    elapsed = time.perf_counter() - start
    print(f"{args.steps} steps in {elapsed:.2f} s ({1000 * elapsed / args.steps:.1f} ms/step)")


if __name__ == "__main__":
    main()
