"""Histogram of GPU idle gaps inside the counted steps: how many, and how much time, by length."""

from __future__ import annotations

from perfscope.record.schema import IdleGaps
from perfscope.record.view import Record, record_of
from perfscope.reports import model
from perfscope.reports.html import esc, figure, note, num, section
from perfscope.reports.palette import GREY, SKY
from perfscope.reports.plots import columns


LOG_SPAN = 100  # the count axis turns logarithmic when the fullest bin holds this many times the emptiest


def _edge(us) -> str:
    v = num(us)
    if v is None:
        return "∞"
    if v >= 1000:
        return f"{v / 1000:g} ms"
    return f"{v:g} µs"


def bin_labels(edges: list) -> list[str]:
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        out.append(f"≥ {_edge(a)}" if num(b) is None else f"{_edge(a)}–{_edge(b)}")
    return out


def render(summary: dict | Record) -> str:
    record = record_of(summary)
    title = "Idle gaps"
    h = model.details(record).idle_gaps
    why = _nothing_to_draw(record, h)
    if why:
        return section("gaps", title, note(why))
    labels = bin_labels(h.edges_us)
    counts = [c or 0.0 for c in h.count or []][: len(labels)]
    totals = [(t or 0.0) / 1000.0 for t in h.total_us or []][: len(labels)]
    if not counts or sum(counts) == 0:
        return section("gaps", title, note("The GPU was never idle inside the counted steps."))
    cap = ("GPU idle gaps inside the counted step windows (all ranks), by length. Left: how many; right: the idle "
           "time they add up to (ms). Many gaps under 10 µs are launch latency between back-to-back kernels; "
           "a few long gaps are the host (input, synchronisation) holding the GPU back.")
    return section("gaps", title, model.withheld_note(record) + _charts(labels, counts, totals)
                   + f'<p class="muted">{esc(cap)}</p>')


def _nothing_to_draw(record: Record, h: IdleGaps | None) -> str | None:
    """Why there is no histogram (a CPU run, no record, no counted step), or None."""
    if record.mode != "gpu":
        return "CPU-only run: there is no GPU to be idle."
    if h is not None and h.edges_us is not None:
        return None
    if model.overall(record).steps_counted == 0:
        return "No step is counted (see Data quality): no idle gaps to show."
    return "No idle-gap histogram in this summary."


def _charts(labels: list[str], counts: list[float], totals: list[float]) -> str:
    """The count and total-time histograms side by side; counts spanning decades on a log axis."""
    nonzero = [c for c in counts if c > 0]
    log = max(nonzero) >= LOG_SPAN * min(nonzero)  # counts spanning decades: a linear axis hides the rare long gaps
    left = columns("gaps-count", counts, labels, GREY, "number of gaps" + (" (log scale)" if log else ""), "idle gaps by length: count",
                   [f"{lab}: {int(c):,} gap" + ("" if c == 1 else "s") for lab, c in zip(labels, counts)], log=log)
    right = columns("gaps-time", totals, labels, SKY, "idle time (ms)", "idle gaps by length: total time",
                    [f"{lab}: {t:.3f} ms idle" for lab, t in zip(labels, totals)])
    count_caption = "Number of gaps per length bin" + (" (logarithmic axis: the counts span decades)." if log else ".")
    return (f'<div class="cols"><div>{figure(left, count_caption)}</div>'
            f'<div>{figure(right, "Total idle time per length bin (ms).")}</div></div>')
