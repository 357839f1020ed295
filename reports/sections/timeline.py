"""Timeline of a representative step: lanes for the main thread, the DataLoader, collectives, each GPU
stream, and how the step partition counted each moment, with idle gaps shaded and labelled; under
them, when ``perfscope profile`` sampled the GPU, its utilisation (NVML) over the step.

The run's representative step (:mod:`perfscope.steptime`) is shown first; up to :data:`MAX_VIEWS` steps are pre-rendered and a row of radio
buttons (CSS only, no script) switches between them.
"""

from __future__ import annotations

import numpy as np

from perfscope.telemetry_format import THROTTLE_MASK
from perfscope.reports import model
from perfscope.reports.html import esc, legend, ms, note, section, truncate
from perfscope.reports.palette import GREY, ORANGE, SKY, YELLOW
from perfscope.reports.svg import nice_ticks, open_svg, rect, text, tick_label
from perfscope.reports.timeline_data import COLUMNS, CPU_LABELLED, GPU_IDLE, STREAM_CATS, events_in, raster

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


def _telemetry_lane(prep, r, y: float) -> list[str]:
    """GPU utilisation samples (NVML) as bars over the step, 0-100% of the lane's height."""
    df = prep.telemetry_samples()
    if df is None:
        return []
    ts = df["ts_ns"].to_numpy()
    interval = (prep.table.telemetry.get("interval_s") or 0.1) * 1e9
    out = [text(LEFT - 6, y + TELEMETRY_H - 4, "GPU util (NVML)", "end"),
           f'<line class="grid" x1="{LEFT}" x2="{LEFT + COLUMNS}" y1="{y + TELEMETRY_H + 0.5:.1f}" '
           f'y2="{y + TELEMETRY_H + 0.5:.1f}"/>']
    for k in np.flatnonzero((ts < r.hi) & (ts + interval > r.lo)):
        util = df["gpu_util_pct"].iloc[k]
        if util is None or util != util or not df["settled"].iloc[k]:  # unsettled: holds time before the window
            continue
        a = max((ts[k] - r.lo) / r.col_ns, 0.0)
        b = min((min(ts[k] + interval, ts[k + 1] if k + 1 < len(ts) else ts[k] + interval) - r.lo) / r.col_ns, COLUMNS)
        h = TELEMETRY_H * min(max(util, 0), 100) / 100
        power = df["power_mw"].iloc[k]
        title = f"{util:.0f}% utilised" + (f", {power / 1000:.0f} W" if power == power and power is not None else "")
        if df["reasons"].iloc[k] and int(df["reasons"].iloc[k]) & THROTTLE_MASK:
            title += ", clocks throttled"
        out.append(rect(LEFT + a, y + TELEMETRY_H - h, max(b - a, 1.0), h, SKY, title))
    return out


def _svg(prep, i: int, step_label: str) -> str:
    r = raster(prep, i)
    n_lanes = len(r.lanes) + 1
    lane_t = prep.telemetry_samples() is not None
    height = TOP + n_lanes * (LANE_H + GAP) + 26 + ((TELEMETRY_H + GAP) if lane_t else 0)
    width = LEFT + COLUMNS + 10
    out = [open_svg(width, height, f"timeline of {step_label}")]
    span_ms = (r.hi - r.lo) / 1e6
    ticks = nice_ticks(span_ms, 8)
    for t in ticks:
        if t > span_ms * 1.0001:
            break
        x = LEFT + t / span_ms * COLUMNS if span_ms else LEFT
        out.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP - 4}" y2="{height - 26}"/>')
        out.append(text(x, TOP - 8, tick_label(t), "middle"))
    out.append(text(LEFT + COLUMNS / 2, height - 6, "time since the step started (ms)", "middle"))
    gpu_lanes = [k for k, (lane, _, _) in enumerate(r.lanes) if lane.categories is STREAM_CATS]
    cats = prep.partition_cats
    labels = []
    if prep.mode == "gpu":  # shade idle stretches behind the stream lanes; label the wide ones
        idle = r.partition_cov[list(GPU_IDLE)]
        mostly = np.where(idle.sum(axis=0) >= 0.75, np.argmax(idle, axis=0), -1)
        labels = _stretches(mostly >= 0, idle, [cats[j] for j in GPU_IDLE], r.col_ns)
        if gpu_lanes:
            y0 = TOP + gpu_lanes[0] * (LANE_H + GAP) - 2
            y1 = TOP + (gpu_lanes[-1] + 1) * (LANE_H + GAP) - GAP + 2
            change = np.flatnonzero(np.diff(mostly)) + 1
            for a, b in zip(np.concatenate([[0], change]), np.concatenate([change, [mostly.size]])):
                if mostly[a] >= 0:
                    out.append(rect(LEFT + a, y0, b - a, y1 - y0, cats[GPU_IDLE[mostly[a]]][1], None, 0.22))
    else:  # CPU: label wide stretches of DataLoader, exposed communication, framework overhead
        other = r.partition_cov[list(CPU_LABELLED)]
        labels = _stretches(other.sum(axis=0) >= 0.75, other, [cats[j] for j in CPU_LABELLED], r.col_ns)
    for k, (lane, lane_runs, cov) in enumerate(r.lanes):
        y = TOP + k * (LANE_H + GAP)
        out.append(text(LEFT - 6, y + LANE_H - 4, lane.label, "end"))
        out.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + COLUMNS}" y1="{y + LANE_H + 0.5:.1f}" y2="{y + LANE_H + 0.5:.1f}"/>')
        for a, b, c, level in lane_runs:
            title, single = _lane_title(lane, r, a, b, cov)
            colour = lane.categories[c][1]
            out.append(rect(LEFT + a, y, b - a, LANE_H, colour, title, level))
            if single and b - a >= 3:  # mark where a wide event starts (it may touch the previous one)
                out.append(f'<line x1="{LEFT + a:.1f}" x2="{LEFT + a:.1f}" y1="{y}" y2="{y + LANE_H}" stroke="#fff"/>')
            if single and level == 1 and b - a >= 50:  # name a wide single event in place
                ink = "#111" if colour in LIGHT else "#fff"
                out.append(text(LEFT + a + 3, y + LANE_H - 4, truncate(single, int((b - a - 6) / 5.6)), "start", "lbl",
                                f' style="fill:{ink}"'))
    y = TOP + len(r.lanes) * (LANE_H + GAP)
    out.append(text(LEFT - 6, y + LANE_H - 4, "counted as", "end"))
    for a, b, c, level in r.partition:
        t0, t1 = r.lo + a * r.col_ns, r.lo + b * r.col_ns
        part = r.partition_cov[:, a:b].sum(axis=1) * r.col_ns / 1e6
        top3 = np.argsort(-part)[:3]
        title = f"{_t(t0, r.lo)}–{_t(t1, r.lo)} ms: " + ", ".join(f"{cats[j][0]} {part[j]:.3f} ms" for j in top3 if part[j] > 0)
        out.append(rect(LEFT + a, y, b - a, LANE_H, cats[c][1], title))
    for a, b, text_ in labels:
        if b - a < 5.6 * len(text_):
            text_ = text_.replace(" wait", "").replace(" idle", "")
            if b - a < 5.6 * len(text_):
                continue
        out.append(rect(LEFT + (a + b) / 2 - 3.2 * len(text_), y + 2, 6.4 * len(text_), LANE_H - 4, "#ffffff", None, 0.8))
        out.append(text(LEFT + (a + b) / 2, y + LANE_H - 4, text_, "middle", "lbl"))
    if lane_t:
        out += _telemetry_lane(prep, r, y + LANE_H + GAP)
    out.append("</svg>")
    return "".join(out)


def _legend(prep) -> str:
    items = []
    for categories in prep.lane_kinds:
        for name, colour in categories:
            if (name, colour) not in items:
                items.append((name, colour))
    where = "; shaded behind the GPU streams where the GPU is idle" if prep.mode == "gpu" else ""
    return (legend(items) + f'<p class="muted">Counted as (bottom lane{where}):</p>'
            + legend(list(dict.fromkeys(prep.partition_cats))))


def _rank_view(summary: dict, found):
    """(summary row, prepared trace, window index) of another rank's representative step, or None."""
    if found is None or found.problem:
        return None
    steps = [s for s in model.steps_of(summary) if s.get("rank") == found.rank]
    k = model.representative_index(summary, steps)
    if k is None:
        return None
    for prep in found.prepared():
        i = prep.step_index(steps[k].get("step"))
        if i is not None:
            return steps[k], prep, i
    return None


TITLE = "Timeline of a representative step"


def _no_timeline(found) -> str:
    """The section's words when there is nothing to draw from."""
    title = TITLE
    if found is not None and found.replaced:  # the problem says what to do: another run's trace
        return section("timeline", title, note(f"No timeline: {found.problem}."))
    why = found.problem if found is not None else "no trace files were given"
    return section("timeline", title, note(
        f"The timeline needs the trace files ({why}). Re-render with the traces in the output "
        "directory's traces/ folder (perfscope report OUT_DIR), or run perfscope analyze on them."))


def _views(summary: dict, found) -> list:
    """``(summary step, prepared trace, window index)`` of each of the rank's steps the traces hold."""
    views = []
    for s in (s for s in model.steps_of(summary) if s.get("rank") == found.rank):
        for prep in found.prepared():
            i = prep.step_index(s.get("step"))
            if i is not None:
                views.append((s, prep, i))
                break
    return views


def _choose(summary: dict, views: list, step) -> tuple[int, int | None, list[int]]:
    """(the view shown first: ``step``'s, else the representative step's; the representative's;
    the views pre-rendered, :data:`MAX_VIEWS` around the first)."""
    chosen = next((k for k, (s, _, _) in enumerate(views) if step is not None and s.get("step") == step), None)
    rep = model.representative_index(summary, [v[0] for v in views])
    if chosen is None:
        chosen = rep if rep is not None else 0
    lo = max(0, min(chosen - MAX_VIEWS // 2, len(views) - MAX_VIEWS))
    return chosen, rep, list(range(lo, min(len(views), lo + MAX_VIEWS)))


def _pane(rid: str, label: str, tag: str, s: dict, prep, i: int, caption: str, checked: str = "") -> tuple[str, str]:
    """(radio button with its label, the pane it shows) of one step's view; ``tag`` follows the
    label on the button only."""
    button = (f'<input type="radio" name="tl" id="{rid}"{checked}><label for="{rid}">{esc(label)}{esc(tag)} · '
              f'{ms(s.get("step_time_us"))} · {esc(s.get("verdict") or s.get("status") or "-")}</label>')
    pane = f'<div class="{rid}"><figure>{_svg(prep, i, label)}<figcaption>{esc(caption)}</figcaption></figure></div>'
    return button, pane


def render(summary: dict, found, step=None, others=()) -> str:
    """``found``: a :class:`perfscope.reports.traces.Found` (traces located for one rank) or None;
    ``others``: the Found of further ranks, each shown at its representative step."""
    title = TITLE
    if found is None or found.problem:
        return _no_timeline(found)
    rank = found.rank
    views = _views(summary, found)
    if not views:
        return section("timeline", title, note(f"The traces of rank {rank} hold none of the summary's steps; "
                                               "they are not the traces this summary was made from."))
    chosen, rep, shown = _choose(summary, views, step)
    picker, panes = [], []
    for pos, k in enumerate(shown):
        s, prep, i = views[k]
        label = f"step {s.get('step')}"
        tag = " (representative)" if k == rep else ""
        caption = (f"Rank {rank}, {label}{tag}: {ms(s.get('step_time_us'))}, {s.get('verdict') or s.get('status') or '-'}. One pixel is "
                   f"{(prep.windows.end[i] - prep.windows.start[i]) / 1e3 / COLUMNS:.1f} µs; events narrower than a "
                   "pixel are merged and a paler block is busy only part of its time. Hover for event names.")
        button, pane = _pane(f"tl{pos}", label, tag, s, prep, i, caption, " checked" if k == chosen else "")
        picker.append(button)
        panes.append(pane)
    other_ranks = [v for v in (_rank_view(summary, f) for f in others) if v is not None]
    for pos, (s, prep, i) in enumerate(other_ranks, start=len(shown)):
        label = f"rank {s.get('rank')} · step {s.get('step')}"
        caption = (f"Rank {s.get('rank')}, step {s.get('step')} (its representative step): {ms(s.get('step_time_us'))}, "
                   f"{s.get('verdict') or s.get('status') or '-'}.")
        button, pane = _pane(f"tl{pos}", label, "", s, prep, i, caption)
        picker.append(button)
        panes.append(pane)
    more = ""
    if len(views) > len(shown):
        more = note(f"{len(shown)} of rank {rank}'s {len(views)} steps are pre-rendered here; "
                    "perfscope report --step N renders around another one.")
    lanes = ("the main CPU thread (top-level operators), the DataLoader, collectives, each GPU stream; the bottom "
             "lane shows what the step partition counted at each moment, with GPU idle stretches labelled by cause"
             if views[chosen][1].mode == "gpu" else
             "the main CPU thread (top-level operators), the DataLoader, collectives; the bottom lane shows what "
             "the step partition counted at each moment")
    ranks_text = (f"; the buttons after its steps show rank {', '.join(str(v[0].get('rank')) for v in other_ranks)} at "
                  "their representative steps" if other_ranks else "")
    intro = note(f"Rank {rank}'s representative step (nearest to the run's step time) is selected; pick another "
                 f"step below{ranks_text}. Lanes: {lanes}.")
    body = (intro + '<div class="picker">' + "".join(picker)
            + f'<div class="tlv">{"".join(panes)}</div></div>' + more + _legend(views[chosen][1]))
    return section("timeline", title, body)
