"""Ranks: step and compute time per rank, the slowest highlighted, and how long the others wait for it."""

from __future__ import annotations

from reports import model
from reports.html import esc, figure, legend, ms, note, num, section, table
from reports.palette import GREEN, GREY, VERMILLION
from reports.svg import open_svg, rect, text


def _chart(rows: list[dict], slowest) -> str:
    peak = max((num(r.get("median_step_time_us")) or 0.0 for r in rows), default=0.0) or 1.0
    left, width, bar_h, gap = 70, 760, 14, 6
    height = 10 + len(rows) * (bar_h + gap) + 24
    out = [open_svg(left + width + 90, height, "median step and compute time per rank")]
    for k, r in enumerate(rows):
        y = 10 + k * (bar_h + gap)
        step, comp = num(r.get("median_step_time_us")) or 0.0, num(r.get("median_compute_us")) or 0.0
        slow = r.get("rank") == slowest
        out.append(text(left - 6, y + bar_h - 3, f"rank {r.get('rank')}", "end"))
        out.append(rect(left, y, step / peak * width, bar_h, VERMILLION if slow else GREY, f"rank {r.get('rank')}: median step {ms(step)}"))
        out.append(rect(left, y + 3, comp / peak * width, bar_h - 6, GREEN, f"rank {r.get('rank')}: median compute {ms(comp)}"))
        out.append(text(left + step / peak * width + 4, y + bar_h - 3, ms(step), "start", "lbl"))
    out.append(text(left + width / 2, height - 6, f"median time per step (ms; full bar = {ms(peak)})", "middle"))
    out.append("</svg>")
    return "".join(out)


def render(summary: dict) -> str:
    title = "Ranks"
    rows, slowest = model.rank_rows(summary)
    run = summary.get("run") or {}
    if len(rows) < 2:
        world = run.get("world_size")
        extra = f" of world size {world}" if isinstance(world, int) and world > 1 else ""
        return section("ranks", title, note(f"One rank analyzed{extra}: comparing ranks (stragglers, load imbalance) "
                                            "needs the traces of several ranks (perfscope analyze DIR)."))
    by = {r.get("rank"): r for r in rows}
    slow = by.get(slowest, {})
    fastest = min(rows, key=lambda r: num(r.get("median_compute_us")) or 0.0)
    waits = [num(r.get("wait_for_slowest_us")) for r in rows if r.get("rank") != slowest]
    waits = [w for w in waits if w is not None]
    lead = (f"Rank {esc(slowest)} is the slowest: median compute {ms(slow.get('median_compute_us'))} per step against "
            f"{ms(fastest.get('median_compute_us'))} on rank {esc(fastest.get('rank'))}")
    if waits:
        lead += (f"; the other ranks wait for it in collectives a median of {ms(sorted(waits)[len(waits) // 2])} per step "
                 f"(up to {ms(max(waits))}). Uneven work per rank (variable-length inputs, an unbalanced sampler) "
                 "shows up here: balance the data (bucket by length, pad evenly) before tuning communication.")
    else:
        lead += "."
    trows = []
    for r in rows:
        hl = r.get("rank") == slowest
        trows.append(("hl" if hl else "", [esc(r.get("rank")) + (" (slowest)" if hl else ""), ms(r.get("median_step_time_us"), unit=False),
                                          ms(r.get("median_compute_us"), unit=False), ms(r.get("median_comm_us"), unit=False),
                                          ms(r.get("wait_for_slowest_us"), unit=False)]))
    compute = "compute" if summary.get("mode") == "gpu" else "operators"
    tab = table([("rank", "l"), ("median step (ms)", ""), (f"median {compute} (ms)", ""), ("median comm (ms)", ""),
                 ("wait for slowest (ms)", "")], trows,
                "Medians over the counted steps of each rank. Wait for slowest: the slowest rank's compute time minus "
                "this rank's, i.e. time spent waiting for it in collectives.")
    fig = figure(_chart(rows, slowest), "Median step time (bar) and median compute time (inner green bar) per rank, "
                 "in ms; the slowest rank in vermillion.")
    return section("ranks", title, f"<p>{lead}</p>" + fig + legend([("step time", GREY), ("slowest rank's step time", VERMILLION),
                                                                    (compute, GREEN)]) + tab)
