"""The cost model of ``perfscope forecast``: a data-parallel step on N nodes of G ranks, with the
gradients all-reduced by a flat ring or hierarchically, priced from one profile.

**Links** (alpha-beta, Hockney's model as NCCL's tuning model and its ``ring`` cost use it): moving
``m`` bytes in one step over a link of latency ``alpha`` (s) and bandwidth ``beta`` (bytes/s) takes
``alpha + m / beta``. A node has an intra-node link (NVLink, PCIe, shared memory; for CPU ranks
the loopback) and an inter-node link (its NIC) that all of its ranks share.

**Flat ring** over ``W = N*G`` ranks (the ring all-reduce of Patarasuk and Yuan, 2009, and NCCL's
``ring``): ``2(W-1)`` steps, each moving ``b/W`` bytes of a ``b``-byte bucket on every hop at
once. With ``N > 1`` some hops cross nodes, so each step is as slow as the slower link::

    T_flat(b) = 2(W-1) * (alpha_max + (b/W) / min(beta_intra, beta_inter))

**Hierarchical** (perfscope.runtime.hierarchical): an intra-node reduce-scatter and all-gather
(``G-1`` steps of ``b/G`` each on the intra-node link) around an inter-node ring all-reduce of
each rank's ``b/G`` shard among the ``N`` nodes, whose ``G`` groups share the NIC::

    RS = AG = (G-1) * (alpha_intra + (b/G) / beta_intra)
    AR      = 2(N-1) * alpha_inter + 2(N-1)/N * b / beta_inter

On CPU ranks the hook pipelines the three stages over chunks of ``chunk_bytes``: with ``C``
chunks, stage times per chunk ``s_i`` (each stage pays its latency per chunk),
``T = sum(s_i) + (C-1) * max(s_i)``; on GPUs (NCCL) the stages run one after the other, ``C = 1``.

**Overlap with backward** (DDP's bucketed all-reduce, Li et al., VLDB 2020): buckets are all-reduced
one after another in DDP's order, each as soon as it is ready and the previous one is done. Bucket
``k`` is taken to be ready when backward has produced its share of the gradient bytes (gradients
appear at a uniform rate over the backward time ``T_b``). The communication left after backward
ends is exposed::

    e_k = max(e_{k-1}, T_b * (b_0 + ... + b_k) / S) + T(b_k);  exposed = max(0, e_last - T_b)
    step = compute + exposed

``compute`` is the profiled step without its exposed communication: it stays the same per rank
as the job grows (weak scaling, the same per-rank batch). **Scaling efficiency** is
``compute / step``: the throughput of the W ranks against W times one rank that never waits
for the network.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence


@dataclasses.dataclass(kw_only=True, frozen=True)
class Link:
    """One kind of link: bandwidth in bytes per second (> 0), latency in seconds (>= 0)."""

    bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.bytes_per_s > 0 and math.isfinite(self.bytes_per_s)):
            raise ValueError(f"a link's bandwidth must be a positive number of bytes/s, got {self.bytes_per_s!r}")
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"a link's latency must be >= 0 s, got {self.latency_s!r}")

    def move(self, steps: int, nbytes: float) -> float:
        """Seconds for ``steps`` sequential steps of ``nbytes`` each."""
        return steps * (self.latency_s + nbytes / self.bytes_per_s)


@dataclasses.dataclass(kw_only=True, frozen=True)
class Cluster:
    """The target: ``nodes`` x ``ranks_per_node``, the two links, and how the hook pipelines.

    Attributes:
        nodes: N (>= 1).
        ranks_per_node: G (>= 1).
        intra: The intra-node link.
        inter: The inter-node link (each node's NIC, shared by its ranks).
        chunk_bytes: The hierarchical hook's pipeline chunk (bytes); None: no pipelining (GPU).
    """

    nodes: int
    ranks_per_node: int
    intra: Link
    inter: Link
    chunk_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("nodes", "ranks_per_node"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node


def flat_allreduce_s(nbytes: float, c: Cluster) -> float:
    """Seconds for a flat ring all-reduce of one ``nbytes`` bucket (module docstring)."""
    w = c.world
    if w == 1:
        return 0.0
    if c.nodes == 1:
        return c.intra.move(2 * (w - 1), nbytes / w)
    if c.ranks_per_node == 1:
        return c.inter.move(2 * (w - 1), nbytes / w)
    slow = Link(bytes_per_s=min(c.intra.bytes_per_s, c.inter.bytes_per_s),
                latency_s=max(c.intra.latency_s, c.inter.latency_s))
    return slow.move(2 * (w - 1), nbytes / w)


def hierarchical_stages_s(nbytes: float, c: Cluster) -> tuple[float, float, float]:
    """Seconds of the reduce-scatter, inter-node all-reduce and all-gather of one bucket."""
    n, g = c.nodes, c.ranks_per_node
    rs = c.intra.move(g - 1, nbytes / g)
    ar = 2 * (n - 1) * c.inter.latency_s + 2 * (n - 1) / n * nbytes / c.inter.bytes_per_s
    return rs, ar, rs


def hierarchical_allreduce_s(nbytes: float, c: Cluster) -> float:
    """Seconds for the hierarchical all-reduce of one ``nbytes`` bucket (module docstring);
    a flat ring where the layout has nothing to split (one node, or one rank per node)."""
    if c.nodes == 1 or c.ranks_per_node == 1:
        return flat_allreduce_s(nbytes, c)
    chunks = max(1, math.ceil(nbytes / c.chunk_bytes)) if c.chunk_bytes else 1
    per_chunk = [_per_chunk(s, steps, link, chunks)
                 for s, steps, link in zip(hierarchical_stages_s(nbytes, c),
                                           (c.ranks_per_node - 1, 2 * (c.nodes - 1), c.ranks_per_node - 1),
                                           (c.intra, c.inter, c.intra))]
    return sum(per_chunk) + (chunks - 1) * max(per_chunk)


def _per_chunk(stage_s: float, steps: int, link: Link, chunks: int) -> float:
    # Each chunk moves 1/C of the bytes but pays every step's latency in full.
    latency = steps * link.latency_s
    return latency + (stage_s - latency) / chunks


def exposed_comm_s(buckets: Sequence[float], backward_s: float, allreduce) -> float:
    """Communication left after backward ends (module docstring: overlap with backward).

    Args:
        buckets: Bucket sizes in bytes, in the order DDP all-reduces them.
        backward_s: Backward compute time per step (s).
        allreduce: Seconds for one bucket: ``f(nbytes) -> s``.
    """
    total = float(sum(buckets)) or 1.0
    done, ready_bytes = 0.0, 0.0
    for b in buckets:
        ready_bytes += b
        done = max(done, backward_s * ready_bytes / total) + allreduce(b)
    return max(0.0, done - backward_s)


def step_time_s(compute_s: float, backward_s: float, buckets: Sequence[float], allreduce) -> dict:
    """The step under one algorithm: ``{"allreduce_s", "exposed_comm_s", "step_time_s",
    "scaling_efficiency"}`` (seconds; efficiency as a fraction)."""
    exposed = exposed_comm_s(buckets, backward_s, allreduce)
    step = compute_s + exposed
    return {"allreduce_s": float(sum(allreduce(b) for b in buckets)), "exposed_comm_s": exposed,
            "step_time_s": step, "scaling_efficiency": compute_s / step if step > 0 else 1.0}
