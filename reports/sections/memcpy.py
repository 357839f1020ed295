"""GPU copies by direction, pageable host memory called out."""

from __future__ import annotations

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


def _pageable_advice(summary: dict, paged: list[dict]) -> str:
    steps_us = sum(num(s.get("step_time_us")) or 0.0 for s in model.counted_steps(summary))
    return "".join(_direction_advice(direction, [e for e in paged if str(e.get("direction")) == direction], steps_us)
                   for direction in sorted({str(e.get("direction")) for e in paged}))


def _direction_advice(direction: str, mine: list[dict], steps_us: float) -> str:
    """The pageable copies of one direction: too little to change, or a warning with the fix."""
    n = sum(int(num(e.get("count")) or 0) for e in mine)
    t = sum(num(e.get("total_us")) or 0.0 for e in mine)
    share = t / steps_us if steps_us > 0 else None
    of = f", {share:.1%} of the counted steps' time" if share is not None else ""
    if share is not None and share < QUIET_SHARE:
        return note(f"{n:,} {direction} copies use pageable host memory ({ms(t)} in all{of}): too little to be "
                    "worth changing.")
    fix = FIX.get(direction, "Allocate the host side pinned (pin_memory=True) and copy with non_blocking=True.")
    return (f'<p class="warn">{n:,} {esc(direction)} copies ({ms(t)}{esc(of)}) use pageable host memory: each '
            f"blocks the host and runs slower than a pinned copy. {esc(fix)}</p>")


def _nothing_to_show(summary: dict, d: dict, entries: list[dict]) -> str | None:
    """Why there is no table of copies (a CPU run, no details, no copies), or None."""
    if summary.get("mode") != "gpu":
        return "CPU-only run: no GPU copies."
    if not d:
        return "This summary has no details section; run perfscope analyze again."
    return None if entries else "No memory copies in the counted steps."


def _zero_note(entries: list[dict]) -> str:
    zero = sum(int(num(e.get("zero_duration")) or 0) for e in entries)
    return note(f"{zero:,} copies lasted 0 µs: counted above, but not in the bandwidth.") if zero else ""


def _copy_row(e: dict) -> tuple[str, list[str]]:
    pageable = bool(e.get("pageable"))
    gbps = num(e.get("gb_per_s"))
    return ("hl" if pageable else "", [
        esc(e.get("direction", "-")), "pageable" if pageable else "pinned / device", count(e.get("count")),
        ms(e.get("total_us"), unit=False), _bytes(e.get("bytes")), "-" if gbps is None else f"{gbps:.1f}",
    ])


def render(summary: dict) -> str:
    title = "Memory copies"
    d = model.details(summary)
    entries = [e for e in d.get("memcpy") or [] if isinstance(e, dict)]
    why = _nothing_to_show(summary, d, entries)
    if why:
        return section("memcpy", title, note(why))
    rows = [_copy_row(e) for e in entries]
    tab = table([("direction", "l"), ("host memory", "l"), ("count", ""), ("total (ms)", ""), ("bytes", ""),
                 ("GB/s", "")], rows, "Copies that are GPU work of the counted steps (all ranks), by direction. "
                 "GB/s is over the copies that took time and say how many bytes they moved.")
    tab += _zero_note(entries)
    paged = [e for e in entries if e.get("pageable")]
    return section("memcpy", title, model.withheld_note(summary) + _pageable_advice(summary, paged) + tab)
