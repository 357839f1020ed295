"""The run's memory view: peak memory per step and rank, the capacity it is measured against,
the headroom left, and whether a run sits near the limit (``docs/metrics.md``, Memory).

Inputs are the per-step columns ``perfscope profile`` records (:mod:`perfscope.collect.memory`):
``device_peak_allocated_bytes``/``device_peak_reserved_bytes`` on CUDA, ``peak_rss_bytes`` on the
host, and each trace's ``memory_capacity``. Traces recorded otherwise have none: no view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from perfscope.analysis.rank_trace import RankTrace

# Headroom below this share of capacity is "near the limit": the caching allocator's blocks
# fragment (a request can fail with free memory scattered over blocks too small for it), and
# cuDNN/cuBLAS workspaces and a larger batch shape need room on top of the measured peak.
NEAR_LIMIT_SHARE = 0.10


def _peak(frame: pd.DataFrame, col: str) -> float | None:
    if col not in frame:
        return None
    v = frame[col].to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    return int(v.max()) if v.size else None


def _device_capacity(rt: RankTrace) -> int | None:
    cap = rt.table.memory_capacity.device_total_bytes
    if cap:
        return int(cap)
    # Kineto's deviceProperties of a GPU trace
    return next((d.total_memory_bytes for d in rt.table.device_properties if (d.total_memory_bytes or 0) > 0), None)


def memory_view(rank_traces: list[RankTrace], ranks: list[int], frame: pd.DataFrame) -> dict | None:
    """The memory section of ``details`` over the counted steps (``frame``), or None unmeasured.

    Returns:
        ``kind`` (``"device"``: the CUDA allocator; ``"host"``: the process's resident set),
        ``ranks[]`` (``rank``, ``host``, ``peak_allocated_bytes`` and ``peak_reserved_bytes``
        (device) or ``peak_rss_bytes`` (host), ``capacity_bytes``, ``headroom_bytes``,
        ``headroom_share``), run-wide ``peak_bytes`` (the largest peak: reserved on the device,
        resident on the host), ``capacity_bytes``, ``headroom_bytes`` and ``headroom_share`` (the
        least of any rank; on the host the ranks of one machine share it, so their peaks are
        summed: an upper bound, as the peaks need not coincide, which can exceed the capacity: the
        headroom is then negative), ``near_limit``, ``near_limit_share`` and ``problems``
        (records that contradict themselves, e.g. a device peak above its capacity).
    """
    kind = _measured(frame)
    if kind is None:
        return None
    rows, problems = [], []
    for rt, rank in zip(rank_traces, ranks):
        mine = frame[(frame["rank"] == rank) & (frame["worker"] == rt.table.worker)]
        if not mine.empty:
            rows.append((_device_row if kind == "device" else _host_row)(rt, int(rank), mine, problems))
    _headroom(rows, shared_by_host=kind == "host")
    peaks = [p for p in (r.pop("_peak") for r in rows) if p is not None]
    return {"kind": kind, "ranks": rows, "peak_bytes": max(peaks, default=None), **_tightest(rows),
            "near_limit_share": NEAR_LIMIT_SHARE, "problems": problems}


def _tightest(rows: list[dict]) -> dict:
    """The run-wide capacity, headroom and share: the rank with the least headroom's."""
    known = [r for r in rows if r["headroom_share"] is not None]
    tightest = min(known, key=lambda r: r["headroom_share"]) if known else {}
    share = tightest.get("headroom_share")
    return {"capacity_bytes": tightest.get("capacity_bytes"), "headroom_bytes": tightest.get("headroom_bytes"),
            "headroom_share": share, "near_limit": share is not None and share < NEAR_LIMIT_SHARE}


def _measured(frame: pd.DataFrame) -> str | None:
    """``"device"`` where the steps carry the CUDA allocator's peaks, else ``"host"`` where they
    carry the resident set's, else None."""
    for kind, column in (("device", "device_peak_reserved_bytes"), ("host", "peak_rss_bytes")):
        if column in frame and frame[column].notna().any():
            return kind
    return None


def _device_row(rt: RankTrace, rank: int, mine: pd.DataFrame, problems: list[str]) -> dict:
    """A rank's device peaks and capacity (None, with a problem named, where the peak exceeds it)."""
    peak = _peak(mine, "device_peak_reserved_bytes")
    cap = _device_capacity(rt)
    if cap is not None and peak is not None and peak > cap:  # a device cannot reserve more than it has
        problems.append(f"rank {rank}: the recorded device peak ({peak / 2**30:.2f} GiB) is above the "
                        f"device's capacity ({cap / 2**30:.2f} GiB); no headroom is given for it")
        cap = None
    return {"rank": rank, "host": rt.table.host, "peak_allocated_bytes": _peak(mine, "device_peak_allocated_bytes"),
            "peak_reserved_bytes": peak, "capacity_bytes": cap, "_peak": peak}


def _host_row(rt: RankTrace, rank: int, mine: pd.DataFrame, problems: list[str]) -> dict:
    """A rank's resident-set peak and its machine's memory."""
    peak = _peak(mine, "peak_rss_bytes")
    return {"rank": rank, "host": rt.table.host, "peak_rss_bytes": peak,
            "capacity_bytes": rt.table.memory_capacity.host_total_bytes, "_peak": peak}


def _headroom(rows: list[dict], *, shared_by_host: bool) -> None:
    """Each row's ``headroom_bytes`` and ``headroom_share`` against its capacity; ranks of one
    machine share its memory (the host's), so there their peaks are summed."""
    used = {r["host"]: 0 for r in rows}
    for r in rows:
        used[r["host"]] += r["_peak"] or 0
    for r in rows:
        peak, cap = (used[r["host"]] if shared_by_host else r["_peak"]), r["capacity_bytes"]
        r["headroom_bytes"] = cap - peak if cap and peak is not None else None
        r["headroom_share"] = r["headroom_bytes"] / cap if r["headroom_bytes"] is not None else None


def memory_warnings(view: dict | None) -> list[str]:
    """The warnings of a memory view: near the limit (or the ranks' peaks above it), and records
    that contradict themselves."""
    if not view:
        return []
    out = list(view.get("problems") or [])
    if view.get("near_limit"):
        what = "device memory" if view["kind"] == "device" else "host memory"
        if view["headroom_bytes"] < 0:
            out.append(f"{what}: the peaks of the ranks on one machine add up to "
                       f"{-view['headroom_bytes'] / 2**30:.2f} GiB more than its {view['capacity_bytes'] / 2**30:.1f} GiB "
                       "(they need not coincide, but the machine may be swapping)")
        else:
            out.append(f"{what} is near its limit: {view['headroom_bytes'] / 2**30:.2f} GiB free of "
                       f"{view['capacity_bytes'] / 2**30:.1f} GiB at the peak ({view['headroom_share']:.0%} headroom, "
                       f"below {view['near_limit_share']:.0%}); a larger batch or another shape can run out of memory")
    return out
