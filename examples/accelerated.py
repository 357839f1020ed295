"""The io-bound training loop of ``io_bound.py``, accelerated by a perfscope configuration.

The lines marked ``# perfscope`` are all a script adds: ``perfscope.accelerate`` rebuilds the
DataLoader (workers, pinning, prefetch), applies AMP, TF32, cuDNN benchmark, DDP (under
torchrun) and gradient accumulation from the configuration; ``perfscope.autocast()`` and
``perfscope.backward(loss)`` honour AMP and accumulation in the loop. Without ``--config`` and
``$PERFSCOPE_CONFIG`` it trains exactly as the plain loop would.

Usage::

    python examples/accelerated.py [--steps 100] [--decode-ms 3] [--config best.yaml]
    PERFSCOPE_CONFIG=best.yaml perfscope profile examples/accelerated.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

import perfscope

sys.path.insert(0, str(Path(__file__).resolve().parent))
from io_bound import SlowDecodeDataset, build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="micro-batches to train on (default 100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--decode-ms", type=float, default=3.0, help="decode time per sample")
    parser.add_argument("--config", default=None, help="acceleration config (YAML); default $PERFSCOPE_CONFIG")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    dataset = SlowDecodeDataset(args.steps * args.batch_size, args.decode_ms, args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(args.seed))
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    # perfscope: apply the configuration (nothing without --config or $PERFSCOPE_CONFIG).
    model, optimizer, loader = perfscope.accelerate(model, optimizer, loader, config=args.config)
    if perfscope.accelerator() is not None:
        print(perfscope.accelerator().summary(), flush=True)

    device = next(model.parameters()).device
    start = time.perf_counter()
    for step, (images, labels) in enumerate(loader, 1):
        optimizer.zero_grad(set_to_none=True)  # skipped inside an accumulation window
        with perfscope.autocast():  # perfscope: autocast at amp_level O1
            loss = loss_fn(model(images.to(device)), labels.to(device))
        perfscope.backward(loss)  # perfscope: instead of loss.backward()
        optimizer.step()  # really steps once per grad_accum_steps micro-batches
        print(f"step {step}: loss {loss.item():.4f}", flush=True)
    elapsed = time.perf_counter() - start
    print(f"{args.steps} steps in {elapsed:.2f} s ({1000 * elapsed / args.steps:.1f} ms/step)")


if __name__ == "__main__":
    main()
