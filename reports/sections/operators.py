"""Operators by name and input shape (``details.operators``): calls, host time and the device time
of what they launched, self and with the operators nested in them."""

from __future__ import annotations

from perfscope.reports import model
from perfscope.reports.html import count, esc, ms, note, num, section, table, truncate

NAME_LIMIT = 90
SHAPE_LIMIT = 70


def _cells(row: dict, gpu: bool) -> list[str]:
    cells = [count(row.get("calls")), ms(row.get("host_us"), unit=False), ms(row.get("host_self_us"), unit=False)]
    if gpu:
        cells += [ms(row.get("device_us"), unit=False), ms(row.get("device_self_us"), unit=False)]
    return cells


def _rows(k: int, r: dict, gpu: bool) -> list[tuple[str, list[str]]]:
    """Operator k's row, then a row per input shape recorded under it."""
    name = str(r.get("name", ""))
    rows = [("", [str(k), f'<span title="{esc(truncate(name, 2000))}">{esc(truncate(name, NAME_LIMIT))}</span>',
                  "", *_cells(r, gpu)])]
    for shape in (s for s in r.get("shapes") or [] if isinstance(s, dict)):
        dims = str(shape.get("input_dims", ""))
        rows.append(("sub", ["", "", f'<code title="{esc(truncate(dims, 2000))}">{esc(truncate(dims, SHAPE_LIMIT))}'
                             "</code>", *_cells(shape, gpu)]))
    return rows


def _nothing_shown(view) -> str:
    skipped = isinstance(view, dict) and view.get("skipped")
    return note("Not placed: a trace holds more than 2 million operators in its steps." if skipped else
                "No operators in the counted steps.")


def _caption(view: dict, gpu: bool) -> str:
    order = "device self time" if gpu else "host self time"
    shapes = ("Under each, its input shapes with most time (the profiler's record_shapes)." if view.get("with_shapes")
              else "No input shapes: the trace was recorded without record_shapes.")
    return (f"The {len(view['rows'])} of {count(view.get('operators'))} operators with the most {order} over the counted "
            f"steps, all ranks and threads ({count(view.get('calls'))} calls). Self: less the operators nested in it. "
            + ("Device: GPU time of the kernels, copies and memsets launched from it. " if gpu else "") + shapes)


def render(summary: dict) -> str:
    """The Operators section (a note when the summary has no operator view)."""
    view = model.details(summary).get("operators")
    title = "Operators"
    if not isinstance(view, dict) or not view.get("rows"):
        return section("operators", title, _nothing_shown(view))
    gpu = summary.get("mode") == "gpu"
    rows = [row for k, r in enumerate((r for r in view["rows"] if isinstance(r, dict)), 1) for row in _rows(k, r, gpu)]
    heads = [("#", ""), ("operator", "name"), ("input shapes", "l"), ("calls", ""), ("host (ms)", ""), ("host self (ms)", "")]
    if gpu:
        heads += [("device (ms)", ""), ("device self (ms)", "")]
    caption = _caption(view, gpu)
    skipped = num(view.get("skipped"))
    extra = note(f"{int(skipped)} trace(s) left out: more than 2 million operators to place.") if skipped else ""
    return section("operators", title, model.withheld_note(summary) + table(heads, rows, caption) + extra)
