"""Benchmark: hierarchical all-reduce against a flat gloo all-reduce on an emulated cluster.

Two nodes (network namespaces, perfscope.emulate) of two gloo ranks each; every node's link is
shaped to each rate in turn. On every rate the rank side (bench/allreduce_ranks.py) times both
algorithms on the same tensor, interleaved, and counts the bytes each node sends. Printed per
rate: the medians, their ratio (flat / hierarchical: above 1, hierarchical is faster), the
inter-node bytes per node against the ring formulas (flat 2(NG-1)/NG * S from the node's ring
neighbour, hierarchical 2(N-1)/N * S in all), and the hierarchical time against its bound (those
bytes at the shaped rate): the share of the link it keeps busy.

Targets (issue): at 200 Mbit/s at least 1.3x and at least 85% of the bound. At 1 and 10 Gbit/s
it may lose: see docs/multinode.md for why.

Needs root.  python bench/bench_hierarchical.py [--rates 200mbit,1gbit,10gbit] [--mib 16] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from perfscope.emulate import EmulatedCluster, LinkShape, parse_rate  # noqa: E402

NODES, RANKS_PER_NODE = 2, 2


def run_rate(rate: str, mib: float, rounds: int, chunk_mib: float | None) -> dict:
    worker = str(ROOT / "bench" / "allreduce_ranks.py")
    extra = [] if chunk_mib is None else ["--chunk-mib", str(chunk_mib)]
    with EmulatedCluster(NODES, LinkShape(rate=rate)) as cluster:
        cmds = [[sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}", f"--node-rank={i}",
                 f"--nproc-per-node={RANKS_PER_NODE}", f"--master-addr={cluster.addresses[0]}",
                 "--master-port=29631", worker, "--mib", str(mib), "--rounds", str(rounds), *extra]
                for i in range(NODES)]
        done = cluster.run(cmds, timeout_s=900)
    for i, d in enumerate(done):
        if d.returncode:
            raise SystemExit(f"node {i} failed ({d.returncode}): {d.stderr.strip()[-800:]}")
    line = [x for x in done[0].stdout.splitlines() if x.startswith("{")][-1]
    return json.loads(line)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="200mbit,1gbit,10gbit")
    p.add_argument("--mib", type=float, default=16.0, help="all-reduced tensor, MiB")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--chunk-mib", type=float, default=None, help="pipeline chunk (default: the hook's)")
    a = p.parse_args()
    size = a.mib * 2**20
    n, g = NODES, RANKS_PER_NODE
    flat_bytes = 2 * (n * g - 1) / (n * g) * size
    hier_bytes = 2 * (n - 1) / n * size
    print(f"{n} nodes x {g} gloo ranks, {a.mib:g} MiB fp32, {a.rounds} interleaved rounds; medians")
    print(f"{'link':>8} {'flat s':>8} {'hier s':>8} {'ratio':>6} {'flat MiB/node':>14} {'hier MiB/node':>14} "
          f"{'bound s':>8} {'of bound':>8}")
    for rate in a.rates.split(","):
        r = run_rate(rate, a.mib, a.rounds, a.chunk_mib)
        flat, hier = statistics.median(r["flat_s"]), statistics.median(r["hier_s"])
        ftx, htx = statistics.median(r["flat_tx"]), statistics.median(r["hier_tx"])
        bound = hier_bytes * 8 / parse_rate(rate)
        print(f"{rate:>8} {flat:8.3f} {hier:8.3f} {flat / hier:5.2f}x {ftx / 2**20:14.1f} {htx / 2**20:14.1f} "
              f"{bound:8.3f} {bound / hier:7.0%}")
    print(f"expected bytes per node: flat {flat_bytes / 2**20:.1f} MiB, hierarchical {hier_bytes / 2**20:.1f} MiB "
          "(+ TCP/IP headers, about 3%)")


if __name__ == "__main__":
    main()
