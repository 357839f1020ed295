"""Where a rank sits in a multi-node job and what its DDP communicates, kept in the trace header.

``perfscope profile`` writes it from every rank (:mod:`perfscope.collect.job_watch`); the trace
reader reads it back (:mod:`perfscope.trace.header`), so a later ``perfscope analyze`` of traces
gathered from several nodes can group the ranks by node and ``perfscope forecast`` can price the
gradients' all-reduce. This module owns the format. It imports nothing heavy: it is loaded into
the profiled script's process.

The header key :data:`JOB_KEY` holds ``{"version": 1, "node": {...}, "ddp": {...} or null}``:

- ``node``: ``node_rank`` (torchrun's ``GROUP_RANK``), ``nnodes`` (``WORLD_SIZE /
  LOCAL_WORLD_SIZE``), ``local_rank``, ``local_world_size`` and ``host`` (the host name; nodes
  emulated in network namespaces of one machine share it, hence the node rank);
- ``ddp`` (the first ``DistributedDataParallel`` the script built, from its own logging data):
  ``bucket_bytes`` (each gradient bucket's size in bytes, in the order DDP all-reduces them),
  ``gradient_bytes`` (their sum), ``bucket_cap_bytes``, ``comm_hook`` (its name, or null),
  ``world_size``, and DDP's averages over the iterations it sampled, in microseconds (trace
  units): ``backward_compute_us``, ``backward_comm_us`` (first bucket ready to last bucket
  reduced) and ``backward_overlap_us`` (the part of it during backward compute); null until
  DDP has sampled an iteration;
- ``loader`` (the first DataLoader the script iterated, or absent): ``num_workers``,
  ``prefetch_factor`` (null without workers), ``persistent_workers``, ``pin_memory``,
  ``batch_size`` (null for a batch sampler) and ``cores`` (the CPUs the process may run on:
  its affinity), so that the io advice fits what the script already has.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

JOB_KEY = "perfscope_job"
VERSION = 1
NODE_FIELDS = ("node_rank", "nnodes", "local_rank", "local_world_size")
DDP_TIMES_US = ("backward_compute_us", "backward_comm_us", "backward_overlap_us")


# Beyond these a value is not a measurement: counts past any cluster, buckets past a petabyte,
# times past a day (µs). Keeps every derived figure of the summary finite and below 2**63.
MAX_COUNT = 1 << 20
MAX_BUCKET_BYTES = 1 << 50
MAX_BUCKETS = 1 << 16
MAX_TIME_US = 86_400e6


def _whole(v, high: int = MAX_COUNT) -> bool:
    return type(v) is int and 0 <= v <= high


class _Part(msgspec.Struct, kw_only=True):
    """A part of the job record as read (:func:`parse`); in ``summary.json`` each field may be
    absent (older summaries), so each has a default."""


class NodeRecord(_Part):
    """Where a rank sits in the job (the trace table's ``node``)."""

    node_rank: Annotated[int | None, Meta(description="torchrun's `GROUP_RANK`")] = None
    nnodes: Annotated[int | None, Meta(description='nodes of the job')] = None
    local_rank: Annotated[int | None, Meta(description='the rank on its node')] = None
    local_world_size: Annotated[int | None, Meta(description='ranks a node')] = None
    host: Annotated[str | None, Meta(description='the host name')] = None


class DdpRecord(_Part):
    """`details.facts.ddp` (*v2*): the first rank's DDP record (the first `DistributedDataParallel`
    the script built, from DDP's own logging data)."""

    bucket_bytes: Annotated[list[int] | None, Meta(description=(
        "each gradient bucket's size in bytes, in the order DDP all-reduces them"))] = None
    gradient_bytes: Annotated[int | None, Meta(description='their sum')] = None
    bucket_cap_bytes: Annotated[int | None, Meta(description="DDP's bucket cap")] = None
    comm_hook: Annotated[str | None, Meta(description='the communication hook, by name')] = None
    world_size: Annotated[int | None, Meta(description='the ranks it all-reduces over')] = None
    backward_compute_us: Annotated[float | None, Meta(description=(
        "DDP's average backward compute over the iterations it sampled (null until it sampled one)"))] = None
    backward_comm_us: Annotated[float | None, Meta(description='first bucket ready to last bucket reduced')] = None
    backward_overlap_us: Annotated[float | None, Meta(description='the part of it during backward compute')] = None


class LoaderRecord(_Part):
    """`details.facts.loader` (*v2*): the first DataLoader the script iterated (`perfscope profile`)."""

    num_workers: Annotated[int | None, Meta(description='its worker processes')] = None
    cores: Annotated[int | None, Meta(description='the CPUs the process may run on (its affinity)')] = None
    prefetch_factor: Annotated[int | None, Meta(description='batches a worker loads ahead (null without workers)')] = None
    batch_size: Annotated[int | None, Meta(description='samples a batch (null for a batch sampler)')] = None
    persistent_workers: Annotated[bool | None, Meta(description='workers kept between epochs')] = None
    pin_memory: Annotated[bool | None, Meta(description='batches in page-locked memory')] = None


def parse(value) -> tuple[NodeRecord | None, DdpRecord | None, LoaderRecord | None, list[str]]:
    """``(node, ddp, loader, problems)`` from the header value under :data:`JOB_KEY`.

    Args:
        value: Any JSON value.

    Returns:
        ``node`` (the four counts and ``host``, or None), ``ddp`` and ``loader`` (as in the module
        docstring, or None) and one line per part refused (a field of the wrong type or out of
        range).
    """
    if not isinstance(value, dict) or value.get("version") != VERSION:
        return None, None, None, ["not perfscope's job record (version 1)"]
    problems: list[str] = []
    node, ddp, loader = _node(value.get("node")), _ddp(value.get("ddp")), _loader(value.get("loader"))
    if node is None and value.get("node") is not None:
        problems.append("its node is not four whole numbers in range")
    if ddp is None and value.get("ddp") is not None:
        problems.append("its DDP buckets are not a list of positive byte counts (at most 2**50 in all)")
    if loader is None and value.get("loader") is not None:
        problems.append("its DataLoader is not a worker count and a core count in range")
    return node, ddp, loader, problems


def _loader(loader) -> LoaderRecord | None:
    """The loader record with its worker and core counts in range, else None; another field of
    the wrong type becomes None."""
    if not (isinstance(loader, dict) and _whole(loader.get("num_workers")) and _whole(loader.get("cores"))
            and loader["cores"] > 0):
        return None
    flag = {k: loader.get(k) if isinstance(loader.get(k), bool) else None for k in ("persistent_workers", "pin_memory")}
    count = {k: loader.get(k) if _whole(loader.get(k)) and loader.get(k) > 0 else None
             for k in ("prefetch_factor", "batch_size")}
    return LoaderRecord(num_workers=loader["num_workers"], cores=loader["cores"], **count, **flag)


def _node(node) -> NodeRecord | None:
    """The node record with its four counts in range (a rank below its count), else None."""
    if not (isinstance(node, dict) and all(_whole(node.get(k)) for k in NODE_FIELDS)):
        return None
    if node["node_rank"] >= max(node["nnodes"], 1) or node["local_rank"] >= max(node["local_world_size"], 1):
        return None
    return NodeRecord(**{k: node[k] for k in NODE_FIELDS}, host=node.get("host") if isinstance(node.get("host"), str) else None)


def _ddp(ddp) -> DdpRecord | None:
    """The DDP record with its buckets positive byte counts (at most 2**50 in all), else None;
    a field of the wrong type or out of range becomes None."""
    buckets = ddp.get("bucket_bytes") if isinstance(ddp, dict) else None
    if not _buckets(buckets):
        return None
    times = {k: _time(ddp.get(k)) for k in DDP_TIMES_US}
    hook, cap, world = ddp.get("comm_hook"), ddp.get("bucket_cap_bytes"), ddp.get("world_size")
    return DdpRecord(bucket_bytes=list(buckets), gradient_bytes=int(sum(buckets)),
                     bucket_cap_bytes=cap if _whole(cap, MAX_BUCKET_BYTES) else None,
                     comm_hook=hook if isinstance(hook, str) else None, world_size=world if _whole(world) else None,
                     **times)


def _buckets(buckets) -> bool:
    """Whether ``buckets`` is a list of 1 to 2**16 positive byte counts, at most 2**50 in all."""
    return (isinstance(buckets, list) and 0 < len(buckets) <= MAX_BUCKETS
            and all(_whole(b, MAX_BUCKET_BYTES) and b > 0 for b in buckets) and sum(buckets) <= MAX_BUCKET_BYTES)


def _time(v) -> float | None:
    """``v`` as a time in µs from 0 to a day, else None."""
    return float(v) if type(v) in (int, float) and 0 <= v <= MAX_TIME_US else None
