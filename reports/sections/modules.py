"""Time per ``nn.Module`` (``details.modules``): the forward pass, by module path."""

from __future__ import annotations

from perfscope.record.schema import ModuleRow, Modules
from perfscope.record.view import Record, record_of
from perfscope.reports import model
from perfscope.reports.html import count, esc, ms, section, table, truncate

NAME_LIMIT = 90


def _cells(r: ModuleRow, gpu: bool) -> list[str]:
    """One module's row: its path indented by depth, calls, host (and device) times in ms."""
    depth = min(r.depth or 0, 8)
    name = r.module or ""
    cells = [f'<span style="padding-left:{depth}em" title="{esc(truncate(name, 2000))}">'
             f"{esc(truncate(name, NAME_LIMIT))}</span>",
             count(r.calls), ms(r.host_us, unit=False), ms(r.host_self_us, unit=False)]
    if gpu:
        cells += [ms(r.device_us, unit=False), ms(r.device_self_us, unit=False)]
    return cells


def render(summary: dict | Record) -> str:
    """The Modules section (only shown when the summary has a module view)."""
    record = record_of(summary)
    view = model.details(record).modules or Modules()
    gpu = record.mode == "gpu"
    rows = [("", _cells(r, gpu)) for r in view.rows or []]
    heads = [("module", "l"), ("calls", ""), ("host (ms)", ""), ("host self (ms)", "")]
    if gpu:
        heads += [("device (ms)", ""), ("device self (ms)", "")]
    source = ("ranges perfscope profile records around each module call of the traced steps"
              if view.source == "perfscope" else "the profiler's module events (with_stack)")
    caption = (f"The {len(rows)} of {count(view.modules)} modules with most "
               f"{'device' if gpu else 'host'} time in the forward pass over the counted steps, all ranks, from "
               f"{source}; each under its parent. Self: less its child modules. The backward runs in autograd's "
               "engine, outside any module call, and is not in these figures (docs/metrics.md, Modules).")
    return section("modules", "Modules", model.withheld_note(record) + table(heads, rows, caption))
