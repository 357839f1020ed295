"""Run facts: what ran, where, with which versions and schedule; the traces read; the notes.

The warnings head the page (:func:`perfscope.reports.sections.quality.render_warnings`), not this section."""

from __future__ import annotations

import shlex

import msgspec

from perfscope.record.schema import Run, TraceEntry
from perfscope.record.view import Record, record_of
from perfscope.reports.html import esc, note, section, table

# (run field, label) in display order; the schema's other fields of ``run`` are listed after them.
FIELDS = (
    ("script", "script"), ("args", "arguments"), ("source", "traces analyzed"), ("cwd", "working directory"),
    ("host", "host"), ("python", "Python"), ("torch_version", "torch"), ("cuda_version", "CUDA"),
    ("devices", "devices"), ("world_size", "world size"), ("ranks_analyzed", "ranks analyzed"),
    ("nproc_per_node", "processes per node"), ("rank", "rank (torchrun)"), ("schedule", "schedule"),
    ("started_at", "started"), ("duration_s", "duration"), ("exit_code", "exit code"), ("error", "error"),
)


def counted(names) -> str:
    """``["A100", "A100", "V100"]`` -> ``"2 x A100, V100"``."""
    counts: dict = {}
    for n in names:
        counts[str(n)] = counts.get(str(n), 0) + 1
    return ", ".join(f"{c} x {n}" if c > 1 else n for n, c in counts.items())


# The facts shown in a form of their own: key -> (the type it has, how it is written).
_FORMATS = {
    "args": (list, lambda v: shlex.join(str(a) for a in v) or "(none)"),
    "devices": (list, lambda v: counted(v) or "-"),
    "schedule": (dict, lambda v: ", ".join(f"{k} {'-' if v[k] is None else v[k]}" for k in v)),
    "duration_s": ((int, float), lambda v: f"{v:.1f} s"),
}


def _value(key: str, v) -> str:
    if v is None:
        return "-"
    if isinstance(v, msgspec.Struct):
        v = msgspec.to_builtins(v)
    kind, write = _FORMATS.get(key, (None, None))
    return write(v) if kind is not None and isinstance(v, kind) else _plain(v)


def _plain(v, depth: int = 0) -> str:
    """A nested value in words, not Python's repr: ``a: 1; b: x, y``; empty ones as ``-``."""
    if isinstance(v, dict):
        return _mapping(v, depth)
    if isinstance(v, (list, tuple)):
        return ", ".join(_plain(x, depth + 1) for x in v) if v else "-"
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def _mapping(v: dict, depth: int) -> str:
    if not v:
        return "-"
    if depth >= 2:
        return f"{len(v)} entries"
    return "; ".join(f"{k}: {_plain(x, depth + 1)}" for k, x in v.items())


def render(summary: dict | Record) -> str:
    record = record_of(summary)
    facts = '<dl class="facts">' + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in _items(record)) + "</dl>"
    rows = [_trace_row(t) for t in record.traces or []]
    traces = table([("file", "l"), ("rank", ""), ("mode", "l"), ("events", ""), ("devices", "l")], rows,
                   "The trace files analyzed.") if rows else ""
    notes = "".join(note(f"Note: {n}") for n in record.notes or [])
    viewers = note("The trace files open in Perfetto (ui.perfetto.dev, Open trace file), in chrome://tracing, and in "
                   "TensorBoard's profiler plugin (tensorboard --logdir OUT_DIR/traces); perfscope merge OUT_DIR puts "
                   "every rank's trace in one file on one clock.") if rows else ""
    return section("facts", "Run facts", facts + traces + viewers + notes)


# Written by both `perfscope profile` and `perfscope analyze`, and by `profile` alone (null where
# unknown; `error` only when the script failed): listed with "-" where the run wrote them, so a CPU
# build shows its CUDA version as "-".
_BOTH_SIDES = frozenset({"devices", "world_size", "ranks_analyzed"})
_PROFILE_SIDE = frozenset(k for k, _ in FIELDS) - _BOTH_SIDES - {"source", "error"}


def _listed(run: Run, key: str) -> bool:
    return (getattr(run, key) is not None or key in _BOTH_SIDES
            or (key in _PROFILE_SIDE and run.script is not None))


def _items(record: Record) -> list[tuple[str, str]]:
    """(label, value) of the run's facts: the fields of :data:`FIELDS` in their order, then the
    schema's others that the record has, then the mode, perfscope's version and when the analysis ran."""
    run = record.run or Run()
    labels = dict(FIELDS)
    keys = [*labels, *(k for k in run.__struct_fields__ if k not in labels)]
    items = [(labels.get(k, k), _value(k, getattr(run, k))) for k in keys if _listed(run, k)]
    return items + [("mode", f"{record.mode or '-'} trace"), ("perfscope", record.perfscope_version or "-"),
                    ("analyzed at", record.generated_at or "-")]


def _trace_row(t: TraceEntry) -> tuple[str, list[str]]:
    events = f"{t.events:,.0f}" if t.events is not None else "-"
    return ("", [esc(t.path), esc(t.rank), esc(t.mode), events, esc(counted(t.devices or []))])
