"""The bottleneck report page (``report.html``): one self-contained file, rendered from a summary.

Sections, verdict first (after the warnings, when there are any): verdict and recommendations,
per-step breakdown, timeline of a representative step (needs the traces), idle gaps, top kernels,
launch statistics, memory copies, memory (peak and headroom), GPU telemetry (GPU runs), ranks, data quality, run facts. Every section renders from the summary record alone except the timeline, which
reads the traces of one rank when they can be found (``reports.traces``) and otherwise says so.
"""

from __future__ import annotations

from pathlib import Path

from perfscope.atomic import write_text_atomic
from perfscope.reports import model
from perfscope.reports import traces as _traces
from perfscope.reports.html import esc, page
from perfscope.reports.sections import facts, gaps, kernels, memcpy, memory, nodes, quality, ranks, steps, telemetry, timeline, verdict

NAV = (("verdict", "Verdict"), ("steps", "Steps"), ("timeline", "Timeline"), ("gaps", "Idle gaps"),
       ("kernels", "Top kernels"), ("launch", "Launches"), ("memcpy", "Copies"), ("memory", "Memory"), ("telemetry", "GPU telemetry"),
       ("ranks", "Ranks"),
       ("quality", "Data quality"), ("facts", "Run facts"))


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
    found, others = None, []
    if find_traces:
        located = _traces.locate_ranks(summary, Path(base_dir) if base_dir is not None else None)
        found = _traces.load(located[0], tables, timelines)
        others = [_traces.load(f, tables, timelines) for f in located[1:1 + timeline.MAX_OTHER_RANKS]]
    nav = list(NAV)
    if summary.get("mode") != "gpu":
        nav[4] = ("kernels", "Top operators")
    if summary.get("mode") != "gpu":
        nav.remove(("telemetry", "GPU telemetry"))
    if isinstance(model.details(summary).get("nodes"), dict):
        nav.insert(nav.index(("ranks", "Ranks")) + 1, ("nodes", "Nodes and links"))
    body = "".join([
        quality.render_warnings(summary),
        verdict.render(summary),
        steps.render(summary),
        timeline.render(summary, found, step, others),
        gaps.render(summary),
        kernels.render_top(summary),
        kernels.render_launch(summary),
        memcpy.render(summary),
        memory.render(summary),
        telemetry.render(summary) if summary.get("mode") == "gpu" else "",
        ranks.render(summary),
        nodes.render(summary),
        quality.render(summary),
        facts.render(summary),
    ])
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
