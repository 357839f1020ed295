"""What a step costs: ``details.cost`` of ``summary.json`` (``docs/metrics.md``, "Cost").

A run's price is the hourly price of each device it holds -- a GPU for GPU runs, the whole machine
for CPU runs (``--price-per-hour``, USD) -- times the devices and the time. Per step, over the
verdict's step time (the clock every figure beside the verdict is on)::

    cost per step = step_time_us / 1e6 / 3600 * price_per_hour * devices

The removable shares and GPU idle (``other``) are priced as their share of that cost: what a
step pays for waiting. Per 1,000 samples needs the samples a step takes (the first DataLoader's
batch size on every rank, which ``perfscope profile`` records); per run needs the run's own time
(its whole-run record). Each is null with its reason where that is unknown.
"""

from __future__ import annotations

from perfscope.classes import REMOVABLE
from perfscope.record.schema import Cost, Energy, TraceEntry

US_PER_HOUR = 3600e6
# The shares a step pays for without doing its math: the removable classes and GPU idle.
PRICED_SHARES = (*REMOVABLE, "other")


def priced_devices(*, gpu: bool, world_size: int, nnodes: int) -> int:
    """The devices a job pays for: a GPU per rank on GPU runs, else a machine per node."""
    return max(1, world_size) if gpu else max(1, nnodes)


def cost_view(*, price_per_hour: float | None, step_time_us: float | None, shares: dict | None, mode: str,
              world_size: int, nnodes: int, batch_size: int | None, run_seconds: float | None) -> Cost | None:
    """``details.cost``: the run's cost per step, per 1,000 samples and per run, and what its
    removable and idle shares cost a step.

    Args:
        price_per_hour: USD an hour per device (GPU runs) or per machine (CPU runs); None: no cost.
        step_time_us: The run's step time on the verdict's clock (µs); None where no step counted.
        shares: Each class's share of that step time (``overall.fractions``), or None.
        mode: ``"gpu"`` (a device per rank) or ``"cpu"`` (a machine per node).
        world_size: Ranks of the job; nnodes: its machines.
        batch_size: Samples a rank's step takes, or None where unknown.
        run_seconds: The run's time as its whole-run record measured it (the slowest rank), or None.

    Returns:
        None without a price; else the record's struct of USD figures (null with ``*_why`` where unknown).
    """
    if price_per_hour is None:
        return None
    devices = priced_devices(gpu=mode == "gpu", world_size=world_size, nnodes=nnodes)
    rate = price_per_hour * devices  # USD an hour for the whole job
    out = Cost(price_per_hour=price_per_hour, unit="GPU" if mode == "gpu" else "machine", devices=devices)
    if step_time_us is None:
        out.per_step_why = out.per_1000_samples_why = "no step was counted"
    else:
        per_step = step_time_us / US_PER_HOUR * rate
        out.per_step = per_step
        if shares:
            out.shares = {c: per_step * float(shares[c]) for c in PRICED_SHARES if shares.get(c) is not None}
        if batch_size:
            out.per_1000_samples = per_step * 1000.0 / (batch_size * world_size)
        else:
            out.per_1000_samples_why = ("the samples a step takes are unknown (perfscope profile records the "
                                        "DataLoader's batch size; a trace alone does not hold it)")
    if run_seconds is not None:
        out.per_run = run_seconds / 3600.0 * rate
    else:
        out.per_run_why = "no whole-run record (perfscope profile writes one for the run it watches)"
    return out


def _counter_means(rows: list[dict], counters: list[tuple]) -> tuple[str, str, list[float]] | None:
    """``(source, unit, means)``: each named counter's mean joules a step over ``rows``, a machine's
    counter once (``unit`` ``machine``: through the first of its ranks), counters without a reading
    left out; None where no counter is named."""
    named = [(rank, e) for rank, e in counters if e.get("source")]
    if not named:
        return None
    source, unit = named[0][1]["source"], named[0][1]["unit"]
    counted, seen = [], set()
    for rank, e in named:
        key = e.get("machine") if unit == "machine" else rank
        if key in seen:
            continue  # a machine's counter, already counted through another of its ranks
        seen.add(key)
        values = [r["host_energy_j"] for r in rows if r.get("rank") == rank and r.get("host_energy_j") is not None]
        if values:
            counted.append(sum(values) / len(values))
    return source, unit, counted


def energy_view(rows: list[dict], traces: list[TraceEntry], world_size: int, batch_size: int | None) -> Energy | None:
    """``details.energy``: joules a step for the job, from the host record's ``host_energy_j``.

    Each rank's mean over ``rows`` (the verdict's steps, or every step where none of those has a
    reading), summed over the counters: every GPU
    (NVML: one per rank), or every machine once (RAPL covers the whole machine, so of the ranks on
    one machine only the first is counted).

    Args:
        rows: The verdict's step rows (``rank``, ``host_energy_j``).
        traces: The record's ``traces[]`` entries (``rank``, ``energy``: the counter or why none).
        world_size: Ranks of the job; batch_size: samples a rank's step takes, or None.

    Returns:
        None where no trace has a host record (a trace not written by ``perfscope profile``).
    """
    counters = [(t.rank, t.energy) for t in traces if t.energy]
    if not counters:
        return None
    found = _counter_means(rows, counters)
    if found is None:
        return Energy(why=counters[0][1].get("why") or "no energy counter was read")
    source, unit, counted = found
    out = Energy(source=source, unit=unit, counters=len(counted) or None)
    if not counted:
        out.why = "no step has an energy reading"
        return out
    out.per_step_j = float(sum(counted))
    if batch_size:
        out.per_1000_samples_j = out.per_step_j * 1000.0 / (batch_size * world_size)
    else:
        out.why = "per 1,000 samples: the batch size is unknown"
    return out
