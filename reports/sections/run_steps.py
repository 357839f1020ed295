"""The whole run (``details.run_steps``): every step's time in phases over the run, timed outside
the profiler by ``perfscope profile``; the profiled window beside it, slow steps, memory creep."""

from __future__ import annotations

from perfscope.analysis.run_view import PHASES, run_findings, run_headline
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


def _marks(view: dict) -> list[tuple[float, float, str]]:
    """The slow steps as (step, ms, tooltip)."""
    out = []
    for s in view.get("slow_steps") or []:
        if isinstance(s, dict) and num(s.get("step")) is not None:
            out.append((num(s.get("step")), (num(s.get("seconds")) or 0.0) * 1e3,
                        f"step {s.get('step')}: {_ms(s.get('seconds'))} ms, {s.get('phase')} +{_ms(s.get('extra_s'))} ms"))
    return out


def _chart(view: dict, key: str, who: str) -> str:
    curve = [p for p in view.get("curve") or [] if isinstance(p, list) and len(p) == 8 and num(p[0]) is not None]
    xs = [num(p[0]) for p in curve]
    parts, marks = _parts(curve), _marks(view)
    w = view.get("window") or {}
    window = (num(w.get("first")), num(w.get("last"))) if w.get("first") is not None else None
    return figure(run_chart(key, xs, parts, window, marks, f"{who}: step time in phases over the whole run"),
                  f"{who}: every step's time in phases (the slowest of each run of consecutive steps where there are "
                  "more than 480); the grey band is the profiled window, triangles mark slow steps. Phases are the "
                  "host's time on the training thread; the profiler's own work at step boundaries is left out.") \
        + legend([(name, _COLOURS[name]) for name in PHASES])


def _slow_table(view: dict) -> str:
    rows = [("", [esc(s.get("step")), _ms(s.get("seconds")), f"{num(s.get('ratio')) or 0:.1f}x", esc(s.get("phase")),
                  "+" + _ms(s.get("extra_s"))]) for s in view.get("slow_steps") or [] if isinstance(s, dict)]
    if not rows:
        return ""
    return table([("step", "l"), ("time (ms)", ""), ("of median", ""), ("grew in", "l"), ("by (ms)", "")], rows,
                 f"Steady steps above {_ms(view.get('slow_threshold_s'))} ms: 1.5x the median, 5 scaled "
                 "median absolute deviations and 2 ms above it.")


def _rank(view: dict, key: str, who: str) -> str:
    lines = "".join(f"<li>{esc(line)}</li>" for line in run_findings(view))
    head = (f"<h3>{esc(who)}</h3><p>{esc(run_headline(view))}; start-up (first 2 steps) {_ms(view.get('startup_s'))} ms; "
            f"the profiler's own work {_ms(view.get('profiler_s'))} ms.</p>")
    return head + (f"<ul>{lines}</ul>" if lines else "") + _chart(view, key, who) + _slow_table(view)


def render(summary: dict) -> str:
    """The Whole run section (a note when no trace has a whole-run record)."""
    views = [v for v in model.details(summary).get("run_steps") or [] if isinstance(v, dict)]
    if not views:
        return section("run", "Whole run", note("Not timed: only `perfscope profile` times every step of a run."))
    parts = [_rank(v, f"run{i}", f"rank {v.get('rank')}" if len(views) > 1 else "this run")
             for i, v in enumerate(views[:MAX_RANKS])]
    more = (note(f"{len(views) - MAX_RANKS} more ranks in summary.json (details.run_steps).")
            if len(views) > MAX_RANKS else "")
    return section("run", "Whole run", "".join(parts) + more)
