"""ResNet-50 or Swin-T, random init, trained on synthetic images: the models of the GPU proof.

``--model resnet50`` is torchvision's ResNet-50 when torchvision is installed, else the same
architecture defined here (bottleneck blocks [3, 4, 6, 3], widths 64-512 x 4, stride on the 3 x 3
convolution as torchvision's v1.5); ``--model swin_t`` is Swin-T in timm's layout (4 x 4 patches,
depths [2, 2, 6, 2], heads [3, 6, 12, 24], 7 x 7 windows shifted every second block, patch merging
between stages) built from this project's window-attention blocks, which ``fused_ops: true``
swaps for the fused operator. ``--width`` and ``--depths`` shrink either for a CPU run; data are
random images and labels made once on the device (no input pipeline: the step is the model).

Usage::

    python examples/vision_models.py --model resnet50 [--batch-size 64] [--image-size 224] [--steps 60]
    python examples/vision_models.py --model swin_t --width 0.125 --depths 1,1,1,1 --steps 20
    perfscope tune examples/vision_models.py -- --model resnet50
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from perfscope.fused_ops.swin import SwinBlock


class Bottleneck(nn.Module):
    """1x1, 3x3 (strided), 1x1 convolutions with batch norm, plus the shortcut:
    ``(B, cin, H, W) -> (B, 4 * width, H / stride, W / stride)``."""

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        out = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out))
        self.shortcut = (nn.Identity() if stride == 1 and cin == out else
                         nn.Sequential(nn.Conv2d(cin, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet50(width: float = 1.0, classes: int = 1000) -> nn.Module:
    """ResNet-50 (torchvision's when ``width`` is 1 and torchvision is installed): ``(B, 3, H, W) -> (B, classes)``."""
    if width == 1.0:
        try:
            from torchvision.models import resnet50 as tv_resnet50

            return tv_resnet50(weights=None, num_classes=classes)
        except ImportError:
            pass
    base = max(4, int(64 * width))
    layers: list[nn.Module] = [nn.Conv2d(3, base, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(base),
                               nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1)]
    cin = base
    for i, blocks in enumerate((3, 4, 6, 3)):
        w = base * 2**i
        for j in range(blocks):
            layers.append(Bottleneck(cin, w, 2 if j == 0 and i > 0 else 1))
            cin = 4 * w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


class PatchMerging(nn.Module):
    """2 x 2 neighbouring tokens concatenated, normed and projected: ``(B, H * W, C) -> (B, H * W / 4, 2C)``."""

    def __init__(self, dim: int, resolution: tuple[int, int]) -> None:
        super().__init__()
        self.resolution = resolution
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (h, w), (b, _, c) = self.resolution, x.shape
        x = x.view(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 4, 2, 5).reshape(b, (h // 2) * (w // 2), 4 * c)
        return self.reduction(self.norm(x))


class SwinT(nn.Module):
    """Swin-T in timm's layout (module docstring): ``(B, 3, S, S) -> (B, classes)``, ``S`` a
    multiple of 32 x 7 / 8 (224 for 7 x 7 windows in every stage)."""

    def __init__(self, image: int = 224, width: float = 1.0, depths=(2, 2, 6, 2), heads=(3, 6, 12, 24),
                 window: int = 7, classes: int = 1000) -> None:
        super().__init__()
        dim = max(heads[0] * 4, int(96 * width) // heads[0] * heads[0])
        self.embed = nn.Conv2d(3, dim, 4, stride=4)
        self.embed_norm = nn.LayerNorm(dim)
        stages: list[nn.Module] = []
        side = image // 4
        for i, (depth, head) in enumerate(zip(depths, heads)):
            win = min(window, side)
            for j in range(depth):
                shift = win // 2 if j % 2 == 1 and side > win else 0
                stages.append(SwinBlock(dim, (side, side), head, win, shift))
            if i < len(depths) - 1:
                stages.append(PatchMerging(dim, (side, side)))
                dim, side = 2 * dim, side // 2
        self.stages = nn.Sequential(*stages)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.embed_norm(self.embed(images).flatten(2).transpose(1, 2))
        return self.head(self.norm(self.stages(tokens)).mean(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("resnet50", "swin_t"), default="resnet50")
    parser.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--width", type=float, default=1.0, help="channel width multiplier (default 1: the real model)")
    parser.add_argument("--depths", default="2,2,6,2", help="Swin blocks per stage (default 2,2,6,2)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.model == "resnet50":
        model = resnet50(args.width).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    else:
        model = SwinT(args.image_size, args.width, tuple(int(d) for d in args.depths.split(","))).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    labels = torch.randint(0, 1000, (args.batch_size,), device=device)

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    elapsed = time.perf_counter() - start
    print(f"{args.steps} steps in {elapsed:.2f} s ({1000 * elapsed / args.steps:.1f} ms/step)")


if __name__ == "__main__":
    main()
