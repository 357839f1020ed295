"""GPU telemetry per step: the samples ``perfscope profile`` took beside the profiled window
(:mod:`perfscope.collect.telemetry`) aligned to the trace's clock, summarised per step and over
the run, with clock and power throttling called out (``docs/metrics.md``, GPU telemetry).

Alignment: a sample's time is ``time.time_ns()``; the trace's is ``base_time_ns + ts``. The host
record holds each step's start on the same clock as the samples (``start_unix_ns``), so the
offset between the two clocks is the median, over the steps both hold, of (trace step start -
host step start): a few microseconds (the profiler's own work at the boundary). Without a host
record the clocks are taken as they are (both count from the epoch; Kineto converts its own clock
to it) and the view says so.

Averaging: a sample's utilisation and power cover the ``averaging_s`` before it (NVML: up to a
second, :data:`perfscope.record.telemetry_format.NVML_AVERAGING_S`). Only samples taken at least that
long after the profiled window opened (its first step's start) are *settled*: they describe the
window, not the time before it. Utilisation and power come from settled samples only; clocks and
throttle reasons, read as they are now, from every sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from perfscope.analysis.intervals import locate
from perfscope.record.telemetry_format import THROTTLE_MASK, THROTTLE_REASONS

if TYPE_CHECKING:
    from perfscope.analysis.rank_trace import RankTrace
    from perfscope.analysis.steps import StepWindows
    from perfscope.trace.table import TraceTable

COLUMNS = ("gpu_util_pct", "power_w", "sm_clock_mhz", "throttled_share", "telemetry_samples")
# Throttled in this share of a run's samples (counted steps): a warning names the reasons.
THROTTLE_WARN_SHARE = 0.05


def clock_offset_ns(t: TraceTable, w: StepWindows) -> tuple[int, str]:
    """(trace clock - sample clock, ns) and how it was found (``"step starts"`` or ``"clocks"``)."""
    diffs = []
    for i, step in enumerate(w.step):
        host = t.host_steps.get(int(step))
        if host is not None and host.start_unix_ns:
            diffs.append(int(t.absolute_ns(int(w.start[i]))) - host.start_unix_ns)
    if diffs:
        return int(np.median(diffs)), "step starts"
    return 0, "clocks"


def aligned_samples(t: TraceTable, w: StepWindows) -> pd.DataFrame | None:
    """The trace's telemetry samples (columns of :data:`~perfscope.record.telemetry_format.FIELDS`) with
    ``ts_ns``, their time on the trace's relative clock (as the step windows), and ``window``, the
    index of the step window holding each (-1: none); None without samples."""
    rec = t.telemetry
    if rec is None or not rec.samples:
        return None
    df = pd.DataFrame(rec.samples)
    offset, _ = clock_offset_ns(t, w)
    df["ts_ns"] = df["unix_ns"].astype("int64") + offset - int(t.absolute_ns(0))
    order = np.argsort(w.start, kind="stable")  # windows tile the run: disjoint once sorted
    held = locate(df["ts_ns"].to_numpy(), w.start[order], w.end[order])
    df["window"] = np.where(held >= 0, order[np.clip(held, 0, None)], -1)
    opened = int(w.start.min()) if len(w.start) else 0
    df["settled"] = df["ts_ns"] - int(1e9 * averaging_s(t)) >= opened
    return df


def averaging_s(t: TraceTable) -> float:
    """How far back (s) a sample's utilisation and power reach, as the record says."""
    return t.telemetry.averaging_s if t.telemetry is not None else 0.0


def step_columns(rt: RankTrace) -> pd.DataFrame | None:
    """Per step (rows of ``rt.metrics``): mean GPU utilisation (%) and power (W) of its settled
    samples (NaN where none is), the lowest SM clock (MHz), the share of samples with a throttle
    reason, and the samples taken; None without samples."""
    df = aligned_samples(rt.table, rt.windows)
    if df is None:
        return None
    w = rt.windows
    out = {c: np.full(len(w.step), np.nan) for c in COLUMNS}
    by_window = dict(tuple(df[df["window"] >= 0].groupby("window")))
    for i in range(len(w.step)):
        mine = by_window.get(i, df.iloc[:0])
        out["telemetry_samples"][i] = len(mine)
        if mine.empty:
            continue
        settled = mine[mine["settled"]]
        out["gpu_util_pct"][i] = settled["gpu_util_pct"].mean()
        out["power_w"][i] = settled["power_mw"].mean() / 1000.0
        out["sm_clock_mhz"][i] = mine["sm_clock_mhz"].min()
        reasons = mine["reasons"].fillna(0).astype("int64")
        out["throttled_share"][i] = float(((reasons & THROTTLE_MASK) != 0).mean())
    return pd.DataFrame(out, index=rt.metrics.index)


def telemetry_view(rank_traces: list[RankTrace], ranks: list[int], frame: pd.DataFrame) -> dict:
    """The telemetry section of ``details`` over the counted steps (``frame``).

    Returns:
        ``{"skipped": why}`` when no trace holds samples (the first reason a trace gives), else
        ``source``, ``interval_s``, ``averaging_s``, ``samples`` (in counted steps),
        ``settled_samples``, ``gpu_util_pct`` and ``mem_util_pct`` (means of the settled samples,
        None where none is: ``unsettled`` then says why), ``power_w`` (mean and max, settled),
        ``sm_clock_mhz`` (min, median, max), ``throttle`` (reason ->
        share of samples), ``throttled_share``, ``sampler_cpu_share`` (the sampler's time over the
        profiled span: its overhead on one core), ``alignment`` (per rank: offset and source) and
        ``devices``.
    """
    g = _Samples()
    for rt, rank in zip(rank_traces, ranks):
        g.add(rt, int(rank), frame)
    df = pd.concat(g.parts, ignore_index=True) if g.parts else None
    if df is None or df.empty:
        return {"skipped": _skipped(g, rank_traces)}
    settled = df[df["settled"]]
    first = rank_traces[0].table.telemetry
    source = first.source if first is not None else "NVML"
    return {"source": source, "interval_s": g.interval, "averaging_s": g.averaging,
            "samples": int(len(df)), "settled_samples": int(len(settled)),
            "unsettled": None if len(settled) else _unsettled(g.longest_s, g.averaging, source),
            "gpu_util_pct": _stat(settled, "gpu_util_pct", "mean"), "mem_util_pct": _stat(settled, "mem_util_pct", "mean"),
            "power_w": {"mean": _stat(settled, "power_mw", "mean", 1000.0), "max": _stat(settled, "power_mw", "max", 1000.0)},
            "sm_clock_mhz": {how: _stat(df, "sm_clock_mhz", how) for how in ("min", "median", "max")},
            **_throttle(df["reasons"].fillna(0).astype("int64").to_numpy()),
            "sampler_cpu_share": g.sampler_share(), "alignment": g.align,
            "devices": g.devices}


@dataclass
class _Samples:
    """The ranks' telemetry gathered for :func:`telemetry_view`: the samples of counted steps,
    clock alignments, devices, and the sampler's busy time over the profiled span (seconds)."""

    parts: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    align: list = field(default_factory=list)
    devices: list = field(default_factory=list)
    busy_s: float = 0.0
    span_s: float = 0.0
    longest_s: float = 0.0  # the longest window of one trace
    interval: float | None = None
    averaging: float = 0.0

    def sampler_share(self) -> float | None:
        """The sampler's busy time over the profiled span: its overhead on one core."""
        return self.busy_s / self.span_s if self.span_s > 0 else None

    def add(self, rt: RankTrace, rank: int, frame: pd.DataFrame) -> None:
        rec = rt.table.telemetry
        if rec is not None and rec.skipped:
            self.skipped.append(rec.skipped)
        df = aligned_samples(rt.table, rt.windows)
        if df is None:  # no samples (and so a record)
            return
        w = rt.windows
        steps = frame.loc[(frame["rank"] == rank) & (frame["worker"] == rt.table.worker), "step"].to_numpy()
        self.parts.append(df[np.isin(df["window"].to_numpy(), np.flatnonzero(np.isin(w.step, steps)))])
        offset, how = clock_offset_ns(rt.table, rt.windows)
        self.align.append({"rank": rank, "offset_us": offset / 1000.0, "source": how})
        self.devices += [{**d, "rank": rank} for d in rec.devices]
        self.busy_s += rec.sampler_busy_s or 0.0
        if len(w.step):
            window_s = (int(w.end.max()) - int(w.start.min())) / 1e9
            self.span_s += window_s
            self.longest_s = max(self.longest_s, window_s)
        self.interval = rec.interval_s or self.interval
        self.averaging = max(self.averaging, averaging_s(rt.table))


def _throttle(reasons: np.ndarray) -> dict:
    """``throttle`` (each reason's share of the samples, the reasons seen) and ``throttled_share``
    (samples held down by any reason that lowers the clocks) from NVML's reason bits."""
    throttle = {name: float(((reasons & bit) != 0).mean()) for bit, name in THROTTLE_REASONS.items()
                if ((reasons & bit) != 0).any()}
    return {"throttle": throttle, "throttled_share": float(((reasons & THROTTLE_MASK) != 0).mean())}


def _skipped(g: _Samples, rank_traces: list[RankTrace]) -> str:
    """Why there is no telemetry view: no trace holds samples (the first reason a trace gives), or
    none of them falls in a counted step."""
    if not g.parts:
        return g.skipped[0] if g.skipped else "no telemetry record in the traces (perfscope profile records it on a " \
            "CUDA device)"
    taken = sum(len(rt.table.telemetry.samples) for rt in rank_traces if rt.table.telemetry is not None)
    return (f"{taken} telemetry samples, none inside the counted steps (their clock does not meet the trace's, or "
            "they were taken outside the profiled window)")


def _stat(rows: pd.DataFrame, col: str, how: str, scale: float = 1.0) -> float | None:
    v = rows[col].dropna()
    return float(getattr(v, how)()) / scale if len(v) else None


def _unsettled(longest_s: float, averaging: float, source: str) -> str:
    """Why no sample is settled: the window is no longer than the device's averaging time, or no
    sample came that far into it."""
    if longest_s <= averaging:
        return (f"the profiled steps span {longest_s * 1000:,.0f} ms, no more than the {averaging:g} s over which "
                f"{source} averages utilisation and power: its readings would hold time before the window")
    return (f"no sample of the counted steps was taken {averaging:g} s or more into the window, the time over "
            f"which {source} averages utilisation and power: its readings would hold time before the window")


def throttle_warning(view: dict | None) -> str | None:
    """The warning for clocks held down in at least :data:`THROTTLE_WARN_SHARE` of the samples."""
    if not view or view.get("skipped") or (view.get("throttled_share") or 0) < THROTTLE_WARN_SHARE:
        return None
    reasons = ", ".join(f"{k} {v:.0%}" for k, v in sorted(view["throttle"].items(), key=lambda kv: -kv[1]))
    clocks = view.get("sm_clock_mhz") or {}
    span = f" (SM clock {clocks['min']:.0f}-{clocks['max']:.0f} MHz)" if clocks.get("min") is not None else ""
    return (f"the GPU's clocks were throttled in {view['throttled_share']:.0%} of the telemetry samples of the counted "
            f"steps: {reasons}{span}; the same code runs slower until cooling or the power limit is fixed")
