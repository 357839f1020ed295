"""Benchmark: `perfscope analyze` cost against parsing the same trace with orjson alone.

Runs both side by side in this process, alternating, and prints the ratio of medians. The
target is a full analysis (read, gunzip, parse, columnar table, steps, metrics, verdicts) within
2x the raw parse (gunzip + orjson.loads) of the same file.

    python bench/bench_analyze.py [TRACE] [--repeat N]
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import time
from pathlib import Path

import orjson

import perfscope

DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared/traces/hta/a100_rank3_of8_train.json.gz"


def raw_parse(path: Path) -> None:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    orjson.loads(data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    if not args.trace.is_file():
        raise SystemExit(f"bench_analyze: {args.trace} not found (the default is the A100 trace in ../shared/traces; pass a trace path)")
    parse_s, analyze_s = [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        raw_parse(args.trace)
        t1 = time.perf_counter()
        perfscope.analyze(args.trace)
        t2 = time.perf_counter()
        parse_s.append(t1 - t0)
        analyze_s.append(t2 - t1)
    p, a = statistics.median(parse_s), statistics.median(analyze_s)
    print(f"trace: {args.trace} ({args.trace.stat().st_size / 1e6:.1f} MB on disk)")
    print(f"raw parse (gunzip + orjson.loads): median {p:.3f} s over {args.repeat} runs")
    print(f"perfscope.analyze:                 median {a:.3f} s")
    print(f"ratio analyze / raw parse: {a / p:.2f}x (target: <= 2x)")


if __name__ == "__main__":
    main()
