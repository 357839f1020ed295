"""Benchmark: analysis time grows linearly with the number of steps.

Writes two traces of one-op CPU steps, N and 10 x N steps (10 us each, one 8 us operator), and
analyzes them alternately in this process. Linear cost gives a ratio of medians near 10; a cost of
steps x events (every step scanning every event, as before the per-step metrics were vectorised)
gives near 100.

    python bench/bench_steps_scaling.py [--steps N] [--repeat R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tracegen import cpu_op, step, write_trace  # noqa: E402

import perfscope  # noqa: E402


def one_op_steps(path: Path, n: int) -> Path:
    events = []
    for i in range(n):
        events += [step(i + 1, 10 * i, 10), cpu_op("aten::add", 10 * i + 1, 8)]
    return write_trace(path, events)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20_000, help="steps of the small trace (the large has 10x)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        small = one_op_steps(Path(d) / "small.json", args.steps)
        large = one_op_steps(Path(d) / "large.json", 10 * args.steps)
        times: dict[Path, list[float]] = {small: [], large: []}
        for _ in range(args.repeat):
            for path in (small, large):  # interleaved: both see the same machine load
                t0 = time.perf_counter()
                perfscope.analyze(path)
                times[path].append(time.perf_counter() - t0)
    s, m = statistics.median(times[small]), statistics.median(times[large])
    print(f"{args.steps:,} steps: median {s:.2f} s; {10 * args.steps:,} steps: median {m:.2f} s over {args.repeat} runs")
    print(f"ratio large / small: {m / s:.1f}x (linear: about 10x; steps x events: about 100x)")


if __name__ == "__main__":
    main()
