"""Benchmark: what timing every step of the run costs, against each shipped example's step time.

1. The timer's cost per step, in this process: the step's hook calls as ``perfscope profile``
   makes them (a DataLoader fetch and a backward through perfscope's wrappers, an optimizer
   step's pre and post hooks, the step's end with its line and, every 50 ms, its memory read),
   timed in rounds that alternate with the same calls without a timer; the cost is the
   difference of the medians.
2. Each shipped example under ``perfscope profile --max-steps 0`` (its default arguments; two
   ranks for ``comm_bound``): the median steady step from the run's own record (rank 0's). Overhead = cost / median step. Target:
   under 1% on every example.

    python bench/bench_run_timer.py [--rounds 15] [--steps 20000] [--examples compute_bound io_bound ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EXAMPLES = ("compute_bound", "io_bound", "launch_bound", "swin", "accelerated", "comm_bound")
PROFILE_ARGS = {"comm_bound": ["--nproc-per-node", "2"]}  # how the README runs it


class _Tracker:
    """What the wrappers read of a StepTracker."""

    point_armed = False
    step_depth = 0

    def __init__(self, timer):
        self.timer = timer
        self._thread = threading.get_ident()

    def _on_script_thread(self) -> bool:
        return threading.get_ident() == self._thread


def _round(timer, steps: int) -> float:
    """Seconds per step of ``steps`` steps' hook calls (timer None: the wrappers without one)."""
    from perfscope import control
    from perfscope.collect.hooks import _wrap_backward, _wrap_fetch

    fetch, backward = _wrap_fetch(lambda self: None), _wrap_backward(lambda: None)
    tracker = _Tracker(timer)
    control.active = tracker
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            fetch(None)
            backward()
            if timer is not None:
                timer.optimizer_begin()
                timer.optimizer_end()
                timer.step_end()
        return (time.perf_counter() - t0) / steps
    finally:
        control.active = None


def timer_cost(rounds: int, steps: int) -> tuple[float, float, float]:
    """(seconds per step with the timer, without, their difference), medians over rounds."""
    from perfscope.collect.run_timer import RunTimer

    on, off = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(rounds):
            timer = RunTimer(Path(tmp) / f"r{k}.run.jsonl")
            timer.start()
            on.append(_round(timer, steps))
            timer.flush()
            off.append(_round(None, steps))
    a, b = statistics.median(on), statistics.median(off)
    return a, b, a - b


def example_step(name: str) -> tuple[float, int] | None:
    """(median steady step in seconds, steps) of one example profiled to its end."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-m", "perfscope", "profile", "--out", tmp, "--max-steps", "0",
                               *PROFILE_ARGS.get(name, []), f"examples/{name}.py"], cwd=ROOT, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            print(f"{name}: profile failed: {proc.stderr.strip().splitlines()[-1:]}")
            return None
        views = json.loads((Path(tmp) / "summary.json").read_text())["details"].get("run_steps") or []
        if not views:
            return None
        return views[0]["median_s"], views[0]["steps"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--examples", nargs="*", default=list(EXAMPLES))
    args = ap.parse_args()
    on, off, cost = timer_cost(args.rounds, args.steps)
    print(f"hook calls per step: {on * 1e6:.2f} µs with the timer, {off * 1e6:.2f} µs without: "
          f"the timer costs {cost * 1e6:.2f} µs a step (medians of {args.rounds} alternating rounds of {args.steps})")
    print(f"{'example':<16} {'steps':>6} {'median step':>12} {'overhead':>9}")
    for name in args.examples:
        found = example_step(name)
        if found is None:
            continue
        median, steps = found
        print(f"{name:<16} {steps:>6} {median * 1e3:>9.2f} ms {cost / median:>8.3%}")


if __name__ == "__main__":
    main()
