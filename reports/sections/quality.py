"""What the analysis could not use: the warnings at the top of the page, and the data-quality
section -- every event dropped, clipped, set aside or left unread, and why each left-out step was
left out."""

from __future__ import annotations

from perfscope.record.schema import QualityEntry
from perfscope.record.view import Record, record_of
from perfscope.reports.html import count, esc, note, section, table, truncate

MAX_SHOWN = 30  # warnings listed at the top; summary.json holds them all
STATUS_WORDS = {
    "ok": "counted in the verdict",
    "incomplete": "incomplete: the profiler did not record all of it",
    "initialisation": "one-time initialisation",
    "host-contended": "host-contended: the training thread was starved of CPU",
}


def render_warnings(summary: dict | Record) -> str:
    """The warnings, first thing under the header (empty when there are none)."""
    warnings = record_of(summary).warnings or []
    if not warnings:
        return ""
    items = "".join(f"<li>{esc(truncate(w, 400))}</li>" for w in warnings[:MAX_SHOWN])
    more = (f"<li>... and {len(warnings) - MAX_SHOWN:,} more (summary.json lists them all)</li>"
            if len(warnings) > MAX_SHOWN else "")
    n = len(warnings)
    return (f'<div class="warnbox" id="warnings"><strong>{n} warning{"s" if n != 1 else ""}</strong>: the analysis '
            f'read the traces with the repairs and omissions below (details in <a href="#quality">Data quality</a>).'
            f"<ul>{items}{more}</ul></div>\n")


def _entries(record: Record) -> list[QualityEntry]:
    if record.data_quality is not None:
        return record.data_quality
    # an older summary: only per-trace lists, if any
    return [e for t in record.traces or [] for e in t.data_quality or []]


def render(summary: dict | Record) -> str:
    record = record_of(summary)
    steps = record.steps or []
    return section("quality", "Data quality", _by_status(steps) + _left_out(steps) + _events(record)
                   + _skipped_files(record))


def _by_status(steps: list[dict]) -> str:
    by_status: dict = {}
    for s in steps:
        st = s.get("status") or ("ok" if s.get("complete", True) else "incomplete")
        by_status[st] = by_status.get(st, 0) + 1
    status_rows = [("" if st == "ok" else "cut", [esc(STATUS_WORDS.get(st, st)), count(n)]) for st, n in by_status.items()]
    return table([("steps", "l"), ("count", "")], status_rows,
                 "Steps by status: only counted steps enter the verdict (docs/metrics.md, Evidence).")


def _left_out(steps: list[dict]) -> str:
    """Why each left-out step was left out, grouped by status and reason ("" when none was)."""
    reasons: dict = {}
    for s in steps:
        if s.get("status") not in (None, "ok") and s.get("status_reason"):
            reasons.setdefault((s.get("status"), s.get("status_reason")), []).append(s)
    if not reasons:
        return ""

    def which(ss: list[dict]) -> str:
        return ", ".join(f"{x.get('rank')}:{x.get('step')}" for x in ss[:8]) + (f" and {len(ss) - 8} more" if len(ss) > 8 else "")

    rows = [("cut", [esc(st), esc(which(ss)), esc(truncate(r, 300))]) for (st, r), ss in list(reasons.items())[:40]]
    return table([("status", "l"), ("rank:step", "l"), ("why", "l")], rows, "Why each left-out step was left out.")


def _events(record: Record) -> str:
    """Every event the analysis could not use as written, or a note that there were none (or that
    the summary predates the record)."""
    entries = _entries(record)
    if not entries:
        if record.data_quality is not None:
            return note("Nothing was repaired, dropped, clipped or set aside: every event was used as written.")
        return note("This summary predates the data-quality record; run perfscope analyze on the traces again.")
    rows = []
    for e in entries:
        ex = ", ".join(f"{k} ({v:,.0f})" for k, v in list((e.examples or {}).items())[:5])
        rows.append(("hl" if e.action != "noted" else "", [
            esc(e.action or "-"), count(e.count), esc(e.unit or "event"),
            esc(truncate(e.reason or "", 200)), f'<span class="name">{esc(truncate(ex, 300))}</span>']))
    return table([("action", "l"), ("count", ""), ("of", "l"), ("reason", "l"), ("examples", "l")], rows,
                 "Every event the analysis could not use as written, summed over the traces "
                 "(repair order in docs/metrics.md). Highlighted rows changed or left out data.")


def _skipped_files(record: Record) -> str:
    skipped = record.skipped or []
    if not skipped:
        return ""
    return table([("file left out", "l"), ("why", "l")],
                 [("hl", [esc(s.path), esc(truncate(s.reason, 300))]) for s in skipped],
                 "Trace files that could not be read; the analysis describes the others.")
