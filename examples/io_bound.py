"""An input-bound training loop: slow per-sample decoding starves a small model.

Each sample is "decoded" from raw bytes and the dataset sleeps ``--decode-ms``
per sample to stand in for JPEG decoding or a slow file system. With the
default ``--num-workers 0`` the decoding runs on the training thread, so most
of every step is spent waiting for the DataLoader. More workers
(``--num-workers 2``) overlap it with compute.

Usage::

    python examples/io_bound.py [--steps 100] [--num-workers 0] [--pin-memory]
                                [--prefetch-factor P] [--threads T]
    perfscope profile examples/io_bound.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

IMAGE_SHAPE = (3, 32, 32)


class SlowDecodeDataset(Dataset):
    """Synthetic images decoded from bytes, ``decode_ms`` milliseconds each."""

    def __init__(self, size: int, decode_ms: float, seed: int) -> None:
        self.size = size
        self.decode_s = decode_ms / 1000.0
        self.seed = seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        # Deterministic per index, whichever worker process decodes it.
        rng = np.random.default_rng(self.seed * 1_000_003 + index)
        raw = rng.integers(0, 256, size=int(np.prod(IMAGE_SHAPE)), dtype=np.uint8).tobytes()
        time.sleep(self.decode_s)  # stands in for the codec / storage latency
        image = np.frombuffer(raw, dtype=np.uint8).reshape(IMAGE_SHAPE)
        image = torch.from_numpy(image.astype(np.float32) / 255.0)
        return image, index % 10


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 16 * 16, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader workers")
    parser.add_argument("--pin-memory", action="store_true", help="DataLoader pin_memory")
    parser.add_argument("--prefetch-factor", type=int, default=None, help="DataLoader prefetch_factor (with workers)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--decode-ms", type=float, default=3.0, help="decode time per sample")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dataset = SlowDecodeDataset(args.steps * args.batch_size, args.decode_ms, args.seed)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        pin_memory=args.pin_memory,
        prefetch_factor=args.prefetch_factor if args.num_workers > 0 else None,
        generator=torch.Generator().manual_seed(args.seed),
    )
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    start = time.perf_counter()
    for step, (images, labels) in enumerate(loader, 1):
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
