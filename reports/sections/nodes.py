"""Nodes and links: the ranks of a multi-node job by node, node clocks, the process groups inside
and across nodes, what the gradients' all-reduce puts on each node's link, and the node the
others wait for. Absent (an empty string) for a job of one node."""

from __future__ import annotations

from perfscope.reports import model
from perfscope.reports.html import count, esc, ms, note, num, section, table


def _rate(bits_per_s) -> str:
    v = num(bits_per_s)
    if v is None:
        return "-"
    return f"{v / 1e9:.2f} Gbit/s" if v >= 1e9 else f"{v / 1e6:.0f} Mbit/s"


def _ranks(ranks) -> str:
    return ", ".join(esc(r) for r in (ranks or [])[:32]) + (" …" if len(ranks or []) > 32 else "")


def _obj(value) -> dict:
    return value if isinstance(value, dict) else {}


def render(summary: dict) -> str:
    nv = model.details(summary).get("nodes")
    if not isinstance(nv, dict) or not isinstance(nv.get("nodes"), list):
        return ""
    rows = [n for n in nv["nodes"] if isinstance(n, dict)]
    link = _obj(nv.get("link"))
    slow = nv.get("straggler_node") if isinstance(nv.get("straggler_node"), dict) else None
    tab = _node_table(rows, _obj(link.get("achieved_bits_per_s")), slow)
    return section("nodes", "Nodes and links", _lead(nv, rows, slow) + _gradients(link) + _groups(_obj(nv.get("process_groups")))
                   + tab)


def _lead(nv: dict, rows: list[dict], slow: dict | None) -> str:
    """How the nodes were told apart, the node the others wait for, and the clocks' offsets."""
    source = {"perfscope": "the node ranks perfscope recorded", "host name": "the host names in the traces"}
    text = f"<p>{esc(nv.get('count'))} nodes, told apart by {esc(source.get(nv.get('source'), nv.get('source')))}."
    if slow is not None:
        text += (f" Node {esc(slow.get('node'))} is the one the others wait for: it holds the straggler, rank "
                 f"{esc(slow.get('rank'))}, and its ranks wait least in the collectives. A slow or busy node "
                 "(thermal throttling, a noisy neighbour, a failing NIC) looks like this: every one of its "
                 "ranks arrives later than every rank of the other nodes.")
    offsets = [n for n in rows if num(n.get("clock_offset_us"))]
    if offsets:
        text += (" Node clocks disagree, and the collectives prove by how much: "
                 + ", ".join(f"node {esc(n.get('node'))} {ms(n.get('clock_offset_us'))}" for n in offsets)
                 + " against node 0, taken out before arrivals were compared.")
    return text + "</p>"


def _node_table(rows: list[dict], rates: dict, slow: dict | None) -> str:
    trows = [("hl" if slow is not None and n.get("node") == slow.get("node") else "",
              [esc(n.get("node")), esc(n.get("host") or "-"), _ranks(n.get("ranks"))]
              + [ms(n.get(k), unit=False) for k in ("median_step_time_us", "median_comm_us", "median_late_us",
                                                    "median_collective_wait_us", "clock_offset_us")]
              + [_rate(rates.get(str(n.get("node"))))]) for n in rows]
    return table([("node", "l"), ("host", "l"), ("ranks", "l"), ("median step (ms)", ""), ("median comm (ms)", ""),
                  ("latest rank arrives late (ms)", ""), ("waits in collectives (ms)", ""), ("clock offset (ms)", ""),
                  ("link carried at least", "")], trows,
                 "Medians over the node's ranks. Link carried at least: the bytes the all-reduce puts on the node's "
                 "link per step divided by the node's median communication time (which also holds the intra-node "
                 "part and any waiting), so the link's real rate is at least this.")


def _gradients(link: dict) -> str:
    """What the gradients' all-reduce puts on each node's link ("" without a DDP record)."""
    if not link:
        return ""
    return (f"<p>Gradients: {count(link.get('gradient_bytes'))} bytes in {esc(link.get('buckets'))} DDP "
            f"bucket(s), reduced by a {esc(link.get('algorithm'))} all-reduce"
            f"{' (' + esc(link.get('comm_hook')) + ')' if link.get('comm_hook') else ''}: "
            f"{count(link.get('inter_node_bytes_per_step'))} bytes through each node's link per step. "
            "perfscope forecast prices the same step on other node counts and links.</p>")


def _groups(pg: dict) -> str:
    """The process groups inside and across nodes, or a note that the traces list none."""
    groups = [g for g in pg.get("groups") or [] if isinstance(g, dict)]
    if not groups:
        return note("The traces list no process groups (distributedInfo.pg_config).")
    return (f"<p>Process groups: {esc(pg.get('intra_node'))} inside one node (the node's own links: NVLink "
            f"or PCIe between GPUs, loopback between CPU ranks), {esc(pg.get('inter_node'))} across nodes (the network).</p>"
            + table([("group", "l"), ("description", "l"), ("ranks", ""), ("where", "l")],
                    [("", [esc(g.get("name")), esc(g.get("desc")), esc(g.get("size")), esc(g.get("span"))])
                     for g in groups[:32]]))
