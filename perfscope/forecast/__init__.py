"""``perfscope forecast``: step time and scaling efficiency of a profiled job on another cluster,
for a flat ring and a hierarchical all-reduce, and which to use (``docs/multinode.md``).

:func:`forecast` is pure: profile inputs (:mod:`perfscope.forecast.inputs`) and a target
(:class:`perfscope.forecast.model.Cluster`) in, the record written as ``forecast.json`` out.
"""

from __future__ import annotations

import functools

from perfscope.forecast.inputs import ProfileInputs, from_summary
from perfscope.forecast.model import (
    Cluster,
    Link,
    flat_allreduce_s,
    hierarchical_allreduce_s,
    step_time_s,
)
from perfscope.runtime.chunking import CHUNK_BYTES

__all__ = ["MARGIN", "Cluster", "Link", "ProfileInputs", "forecast", "from_summary", "target_cluster"]

# Recommend the hierarchical all-reduce only when it is predicted this much faster: below it the
# model's error (docs/multinode.md) is larger than the gain, and flat is DDP's default.
MARGIN = 0.05
# CPU ranks move bytes with their own cores. Where the network is at least this share of the
# loopback bandwidth the profile measured, communication costs about as much CPU as link time,
# which the model leaves out: measured on emulated nodes, it was within 9% below this share and
# predicted the hierarchical all-reduce 1.16x faster where it was 2.3x slower above it.
CPU_BOUND_SHARE = 0.25


def target_cluster(nodes: int, ranks_per_node: int, intra: Link, inter: Link, mode: str) -> Cluster:
    """The target, with the hook's pipelining as it runs there: chunked on CPU ranks (gloo), not
    on GPUs (NCCL orders the stages on its streams)."""
    return Cluster(nodes=nodes, ranks_per_node=ranks_per_node, intra=intra, inter=inter,
                   chunk_bytes=CHUNK_BYTES if mode == "cpu" else None)


def forecast(inputs: ProfileInputs, cluster: Cluster) -> dict:
    """Predict one step on ``cluster`` under both algorithms.

    Where the model does not hold (CPU ranks on a network at least :data:`CPU_BOUND_SHARE` of
    their loopback bandwidth) ``cautions`` says so and the recommendation stays flat.

    Returns:
        ``{"flat": {...}, "hierarchical": {...}, "recommended": "flat" | "hierarchical",
        "speedup": flat / hierarchical step time, "reason": text, "cautions": [text]}``; each algorithm's entry has
        ``allreduce_s``, ``exposed_comm_s``, ``step_time_s`` (seconds) and ``scaling_efficiency``.
    """
    mode = inputs.mode
    runs = {name: step_time_s(inputs.compute_s, inputs.backward_s, inputs.buckets,
                              functools.partial(fn, c=cluster))
            for name, fn in (("flat", flat_allreduce_s), ("hierarchical", hierarchical_allreduce_s))}
    flat, hier = runs["flat"]["step_time_s"], runs["hierarchical"]["step_time_s"]
    speedup = flat / hier if hier > 0 else 1.0
    cautions = []
    if mode == "cpu" and cluster.nodes > 1 and cluster.inter.bytes_per_s >= CPU_BOUND_SHARE * cluster.intra.bytes_per_s:
        cautions.append(f"the network ({cluster.inter.bytes_per_s * 8 / 1e9:.3g} Gbit/s) is at least "
                        f"{CPU_BOUND_SHARE:.0%} of the CPU ranks' loopback ({cluster.intra.bytes_per_s * 8 / 1e9:.3g} "
                        "Gbit/s): moving the bytes then costs about as much CPU time as link time, which the model "
                        "leaves out, so both step times may be too low, the hierarchical one most")
    if cluster.nodes == 1 or cluster.ranks_per_node == 1:
        pick, why = "flat", "one node, or one rank per node: the hierarchical all-reduce has nothing to split"
    elif cautions and speedup > 1:
        pick, why = "flat", (f"the hierarchical all-reduce is predicted {speedup:.2f}x faster, but outside the range "
                             "the model holds in (see the caution): keep DDP's default, or measure both with "
                             "perfscope tune")
    elif speedup >= 1 + MARGIN:
        pick, why = "hierarchical", (f"{speedup:.2f}x faster step: only 1/{cluster.ranks_per_node} of each rank's "
                                     "bytes cross the inter-node link, in parallel groups")
    elif speedup > 1:
        pick, why = "flat", (f"the hierarchical all-reduce is predicted only {speedup:.2f}x faster, within the model's "
                             "error: keep DDP's default")
    else:
        pick, why = "flat", (f"the hierarchical all-reduce is predicted {1 / speedup:.2f}x slower: the intra-node "
                             "reduce-scatter and all-gather cost more than the inter-node link saves")
    return {**runs, "recommended": pick, "speedup": speedup, "reason": why, "cautions": cautions}
