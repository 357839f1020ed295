"""Operators by name and input shape (``details.operators``): calls, host time and the device time
of what they launched, self and with the operators nested in them."""

from __future__ import annotations

from perfscope.record.schema import OperatorRow, Operators, OperatorShape
from perfscope.record.view import Record, record_of
from perfscope.reports import model
from perfscope.reports.html import count, esc, ms, note, section, table, truncate

NAME_LIMIT = 90
SHAPE_LIMIT = 70


def _cells(row: OperatorRow | OperatorShape, gpu: bool) -> list[str]:
    cells = [count(row.calls), ms(row.host_us, unit=False), ms(row.host_self_us, unit=False)]
    if gpu:
        cells += [ms(row.device_us, unit=False), ms(row.device_self_us, unit=False)]
    return cells


def _rows(k: int, r: OperatorRow, gpu: bool) -> list[tuple[str, list[str]]]:
    """Operator k's row, then a row per input shape recorded under it."""
    name = r.name or ""
    rows = [("", [str(k), f'<span title="{esc(truncate(name, 2000))}">{esc(truncate(name, NAME_LIMIT))}</span>',
                  "", *_cells(r, gpu)])]
    for shape in r.shapes or []:
        dims = shape.input_dims or ""
        rows.append(("sub", ["", "", f'<code title="{esc(truncate(dims, 2000))}">{esc(truncate(dims, SHAPE_LIMIT))}'
                             "</code>", *_cells(shape, gpu)]))
    return rows


def _nothing_shown(view: Operators | None) -> str:
    skipped = view is not None and view.skipped
    return note("Not placed: a trace holds more than 2 million operators in its steps." if skipped else
                "No operators in the counted steps.")


def _caption(view: Operators, gpu: bool) -> str:
    order = "device self time" if gpu else "host self time"
    shapes = ("Under each, its input shapes with most time (the profiler's record_shapes)." if view.with_shapes
              else "No input shapes: the trace was recorded without record_shapes.")
    return (f"The {len(view.rows)} of {count(view.operators)} operators with the most {order} over the counted "
            f"steps, all ranks and threads ({count(view.calls)} calls). Self: less the operators nested in it. "
            + ("Device: GPU time of the kernels, copies and memsets launched from it. " if gpu else "") + shapes)


def render(summary: dict | Record) -> str:
    """The Operators section (a note when the summary has no operator view)."""
    record = record_of(summary)
    view = model.details(record).operators
    title = "Operators"
    if view is None or not view.rows:
        return section("operators", title, _nothing_shown(view))
    gpu = record.mode == "gpu"
    rows = [row for k, r in enumerate(view.rows, 1) for row in _rows(k, r, gpu)]
    heads = [("#", ""), ("operator", "name"), ("input shapes", "l"), ("calls", ""), ("host (ms)", ""), ("host self (ms)", "")]
    if gpu:
        heads += [("device (ms)", ""), ("device self (ms)", "")]
    caption = _caption(view, gpu)
    extra = note(f"{view.skipped} trace(s) left out: more than 2 million operators to place.") if view.skipped else ""
    return section("operators", title, model.withheld_note(record) + table(heads, rows, caption) + extra)
