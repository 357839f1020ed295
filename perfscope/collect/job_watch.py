"""The rank side of :mod:`perfscope.record.job_facts`: this rank's place in the job and its DDP.

:class:`JobWatch` notes the first ``DistributedDataParallel`` built while it is active (a weak
reference, so the module is never kept alive by perfscope) and, at every recorded step, gives
the header value to write: DDP's own logging data is read then, after it has sampled iterations.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import weakref
from typing import Any

from perfscope.record.job_facts import JOB_KEY, VERSION
from perfscope.patches import replace


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "")
    return int(raw) if raw.isdigit() else None


def node_record() -> dict | None:
    """This rank's node from torchrun's environment, or None outside a torchrun job."""
    world, local_world = _env_int("WORLD_SIZE"), _env_int("LOCAL_WORLD_SIZE")
    local_rank, node_rank = _env_int("LOCAL_RANK"), _env_int("GROUP_RANK")
    if None in (world, local_world, local_rank) or not local_world:
        return None
    rank = _env_int("RANK")
    if node_rank is None and rank is not None:
        node_rank = rank // local_world  # torchrun numbers ranks node by node
    return {"node_rank": node_rank or 0, "nnodes": max(1, world // local_world), "local_rank": local_rank,
            "local_world_size": local_world, "host": socket.gethostname()}


def _us(ns) -> float | None:
    return float(ns) / 1000.0 if isinstance(ns, (int, float)) and ns > 0 else None


def ddp_record(ddp: Any) -> dict | None:
    """The ``ddp`` part of the record from DDP's ``_get_ddp_logging_data()`` (None if unreadable)."""
    try:
        data = ddp._get_ddp_logging_data()
        buckets = [int(b) for b in str(data.get("bucket_sizes", "")).replace(" ", "").split(",") if b]
    except Exception:  # noqa: BLE001 - a private API: a version without it leaves the record out
        return None
    if not buckets:
        return None
    # DDP lists buckets in its own index order; it all-reduces them in that order, which is the
    # reverse of the parameters' (the last layers' gradients are ready first).
    return {"bucket_bytes": buckets, "bucket_cap_bytes": int(data.get("bucket_cap_bytes") or 0) or None,
            "comm_hook": str(data.get("comm_hook") or "") or None, "world_size": int(data.get("world_size") or 0) or None,
            "backward_compute_us": _us(data.get("avg_backward_compute_time")),
            "backward_comm_us": _us(data.get("avg_backward_comm_time")),
            "backward_overlap_us": _us(data.get("avg_backward_compute_comm_overlap_time"))}


def loader_record(loader: Any) -> dict | None:
    """The ``loader`` part of the record from a ``torch.utils.data.DataLoader`` (None if unreadable)."""
    try:
        workers = int(loader.num_workers)
        record = {"num_workers": workers, "prefetch_factor": loader.prefetch_factor if workers else None,
                  "persistent_workers": bool(loader.persistent_workers), "pin_memory": bool(loader.pin_memory),
                  "batch_size": loader.batch_size}
    except (AttributeError, TypeError, ValueError):  # a loader-like object of another shape
        return None
    return {**record, "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}


class JobWatch:
    """Watch DDP construction and the first DataLoader iterated while active (``with JobWatch()
    as w``); ``w.header()`` is the ``(key, JSON text)`` to add to the trace, or None outside a
    torchrun job without DDP or a DataLoader."""

    def __init__(self) -> None:
        self._ddp: weakref.ref | None = None
        self._loader: dict | None = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> JobWatch:  # noqa: PYI034 - typing.Self needs Python 3.11
        from torch.nn.parallel import DistributedDataParallel

        def watched(original):
            @functools.wraps(original)
            def __init__(ddp, *args, **kwargs):
                original(ddp, *args, **kwargs)
                if self._ddp is None or self._ddp() is None:
                    self._ddp = weakref.ref(ddp)

            return __init__

        replace(self._stack, DistributedDataParallel, "__init__", watched)
        from torch.utils.data import dataloader

        def iterated(original):
            @functools.wraps(original)
            def __init__(it, loader, *args, **kwargs):
                original(it, loader, *args, **kwargs)
                if self._loader is None:  # once: the training loader is iterated first in nearly every script
                    self._loader = loader_record(loader)

            return __init__

        replace(self._stack, dataloader._BaseDataLoaderIter, "__init__", iterated)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def header(self) -> tuple[str, str] | None:
        ddp = self._ddp() if self._ddp is not None else None
        node, record = node_record(), ddp_record(ddp) if ddp is not None else None
        if node is None and record is None and self._loader is None:
            return None
        return JOB_KEY, json.dumps({"version": VERSION, "node": node, "ddp": record, "loader": self._loader})
