"""The nodes of a multi-node job: ranks grouped by node, node clocks aligned, the process groups
placed inside or across nodes, and the node the others wait for.

Which node a rank ran on comes from the trace header (:mod:`perfscope.trace.header`):
``perfscope profile`` records the node rank (:mod:`perfscope.record.job_facts`); traces from elsewhere
carry the profiler's ``host_name``, which tells nodes apart when they have distinct names. With
neither, or with one node, there is no node view (``None``) and nothing is guessed.

**Clocks.** Each node has its own clock; NTP keeps them within about a millisecond, but not
always. No rank leaves a collective before all have entered it, which bounds each node's offset
from node 0 (:func:`node_offsets_ns`); an offset the bounds prove is taken out of that node's
arrivals before lateness is measured (:func:`perfscope.analysis.ranks.collective_skew`) and is
reported.

**Process groups.** ``distributedInfo.pg_config`` lists each group's ranks: a group whose ranks
sit on one node communicates over the node's own links (NVLink, shared memory), one spanning
nodes crosses the network. Per-collective group ids are not in gloo traces, so collectives are
attributed only where their name says it (the hierarchical hook labels its stages).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.record.schema import Link, NodeRow, Nodes, ProcessGroup, ProcessGroups, RankRow, Straggler, StragglerNode

if TYPE_CHECKING:
    from perfscope.analysis.rank_trace import RankTrace

_NS_PER_US = 1000.0
MAX_BITS_PER_S = 8e15  # 1 PB/s: no link carries more
# The hierarchical hook's stage labels (perfscope.runtime.hierarchical): where each one runs.
STAGE_SPANS = {"perfscope.hier.reduce_scatter": "intra-node", "perfscope.hier.all_reduce": "inter-node",
               "perfscope.hier.all_gather": "intra-node"}


def node_of_ranks(rank_traces: list[RankTrace], ranks: list[int]) -> tuple[dict[int, int], str | None]:
    """Rank -> node index, and what it was read from (``"perfscope"``, ``"host name"``).

    Returns ``({}, None)`` when the traces do not tell nodes apart (one node, or no record).
    """
    recorded = {r: rt.table.node.node_rank for rt, r in zip(rank_traces, ranks) if rt.table.node}
    if len(recorded) == len(ranks) and len(set(recorded.values())) > 1:
        return recorded, "perfscope"
    hosts = {r: rt.table.host for rt, r in zip(rank_traces, ranks)}
    if None not in hosts.values() and len(set(hosts.values())) > 1:
        # Node index by first appearance in rank order: node 0 holds rank 0, as torchrun numbers them.
        order = {h: i for i, h in enumerate(dict.fromkeys(hosts[r] for r in sorted(hosts)))}
        return {r: order[h] for r, h in hosts.items()}, "host name"
    return {}, None


def node_offsets_ns(matched: pd.DataFrame, nodes: dict[int, int]) -> dict[int, float]:
    """Each node's clock offset from node 0 (ns) that causality proves, from matched collectives.

    No rank can leave a collective before every rank has entered it. So for node ``n`` and every
    collective ``c``, with ``A`` the last arrival and ``E`` the first end of a node's ranks, the
    offset ``o`` of ``n``'s clock satisfies ``A_n(c) - E_0(c) <= o <= E_n(c) - A_0(c)``. Where 0
    lies in the intersection of these intervals the clocks are consistent and the offset is 0 (a
    late node and a node whose clock is behind look alike in arrivals; only a proven offset is
    taken out). Where it does not, the offset is the median difference of the nodes' mean ends
    (a blocking collective releases its ranks at nearly one instant, whoever arrived last),
    kept inside the intersection. An empty intersection (a drifting clock, which no constant
    offset fixes) leaves the node at 0 for the clock check of
    :func:`perfscope.analysis.ranks.collective_skew` to report.

    Args:
        matched: One row per rank and matched collective: ``rank``, ``step``, ``name``, ``k``,
            ``arrival_ns``, ``dur_ns``.
        nodes: Rank -> node.
    """
    if matched.empty or len(set(nodes.values())) < 2:
        return {}
    m = matched.assign(node=matched["rank"].map(nodes), end=matched["arrival_ns"] + matched["dur_ns"])
    g = m.groupby(["step", "name", "k", "node"])
    last_in, first_out = g["arrival_ns"].max().unstack("node"), g["end"].min().unstack("node")
    mean_end = g["end"].mean().unstack("node")
    ref = min(last_in.columns)
    out = {}
    for n in last_in.columns:
        lo = float(np.nanmax(last_in[n] - first_out[ref]))
        hi = float(np.nanmin(first_out[n] - last_in[ref]))
        proven = lo <= hi and not lo <= 0.0 <= hi
        out[int(n)] = float(np.clip(np.nanmedian(mean_end[n] - mean_end[ref]), lo, hi)) if proven else 0.0
    return out


def subgroup_count(rank_traces: list[RankTrace]) -> int:
    """Process groups smaller than the world in any trace's ``pg_config`` (0 when none is listed).

    gloo's collectives carry no group in the trace, so with such groups the k-th ``gloo:all_gather``
    of one rank may be another group's collective than the k-th of another rank: collectives can
    then not be matched across ranks by name and order.
    """
    seen = set()
    for rt in rank_traces:
        world = rt.table.world_size
        for pg in rt.table.process_groups:
            size = len(pg.ranks) if pg.ranks is not None else pg.pg_size
            if size is not None and world is not None and 0 < size < world:
                seen.add(str(pg.pg_name))
    return len(seen)


def process_groups(rank_traces: list[RankTrace], nodes: dict[int, int]) -> ProcessGroups:
    """The job's process groups (from any trace's ``pg_config``) as inside one node or across."""
    seen: dict[str, dict] = {}
    for rt in rank_traces:
        for pg in rt.table.process_groups:
            if pg.ranks is None or not all(type(r) is int for r in pg.ranks):
                continue
            on = {nodes.get(r) for r in pg.ranks}
            span = "unknown" if None in on else ("intra-node" if len(on) == 1 else "inter-node")
            seen.setdefault(str(pg.pg_name), ProcessGroup(
                name=str(pg.pg_name)[:80], desc=(pg.pg_desc or "")[:80], size=len(pg.ranks), span=span))
    groups = list(seen.values())
    return ProcessGroups(groups=groups[:64], intra_node=sum(g.span == "intra-node" for g in groups),
                         inter_node=sum(g.span == "inter-node" for g in groups))


def node_view(rank_traces: list[RankTrace], ranks: list[int], nodes: dict[int, int], source: str | None,
              rows: list[RankRow], skew: dict) -> Nodes | None:
    """The ``details.nodes`` entry of the summary (``docs/metrics.md``), or None for one node.

    Args:
        rank_traces, ranks: The traces and their ranks.
        nodes, source: From :func:`node_of_ranks`.
        rows: ``details.ranks`` (median step, comm, lateness and wait per rank; microseconds).
        skew: :func:`perfscope.analysis.ranks.collective_skew`'s result.
    """
    if not nodes:
        return None
    by_rank = {r.rank: r for r in rows}
    hosts = {r: rt.table.host for rt, r in zip(rank_traces, ranks)}
    offsets = skew.get("node_offsets_ns") or {}
    out = [_node_row(node, [r for r in sorted(nodes) if nodes[r] == node], by_rank, hosts, offsets.get(node, 0.0))
           for node in sorted(set(nodes.values()))]
    slow = _slow_node(skew["straggler"], nodes, by_rank)
    return Nodes(source=source, count=len(out), nodes=out, straggler_node=slow,
                 problems=_contradictions(rank_traces, ranks, nodes) if source == "perfscope" else [],
                 process_groups=process_groups(rank_traces, nodes), link=link_use(rank_traces, nodes, out))


def _node_row(node: int, its_ranks: list[int], by_rank: dict[int, RankRow], hosts: dict, offset_ns: float) -> NodeRow:
    """A node's row: its host and ranks, the medians of its ranks' step and communication times
    and collective waits, its latest rank's lateness, and its clock's offset (µs)."""
    mine = [by_rank[r] for r in its_ranks if r in by_rank]

    def median(key: str) -> float | None:
        values = [getattr(r, key) for r in mine if getattr(r, key) is not None]
        return float(np.median(values)) if values else None

    late = [r.median_late_us for r in mine if r.median_late_us is not None]
    return NodeRow(node=node, host=hosts.get(its_ranks[0]) if its_ranks else None, ranks=[r.rank for r in mine],
                   median_step_time_us=median("median_step_time_us"), median_comm_us=median("median_comm_us"),
                   median_late_us=max(late) if late else None,
                   median_collective_wait_us=median("median_collective_wait_us"), clock_offset_us=offset_ns / _NS_PER_US)


def _contradictions(rank_traces: list[RankTrace], ranks: list[int], nodes: dict[int, int]) -> list[str]:
    """What the job records say against each other (each one line), for the warnings."""
    out = []
    records = {r: rt.table.node for rt, r in zip(rank_traces, ranks) if rt.table.node}
    counts = sorted({n.nnodes for n in records.values()})
    if len(counts) > 1:
        out.append(f"the ranks' job records disagree on the number of nodes ({', '.join(map(str, counts))})")
    moved = [r for r, n in records.items() if n.node_rank != r // max(n.local_world_size, 1)]
    if moved:
        out.append(f"rank(s) {', '.join(map(str, sorted(moved)[:8]))} are not on the node torchrun's numbering puts them "
                   "on (rank // ranks per node): the node view follows the records")
    seen = len(set(nodes.values()))
    if counts and seen < counts[-1]:
        out.append(f"traces of {seen} of the job's {counts[-1]} nodes were analyzed")
    return out


def _slow_node(straggler: Straggler | None, nodes: dict[int, int], by_rank: dict[int, RankRow]) -> StragglerNode | None:
    """The node the others wait for: the straggler's node, when every one of its ranks arrives
    later (median lateness per step) than every rank of every other node -- a node slow as a whole
    (a busy or throttled host, a slow NIC), not one slow rank on it. None otherwise."""
    if straggler is None or straggler.basis != "arrival":
        return None
    node = nodes.get(straggler.rank)
    late = {r: by_rank[r].median_late_us for r in nodes if r in by_rank and by_rank[r].median_late_us is not None}
    mine = [v for r, v in late.items() if nodes[r] == node]
    others = [v for r, v in late.items() if nodes[r] != node]
    if node is None or not mine or not others or min(mine) <= max(others):
        return None
    return StragglerNode(node=node, rank=straggler.rank, basis=straggler.basis)


def link_use(rank_traces: list[RankTrace], nodes: dict[int, int], node_rows: list[NodeRow]) -> Link | None:
    """What the gradients' all-reduce puts on each node's link per step, and the rate that implies.

    From the first DDP record (:mod:`perfscope.record.job_facts`) with ``S`` gradient bytes, ``N`` nodes
    of ``G`` ranks: a flat ring sends ``2(NG-1)/NG * S`` through each node's link per step, the
    hierarchical all-reduce ``2(N-1)/N * S`` (its inter-node groups together); divided by the
    node's median communication time per step this is the rate its link carried at least (the
    communication time includes the intra-node part and any waiting). None without a DDP record.
    """
    ddp = next((rt.table.ddp for rt in rank_traces if rt.table.ddp), None)
    if ddp is None:
        return None
    n = len(set(nodes.values()))
    g = max(1, round(len(nodes) / n))
    hierarchical = "hierarchical" in (ddp.comm_hook or "")
    size = ddp.gradient_bytes
    per_node = (2 * (n - 1) / n if hierarchical else 2 * (n * g - 1) / (n * g)) * size
    rates = {row.node: per_node * 8 / (row.median_comm_us / 1e6) for row in node_rows if row.median_comm_us}
    rates = {k: v for k, v in rates.items() if v <= MAX_BITS_PER_S}  # beyond, the times are not a link's
    slowest = min(rates, key=rates.get) if rates else None
    return Link(gradient_bytes=size, buckets=len(ddp.bucket_bytes), comm_hook=ddp.comm_hook,
                algorithm="hierarchical" if hierarchical else "flat ring", inter_node_bytes_per_step=per_node,
                achieved_bits_per_s={str(k): v for k, v in rates.items()}, slowest_link_node=slowest)
