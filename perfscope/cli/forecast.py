"""``perfscope forecast``: the command's options, its table, and ``forecast.json``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from perfscope.cli.args import one_line_errors, number, out_path, whole
from perfscope.errors import PerfscopeError
from perfscope.text import safe
from perfscope.units import format_bandwidth, parse_bandwidth

if TYPE_CHECKING:
    from perfscope.record.view import Record

MAX_NODES = 100_000
MAX_LATENCY_US = 1e6
# Per-message latency when the user gives none: a TCP message inside a rack (inter-node) and
# shared memory or NVLink (intra-node) take tens of microseconds, resp. a few (NCCL's tuning
# model uses similar base latencies); what matters at the bucket sizes of DDP is the bandwidth.
DEFAULT_INTER_LATENCY_US = 50.0
DEFAULT_INTRA_LATENCY_US = 5.0


def _bandwidth(text: str) -> float:
    try:
        return parse_bandwidth(text)[0]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None



def add_forecast_parser(sub) -> None:
    """Add ``forecast`` to the ``perfscope`` sub-commands."""
    f = sub.add_parser(
        "forecast",
        help="predict step time and scaling efficiency on other nodes and links, flat vs hierarchical all-reduce",
        description="From one profile (summary.json or its output directory), predict the step time and scaling "
        "efficiency of the same job on NODES x RANKS_PER_NODE ranks over the given links, for a flat ring and the "
        "hierarchical all-reduce, and say which to use. Writes forecast.json. See docs/multinode.md.",
    )
    f.error = one_line_errors("forecast")
    f.add_argument("summary", metavar="SUMMARY_OR_OUT_DIR", help="summary.json, or the output directory holding it")
    f.add_argument("--nodes", type=whole(1, MAX_NODES), required=True, metavar="N", help="nodes of the target job")
    f.add_argument("--ranks-per-node", type=whole(1, 1024), required=True, metavar="G", help="ranks on each node")
    f.add_argument("--inter-node", type=_bandwidth, required=True, metavar="BW",
                   help="each node's network bandwidth, with a unit: 200Mbit, 25Gbit, 10GB (bytes)")
    f.add_argument("--intra-node", type=_bandwidth, default=None, metavar="BW",
                   help="bandwidth between ranks of a node (default: measured from the profile, which must then "
                   "be of one node with several ranks)")
    f.add_argument("--inter-node-latency", type=number(0.0, MAX_LATENCY_US, "a number of microseconds"),
                   default=DEFAULT_INTER_LATENCY_US, metavar="US",
                   help=f"per-message latency between nodes, µs (default {DEFAULT_INTER_LATENCY_US:g})")
    f.add_argument("--intra-node-latency", type=number(0.0, MAX_LATENCY_US, "a number of microseconds"),
                   default=DEFAULT_INTRA_LATENCY_US, metavar="US",
                   help=f"per-message latency inside a node, µs (default {DEFAULT_INTRA_LATENCY_US:g})")
    f.add_argument("--gradient-mb", type=number(0.001, 1e7, "a number of MiB"), default=None, metavar="MIB",
                   help="gradient size when the profile holds no DDP record (traces not taken by perfscope profile)")
    f.add_argument("--out", type=out_path, default=None, metavar="DIR",
                   help="where forecast.json goes (default: beside the summary)")


def run(args, summary_path: Path, summary: Record) -> int:
    """Forecast, print the table, write ``forecast.json``; 0 on success.

    Raises:
        PerfscopeError: the profile cannot price the target (see :func:`perfscope.forecast.from_summary`),
            or the intra-node bandwidth is neither given nor measurable.
    """
    from perfscope.atomic import write_bytes_atomic
    from perfscope.forecast import Link, forecast, from_summary, target_cluster

    inputs = from_summary(summary, gradient_mb=args.gradient_mb)
    intra_latency = args.intra_node_latency / 1e6
    if args.intra_node is not None:
        intra, intra_source = Link(bytes_per_s=args.intra_node, latency_s=intra_latency), "given"
    else:
        intra = inputs.measured_intra_link(intra_latency)
        if intra is None:
            raise PerfscopeError(f"the profile ran {inputs.world} rank(s) on {inputs.nodes} node(s), which does not measure "
                                 "the intra-node link: give --intra-node BW")
        intra_source = "measured from the profile"
    inter = Link(bytes_per_s=args.inter_node, latency_s=args.inter_node_latency / 1e6)
    cluster = target_cluster(args.nodes, args.ranks_per_node, intra, inter, inputs.mode)
    result = forecast(inputs, cluster)
    record = {
        "schema": "perfscope.forecast", "schema_version": 1,
        "summary": str(summary_path),
        "target": {"nodes": args.nodes, "ranks_per_node": args.ranks_per_node,
                   "inter_node_bytes_per_s": inter.bytes_per_s, "inter_node_latency_s": inter.latency_s,
                   "intra_node_bytes_per_s": intra.bytes_per_s, "intra_node_latency_s": intra.latency_s,
                   "intra_node_source": intra_source, "chunk_bytes": cluster.chunk_bytes},
        "profile": {"compute_s": inputs.compute_s, "backward_s": inputs.backward_s,
                    "backward_source": inputs.backward_source, "gradient_bytes": inputs.gradient_bytes,
                    "buckets": list(inputs.buckets), "allreduce_s": inputs.allreduce_s, "world_size": inputs.world,
                    "nodes": inputs.nodes, "ranks_per_node": inputs.ranks_per_node, "mode": inputs.mode,
                    "steps": inputs.steps, "provisional": inputs.provisional},
        **result,
    }
    out_dir = args.out if args.out is not None else summary_path.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "forecast.json"
    replaced = path.exists()
    write_bytes_atomic(path, orjson.dumps(record, option=orjson.OPT_INDENT_2) + b"\n")
    print(format_forecast(record))
    if inputs.provisional:
        print("note: the profile had no clean step (busy host): its compute time is taken from the steps its provisional "
              "verdict classified, without their waits for a core (docs/metrics.md, \"Provisional verdict\")")
    print(f"\n{'replaced' if replaced else 'wrote'} {safe(path)}")
    return 0


def format_forecast(record: dict) -> str:
    """The terminal table of a forecast record."""
    t, p = record["target"], record["profile"]
    lines = [f"forecast: {t['nodes']} node(s) x {t['ranks_per_node']} rank(s); inter-node "
             f"{format_bandwidth(t['inter_node_bytes_per_s'])} ({t['inter_node_latency_s'] * 1e6:g} µs), intra-node "
             f"{format_bandwidth(t['intra_node_bytes_per_s'])} ({t['intra_node_source']})",
             f"from the profile: compute {p['compute_s'] * 1e3:.1f} ms per step (backward {p['backward_s'] * 1e3:.1f} ms, "
             f"{p['backward_source']}), gradients {p['gradient_bytes'] / 2**20:.1f} MiB in {len(p['buckets'])} bucket(s)",
             "",
             f"{'all-reduce':<14}{'per step':>12}{'exposed':>12}{'step time':>12}{'scaling eff.':>14}"]
    for name, label in (("flat", "flat ring"), ("hierarchical", "hierarchical")):
        r = record[name]
        lines.append(f"{label:<14}{r['allreduce_s'] * 1e3:>9.1f} ms{r['exposed_comm_s'] * 1e3:>9.1f} ms"
                     f"{r['step_time_s'] * 1e3:>9.1f} ms{100 * r['scaling_efficiency']:>13.1f}%")
    lines += [f"caution: {c}" for c in record.get("cautions") or []]
    lines += ["", f"recommended: {record['recommended']} ({record['reason']})"]
    return "\n".join(lines)
