"""The rank side of bench/bench_forecast.py: started by torchrun on every emulated node.

Measures the link as a user would before forecasting (the per-step latency of a one-value
all-reduce: ``2(W-1)`` steps of the ring), then trains examples/comm_bound.py's model with
flat DDP and with perfscope's hierarchical hook, interleaved step window by step window, and
prints one JSON line from rank 0: ``{"latency_s", "flat_s": [...], "hier_s": [...]}`` (median
step seconds of each window).

    torchrun ... bench/forecast_ranks.py --width 1024 --depth 2 --windows 3 --steps 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "examples"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from comm_bound import build_model  # noqa: E402

from perfscope.runtime.parallel import wrap_ddp  # noqa: E402


def latency_s(world: int) -> float:
    x = torch.zeros(1)
    for _ in range(5):
        dist.all_reduce(x)
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / (2 * (world - 1))


def window(ddp, opt, x, y, steps: int) -> float:
    times = []
    for _ in range(steps + 1):  # the first step of a window re-warms the caches: not counted
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    out = {"latency_s": latency_s(world), "flat_s": [], "hier_s": []}
    torch.manual_seed(0)
    runs = {"flat_s": DistributedDataParallel(build_model(a.width, a.depth)),
            "hier_s": wrap_ddp(build_model(a.width, a.depth), bucket_cap_mb=25.0, static_graph=False,
                               hierarchical_allreduce=True)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in runs.items()}
    g = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(a.batch_size, a.width, generator=g), torch.randint(0, 10, (a.batch_size,), generator=g)
    for _ in range(a.windows):
        for k, m in runs.items():
            out[k].append(window(m, opts[k], x, y, a.steps))
    if dist.get_rank() == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
