"""The bottleneck report page (``report.html``): one self-contained file, rendered from a summary.

Sections, verdict first (after the warnings, when there are any), in the order of :data:`SECTIONS`,
from which both the page's nav and its body are built: verdict and recommendations, per-step
breakdown, timeline of a representative step (needs the traces), idle gaps, top kernels, launch
statistics, memory copies, memory (peak and headroom), GPU telemetry (GPU runs), ranks, nodes
(multi-node runs), data quality, run facts. Every section renders from the summary record alone except the timeline, which
reads the traces of one rank when they can be found (``reports.traces``) and otherwise says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from perfscope.atomic import write_text_atomic
from perfscope.reports import model
from perfscope.reports import traces as _traces
from perfscope.reports.html import esc, page
from perfscope.reports.sections import facts, gaps, kernels, memcpy, memory, nodes, quality, ranks, steps, telemetry, timeline, verdict


@dataclass(frozen=True)
class Traces:
    """What the timeline draws from: the representative rank's trace and up to
    ``timeline.MAX_OTHER_RANKS`` others (``reports.traces.load``; None when not found), and the step."""

    found: object = None
    others: tuple = ()
    step: int | None = None


def _gpu(summary: dict) -> bool:
    return summary.get("mode") == "gpu"


@dataclass(frozen=True)
class Section:
    """One section of the report: its ``anchor`` (the ``id`` its HTML carries, and the nav's link),
    its nav ``label`` for a summary, whether a summary ``shows`` it, and ``render(summary, traces)``.
    The page's nav and body are both built from :data:`SECTIONS`, in its order."""

    anchor: str
    label: Callable[[dict], str]
    render: Callable[[dict, Traces], str]
    shows: Callable[[dict], bool] = lambda summary: True


def _has_nodes(view) -> bool:
    return isinstance(view, dict) and isinstance(view.get("nodes"), list)


def _fixed(text: str) -> Callable[[dict], str]:
    return lambda summary: text


SECTIONS = (
    Section("verdict", _fixed("Verdict"), lambda s, t: verdict.render(s)),
    Section("steps", _fixed("Steps"), lambda s, t: steps.render(s)),
    Section("timeline", _fixed("Timeline"), lambda s, t: timeline.render(s, t.found, t.step, list(t.others))),
    Section("gaps", _fixed("Idle gaps"), lambda s, t: gaps.render(s)),
    Section("kernels", lambda s: "Top kernels" if _gpu(s) else "Top operators", lambda s, t: kernels.render_top(s)),
    Section("launch", _fixed("Launches"), lambda s, t: kernels.render_launch(s)),
    Section("memcpy", _fixed("Copies"), lambda s, t: memcpy.render(s)),
    Section("memory", _fixed("Memory"), lambda s, t: memory.render(s)),
    Section("telemetry", _fixed("GPU telemetry"), lambda s, t: telemetry.render(s), shows=_gpu),
    Section("ranks", _fixed("Ranks"), lambda s, t: ranks.render(s)),
    Section("nodes", _fixed("Nodes and links"), lambda s, t: nodes.render(s),
            shows=lambda s: _has_nodes(model.details(s).get("nodes"))),
    Section("quality", _fixed("Data quality"), lambda s, t: quality.render(s)),
    Section("facts", _fixed("Run facts"), lambda s, t: facts.render(s)),
)


def header(summary: dict, heading: str = "perfscope bottleneck report") -> str:
    run = summary.get("run") if isinstance(summary.get("run"), dict) else {}
    what = run.get("script") or run.get("source") or "analyzed traces"
    world = run.get("world_size")
    ranks_ = run.get("ranks_analyzed")
    bits = [str(what), f"{str(summary.get('mode', '-')).upper()} trace"]
    if world is not None:
        bits.append(f"world size {world}" + (f" ({ranks_} analyzed)" if ranks_ not in (None, world) else ""))
    skipped = [x for x in summary.get("skipped") or [] if isinstance(x, dict)]
    if skipped:
        bits.append(f"{len(skipped)} trace file{'s' if len(skipped) != 1 else ''} left out (see Data quality)")
    bits.append(f"analyzed {summary.get('generated_at', '-')}")
    return f'<h1>{esc(heading)}</h1>\n<p class="muted">{" · ".join(esc(b) for b in bits)}</p>'


def render_report(summary: dict, *, base_dir: str | Path | None = None, step=None, find_traces: bool = True,
                  tables: dict | None = None, timelines: dict | None = None) -> str:
    """The report page for a summary record (as from :func:`perfscope.summary.build_summary`).

    Args:
        summary: The record.
        base_dir: The output directory the summary belongs to: its ``traces/`` folder is searched
            first for the trace files (then the paths the summary records).
        step: Step number the timeline shows first (default: the representative step, nearest to the run's step time).
        find_traces: False renders from the summary alone (the timeline then says it needs traces).
        tables: Trace tables already built, by resolved file path (``Analysis.tables``): used
            instead of parsing those files again.
        timelines: Their step windows and partition sets by the same paths
            (``Analysis.timelines``): used instead of finding them again.

    Returns:
        One self-contained HTML document (str).
    """
    drawn = Traces(step=step)
    if find_traces:
        located = _traces.locate_ranks(summary, Path(base_dir) if base_dir is not None else None)
        drawn = Traces(_traces.load(located[0], tables, timelines),
                       tuple(_traces.load(f, tables, timelines) for f in located[1:1 + timeline.MAX_OTHER_RANKS]), step)
    shown = [s for s in SECTIONS if s.shows(summary)]
    nav = [(s.anchor, s.label(summary)) for s in shown]
    body = quality.render_warnings(summary) + "".join(s.render(summary, drawn) for s in shown)
    title = f"perfscope: {(summary.get('overall') or {}).get('verdict') or 'no verdict'}"
    return page(title, header(summary), nav, body)


def write_report(summary: dict, path: str | Path, *, base_dir: str | Path | None = None, step=None,
                 find_traces: bool = True, tables: dict | None = None, timelines: dict | None = None) -> Path:
    """Render the report and write it to ``path`` atomically.

    ``base_dir`` defaults to the directory of ``path`` (the output directory); ``tables`` and ``timelines`` as in
    :func:`render_report`.
    """
    path = Path(path)
    html = render_report(summary, base_dir=path.parent if base_dir is None else base_dir, step=step,
                         find_traces=find_traces, tables=tables, timelines=timelines)
    return write_text_atomic(path, html)
