"""A tiny DataLoader + SGD training loop that the ``tests/test_measure_*.py`` tests run under the measurement.

Options:
    --steps N           micro-batches in the loader (the loop ends after them)
    --batch-size B      samples per batch (default 4)
    --num-workers N     DataLoader workers; with --pid-dir each worker writes its pid there
    --fail-at S         raise in iteration S (1-based), before its forward; --error picks what:
                        memory (MemoryError), cpu-alloc (torch's CPU allocator message), value
    --backward KIND     plain (loss.backward()), perfscope (perfscope.backward(loss) without
                        accelerate), accelerate (perfscope.accelerate + perfscope.backward)
    --loss-log FILE     append every micro-batch's loss.item() (one per line)
    --seed-log FILE     write random.random(), numpy.random.rand(), torch.rand(1) at the start
    --sleep-ms A,B,...  sleep A ms in iteration 1, B in 2, ... (cycling): steps of known lengths
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

import perfscope

CPU_ALLOC_MESSAGE = ("[enforce fail at alloc_cpu.cpp:118] data. DefaultCPUAllocator: can't allocate memory: "
                     "you tried to allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)")


def record_pid(pid_dir: str, worker_id: int) -> None:
    with open(os.path.join(pid_dir, str(os.getpid())), "w") as f:
        f.write(str(worker_id))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--pid-dir", default=None)
    parser.add_argument("--fail-at", type=int, default=0)
    parser.add_argument("--error", choices=("memory", "cpu-alloc", "value"), default="memory")
    parser.add_argument("--backward", choices=("plain", "perfscope", "accelerate"), default="plain")
    parser.add_argument("--loss-log", default=None)
    parser.add_argument("--seed-log", default=None)
    parser.add_argument("--sleep-ms", default=None)
    args = parser.parse_args()

    if args.seed_log:
        with open(args.seed_log, "w") as f:
            json.dump([random.random(), float(np.random.rand()), torch.rand(1).item()], f)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.steps * args.batch_size, 8, generator=g)
    dataset = TensorDataset(x, x.sum(1, keepdim=True))
    init = functools.partial(record_pid, args.pid_dir) if args.pid_dir else None
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.num_workers, worker_init_fn=init)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.backward == "accelerate":
        model, opt, loader = perfscope.accelerate(model, opt, loader)
    log = open(args.loss_log, "a") if args.loss_log else None  # noqa: SIM115 - lives as long as the loop
    sleeps = [float(v) / 1000 for v in args.sleep_ms.split(",")] if args.sleep_ms else None
    for it, (inputs, targets) in enumerate(loader, 1):
        if sleeps:
            time.sleep(sleeps[(it - 1) % len(sleeps)])
        if it == args.fail_at:
            if args.error == "memory":
                raise MemoryError("simulated allocation failure")
            if args.error == "cpu-alloc":
                raise RuntimeError(CPU_ALLOC_MESSAGE)
            raise ValueError("bad batch")
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        if log is not None:
            log.write(f"{loss.item()!r}\n")
            log.flush()
        if args.backward == "plain":
            loss.backward()
        else:
            perfscope.backward(loss)
        opt.step()


if __name__ == "__main__":
    main()
