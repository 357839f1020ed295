"""The whole run (``details.run_steps``): every step's time in phases over the run, timed outside
the profiler by ``perfscope profile``; the profiled window beside it, slow steps, memory creep."""

from __future__ import annotations

from perfscope.analysis.run_view import PHASES, run_findings, run_headline
from perfscope.record.schema import RunSteps
from perfscope.record.view import Record, record_of
from perfscope.reports import model
from perfscope.reports.html import esc, figure, legend, note, num, section, table
from perfscope.reports.palette import BLUE, GREEN, GREY, ORANGE, PURPLE
from perfscope.reports.plots import run_steps as run_chart

MAX_RANKS = 4  # ranks drawn; summary.json holds every rank's record
_COLOURS = {"input": ORANGE, "forward": BLUE, "backward": GREEN, "optimizer": PURPLE, "other": GREY}


def _ms(seconds) -> str:
    v = num(seconds)
    return "-" if v is None else f"{v * 1e3:,.1f}"


def _parts(curve: list[list]) -> list[tuple[str, list[float], str]]:
    """The phases of each drawn step in ms, ``other`` being the rest of its time."""
    stacked = [[num(v) or 0.0 for v in p[2:6]] for p in curve]
    parts = [(name, [s[i] * 1e3 for s in stacked], _COLOURS[name]) for i, name in enumerate(PHASES[:4])]
    rest = [max((num(p[1]) or 0.0) - sum(s), 0.0) * 1e3 for p, s in zip(curve, stacked)]
    return [*parts, ("other", rest, _COLOURS["other"])]


def _marks(view: RunSteps) -> list[tuple[float, float, str]]:
    """The slow steps as (step, ms, tooltip)."""
    return [(float(s.step), (s.seconds or 0.0) * 1e3,
             f"step {s.step}: {_ms(s.seconds)} ms, {s.phase} +{_ms(s.extra_s)} ms")
            for s in view.slow_steps or [] if s.step is not None]


def _chart(view: RunSteps, key: str, who: str) -> str:
    curve = [p for p in view.curve or [] if len(p) == 8 and p[0] is not None]
    xs = [p[0] for p in curve]
    parts, marks = _parts(curve), _marks(view)
    w = view.window
    window = (float(w.first), num(w.last)) if w is not None and w.first is not None else None
    return figure(run_chart(key, xs, parts, window, marks, f"{who}: step time in phases over the whole run"),
                  f"{who}: every step's time in phases (the slowest of each run of consecutive steps where there are "
                  "more than 480); the grey band is the profiled window, triangles mark slow steps. Phases are the "
                  "host's time on the training thread; the profiler's own work at step boundaries is left out.") \
        + legend([(name, _COLOURS[name]) for name in PHASES])


def _slow_table(view: RunSteps) -> str:
    rows = [("", [esc(s.step), _ms(s.seconds), f"{s.ratio or 0:.1f}x", esc(s.phase), "+" + _ms(s.extra_s)])
            for s in view.slow_steps or []]
    if not rows:
        return ""
    return table([("step", "l"), ("time (ms)", ""), ("of median", ""), ("grew in", "l"), ("by (ms)", "")], rows,
                 f"Steady steps above {_ms(view.slow_threshold_s)} ms: 1.5x the median, 5 scaled "
                 "median absolute deviations and 2 ms above it.")


def _rank(view: RunSteps, key: str, who: str) -> str:
    lines = "".join(f"<li>{esc(line)}</li>" for line in run_findings(view))
    head = (f"<h3>{esc(who)}</h3><p>{esc(run_headline(view))}; start-up (first 2 steps) {_ms(view.startup_s)} ms; "
            f"the profiler's own work {_ms(view.profiler_s)} ms.</p>")
    return head + (f"<ul>{lines}</ul>" if lines else "") + _chart(view, key, who) + _slow_table(view)


def render(summary: dict | Record) -> str:
    """The Whole run section (a note when no trace has a whole-run record)."""
    views = model.details(record_of(summary)).run_steps or []
    if not views:
        return section("run", "Whole run", note("Not timed: only `perfscope profile` times every step of a run."))
    parts = [_rank(v, f"run{i}", f"rank {v.rank}" if len(views) > 1 else "this run")
             for i, v in enumerate(views[:MAX_RANKS])]
    more = (note(f"{len(views) - MAX_RANKS} more ranks in summary.json (details.run_steps).")
            if len(views) > MAX_RANKS else "")
    return section("run", "Whole run", "".join(parts) + more)
