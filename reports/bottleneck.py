"""The bottleneck report page (``report.html``): one self-contained file, rendered from a summary.

Sections, verdict first (after the warnings, when there are any), in the order of :data:`SECTIONS`,
from which both the page's nav and its body are built: verdict and recommendations, per-step
breakdown, the whole run (every step, timed outside the profiler), timeline of a representative step
(needs the traces), idle gaps, top kernels, launch
statistics, memory copies, memory (peak and headroom), GPU telemetry (GPU runs), ranks, nodes
(multi-node runs), data quality, run facts. Every section renders from the summary record alone except the timeline,
which draws from ``timeline.json`` beside it (written with the summary) or from the traces when they
can be found (``reports.traces``), and otherwise says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from perfscope.atomic import write_text_atomic
from perfscope.record.schema import Run
from perfscope.record.view import Record, record_of
from perfscope.reports import model
from perfscope.reports import traces as _traces
from perfscope.reports.html import esc, page
from perfscope.reports.timeline_record import TimelineRecord
from perfscope.reports.sections import (
    facts, gaps, kernels, memcpy, memory, modules, nodes, operators, quality, ranks, run_steps, steps, telemetry,
    timeline, verdict,
)


@dataclass(frozen=True)
class Traces:
    """What the timeline section draws: a :class:`~perfscope.reports.timeline_record.TimelineRecord`
    (built from the traces or stored beside the summary), or the note saying why there is none."""

    timeline: TimelineRecord | str


def _gpu(record: Record) -> bool:
    return record.mode == "gpu"


@dataclass(frozen=True)
class Section:
    """One section of the report: its ``anchor`` (the ``id`` its HTML carries, and the nav's link),
    its nav ``label`` for a record, whether a record ``shows`` it, and ``render(record, traces)``.
    The page's nav and body are both built from :data:`SECTIONS`, in its order."""

    anchor: str
    label: Callable[[Record], str]
    render: Callable[[Record, Traces], str]
    shows: Callable[[Record], bool] = lambda record: True


def _fixed(text: str) -> Callable[[Record], str]:
    return lambda record: text


SECTIONS = (
    Section("verdict", _fixed("Verdict"), lambda s, t: verdict.render(s)),
    Section("steps", _fixed("Steps"), lambda s, t: steps.render(s)),
    Section("run", _fixed("Whole run"), lambda s, t: run_steps.render(s),
            shows=lambda s: bool(model.details(s).run_steps)),
    Section("timeline", _fixed("Timeline"), lambda s, t: timeline.render(t.timeline)),
    Section("gaps", _fixed("Idle gaps"), lambda s, t: gaps.render(s)),
    Section("kernels", lambda s: "Top kernels" if _gpu(s) else "Top operators", lambda s, t: kernels.render_top(s)),
    Section("operators", _fixed("Operators"), lambda s, t: operators.render(s)),
    Section("modules", _fixed("Modules"), lambda s, t: modules.render(s),
            shows=lambda s: bool(model.details(s).modules and model.details(s).modules.rows)),
    Section("launch", _fixed("Launches"), lambda s, t: kernels.render_launch(s)),
    Section("memcpy", _fixed("Copies"), lambda s, t: memcpy.render(s)),
    Section("memory", _fixed("Memory"), lambda s, t: memory.render(s)),
    Section("telemetry", _fixed("GPU telemetry"), lambda s, t: telemetry.render(s), shows=_gpu),
    Section("ranks", _fixed("Ranks"), lambda s, t: ranks.render(s)),
    Section("nodes", _fixed("Nodes and links"), lambda s, t: nodes.render(s),
            shows=lambda s: bool(model.details(s).nodes and model.details(s).nodes.nodes is not None)),
    Section("quality", _fixed("Data quality"), lambda s, t: quality.render(s)),
    Section("facts", _fixed("Run facts"), lambda s, t: facts.render(s)),
)


def _world(run: Run) -> list[str]:
    """``["world size 8 (2 analyzed)"]`` of the run's facts; ``[]`` without a world size."""
    world, analyzed = run.world_size, run.ranks_analyzed
    if world is None:
        return []
    return [f"world size {world}" + (f" ({analyzed} analyzed)" if analyzed not in (None, world) else "")]


def header(summary: dict | Record, heading: str = "perfscope bottleneck report") -> str:
    record = record_of(summary)
    run = record.run or Run()
    what = run.script or run.source or "analyzed traces"
    bits = [what, f"{(record.mode or '-').upper()} trace", *_world(run)]
    skipped = record.skipped or []
    if skipped:
        bits.append(f"{len(skipped)} trace file{'s' if len(skipped) != 1 else ''} left out (see Data quality)")
    bits.append(f"analyzed {record.generated_at or '-'}")
    return f'<h1>{esc(heading)}</h1>\n<p class="muted">{" · ".join(esc(b) for b in bits)}</p>'


def timeline_of(summary: dict | Record, *, base_dir: str | Path | None = None, step=None, tables: dict | None = None,
                timelines: dict | None = None, stored: TimelineRecord | None = None,
                stored_problem: str | None = None) -> TimelineRecord | str:
    """What the timeline section draws: ``stored`` (a ``timeline.json`` of this summary) where it
    holds ``step``, else a record built from the traces of up to ``1 + timeline.MAX_OTHER_RANKS``
    ranks that are still on disk (``reports.traces``), else the note saying why there is none
    (with ``stored_problem``, why a stored record could not serve).

    ``summary``, ``base_dir``, ``tables`` and ``timelines`` as in :func:`render_report`.
    """
    if stored is not None and stored.holds(step):
        return stored.choose(step)
    if stored is not None:
        stored_problem = (f"step {step} is not among its steps "
                          f"({', '.join(str(v.step) for v in stored.views)})")
    record = record_of(summary)
    located = _traces.locate_ranks(record, Path(base_dir) if base_dir is not None else None)
    first = _traces.load(located[0], tables, timelines)
    if first.problem:
        return timeline.no_timeline(first, stored_problem)
    others = tuple(_traces.load(f, tables, timelines) for f in located[1:1 + timeline.MAX_OTHER_RANKS])
    return timeline.build(record, first, step, others)


def render_report(summary: dict | Record, *, base_dir: str | Path | None = None, step=None, find_traces: bool = True,
                  tables: dict | None = None, timelines: dict | None = None,
                  drawn: TimelineRecord | str | None = None) -> str:
    """The report page for a summary record (as from :func:`perfscope.analysis.summary.build_summary`).

    Args:
        summary: The record (as plain data, or a :class:`~perfscope.record.view.Record`).
        base_dir: The output directory the summary belongs to: its ``traces/`` folder is searched
            first for the trace files (then the paths the summary records).
        step: Step number the timeline shows first (default: the representative step, nearest to the run's step time).
        find_traces: False renders from the summary alone (the timeline then says it needs traces).
        tables: Trace tables already built, by resolved file path (``Analysis.tables``): used
            instead of parsing those files again.
        timelines: Their step windows and partition sets by the same paths
            (``Analysis.timelines``): used instead of finding them again.
        drawn: The timeline section's content already made (:func:`timeline_of`); the traces are
            then not looked for.

    Returns:
        One self-contained HTML document (str).

    Raises:
        PerfscopeError: a field of the wrong type (:func:`~perfscope.record.view.record_of`).
    """
    record = record_of(summary)
    if drawn is None:
        drawn = (timeline_of(record, base_dir=base_dir, step=step, tables=tables, timelines=timelines)
                 if find_traces else timeline.no_timeline(None))
    shown = [s for s in SECTIONS if s.shows(record)]
    nav = [(s.anchor, s.label(record)) for s in shown]
    body = quality.render_warnings(record) + "".join(s.render(record, Traces(drawn)) for s in shown)
    title = f"perfscope: {model.overall(record).verdict or 'no verdict'}"
    return page(title, header(record), nav, body)


def write_report(summary: dict | Record, path: str | Path, *, base_dir: str | Path | None = None, step=None,
                 find_traces: bool = True, tables: dict | None = None, timelines: dict | None = None,
                 drawn: TimelineRecord | str | None = None) -> Path:
    """Render the report and write it to ``path`` atomically.

    ``base_dir`` defaults to the directory of ``path`` (the output directory); the others as in
    :func:`render_report`.
    """
    path = Path(path)
    html = render_report(summary, base_dir=path.parent if base_dir is None else base_dir, step=step,
                         find_traces=find_traces, tables=tables, timelines=timelines, drawn=drawn)
    return write_text_atomic(path, html)
