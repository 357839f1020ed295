"""GPU copies by direction, pageable host memory called out."""

from __future__ import annotations

from reports import model
from reports.html import count, esc, ms, note, num, section, table


def _bytes(b) -> str:
    v = num(b)
    if v is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if v >= size:
            return f"{v / size:.1f} {unit}"
    return f"{int(v)} B"


def render(summary: dict) -> str:
    title = "Memory copies"
    if summary.get("mode") != "gpu":
        return section("memcpy", title, note("CPU-only run: no GPU copies."))
    d = model.details(summary)
    entries = [e for e in d.get("memcpy") or [] if isinstance(e, dict)]
    if not d:
        return section("memcpy", title, note("This summary has no details section; run perfscope analyze again."))
    if not entries:
        return section("memcpy", title, note("No memory copies in the counted steps."))
    rows = []
    for e in entries:
        pageable = bool(e.get("pageable"))
        gbps = num(e.get("gb_per_s"))
        rows.append(("hl" if pageable else "", [
            esc(e.get("direction", "-")), "pageable" if pageable else "pinned / device", count(e.get("count")),
            ms(e.get("total_us"), unit=False), _bytes(e.get("bytes")), "-" if gbps is None else f"{gbps:.1f}",
        ]))
    tab = table([("direction", "l"), ("host memory", "l"), ("count", ""), ("total (ms)", ""), ("bytes", ""),
                 ("GB/s", "")], rows, "Copies that are GPU work of the counted steps (all ranks), by direction. "
                 "GB/s is over the copies that took time and say how many bytes they moved.")
    zero = sum(int(num(e.get("zero_duration")) or 0) for e in entries)
    if zero:
        tab += note(f"{zero:,} copies lasted 0 µs: counted above, but not in the bandwidth.")
    warn = ""
    paged = [e for e in entries if e.get("pageable")]
    if paged:
        n = sum(int(num(e.get("count")) or 0) for e in paged)
        t = sum(num(e.get("total_us")) or 0.0 for e in paged)
        warn = (f'<p class="warn">{n:,} copies ({ms(t)}) use pageable host memory: each blocks the host and runs '
                "slower than a pinned copy. Set pin_memory=True in the DataLoader and copy with non_blocking=True.</p>")
    return section("memcpy", title, warn + tab)
