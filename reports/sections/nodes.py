"""Nodes and links: the ranks of a multi-node job by node, node clocks, the process groups inside
and across nodes, what the gradients' all-reduce puts on each node's link, and the node the
others wait for. Absent (an empty string) for a job of one node."""

from __future__ import annotations

from perfscope.record.schema import Link, NodeRow, Nodes, ProcessGroups, StragglerNode
from perfscope.record.view import Record, record_of
from perfscope.reports import model
from perfscope.reports.html import count, esc, ms, note, num, section, table


def _rate(bits_per_s) -> str:
    v = num(bits_per_s)
    if v is None:
        return "-"
    return f"{v / 1e9:.2f} Gbit/s" if v >= 1e9 else f"{v / 1e6:.0f} Mbit/s"


def _ranks(ranks) -> str:
    return ", ".join(esc(r) for r in (ranks or [])[:32]) + (" …" if len(ranks or []) > 32 else "")


def render(summary: dict | Record) -> str:
    nv = model.details(record_of(summary)).nodes
    if nv is None or nv.nodes is None:
        return ""
    rows, link, slow = nv.nodes, nv.link, nv.straggler_node
    tab = _node_table(rows, (link.achieved_bits_per_s if link else None) or {}, slow)
    return section("nodes", "Nodes and links", _lead(nv, rows, slow) + _gradients(link)
                   + _groups(nv.process_groups or ProcessGroups()) + tab)


def _lead(nv: Nodes, rows: list[NodeRow], slow: StragglerNode | None) -> str:
    """How the nodes were told apart, the node the others wait for, and the clocks' offsets."""
    source = {"perfscope": "the node ranks perfscope recorded", "host name": "the host names in the traces"}
    text = f"<p>{esc(nv.count)} nodes, told apart by {esc(source.get(nv.source, nv.source))}."
    if slow is not None:
        text += (f" Node {esc(slow.node)} is the one the others wait for: it holds the straggler, rank "
                 f"{esc(slow.rank)}, and its ranks wait least in the collectives. A slow or busy node "
                 "(thermal throttling, a noisy neighbour, a failing NIC) looks like this: every one of its "
                 "ranks arrives later than every rank of the other nodes.")
    offsets = [n for n in rows if n.clock_offset_us]
    if offsets:
        text += (" Node clocks disagree, and the collectives prove by how much: "
                 + ", ".join(f"node {esc(n.node)} {ms(n.clock_offset_us)}" for n in offsets)
                 + " against node 0, taken out before arrivals were compared.")
    return text + "</p>"


def _node_table(rows: list[NodeRow], rates: dict, slow: StragglerNode | None) -> str:
    trows = [("hl" if slow is not None and n.node == slow.node else "",
              [esc(n.node), esc(n.host or "-"), _ranks(n.ranks)]
              + [ms(v, unit=False) for v in (n.median_step_time_us, n.median_comm_us, n.median_late_us,
                                             n.median_collective_wait_us, n.clock_offset_us)]
              + [_rate(rates.get(str(n.node)))]) for n in rows]
    return table([("node", "l"), ("host", "l"), ("ranks", "l"), ("median step (ms)", ""), ("median comm (ms)", ""),
                  ("latest rank arrives late (ms)", ""), ("waits in collectives (ms)", ""), ("clock offset (ms)", ""),
                  ("link carried at least", "")], trows,
                 "Medians over the node's ranks. Link carried at least: the bytes the all-reduce puts on the node's "
                 "link per step divided by the node's median communication time (which also holds the intra-node "
                 "part and any waiting), so the link's real rate is at least this.")


def _gradients(link: Link | None) -> str:
    """What the gradients' all-reduce puts on each node's link ("" without a DDP record)."""
    if link is None:
        return ""
    return (f"<p>Gradients: {count(link.gradient_bytes)} bytes in {esc(link.buckets)} DDP "
            f"bucket(s), reduced by a {esc(link.algorithm)} all-reduce"
            f"{' (' + esc(link.comm_hook) + ')' if link.comm_hook else ''}: "
            f"{count(link.inter_node_bytes_per_step)} bytes through each node's link per step. "
            "perfscope forecast prices the same step on other node counts and links.</p>")


def _groups(pg: ProcessGroups) -> str:
    """The process groups inside and across nodes, or a note that the traces list none."""
    groups = pg.groups or []
    if not groups:
        return note("The traces list no process groups (distributedInfo.pg_config).")
    return (f"<p>Process groups: {esc(pg.intra_node)} inside one node (the node's own links: NVLink "
            f"or PCIe between GPUs, loopback between CPU ranks), {esc(pg.inter_node)} across nodes (the network).</p>"
            + table([("group", "l"), ("description", "l"), ("ranks", ""), ("where", "l")],
                    [("", [esc(g.name), esc(g.desc), esc(g.size), esc(g.span)])
                     for g in groups[:32]]))
