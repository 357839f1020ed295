"""Timeline of a representative step: lanes for the main thread, the DataLoader, collectives, each GPU
stream, and how the step partition counted each moment, with idle gaps shaded and labelled; under
them, when ``perfscope profile`` sampled the GPU, its utilisation (NVML) over the step.

The run's representative step (:mod:`perfscope.steptime`) is shown first; up to :data:`MAX_VIEWS` steps are pre-rendered and a row of radio
buttons (CSS only, no script) switches between them.
"""

from __future__ import annotations

import numpy as np

from perfscope.record.telemetry_format import THROTTLE_MASK
from perfscope.record.view import Record
from perfscope.reports import model
from perfscope.reports.html import esc, legend, ms, note, num, section, truncate
from perfscope.reports.palette import GREY, ORANGE, SKY, YELLOW
from perfscope.reports.svg import nice_ticks, open_svg, rect, text, tick_label
from perfscope.reports.timeline_data import COLUMNS, CPU_LABELLED, GPU_IDLE, STREAM_CATS, events_in, raster
from perfscope.reports.timeline_record import Bar, Label, Lane, Run, StepView, TimelineRecord, summary_digest

MAX_VIEWS = 12
MAX_OTHER_RANKS = 8  # further ranks' representative steps beside the first rank's steps (templates/report.css)
LEFT, LANE_H, GAP, TOP = 150, 16, 6, 24
TELEMETRY_H = 24
NAME_LIMIT = 90
LABEL_MIN_COLS = 40
LIGHT = (ORANGE, SKY, GREY, YELLOW)  # fills that take dark text  # an idle stretch this wide (px) gets a text label


def _t(ns: float, lo: int) -> str:
    return f"{(ns - lo) / 1e6:.3f}"


def _lane_title(lane, r, a, b, cov) -> tuple[str | None, str | None]:
    """Tooltip of a run of columns, and the name of its event when one event fills it."""
    t0, t1 = r.lo + a * r.col_ns, r.lo + b * r.col_ns
    idx = events_in(lane, t0, t1)
    if idx.size == 0:
        return None, None
    dur = lane.ends[idx] - lane.starts[idx]
    k = idx[int(np.argmax(dur))]
    name = str(lane.names[lane.name_id[k]])
    longest = f"{truncate(name, NAME_LIMIT)} ({(lane.ends[k] - lane.starts[k]) / 1e3:.1f} µs)"
    where = f"{_t(t0, r.lo)}–{_t(t1, r.lo)} ms"
    # the run is essentially one event: name it in place
    single = name if (lane.ends[k] - lane.starts[k]) >= 0.8 * (t1 - t0) else None
    if idx.size == 1:
        return f"{longest}, at {where}", single
    busy = cov[:, a:b].sum() * r.col_ns / 1e6
    return f"{idx.size} {lane.noun} in {where}, busy {busy:.3f} ms; longest: {longest}", single


def _stretches(mask: np.ndarray, cov: np.ndarray, cats, col_ns: float) -> list[tuple[int, int, str]]:
    """Labels for runs of ``mask`` at least :data:`LABEL_MIN_COLS` wide: the main cause and its time."""
    out = []
    change = np.flatnonzero(np.diff(mask.astype(np.int8))) + 1
    for a, b in zip(np.concatenate([[0], change]), np.concatenate([change, [mask.size]])):
        if mask[a] and b - a >= LABEL_MIN_COLS:
            t = cov[:, a:b].sum(axis=1) * col_ns / 1e6
            j = int(np.argmax(t))
            out.append((int(a), int(b), f"{cats[j][0]} {t[j]:.1f} ms"))
    return out


def _telemetry_bars(prep, r) -> list[Bar] | None:
    """GPU utilisation samples (NVML) over the step as bars (height 0..1); None without samples."""
    df = prep.telemetry_samples()
    if df is None:
        return None
    ts = df["ts_ns"].to_numpy()
    interval = (prep.table.telemetry.interval_s or 0.1) * 1e9
    bars = []
    for k in np.flatnonzero((ts < r.hi) & (ts + interval > r.lo)):
        util = df["gpu_util_pct"].iloc[k]
        if util is None or util != util or not df["settled"].iloc[k]:  # unsettled: holds time before the window
            continue
        a = max((ts[k] - r.lo) / r.col_ns, 0.0)
        b = min((min(ts[k] + interval, ts[k + 1] if k + 1 < len(ts) else ts[k] + interval) - r.lo) / r.col_ns, COLUMNS)
        bars.append(Bar(float(a), float(b), min(max(float(util), 0.0), 100.0) / 100, _sample_title(df, k, util)))
    return bars


def _sample_title(df, k: int, util: float) -> str:
    """``"87% utilised, 250 W, clocks throttled"``: sample ``k`` of the telemetry frame in words."""
    power = df["power_mw"].iloc[k]
    title = f"{util:.0f}% utilised" + (f", {power / 1000:.0f} W" if power == power and power is not None else "")
    if df["reasons"].iloc[k] and int(df["reasons"].iloc[k]) & THROTTLE_MASK:
        title += ", clocks throttled"
    return title


def _shade_and_labels(prep, r) -> tuple[list[Run], list[tuple[int, int, str]]]:
    """(runs shaded behind the lanes, labelled stretches) of a rastered step: on a GPU the idle
    stretches, shaded and the wide ones labelled; on a CPU wide stretches of DataLoader, exposed
    communication and framework overhead, labelled."""
    cats = prep.partition_cats
    if prep.mode != "gpu":
        other = r.partition_cov[list(CPU_LABELLED)]
        return [], _stretches(other.sum(axis=0) >= 0.75, other, [cats[j] for j in CPU_LABELLED], r.col_ns)
    idle = r.partition_cov[list(GPU_IDLE)]
    mostly = np.where(idle.sum(axis=0) >= 0.75, np.argmax(idle, axis=0), -1)
    labels = _stretches(mostly >= 0, idle, [cats[j] for j in GPU_IDLE], r.col_ns)
    change = np.flatnonzero(np.diff(mostly)) + 1
    shade = [Run(int(a), int(b), cats[GPU_IDLE[mostly[a]]][1])
             for a, b in zip(np.concatenate([[0], change]), np.concatenate([change, [mostly.size]])) if mostly[a] >= 0]
    return shade, labels


def _step_view(prep, i: int, s: dict, representative: bool) -> StepView:
    """Step ``i`` of a prepared trace as drawn (``s``: its summary row)."""
    r = raster(prep, i)
    cats = prep.partition_cats
    shade, labels = _shade_and_labels(prep, r)
    lanes = []
    for lane, lane_runs, cov in r.lanes:
        runs = []
        for a, b, c, level in lane_runs:
            title, single = _lane_title(lane, r, a, b, cov)
            runs.append(Run(a, b, lane.categories[c][1], level, title, single))
        lanes.append(Lane(lane.label, lane.categories is STREAM_CATS, runs))
    partition = []
    for a, b, c, level in r.partition:
        t0, t1 = r.lo + a * r.col_ns, r.lo + b * r.col_ns
        part = r.partition_cov[:, a:b].sum(axis=1) * r.col_ns / 1e6
        top3 = np.argsort(-part)[:3]
        title = f"{_t(t0, r.lo)}–{_t(t1, r.lo)} ms: " + ", ".join(f"{cats[j][0]} {part[j]:.3f} ms" for j in top3 if part[j] > 0)
        partition.append(Run(a, b, cats[c][1], 1.0, title))
    rank = s.get("rank")
    return StepView(rank=rank if isinstance(rank, int) else None, step=int(s.get("step")), representative=representative,
                    step_time_us=num(s.get("step_time_us")), verdict=s.get("verdict") or s.get("status"),
                    mode=prep.mode, span_ns=int(r.hi - r.lo), lanes=lanes, shade=shade, partition=partition,
                    labels=[Label(a, b, t) for a, b, t in labels], telemetry=_telemetry_bars(prep, r))


def _ticks(span_ms: float, height: float) -> list[str]:
    """Grid lines and labels of the time axis (ms since the step started)."""
    out = []
    for t in nice_ticks(span_ms, 8):
        if t > span_ms * 1.0001:
            break
        x = LEFT + t / span_ms * COLUMNS if span_ms else LEFT
        out.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP - 4}" y2="{height - 26}"/>')
        out.append(text(x, TOP - 8, tick_label(t), "middle"))
    return out


def _shading(view: StepView) -> list[str]:
    """The idle stretches, shaded behind the GPU stream lanes."""
    gpu_lanes = [k for k, lane in enumerate(view.lanes) if lane.gpu]
    if not gpu_lanes:
        return []
    y0 = TOP + gpu_lanes[0] * (LANE_H + GAP) - 2
    y1 = TOP + (gpu_lanes[-1] + 1) * (LANE_H + GAP) - GAP + 2
    return [rect(LEFT + run.a, y0, run.b - run.a, y1 - y0, run.colour, None, 0.22) for run in view.shade]


def _lane_runs(lane: Lane, y: float) -> list[str]:
    """One lane: its label, its line, its runs (a wide single event marked and named in place)."""
    out = [text(LEFT - 6, y + LANE_H - 4, lane.label, "end"),
           f'<line class="grid" x1="{LEFT}" x2="{LEFT + COLUMNS}" y1="{y + LANE_H + 0.5:.1f}" y2="{y + LANE_H + 0.5:.1f}"/>']
    for run in lane.runs:
        a, b, single = run.a, run.b, run.single
        out.append(rect(LEFT + a, y, b - a, LANE_H, run.colour, run.title, run.level))
        if single and b - a >= 3:  # mark where a wide event starts (it may touch the previous one)
            out.append(f'<line x1="{LEFT + a:.1f}" x2="{LEFT + a:.1f}" y1="{y}" y2="{y + LANE_H}" stroke="#fff"/>')
        if single and run.level == 1 and b - a >= 50:  # name a wide single event in place
            ink = "#111" if run.colour in LIGHT else "#fff"
            out.append(text(LEFT + a + 3, y + LANE_H - 4, truncate(single, int((b - a - 6) / 5.6)), "start", "lbl",
                            f' style="fill:{ink}"'))
    return out


def _counted_as(view: StepView, y: float) -> list[str]:
    """The "counted as" lane, with the wide stretches labelled where the label fits."""
    out = [text(LEFT - 6, y + LANE_H - 4, "counted as", "end")]
    out += [rect(LEFT + run.a, y, run.b - run.a, LANE_H, run.colour, run.title) for run in view.partition]
    for label in view.labels:
        a, b, text_ = label.a, label.b, label.text
        if b - a < 5.6 * len(text_):
            text_ = text_.replace(" wait", "").replace(" idle", "")
            if b - a < 5.6 * len(text_):
                continue
        out.append(rect(LEFT + (a + b) / 2 - 3.2 * len(text_), y + 2, 6.4 * len(text_), LANE_H - 4, "#ffffff", None, 0.8))
        out.append(text(LEFT + (a + b) / 2, y + LANE_H - 4, text_, "middle", "lbl"))
    return out


def _telemetry_lane(bars: list[Bar], y: float) -> list[str]:
    """GPU utilisation samples (NVML) as bars, 0-100% of the lane's height."""
    out = [text(LEFT - 6, y + TELEMETRY_H - 4, "GPU util (NVML)", "end"),
           f'<line class="grid" x1="{LEFT}" x2="{LEFT + COLUMNS}" y1="{y + TELEMETRY_H + 0.5:.1f}" '
           f'y2="{y + TELEMETRY_H + 0.5:.1f}"/>']
    for bar in bars:
        h = TELEMETRY_H * bar.height
        out.append(rect(LEFT + bar.a, y + TELEMETRY_H - h, max(bar.b - bar.a, 1.0), h, SKY, bar.title))
    return out


def _svg(view: StepView, step_label: str) -> str:
    """The drawing of one stored step view."""
    lane_t = view.telemetry is not None
    height = TOP + (len(view.lanes) + 1) * (LANE_H + GAP) + 26 + ((TELEMETRY_H + GAP) if lane_t else 0)
    out = [open_svg(LEFT + COLUMNS + 10, height, f"timeline of {step_label}"), *_ticks(view.span_ns / 1e6, height),
           text(LEFT + COLUMNS / 2, height - 6, "time since the step started (ms)", "middle"), *_shading(view)]
    for k, lane in enumerate(view.lanes):
        out += _lane_runs(lane, TOP + k * (LANE_H + GAP))
    y = TOP + len(view.lanes) * (LANE_H + GAP)
    out += _counted_as(view, y)
    if lane_t:
        out += _telemetry_lane(view.telemetry, y + LANE_H + GAP)
    out.append("</svg>")
    return "".join(out)


def _legends(prep) -> tuple[list, list]:
    """The lanes' legend items and the partition's, as (label, colour) pairs."""
    items = []
    for categories in prep.lane_kinds:
        for name, colour in categories:
            if (name, colour) not in items:
                items.append((name, colour))
    return items, list(dict.fromkeys(prep.partition_cats))


def _rank_view(record: Record, found) -> StepView | None:
    """Another rank's representative step as drawn, or None."""
    if found is None or found.problem:
        return None
    steps = [s for s in record.steps or [] if s.get("rank") == found.rank]
    k = model.representative_index(record, steps)
    if k is None:
        return None
    for prep in found.prepared():
        i = prep.step_index(steps[k].get("step"))
        if i is not None:
            return _step_view(prep, i, steps[k], True)
    return None


TITLE = "Timeline of a representative step"


def no_timeline(found, stored_problem: str | None = None) -> str:
    """The section's words when there is nothing to draw from (``found``: the located traces or
    None; ``stored_problem``: why a stored ``timeline.json`` could not serve)."""
    if found is not None and found.replaced:  # the problem says what to do: another run's trace
        return section("timeline", TITLE, note(f"No timeline: {found.problem}."))
    why = found.problem if found is not None else "no trace files were given"
    stored = f" The stored timeline could not serve: {stored_problem}." if stored_problem else ""
    return section("timeline", TITLE, note(
        f"The timeline needs the trace files ({why}).{stored} Re-render with the traces in the output "
        "directory's traces/ folder (perfscope report OUT_DIR), or run perfscope analyze on them."))


def _views(record: Record, found) -> list:
    """``(summary step, prepared trace, window index)`` of each of the rank's steps the traces hold."""
    views = []
    for s in (s for s in record.steps or [] if s.get("rank") == found.rank):
        for prep in found.prepared():
            i = prep.step_index(s.get("step"))
            if i is not None:
                views.append((s, prep, i))
                break
    return views


def _choose(record: Record, views: list, step) -> tuple[int, int | None, list[int]]:
    """(the view shown first: ``step``'s, else the representative step's; the representative's;
    the views pre-rendered, :data:`MAX_VIEWS` around the first)."""
    chosen = next((k for k, (s, _, _) in enumerate(views) if step is not None and s.get("step") == step), None)
    rep = model.representative_index(record, [v[0] for v in views])
    if chosen is None:
        chosen = rep if rep is not None else 0
    lo = max(0, min(chosen - MAX_VIEWS // 2, len(views) - MAX_VIEWS))
    return chosen, rep, list(range(lo, min(len(views), lo + MAX_VIEWS)))


def build(record: Record, found, step=None, others=()) -> TimelineRecord | str:
    """What the timeline draws, from the located traces: a :class:`TimelineRecord`, or the
    section's note (HTML) when there is nothing to draw.

    Args:
        record: The summary record the traces belong to.
        found: A :class:`perfscope.reports.traces.Found` (one rank's traces) or None.
        step: The step shown first (default: the representative step).
        others: The Found of further ranks, each shown at its representative step.
    """
    if found is None or found.problem:
        return no_timeline(found)
    views = _views(record, found)
    if not views:
        return section("timeline", TITLE, note(f"The traces of rank {found.rank} hold none of the summary's steps; "
                                               "they are not the traces this summary was made from."))
    chosen, rep, shown = _choose(record, views, step)
    drawn = [_step_view(views[k][1], views[k][2], views[k][0], k == rep) for k in shown]
    legend_items, partition_items = _legends(views[chosen][1])
    return TimelineRecord(summary_digest=summary_digest(record), rank=found.rank if isinstance(found.rank, int) else None,
                          views=drawn, chosen=shown.index(chosen), total_views=len(views),
                          others=[v for v in (_rank_view(record, f) for f in others) if v is not None],
                          legend=legend_items, partition_legend=partition_items)


def _pane(rid: str, label: str, tag: str, view: StepView, caption: str, checked: str = "") -> tuple[str, str]:
    """(radio button with its label, the pane it shows) of one step's view; ``tag`` follows the
    label on the button only."""
    button = (f'<input type="radio" name="tl" id="{rid}"{checked}><label for="{rid}">{esc(label)}{esc(tag)} · '
              f'{ms(view.step_time_us)} · {esc(view.verdict or "-")}</label>')
    pane = f'<div class="{rid}"><figure>{_svg(view, label)}<figcaption>{esc(caption)}</figcaption></figure></div>'
    return button, pane


def _panes(timeline: TimelineRecord) -> tuple[list[str], list[str]]:
    """(buttons, panes): the chosen rank's steps, then the other ranks' representative steps."""
    picker, panes = [], []
    for pos, view in enumerate(timeline.views):
        label = f"step {view.step}"
        tag = " (representative)" if view.representative else ""
        caption = (f"Rank {timeline.rank}, {label}{tag}: {ms(view.step_time_us)}, {view.verdict or '-'}. One pixel is "
                   f"{view.span_ns / 1e3 / COLUMNS:.1f} µs; events narrower than a "
                   "pixel are merged and a paler block is busy only part of its time. Hover for event names.")
        button, pane = _pane(f"tl{pos}", label, tag, view, caption, " checked" if pos == timeline.chosen else "")
        picker.append(button)
        panes.append(pane)
    for pos, view in enumerate(timeline.others, start=len(timeline.views)):
        label = f"rank {view.rank} · step {view.step}"
        caption = (f"Rank {view.rank}, step {view.step} (its representative step): {ms(view.step_time_us)}, "
                   f"{view.verdict or '-'}.")
        button, pane = _pane(f"tl{pos}", label, "", view, caption)
        picker.append(button)
        panes.append(pane)
    return picker, panes


def render(timeline: TimelineRecord | str) -> str:
    """The section: the drawings of a :class:`TimelineRecord` (from :func:`build` or a stored
    ``timeline.json``), or the note :func:`build` returned."""
    if isinstance(timeline, str):
        return timeline
    rank = timeline.rank
    picker, panes = _panes(timeline)
    more = ""
    if timeline.total_views > len(timeline.views):
        more = note(f"{len(timeline.views)} of rank {rank}'s {timeline.total_views} steps are pre-rendered here; "
                    "perfscope report --step N renders around another one (it needs the traces).")
    gpu = timeline.views[timeline.chosen].mode == "gpu"
    lanes = ("the main CPU thread (top-level operators), the DataLoader, collectives, each GPU stream; the bottom "
             "lane shows what the step partition counted at each moment, with GPU idle stretches labelled by cause"
             if gpu else
             "the main CPU thread (top-level operators), the DataLoader, collectives; the bottom lane shows what "
             "the step partition counted at each moment")
    ranks_text = (f"; the buttons after its steps show rank {', '.join(str(v.rank) for v in timeline.others)} at "
                  "their representative steps" if timeline.others else "")
    intro = note(f"Rank {rank}'s representative step (nearest to the run's step time) is selected; pick another "
                 f"step below{ranks_text}. Lanes: {lanes}.")
    where = "; shaded behind the GPU streams where the GPU is idle" if gpu else ""
    legends = (legend(timeline.legend) + f'<p class="muted">Counted as (bottom lane{where}):</p>'
               + legend(timeline.partition_legend))
    body = (intro + '<div class="picker">' + "".join(picker)
            + f'<div class="tlv">{"".join(panes)}</div></div>' + more + legends)
    return section("timeline", TITLE, body)
