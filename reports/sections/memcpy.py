"""GPU copies by direction, pageable host memory called out."""

from __future__ import annotations

from perfscope.record.schema import Details, MemcpyRow
from perfscope.record.view import Record, record_of
from perfscope.reports import model
from perfscope.reports.html import count, esc, ms, note, num, section, table


def _bytes(b) -> str:
    v = num(b)
    if v is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if v >= size:
            return f"{v / size:.1f} {unit}"
    return f"{int(v)} B"


# Pageable copies that take less than this share of the counted steps' time are noted, not warned
# about: changing the code would not make the run measurably faster.
QUIET_SHARE = 0.01
# What fixes a pageable copy depends on its direction: pinning the DataLoader's batches only
# touches host-to-device copies.
FIX = {
    "HtoD": "Set pin_memory=True in the DataLoader and copy with non_blocking=True.",
    "DtoH": ("These copy results to the host (.cpu(), .item(), .tolist(), printing a tensor) into pageable memory and "
             "block the host until the GPU reaches them: read fewer values back (log every N steps), or copy into a "
             "pinned buffer with non_blocking=True and synchronise where the value is needed."),
}


def _pageable_advice(record: Record, paged: list[MemcpyRow]) -> str:
    steps_us = sum(num(s.get("step_time_us")) or 0.0 for s in model.counted_steps(record))
    return "".join(_direction_advice(direction, [e for e in paged if str(e.direction) == direction], steps_us)
                   for direction in sorted({str(e.direction) for e in paged}))


def _direction_advice(direction: str, mine: list[MemcpyRow], steps_us: float) -> str:
    """The pageable copies of one direction: too little to change, or a warning with the fix."""
    n = sum(int(e.count or 0) for e in mine)
    t = sum(e.total_us or 0.0 for e in mine)
    share = t / steps_us if steps_us > 0 else None
    of = f", {share:.1%} of the counted steps' time" if share is not None else ""
    if share is not None and share < QUIET_SHARE:
        return note(f"{n:,} {direction} copies use pageable host memory ({ms(t)} in all{of}): too little to be "
                    "worth changing.")
    fix = FIX.get(direction, "Allocate the host side pinned (pin_memory=True) and copy with non_blocking=True.")
    return (f'<p class="warn">{n:,} {esc(direction)} copies ({ms(t)}{esc(of)}) use pageable host memory: each '
            f"blocks the host and runs slower than a pinned copy. {esc(fix)}</p>")


def _nothing_to_show(record: Record, d: Details | None, entries: list[MemcpyRow]) -> str | None:
    """Why there is no table of copies (a CPU run, no details, no copies), or None."""
    if record.mode != "gpu":
        return "CPU-only run: no GPU copies."
    if d is None:
        return "This summary has no details section; run perfscope analyze again."
    return None if entries else "No memory copies in the counted steps."


def _zero_note(entries: list[MemcpyRow]) -> str:
    zero = sum(int(e.zero_duration or 0) for e in entries)
    return note(f"{zero:,} copies lasted 0 µs: counted above, but not in the bandwidth.") if zero else ""


def _copy_row(e: MemcpyRow) -> tuple[str, list[str]]:
    pageable = bool(e.pageable)
    gbps = e.gb_per_s
    return ("hl" if pageable else "", [
        esc(e.direction or "-"), "pageable" if pageable else "pinned / device", count(e.count),
        ms(e.total_us, unit=False), _bytes(e.bytes), "-" if gbps is None else f"{gbps:.1f}",
    ])


def render(summary: dict | Record) -> str:
    record = record_of(summary)
    title = "Memory copies"
    d = record.details
    entries = (d.memcpy if d else None) or []
    why = _nothing_to_show(record, d, entries)
    if why:
        return section("memcpy", title, note(why))
    rows = [_copy_row(e) for e in entries]
    tab = table([("direction", "l"), ("host memory", "l"), ("count", ""), ("total (ms)", ""), ("bytes", ""),
                 ("GB/s", "")], rows, "Copies that are GPU work of the counted steps (all ranks), by direction. "
                 "GB/s is over the copies that took time and say how many bytes they moved.")
    tab += _zero_note(entries)
    paged = [e for e in entries if e.pageable]
    return section("memcpy", title, model.withheld_note(record) + _pageable_advice(record, paged) + tab)
