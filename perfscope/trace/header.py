"""The header of a trace: base time, rank and world size, devices, and perfscope's host and job records.

Every field is checked for its type and range before it is believed: a boolean or negative rank,
a rank past the world size, a device name that is a list, ``args`` that are not an object all
occur in real or hostile files. What is refused is said in a warning, never silently guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from perfscope.record import host_steps, job_facts, telemetry_format
from perfscope.record.host_steps import HOST_STEPS_KEY, HostStep
from perfscope.errors import TraceFormatError
from perfscope.record.lenient import lenient
from perfscope.record.schema import DistributedInfo, MemoryCapacity
from perfscope.record.telemetry_format import TELEMETRY_KEY, TelemetryRecord

MERGED_KEY = "perfscope_merged"  # perfscope merge's header key (perfscope/trace/merge.py)
from perfscope.record.job_facts import JOB_KEY, DdpRecord, LoaderRecord, NodeRecord
from perfscope.record import step_flops
from perfscope.record.step_flops import FLOPS_KEY, StepFlops
from perfscope.trace.columns import is_number
from perfscope.trace.reader import RawTrace

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?([0-9]{1,9})(?:[^0-9]|$)", re.IGNORECASE)
_MAX_RANK = 2**31 - 1  # torch.distributed ranks are 32-bit
_MAX_BASE_NS = 2**62  # ~146 years past the epoch: beyond, a base time is not a clock reading


class Device(msgspec.Struct, kw_only=True, frozen=True):
    """An entry of Kineto's ``deviceProperties``: CUDA's ``cudaDeviceProp`` fields under Kineto's
    names (ROCm writes its devices in the same ones, an MI250 as ``warpSize`` 64). A field is None
    where the entry lacks it or holds another type (read leniently, :mod:`perfscope.record.lenient`)."""

    name: str | None = None
    total_memory_bytes: int | None = msgspec.field(default=None, name="totalGlobalMem")
    compute_major: int | None = msgspec.field(default=None, name="computeMajor")
    compute_minor: int | None = msgspec.field(default=None, name="computeMinor")
    warp_size: int | None = msgspec.field(default=None, name="warpSize")


class ProcessGroupConfig(msgspec.Struct, kw_only=True, frozen=True):
    """An entry of ``distributedInfo.pg_config``: a process group as PyTorch's profiler lists it,
    read leniently like :class:`Device`."""

    pg_name: str | int | None = None
    pg_desc: str | None = None
    pg_size: int | None = None
    ranks: list[Any] | None = None
    """As written: its readers use a group only where every rank is a whole number."""


@dataclass
class Header:
    """The header fields of one trace, checked (see the module docstring).

    Attributes:
        base_time_ns: ``baseTimeNanoseconds`` (0 when absent or unusable).
        rank, rank_source: The rank and where it came from (``"distributedInfo"``, ``"file name"``).
        world_size: ``distributedInfo.world_size`` when usable.
        distributed_info: What of ``distributedInfo`` the record keeps (backend, rank, world size,
            NCCL version; each as written where it is text or a number).
        process_groups: ``distributedInfo.pg_config``'s entries that are objects.
        device_properties: ``deviceProperties`` entries that are objects.
        host_steps: Step number -> the host measurements ``perfscope profile`` recorded (:class:`HostStep`)
            (:mod:`perfscope.record.host_steps`; microseconds).
        node: The rank's node as ``perfscope profile`` recorded it (:mod:`perfscope.record.job_facts`),
            or None.
        host: The host name: the job record's, else the profiler's ``host_name``; None if neither.
        ddp: The rank's DDP gradient buckets and timings (:mod:`perfscope.record.job_facts`), or None.
        loader: The rank's first DataLoader's workers and cores (:mod:`perfscope.record.job_facts`), or None.
        telemetry: The GPU telemetry record (:func:`perfscope.record.telemetry_format.parse`), None
            when the trace has none.
        memory_capacity: The host's and device's memory as ``perfscope profile`` recorded them
            (:func:`perfscope.record.host_steps.parse_capacity`; bytes), empty when not recorded.
        energy: The energy counter of the host record (:func:`perfscope.record.host_steps.parse_energy`).
        flops: The FLOPs of one step as ``perfscope profile`` counted them
            (:class:`perfscope.record.step_flops.StepFlops`), or None.
        warnings: What was refused, one line each (file name first).
    """

    base_time_ns: int = 0
    rank: int | None = None
    rank_source: str | None = None
    world_size: int | None = None
    distributed_info: DistributedInfo = field(default_factory=DistributedInfo)
    process_groups: list[ProcessGroupConfig] = field(default_factory=list)
    device_properties: list[Device] = field(default_factory=list)
    host_steps: dict[int, HostStep] = field(default_factory=dict)
    node: NodeRecord | None = None
    host: str | None = None
    ddp: DdpRecord | None = None
    loader: LoaderRecord | None = None
    memory_capacity: MemoryCapacity = field(default_factory=MemoryCapacity)
    energy: dict = field(default_factory=dict)
    telemetry: TelemetryRecord | None = None
    flops: StepFlops | None = None
    warnings: list[str] = field(default_factory=list)


def _whole(v) -> bool:
    return type(v) is int


def read_header(raw: RawTrace) -> Header:
    """Read and check the header of ``raw`` (warnings name the file).

    Raises:
        TraceFormatError: the file is ``perfscope merge``'s view of several ranks, not a rank's trace.
    """
    data, name = raw.data, raw.path.name
    if data.get(MERGED_KEY) is not None:
        raise TraceFormatError(f"{raw.path}: a view merged by perfscope merge (several ranks in one file), not one "
                               "rank's trace; analyze the rank traces it was made from")
    h = Header()
    base = data.get("baseTimeNanoseconds")
    if base is not None:
        if is_number(base) and 0 <= base < _MAX_BASE_NS:
            h.base_time_ns = int(base)
        else:
            h.warnings.append(f"{name}: baseTimeNanoseconds {str(base)[:40]!r} is not a time; ranks are aligned without it")
    dist = _distributed(h, data.get("distributedInfo"), name)
    _rank_from_name(h, raw.worker, name, rank_given=dist.get("rank") is not None)
    h.device_properties = _devices(data, name, h.warnings)
    _perfscope_records(h, data, name)
    host = (h.node.host if h.node else None) or data.get("host_name")
    h.host = host[:200] if isinstance(host, str) and host else None
    return h


# What of distributedInfo the record keeps (traces[].distributed_info); pg_config is read apart.
_DISTRIBUTED_INFO = tuple(f.name for f in msgspec.structs.fields(DistributedInfo))


def _distributed(h: Header, dist, name: str) -> dict:
    """``distributedInfo``: the object, the world size and the rank, each refused with a warning
    when it is not what the format says, and its process groups; returns the object as written
    (``{}`` when it is not one)."""
    if dist is not None and not isinstance(dist, dict):
        h.warnings.append(f"{name}: distributedInfo is not an object; ignored")
    dist = dist if isinstance(dist, dict) else {}
    h.distributed_info = DistributedInfo(**{k: dist[k] for k in _DISTRIBUTED_INFO
                                            if isinstance(dist.get(k), (str, int, float))})
    h.process_groups = _process_groups(dist.get("pg_config"))
    world = dist.get("world_size")
    if world is not None:
        if _whole(world) and world >= 1:
            h.world_size = world
        else:
            h.warnings.append(f"{name}: distributedInfo.world_size {str(world)[:40]!r} is not a positive whole number; ignored")
    if dist.get("rank") is not None:
        _distributed_rank(h, dist["rank"], name)
    return dist


def _process_groups(groups) -> list[ProcessGroupConfig]:
    """``distributedInfo.pg_config``'s entries that are objects (none where it is not a list)."""
    return [lenient(g, ProcessGroupConfig) for g in groups if isinstance(g, dict)] if isinstance(groups, list) else []


def _distributed_rank(h: Header, rank, name: str) -> None:
    """``distributedInfo.rank``, taken if a whole number within the world size."""
    if not _whole(rank) or rank < 0 or rank > _MAX_RANK:
        h.warnings.append(f"{name}: distributedInfo.rank {str(rank)[:40]!r} is not a whole number from 0 to "
                          f"{_MAX_RANK}; ignored")
    elif h.world_size is not None and rank >= h.world_size:
        h.warnings.append(f"{name}: distributedInfo.rank {rank} is out of range for world size {h.world_size}; ignored")
    else:
        h.rank, h.rank_source = rank, "distributedInfo"


def _rank_from_name(h: Header, worker: str, name: str, *, rank_given: bool) -> None:
    """The rank a file name gives (``rank3``...): taken where ``distributedInfo`` gave none, named
    where the two disagree (``rank_given``: ``distributedInfo`` holds a rank, usable or not)."""
    m = _RANK_IN_NAME.search(worker)
    if not rank_given and not m and (h.world_size or 0) > 1:  # not rank 0 of the job
        h.warnings.append(f"{name}: distributedInfo gives world size {h.world_size} but no rank; the rank shown is the "
                          "file's place among those analyzed, not its rank in the job")
    if h.rank is None and m:  # the job check warns about it where ranks are compared (analysis/job.py)
        h.rank, h.rank_source = int(m.group(1)), "file name"
    elif m and int(m.group(1)) != h.rank:
        h.warnings.append(f"{name}: the file name says rank {int(m.group(1))}, distributedInfo says rank {h.rank}; "
                          "used distributedInfo")


def _perfscope_records(h: Header, data: dict, name: str) -> None:
    """The records ``perfscope profile`` keeps in the header (host steps, telemetry, job, FLOPs),
    each validated by its format's module; what is refused becomes a warning."""
    h.host_steps = _host_steps(data.get(HOST_STEPS_KEY), name, h.warnings)
    h.memory_capacity = MemoryCapacity(**host_steps.parse_capacity(data.get(HOST_STEPS_KEY)))
    h.energy = host_steps.parse_energy(data.get(HOST_STEPS_KEY))
    if data.get(TELEMETRY_KEY) is not None:
        h.telemetry, problems = telemetry_format.parse(data.get(TELEMETRY_KEY))
        h.warnings += [f"{name}: {TELEMETRY_KEY}: {p}; ignored" for p in problems]  # each p a phrase
    if data.get(JOB_KEY) is not None:
        h.node, h.ddp, h.loader, problems = job_facts.parse(data.get(JOB_KEY))
        h.warnings += [f"{name}: {JOB_KEY}: {p}; ignored" for p in problems]
    if data.get(FLOPS_KEY) is not None:
        h.flops, problems = step_flops.parse(data.get(FLOPS_KEY))
        h.warnings += [f"{name}: {FLOPS_KEY}: {p}; ignored" for p in problems]


def _devices(data: dict, name: str, warnings: list[str]) -> list[Device]:
    props = data.get("deviceProperties") or data.get("computeProperties") or []
    if not isinstance(props, list):
        warnings.append(f"{name}: deviceProperties is not a list; ignored")
        return []
    out, bad = [], 0
    for d in props:
        if not isinstance(d, dict):
            bad += 1
            continue
        if "name" in d and not isinstance(d["name"], str):
            bad += 1
        out.append(lenient(d, Device))
    if bad:
        warnings.append(f"{name}: {bad} deviceProperties entries (or their names) are not what the format says; ignored them")
    return out


def _host_steps(value, name: str, warnings: list[str]) -> dict:
    """Step -> host measurements from perfscope's own header key; refused entries are named."""
    if value is None:
        return {}
    steps, unusable = host_steps.parse(value)
    if unusable < 0:
        warnings.append(f"{name}: {HOST_STEPS_KEY} is not perfscope's host record; ignored")
    elif unusable:
        warnings.append(f"{name}: {unusable} host measurements in {HOST_STEPS_KEY} are unusable; ignored them")
    return steps
