"""The rank side of bench/bench_forecast.py: started by torchrun on every emulated node.

Measures the links as a user would before forecasting: an all-reduce between one rank per node at
two message sizes, fitted to the ring's alpha-beta cost ``2(N-1) * (alpha + m/N / beta)`` (the
way NCCL-tests' figures are read), and the same among the ranks of each node, every node at once
(as the hierarchical hook's intra-node stages run); then trains examples/comm_bound.py's model
with flat DDP and with perfscope's hierarchical hook, interleaved step window by step window, and
prints one JSON line from rank 0: ``{"latency_s", "bytes_per_s", "intra_latency_s",
"intra_bytes_per_s", "flat_s": [...], "hier_s": [...]}`` (the fitted links; median step seconds
of each window).

    torchrun ... bench/forecast_ranks.py --width 1024 --depth 2 --windows 3 --steps 4
"""

from __future__ import annotations

import argparse
import json
import os
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


SIZES = (64 << 10, 4 << 20)  # bytes: about the latency, about the bandwidth


def _ring_fit(group, members: int, timing: bool) -> tuple[float, float]:
    """(alpha s, beta bytes/s) of a ring all-reduce among ``members`` ranks of ``group``, from the
    median of 7 all-reduces at each of :data:`SIZES` (0, 0 where ``timing`` is False)."""
    times = []
    for size in SIZES:
        x = torch.zeros(size // 4)
        for _ in range(3):
            dist.all_reduce(x, group=group)
        t = []
        for _ in range(7):
            t0 = time.perf_counter()
            dist.all_reduce(x, group=group)
            t.append(time.perf_counter() - t0)
        times.append(statistics.median(t))
    if not timing:
        return 0.0, 0.0
    steps = 2 * (members - 1)
    (m1, m2), (t1, t2) = SIZES, times
    beta = (m2 - m1) / members / ((t2 - t1) / steps)
    alpha = max(0.0, t1 / steps - m1 / members / beta)
    return alpha, beta


def fitted_links(nodes: int, per_node: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """((alpha, beta) inter-node, (alpha, beta) intra-node): the first from all-reduces among one
    rank per node, the second among the ranks of each node with every node's running at once."""
    rank = dist.get_rank()
    # new_group is collective: every rank creates every group, in the same order.
    inter = dist.new_group(list(range(0, nodes * per_node, per_node)))
    intra = [dist.new_group(list(range(n * per_node, (n + 1) * per_node))) for n in range(nodes)]
    inter_link = _ring_fit(inter, nodes, True) if rank % per_node == 0 else (0.0, 0.0)
    dist.barrier()
    intra_link = _ring_fit(intra[rank // per_node], per_node, rank == 0)
    dist.barrier()
    return inter_link, intra_link


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
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    (alpha, beta), (intra_alpha, intra_beta) = fitted_links(dist.get_world_size() // per_node, per_node)
    out = {"latency_s": alpha, "bytes_per_s": beta, "intra_latency_s": intra_alpha, "intra_bytes_per_s": intra_beta,
           "flat_s": [], "hier_s": []}
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
