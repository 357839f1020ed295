"""The GPU telemetry record of a profiled run, kept in the trace header (``perfscope profile``
writes it: :mod:`perfscope.collect.telemetry`; the trace reader reads it: :func:`parse`). Like
:mod:`perfscope.record.host_steps` it imports nothing heavy: it is loaded into the profiled process.

The header key :data:`TELEMETRY_KEY` holds::

    {"version": 1, "source": "NVML", "interval_s": 0.1, "averaging_s": 1.0, "sampler_busy_s": 0.012,
     "devices": [{"index": 0, "name": "NVIDIA H100", "uuid": "GPU-..."}],
     "fields": [...FIELDS...], "samples": [[...], ...]}

or, when nothing could be sampled, ``{"version": 1, "skipped": "why"}``. Each sample is a list in
the order of :data:`FIELDS`: ``unix_ns`` (``time.time_ns()`` when read), ``device`` (an index into
``devices``), ``gpu_util_pct`` and ``mem_util_pct`` (NVML's utilisation rates over its last
sample period, percent), ``mem_used_bytes``, ``power_mw`` (milliwatts), ``sm_clock_mhz``,
``mem_clock_mhz``, ``reasons`` (NVML's clocks-event reasons bit mask) and ``temp_c``; null where
the device does not report it. ``sampler_busy_s`` is the time the sampler spent reading (seconds),
the basis of its overhead. ``averaging_s`` is how far back a sample's utilisation and power reach
(seconds): NVML averages both over up to a second (:data:`NVML_AVERAGING_S`); a record without it
is read as its source's.
"""

from __future__ import annotations

import msgspec

TELEMETRY_KEY = "perfscope_telemetry"
VERSION = 1
FIELDS = ("unix_ns", "device", "gpu_util_pct", "mem_util_pct", "mem_used_bytes", "power_mw", "sm_clock_mhz",
          "mem_clock_mhz", "reasons", "temp_c")
# NVML's utilisation rates cover its last sample period, "between 1 second and 1/6 second depending
# on the product", and its power reading is "averaged over 1 sec interval" on Ampere (but GA100) and
# newer GPUs (NVML API reference: nvmlDeviceGetUtilizationRates, nvmlDeviceGetPowerUsage): a
# reading can hold up to the second before it.
NVML_AVERAGING_S = 1.0
MAX_SAMPLES = 20_000  # 10 Hz for over half an hour of profiled window: the header stays small
# NVML's clocks-event reasons (nvml.h, nvmlClocksEventReason*): the bits that mean the clocks were
# held down. GpuIdle, ApplicationsClocksSetting and DisplayClockSetting are not throttling.
THROTTLE_REASONS = {
    0x4: "power cap (software)", 0x8: "hardware slowdown", 0x10: "sync boost", 0x20: "thermal (software)",
    0x40: "thermal (hardware)", 0x80: "power brake (hardware)", 0x200: "board limit", 0x400: "reliability",
}
THROTTLE_MASK = sum(THROTTLE_REASONS)


# The range a reading can take; outside it the sample is unusable (a damaged or hand-edited record).
RANGES = {"gpu_util_pct": (0, 100), "mem_util_pct": (0, 100), "mem_used_bytes": (0, 2**50), "power_mw": (0, 10**7),
          "sm_clock_mhz": (0, 10**5), "mem_clock_mhz": (0, 10**5), "reasons": (0, 2**32 - 1), "temp_c": (-50, 200)}
MAX_BUSY_S = 10**6
MAX_AVERAGING_S = 60.0


def _number(v) -> bool:
    return type(v) in (int, float) and v == v and abs(v) < 2**62


def _in_range(field: str, v) -> bool:
    if v is None:
        return True
    low, high = RANGES[field]
    return _number(v) and low <= v <= high


class TelemetryRecord(msgspec.Struct, kw_only=True):
    """A trace's telemetry record as read (:func:`parse`): ``skipped`` (why nothing was sampled,
    and nothing else set), or the ``source``, ``interval_s`` (seconds between samples, None where
    not usable), ``averaging_s`` (how far back a reading reaches, s), ``sampler_busy_s`` (the
    sampler's reading time, s, None where not usable), ``devices`` (``index``, ``name``, ``uuid``)
    and ``samples`` (dicts keyed by :data:`FIELDS`, the usable ones)."""

    skipped: str | None = None
    source: str = "NVML"
    interval_s: float | None = None
    averaging_s: float = 0.0
    sampler_busy_s: float | None = None
    devices: list[dict] = msgspec.field(default_factory=list)
    samples: list[dict] = msgspec.field(default_factory=list)


def _text(v, limit: int) -> str | None:
    return v[:limit] if isinstance(v, str) else None


def _devices(value) -> list[dict]:
    """The record's devices (``index``, ``name``, ``uuid``; None where not of their type)."""
    return [{"index": d.get("index") if type(d.get("index")) is int else None, "name": _text(d.get("name"), 100),
             "uuid": _text(d.get("uuid"), 100)} for d in (value if isinstance(value, list) else []) if isinstance(d, dict)]


def _usable(sample, devices: int) -> bool:
    """A sample row of :data:`FIELDS`: a time, a device index into the record's devices, and each
    value of its type and within :data:`RANGES`."""
    return (isinstance(sample, list) and len(sample) == len(FIELDS) and _number(sample[0]) and sample[0] >= 0
            and type(sample[1]) is int and 0 <= sample[1] < devices
            and all(_in_range(f, v) for f, v in zip(FIELDS[2:], sample[2:])))


def parse(value) -> tuple[TelemetryRecord, list[str]]:
    """The telemetry record, checked, and what was refused.

    Returns:
        ``(record, problems)``: a :class:`TelemetryRecord` with ``skipped`` set where the record
        says why or is no record this version reads; else its samples, those of the wrong type or
        with a value outside :data:`RANGES` left out and counted in ``problems`` (each problem a
        phrase; the caller says they were ignored).
    """
    if not isinstance(value, dict) or value.get("version") != VERSION:
        return TelemetryRecord(skipped="the trace's telemetry record is not one this perfscope reads"), [
            "not perfscope's telemetry record"]
    if isinstance(value.get("skipped"), str):
        return TelemetryRecord(skipped=value["skipped"][:300]), []
    devices = _devices(value.get("devices"))
    fields = value.get("fields")
    raw = value.get("samples")
    if fields != list(FIELDS) or not isinstance(raw, list):
        return TelemetryRecord(skipped="the trace's telemetry record has no usable fields or samples"), [
            "telemetry record without its fields or samples"]
    samples, problems = _samples(raw, len(devices))
    interval, busy = value.get("interval_s"), value.get("sampler_busy_s")
    source = str(value.get("source") or "NVML")[:40]
    return TelemetryRecord(source=source, interval_s=float(interval) if _number(interval) and interval > 0 else None,
                           averaging_s=_averaging(value.get("averaging_s"), source), sampler_busy_s=_busy(busy),
                           devices=devices, samples=samples), problems


def _busy(busy) -> float | None:
    """The sampler's busy seconds, from 0 to :data:`MAX_BUSY_S`, else None."""
    return float(busy) if _number(busy) and 0 <= busy <= MAX_BUSY_S else None


def _samples(raw: list, devices: int) -> tuple[list[dict], list[str]]:
    """The usable samples of the first :data:`MAX_SAMPLES`, and how many were refused or beyond."""
    samples = [dict(zip(FIELDS, s)) for s in raw[:MAX_SAMPLES] if _usable(s, devices)]
    bad = min(len(raw), MAX_SAMPLES) - len(samples)
    problems = [f"{bad} telemetry samples are unusable (a value out of its range, or of the wrong type)"] if bad else []
    if len(raw) > MAX_SAMPLES:
        problems.append(f"{len(raw) - MAX_SAMPLES} telemetry samples beyond the first {MAX_SAMPLES}")
    return samples, problems


def _averaging(averaging, source: str) -> float:
    """The seconds the source averages utilisation over: as recorded (0 to :data:`MAX_AVERAGING_S`),
    else NVML's for NVML, else 0."""
    if _number(averaging) and 0 <= averaging <= MAX_AVERAGING_S:
        return float(averaging)
    return NVML_AVERAGING_S if source == "NVML" else 0.0
