"""A steady training loop that records its own step times (for bench_overhead.py): each step's
wall time and the training thread's CPU time (``time.thread_time``), in seconds.

    python bench/steady_loop.py --steps 60 --timings out.json
"""

import argparse
import json
import time

import torch
from torch import nn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--timings", required=True,
                    help='where to write the per-step times (JSON: {"wall_s": [...], "thread_cpu_s": [...]})')
    ap.add_argument("--width", type=int, default=256, help="layer width (256: about 3 ms a step, 48: about 0.5 ms)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    w = args.width
    model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(w, w), nn.ReLU())])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, w), torch.randn(64, w)
    wall, cpu = [], []
    for _ in range(args.steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    with open(args.timings, "w") as f:
        json.dump({"wall_s": wall, "thread_cpu_s": cpu}, f)


if __name__ == "__main__":
    main()
