"""Benchmark: how much DataLoader workers speed up ``examples/io_bound.py`` (the knob its io advice names).

The script runs with ``--num-workers 0`` and with ``--num-workers N`` in alternation (A B B A ...)
for ``--rounds`` rounds; each run prints its own ``ms/step``; the result is the ratio of the median
step times (0 workers / N workers). Decoding sleeps per sample, so N workers overlap it about N
times even on 2 cores. This was a test once; a speed-up between separate runs is a measurement,
and on a loaded machine it belongs here.

    python bench/bench_io_workers.py [--workers 4] [--rounds 5] [--steps 60]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_MS = re.compile(r"\(([0-9.]+) ms/step\)")


def ms_per_step(workers: int, steps: int) -> float:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "io_bound.py"), "--steps", str(steps),
                           "--num-workers", str(workers)], capture_output=True, text=True, timeout=600, check=True)
    return float(_MS.search(proc.stdout).group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    times: dict[int, list[float]] = {0: [], args.workers: []}
    for r in range(args.rounds):
        for w in ((0, args.workers) if r % 2 == 0 else (args.workers, 0)):
            times[w].append(ms_per_step(w, args.steps))
    base, more = statistics.median(times[0]), statistics.median(times[args.workers])
    print(f"0 workers: median {base:.1f} ms/step ({', '.join(f'{t:.1f}' for t in times[0])})")
    print(f"{args.workers} workers: median {more:.1f} ms/step ({', '.join(f'{t:.1f}' for t in times[args.workers])})")
    print(f"speed-up: {base / more:.2f}x")


if __name__ == "__main__":
    main()
