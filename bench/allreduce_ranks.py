"""The rank side of bench/bench_hierarchical.py: started by torchrun on every emulated node.

Times a flat gloo all-reduce and perfscope's hierarchical all-reduce of the same tensor,
interleaved round by round (flat, hierarchical, flat, ...) so that a busy machine slows both
alike, and counts the bytes each sends through the node's link (``eth0``'s transmit counter,
which inside a network namespace is the node's own). Rank 0 prints one JSON line:
``{"flat_s": [...], "hier_s": [...], "flat_tx": [...], "hier_tx": [...]}`` (seconds per
all-reduce; bytes sent by rank 0's node).

    torchrun ... bench/allreduce_ranks.py --mib 16 --rounds 5 [--chunk-mib 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from perfscope.runtime.hierarchical import HierarchicalAllReduce  # noqa: E402

TX = Path("/sys/class/net/eth0/statistics/tx_bytes")


def tx_bytes() -> int:
    return int(TX.read_text()) if TX.exists() else 0


def timed(fn) -> tuple[float, int]:
    dist.barrier()
    sent, t0 = tx_bytes(), time.perf_counter()
    fn()
    dist.barrier()  # the slowest rank's end: what a training step waits for
    return time.perf_counter() - t0, tx_bytes() - sent


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=float, default=16.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--chunk-mib", type=float, default=None)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    kw = {} if a.chunk_mib is None else {"chunk_bytes": int(a.chunk_mib * 2**20)}
    state = HierarchicalAllReduce(**kw)
    t = torch.randn(int(a.mib * 2**20) // 4)
    ref = t.clone()
    dist.all_reduce(ref)
    check = t.clone()
    state.allreduce(check).wait()
    assert torch.allclose(check, ref / dist.get_world_size(), rtol=1e-5, atol=1e-6), "hierarchical != flat"
    out: dict[str, list] = {"flat_s": [], "hier_s": [], "flat_tx": [], "hier_tx": []}
    for _ in range(a.rounds):
        s, b = timed(lambda: dist.all_reduce(t))
        out["flat_s"].append(s)
        out["flat_tx"].append(b)
        s, b = timed(lambda: state.allreduce(t).wait())
        out["hier_s"].append(s)
        out["hier_tx"].append(b)
    if dist.get_rank() == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
