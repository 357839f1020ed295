"""What ``perfscope forecast`` takes from one profile: compute time, backward time, the gradient
buckets, the profiled layout, and the all-reduce time measured there (which prices the link the
profile ran on). Seconds and bytes."""

from __future__ import annotations

import dataclasses
import math
import statistics

from perfscope import steptime
from perfscope.errors import PerfscopeError
from perfscope.forecast.model import Link
from perfscope.record.job_facts import MAX_BUCKET_BYTES, MAX_BUCKETS, MAX_COUNT, MAX_TIME_US, DdpRecord
from perfscope.record.schema import Facts, JobLayout, Run
from perfscope.record.view import Record, record_of

# Backward takes about twice the forward's arithmetic (one matmul for the input gradient, one for
# the weight gradient, per forward matmul; Kaplan et al. 2020, "6N FLOPs per token"), so about 2/3
# of a step's compute when DDP did not measure it.
BACKWARD_SHARE = 2.0 / 3.0


@dataclasses.dataclass(kw_only=True, frozen=True)
class ProfileInputs:
    """The profile's part of a forecast.

    Attributes:
        compute_s: Median over counted steps of step time minus exposed communication (s).
        backward_s: Backward compute time per step (s); ``backward_source`` says where from.
        buckets: Gradient bucket sizes (bytes), in DDP's all-reduce order.
        allreduce_s: Median communication time per step in the profile (s; the union of the
            collectives, overlapped or not).
        world, nodes, ranks_per_node: The profiled layout.
        mode: ``"gpu"`` or ``"cpu"`` (the trace's).
        steps: Counted steps the medians are over.
        provisional: No step was clean: the medians are over the steps a provisional verdict
            classified, each without its waits for a core (``docs/metrics.md``).
    """

    compute_s: float
    backward_s: float
    backward_source: str
    buckets: tuple[int, ...]
    allreduce_s: float
    world: int
    nodes: int
    ranks_per_node: int
    mode: str
    steps: int
    provisional: bool = False

    @property
    def gradient_bytes(self) -> int:
        return int(sum(self.buckets))

    def measured_intra_link(self, latency_s: float) -> Link | None:
        """The intra-node link the profile's own all-reduce implies, or None (a profile of one rank,
        or of several nodes, where the time also holds inter-node hops).

        Solves the flat-ring time over the profiled buckets (:func:`flat_allreduce_s`, latency
        ``latency_s`` per step) for the bandwidth: NCCL-tests' "bus bandwidth" of this run.
        """
        if self.nodes != 1 or self.world < 2 or self.allreduce_s <= 0:
            return None
        w = self.world
        latency = 2 * (w - 1) * latency_s * len(self.buckets)
        moving = self.allreduce_s - latency
        if moving <= 0:  # the latency asked for explains all of it: take none
            moving, latency_s = self.allreduce_s, 0.0
        return Link(bytes_per_s=2 * (w - 1) / w * self.gradient_bytes / moving, latency_s=latency_s)


def _median(values) -> float:
    return float(statistics.median(values))


def _number(v, where: str, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (positive and v <= 0) \
            or v > MAX_TIME_US:
        raise PerfscopeError(f"malformed summary: {where} is {str(v)[:40]!r}, not a time in microseconds")
    return float(v)


def _count(v, where: str) -> int | None:
    if v is None:
        return None
    if type(v) is not int or not 1 <= v <= MAX_COUNT:
        raise PerfscopeError(f"malformed summary: {where} is {str(v)[:40]!r}, not a whole number of ranks or nodes")
    return v


def from_summary(summary: dict | Record, *, gradient_mb: float | None = None) -> ProfileInputs:
    """Read the inputs from a summary record (``summary.json``).

    Args:
        summary: A summary as :func:`perfscope.record.load_summary` returns it (or its
            :class:`~perfscope.record.view.Record`).
        gradient_mb: Gradient size in MiB to use when the profile has no DDP record (traces not
            recorded by ``perfscope profile``): split into DDP's default 25 MiB buckets.

    Raises:
        PerfscopeError: no counted step, no DDP record and no ``gradient_mb``, or a profile of one rank.
    """
    record = record_of(summary)
    steps, provisional = _verdict_steps(record)
    compute, comm = _step_times(steps)
    facts = (record.details.facts if record.details is not None else None) or Facts()
    ddp = facts.ddp
    buckets = _buckets(ddp, gradient_mb)
    world, nodes, per_node = _layout(record.run or Run(), facts.job or JobLayout())
    backward_us = ddp.backward_compute_us if ddp else None
    if backward_us:
        backward, source = _number(backward_us, "details.facts.ddp.backward_compute_us") / 1e6, \
            "DDP's measured backward time"
    else:
        backward, source = BACKWARD_SHARE * compute, f"{BACKWARD_SHARE:.2f} of compute (DDP measured none)"
    backward = min(backward, compute)
    return ProfileInputs(compute_s=compute, backward_s=backward, backward_source=source, buckets=buckets,
                         allreduce_s=comm, world=world, nodes=nodes, ranks_per_node=per_node,
                         mode=record.mode or "cpu", steps=len(steps), provisional=provisional)


def _verdict_steps(record: Record) -> tuple[list[dict], bool]:
    """The step rows the verdict rests on (:func:`perfscope.steptime.verdict_rows`), and whether
    they are a provisional verdict's (no step counted).

    Raises:
        PerfscopeError: there are none.
    """
    steps = steptime.verdict_rows(record.steps or [], record.overall_or_empty().provisional)
    if not steps:
        raise PerfscopeError("the profile has no counted step (every step's evidence was incomplete, and no step "
                             "got a provisional verdict); profile whole steps, later in the run")
    return steps, not any(s.get("counted") for s in steps)


def _step_times(steps: list[dict]) -> tuple[float, float]:
    """(median compute, median all-reduce) of the steps, in seconds: compute is the step less its
    exposed communication."""
    step_us = [_number(s.get("step_time_us"), "steps[].step_time_us", positive=True) for s in steps]
    exposed_us = [min(_number(s.get("exposed_comm_us") or 0.0, "steps[].exposed_comm_us"), t) for s, t in zip(steps, step_us)]
    compute = _median([t - e for t, e in zip(step_us, exposed_us)]) / 1e6
    comm = _median([_number(s.get("comm_us") or 0.0, "steps[].comm_us") for s in steps]) / 1e6
    return compute, comm


def _buckets(ddp: DdpRecord | None, gradient_mb: float | None) -> tuple[int, ...]:
    """DDP's gradient buckets (bytes): as recorded, else ``gradient_mb`` in DDP's default 25 MiB buckets."""
    if ddp and ddp.bucket_bytes is not None:
        buckets = ddp.bucket_bytes
        if not (isinstance(buckets, list) and 0 < len(buckets) <= MAX_BUCKETS
                and all(type(b) is int and 0 < b <= MAX_BUCKET_BYTES for b in buckets)):
            raise PerfscopeError("malformed summary: details.facts.ddp.bucket_bytes is not a list of positive byte "
                                 "counts (at most 2**50 each)")
        return tuple(buckets)
    if gradient_mb is not None:
        total, cap = int(gradient_mb * 2**20), 25 * 2**20
        return tuple([cap] * (total // cap) + ([total % cap] if total % cap else []))
    raise PerfscopeError("the profile holds no DDP record (gradient buckets): profile the script with perfscope "
                         "profile --nproc-per-node N, or give the gradient size with --gradient-mb")


def _layout(run: Run, job: JobLayout) -> tuple[int, int, int]:
    """(world size, nodes, ranks per node) of the profiled job (``job``: ``details.facts.job``)."""
    world = _count(run.world_size, "run.world_size") or 1
    per_node = _count(job.local_world_size, "details.facts.job.local_world_size") \
        or _count(run.nproc_per_node, "run.nproc_per_node") or world
    nodes = _count(job.nnodes, "details.facts.job.nnodes") or max(1, world // max(per_node, 1))
    return world, nodes, per_node
