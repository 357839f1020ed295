"""Memory: the peak per step and rank against the capacity, and the headroom left
(``details.memory``, ``docs/metrics.md`` Memory)."""

from __future__ import annotations

from perfscope.record.schema import Memory, MemoryRank, OomBlock
from perfscope.record.view import Record, record_of
from perfscope.reports import model
from perfscope.reports.html import esc, figure, note, num, pct, section, table
from perfscope.reports.palette import BLUE, SKY
from perfscope.reports.plots import columns
from perfscope.reports.sections import trace_memory

MAX_BARS = 60  # per-step bars drawn; the table and summary.json hold the rest


def gib(value) -> str:
    v = num(value)
    return "-" if v is None else f"{v / 2**30:.2f} GiB"


def _labels(steps: list[dict]) -> list[str]:
    """Each bar's label: its step, with its rank where several ranks are drawn."""
    multi = len({s.get("rank") for s in steps}) > 1
    return [f"r{s.get('rank')} s{s.get('step')}" if multi else str(s.get("step")) for s in steps]


def _step_title(s: dict, col: str, kind: str) -> str:
    """A step's bar tooltip: its peak (reserved and allocated, on a device)."""
    return (f"rank {s.get('rank')} step {s.get('step')}: peak {gib(s[col])}"
            + (f" reserved, {gib(s.get('device_peak_allocated_bytes'))} allocated" if kind == "device" else ""))


def _chart(record: Record, kind: str) -> str:
    col = "device_peak_reserved_bytes" if kind == "device" else "peak_rss_bytes"
    steps = [s for s in model.counted_steps(record) if num(s.get(col)) is not None][:MAX_BARS]
    if not steps:
        return ""
    labels = _labels(steps)
    values = [num(s[col]) / 2**30 for s in steps]
    titles = [_step_title(s, col, kind) for s in steps]
    what = "reserved by the CUDA caching allocator" if kind == "device" else "resident (the process's RSS)"
    svg = columns("memory", values, labels, BLUE if kind == "device" else SKY, "GiB", f"peak memory per step, {what}",
                  titles=titles, width=900)
    return figure(svg, f"Peak memory {what} in each counted step (GiB), from the allocator's or the kernel's own "
                  "peak counters reset at every step boundary.")


def _block_cells(b: OomBlock) -> list[str]:
    """A live allocation at the OOM: its size, the size asked for, its innermost three frames."""
    frames = "<br>".join(esc(f) for f in (b.frames or [])[:3])
    return [f"{(b.bytes or 0) / 2**20:,.1f} MiB", f"{(b.requested_bytes or 0) / 2**20:,.1f} MiB",
            frames or "(no stack recorded)"]


def _oom(record: Record) -> str:
    """The largest live allocations when the GPU ran out of memory (``run.oom``); "" without it."""
    oom = record.run.oom if record.run else None
    if oom is None:
        return ""
    rows = [("", _block_cells(b)) for b in oom.largest or []]
    head = (f'<p class="verdict warn"><strong>Out of memory</strong> on cuda:{esc(oom.device)}: '
            f"{esc(gib(oom.requested_bytes))} asked for with {esc(gib(oom.allocated_bytes))} allocated, "
            f"{esc(gib(oom.reserved_bytes))} reserved and {esc(gib(oom.free_bytes))} free.</p>")
    return head + table([("live allocation", ""), ("requested", ""), ("made at (innermost frames)", "l")], rows,
                        "The largest live allocations when the allocation failed, from the caching allocator's "
                        "snapshot; torch's own snapshot (oom-rank*.pickle beside the traces) opens in "
                        "https://pytorch.org/memory_viz.")


def _head(m: Memory, kind: str) -> str:
    """The peak against the capacity and the headroom, flagged near the limit."""
    near = bool(m.near_limit)
    what = "device memory (reserved by the CUDA caching allocator)" if kind == "device" else "host memory (resident)"
    shared = " On the host the ranks of one machine share it: their peaks are summed." if kind == "host" else ""
    return (f'<p class="verdict{" warn" if near else ""}"><strong>Peak {esc(gib(m.peak_bytes))}</strong> of '
            f"{esc(what)}; capacity {esc(gib(m.capacity_bytes))}, headroom {esc(gib(m.headroom_bytes))} "
            f"({esc(pct(m.headroom_share, 0))})."
            f"<small>{'Near the limit: ' if near else ''}below {esc(pct(m.near_limit_share, 0))} headroom a "
            "run is flagged: the allocator's blocks fragment, and workspaces or a larger batch need room above the "
            "measured peak." + shared + "</small></p>")


def _rank_row(r: MemoryRank, kind: str, near_limit_share: float) -> tuple[str, list[str]]:
    """A rank's peaks, capacity and headroom; highlighted below the near-limit share."""
    share = r.headroom_share
    cells = [esc(r.rank), esc(r.host or "-")]
    if kind == "device":
        cells += [gib(r.peak_allocated_bytes), gib(r.peak_reserved_bytes)]
    else:
        cells += [gib(r.peak_rss_bytes)]
    cells += [gib(r.capacity_bytes), gib(r.headroom_bytes), pct(r.headroom_share, 0)]
    return ("hl" if share is not None and share < near_limit_share else "", cells)


def render(summary: dict | Record) -> str:
    record = record_of(summary)
    m = model.details(record).memory
    title = "Memory"
    from_traces = trace_memory.render(record)
    if m is None:
        return section("memory", title, _oom(record) + note(
            ("No per-step peak record: the traces were not taken by perfscope profile, which records the CUDA "
             "caching allocator's peaks on a GPU and the process's peak resident set on the host, against the "
             "capacity." if from_traces else
             "Not measured: the traces hold no per-step memory record and no allocator instants. perfscope profile "
             "records the first (the CUDA caching allocator's peaks on a GPU, the process's peak resident set on "
             "the host); the profiler's profile_memory=True the second.")) + from_traces)
    kind = "device" if m.kind == "device" else "host"
    head = _head(m, kind)
    rows = [_rank_row(r, kind, m.near_limit_share or 0) for r in m.ranks or []]
    heads = [("rank", "l"), ("host", "l")]
    heads += [("peak allocated", ""), ("peak reserved", "")] if kind == "device" else [("peak resident", "")]
    heads += [("capacity", ""), ("headroom", ""), ("headroom share", "")]
    caption = ("Allocated: memory in tensors; reserved: what the caching allocator holds from the driver (allocated "
               "plus cached blocks). Headroom: capacity minus the peak reserved." if kind == "device" else
               "Resident: the process's peak resident set per step. Headroom: the machine's memory minus the peaks "
               "of the ranks on it (other processes use some too).")
    return section("memory", title, _oom(record) + head + _chart(record, kind) + table(heads, rows, caption) + from_traces)
