"""What ``perfscope tune`` optimises (``--objective``), and the cost of its answer.

``time`` (the default) ranks and proves configurations by throughput: samples (or steps) per
second over each trial's measured window. ``energy`` ranks and proves them by samples (or
steps) per joule over the same window: each trial reads the energy counter at its steps'
boundaries (``perfscope.measure --energy``: NVML's on a GPU, RAPL's on a CPU), and the
confirmation's rounds compare that figure as they compare throughput. ``cost`` ranks them by what 1,000 samples cost at
``--price-per-hour``: price x devices / throughput. The devices a job holds do not change between
trials (the tuner searches the runtime's knobs, never the world size), so cost is the same
ordering as time, and the confirmation's speed-up interval ``[low, high]`` proves the cost ratio
``[1/high, 1/low]``: the cheaper configuration is the proven faster one, and the answer states the
cost before and after with that interval.
"""

from __future__ import annotations

from collections.abc import Sequence

from perfscope.tuner.window import window_throughput
from perfscope.record.run_facts import run_facts
from perfscope.tuner.attrs import BaselineRun

OBJECTIVES = ("time", "cost", "energy")


def energy_throughput(samples: Sequence[int | None], joules: Sequence[float | None], drawn: int = 0) -> float | None:
    """Samples per joule over a window (steps per joule where a step's batch size is unknown);
    None where a step has no energy reading or the window used none.

    Args:
        samples: Samples of each step over all ranks, None where unknown.
        joules: Energy of each step over all ranks (joules), None where not read.
        drawn: Samples the window drew from batches loaded before it (not counted).
    """
    if not joules or any(j is None for j in joules):
        return None
    total = sum(joules)
    if total <= 0:
        return None
    if all(isinstance(n, int) for n in samples):
        return max(0, sum(samples) - drawn) / total
    return len(joules) / total


def better_word(objective: str) -> str:
    """What a gain in the objective's figure is called in the answer's line."""
    return "more work per joule" if objective == "energy" else "faster"


def require_energy_counter() -> None:
    """Refuse the energy objective where no trial could read an energy counter on this machine:
    neither RAPL nor NVML's counter of GPU 0 (:mod:`perfscope.collect.energy`).

    Raises:
        PerfscopeError: naming why each cannot be read.
    """
    from perfscope.collect.energy import EnergyUnavailable, NvmlMeter, RaplMeter
    from perfscope.errors import PerfscopeError

    reasons = []
    for meter in (lambda: RaplMeter(), lambda: NvmlMeter(None, 0)):
        try:
            meter()
            return
        except EnergyUnavailable as e:
            reasons.append(str(e))
    raise PerfscopeError("--objective energy needs an energy counter, and this machine gives none: "
                         + "; ".join(reasons))


def objective_value(objective: str, samples, seconds, joules, drawn: int = 0) -> float | None:
    """A window's figure for ``objective`` (higher is better): throughput for ``time`` and
    ``cost``, samples per joule for ``energy``."""
    if objective == "energy":
        return energy_throughput(samples, joules, drawn)
    return window_throughput(samples, seconds, drawn)


def unit_of(objective: str, rate_unit: str) -> str:
    """The figure's unit: ``samples/s`` or ``steps/s`` as measured, ``/J`` for energy."""
    return rate_unit.replace("/s", "/J") if objective == "energy" else rate_unit


def per_1000(price_per_hour: float, devices: int, throughput: float) -> float | None:
    """USD for 1,000 samples (or steps, where the batch size is unknown) at ``throughput`` per second."""
    return price_per_hour * devices / 3600.0 / throughput * 1000.0 if throughput > 0 else None


def cost_of(*, price_per_hour: float | None, baseline: BaselineRun, recommendation: dict | None, nproc_per_node: int | None,
            nnodes: int) -> dict | None:
    """``tune.json``'s ``cost``: the baseline's cost per 1,000 samples and, for a proven faster
    configuration, the winner's with the saving and its interval; None without a price.

    Args:
        price_per_hour: USD an hour per device (GPU), or per machine for CPU runs.
        baseline: The study's baseline.
        recommendation: The answer (``status``, ``speedup``, ``ci_low``, ``ci_high``) or None.
    """
    value = baseline.value
    if price_per_hour is None or value is None or not value > 0:
        return None
    from perfscope.analysis.cost import priced_devices

    n = priced_devices(gpu=run_facts(baseline.facts).cuda, world_size=(nproc_per_node or 1) * nnodes, nnodes=nnodes)
    per = "samples" if baseline.unit == "samples/s" else "steps"
    cost = per_1000(price_per_hour, n, float(value))
    return {"price_per_hour": price_per_hour, "devices": n, "per": f"1000 {per}", "baseline": cost,
            **_saving(cost, recommendation)}


def _saving(cost: float, recommendation: dict | None) -> dict:
    """``best`` (the proven faster configuration's cost per 1,000) and ``saving`` with its
    interval, ``1 - 1 / speed-up`` (``docs/tune.md``, "Objective"); None where nothing was
    proven faster, the interval None where it has no ends."""
    rec = recommendation or {}
    speedup, low, high = rec.get("speedup"), rec.get("ci_low"), rec.get("ci_high")
    if rec.get("status") != "faster" or not speedup:
        return {"best": None, "saving": None, "saving_low": None, "saving_high": None}
    bounded = bool(low and high)
    return {"best": cost / speedup, "saving": 1.0 - 1.0 / speedup, "saving_low": 1.0 - 1.0 / low if bounded else None,
            "saving_high": 1.0 - 1.0 / high if bounded else None}


def cost_line(cost: dict | None) -> str | None:
    """The answer's cost in words, or None without a price."""
    if cost is None:
        return None
    from perfscope.console_views import usd

    head = f"cost per {cost['per'].replace('1000', '1,000')} at ${cost['price_per_hour']:,.2f}/h x {cost['devices']}: "
    if cost["best"] is None:
        return head + f"{usd(cost['baseline'])} (your setting; no configuration was proven cheaper)"
    interval = (f", {cost['saving_low']:.0%}-{cost['saving_high']:.0%} at the proof's confidence"
                if cost["saving_low"] is not None else "")
    return head + f"{usd(cost['baseline'])} -> {usd(cost['best'])} (saves {cost['saving']:.0%}{interval})"
