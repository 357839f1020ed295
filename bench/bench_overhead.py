"""Benchmark: how much slower steps run under `perfscope profile` outside the profiled window.

Runs bench/steady_loop.py plainly and under `perfscope profile` (window placed after the measured
steps), alternating, and prints the ratio of median step times over steps 5-45 (target <= 1.02).

    python bench/bench_overhead.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOOP = HERE / "steady_loop.py"
STEPS = 60
MEASURED = slice(5, 45)  # the profiler records steps 51-52, well after these


def run(profiled: bool, tmp: Path, i: int) -> float:
    timings = tmp / f"{'p' if profiled else 'plain'}{i}.json"
    loop_args = ["--steps", str(STEPS), "--timings", str(timings)]
    if profiled:
        cmd = [sys.executable, "-m", "perfscope", "profile", str(LOOP), "--skip-first", "50", "--warmup", "0",
               "--active", "2", "--max-steps", "0", "--out", str(tmp / f"out{i}"), "--", *loop_args]
    else:
        cmd = [sys.executable, str(LOOP), *loop_args]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return statistics.median(json.loads(timings.read_text())[MEASURED])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    plain, profiled = [], []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.rounds):  # alternate so drift on a noisy machine hits both alike
            plain.append(run(False, Path(d), i))
            profiled.append(run(True, Path(d), i))
    p, q = statistics.median(plain), statistics.median(profiled)
    print(f"plain run:          median step {p * 1e3:.3f} ms (steps 5-45, median of {args.rounds} runs)")
    print(f"under perfscope:    median step {q * 1e3:.3f} ms")
    print(f"ratio profiled / plain: {q / p:.3f} (target: <= 1.02)")


if __name__ == "__main__":
    main()
