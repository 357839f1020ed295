"""Ranks: step and compute time per rank, the slowest highlighted, and how long the others wait for it."""

from __future__ import annotations

from perfscope.record.schema import RankRow, Straggler
from perfscope.record.view import Record, record_of
from perfscope.reports import model
from perfscope.reports.html import esc, figure, legend, ms, note, section, table
from perfscope.reports.palette import GREEN, GREY, VERMILLION
from perfscope.reports.plots import hbars


def _chart(rows: list[RankRow], slowest) -> str:
    drawn = []
    for r in rows:
        step, comp = r.median_step_time_us or 0.0, r.median_compute_us or 0.0
        colour = VERMILLION if r.rank == slowest else GREY
        drawn.append({"label": f"rank {r.rank}", "end": ms(step),
                      "segments": [(step / 1000, colour, f"rank {r.rank}: median step {ms(step)}", "")],
                      "inner": [(comp / 1000, GREEN, f"rank {r.rank}: median compute {ms(comp)}")]})
    return hbars("ranks", drawn, "median step and compute time per rank", "median time per step (ms)",
                 left=70, right=90, bar_h=14, gap=6)


def _straggler_lead(st: Straggler) -> str:
    if st.basis == "collective waits":  # the clocks disagree: durations only
        how = (f"Rank {esc(st.rank)} is the straggler: it waits least in the collectives in "
               f"{esc(st.steps_last)} of {esc(st.steps)} steps, so the others wait for it, a median of "
               f"{ms(st.median_others_wait_us)} per step. The ranks' clocks do not agree, so arrivals are not "
               "compared; the wait is each collective's duration minus its shortest duration on any rank.")
    else:
        how = (f"Rank {esc(st.rank)} is the straggler: it arrives last at the collectives in "
               f"{esc(st.steps_last)} of {esc(st.steps)} steps, and its lateness summed over a step's "
               f"collectives is a median of {ms(st.median_late_us)}, while the other ranks wait a median of "
               f"{ms(st.median_others_wait_us)} per step inside collectives. Ranks are compared on one clock "
               "(each trace's base time plus its timestamps); the wait is each collective's duration minus its "
               "shortest duration on any rank.")
    return how + (" Uneven work per rank (variable-length inputs, an unbalanced sampler, a slow node) shows up here: "
                  "balance the data or fix the node before tuning communication.")


def render(summary: dict | Record) -> str:
    record = record_of(summary)
    title = "Ranks"
    rows, slowest = model.rank_rows(record)
    straggler = model.details(record).straggler
    if straggler is not None and straggler.rank is None:
        straggler = None
    if straggler:
        slowest = straggler.rank
    if len(rows) < 2:
        return _one_rank(record)
    lead = _straggler_lead(straggler) if straggler else _lead(record, rows, slowest)
    compute = "compute" if record.mode == "gpu" else "operators"
    tab = table([("rank", "l"), ("median step (ms)", ""), (f"median {compute} (ms)", ""), ("median comm (ms)", ""),
                 ("wait for slowest, est. (ms)", ""), ("arrives late (ms)", ""), ("waits in collectives (ms)", "")],
                [_table_row(r, slowest, straggler is not None) for r in rows],
                "Medians over the counted steps of each rank. Wait for slowest (estimated): the slowest rank's compute "
                "time minus this rank's. Arrives late (measured): per step, the sum over its collectives of this "
                "rank's start minus the earliest rank's, on one clock. Waits in collectives (measured): the sum of "
                "each collective's duration minus its shortest duration on any rank.")
    fig = figure(_chart(rows, slowest), "Median step time (bar) and median compute time (inner green bar) per rank, "
                 "in ms; the slowest rank in vermillion.")
    return section("ranks", title, f"<p>{lead}</p>" + fig + legend([("step time", GREY), ("slowest rank's step time", VERMILLION),
                                                                    (compute, GREEN)]) + tab)


def _lead(record: Record, rows: list[RankRow], slowest) -> str:
    """The lead without a straggler: the slowest rank's compute against the fastest's, then who
    arrives last at the collectives or, where none could be matched, the estimated waits."""
    slow = next((r for r in rows if r.rank == slowest), RankRow())
    fastest = min(rows, key=lambda r: r.median_compute_us or 0.0)
    lead = (f"Rank {esc(slowest)} is the slowest: median compute {ms(slow.median_compute_us)} per step against "
            f"{ms(fastest.median_compute_us)} on rank {esc(fastest.rank)}")
    last_counts = model.details(record).last_counts or {}
    if len(last_counts) > 1:
        return _no_straggler(last_counts)
    return lead + _estimated_waits(rows, slowest)


def _estimated_waits(rows: list[RankRow], slowest) -> str:
    """The end of the lead: the others' estimated waits for the slowest rank, where there are any."""
    waits = [r.wait_for_slowest_us for r in rows if r.rank != slowest and r.wait_for_slowest_us is not None]
    if not waits:
        return "."
    return (f"; the other ranks wait for it in collectives a median of {ms(sorted(waits)[len(waits) // 2])} "
            f"per step (up to {ms(max(waits))}, estimated from compute times: no collectives could be matched "
            "across ranks). Uneven work per rank (variable-length inputs, an unbalanced sampler) "
            "shows up here: balance the data (bucket by length, pad evenly) before tuning communication.")


def _table_row(r: RankRow, slowest, straggler: bool) -> tuple[str, list[str]]:
    """A rank's row of the table, highlighted (and named straggler or slowest) for the slowest."""
    hl = r.rank == slowest
    word = (" (straggler)" if straggler else " (slowest)") if hl else ""
    return ("hl" if hl else "", [esc(r.rank) + word] + [
        ms(v, unit=False) for v in (r.median_step_time_us, r.median_compute_us, r.median_comm_us,
                                    r.wait_for_slowest_us, r.median_late_us, r.median_collective_wait_us)])


def _one_rank(record: Record) -> str:
    world = record.run.world_size if record.run else None
    extra = f" of world size {world}" if world is not None and world > 1 else ""
    return section("ranks", "Ranks", note(f"One rank analyzed{extra}: comparing ranks (stragglers, load imbalance) "
                                          "needs the traces of several ranks (perfscope analyze DIR)."))


def _no_straggler(last_counts: dict[str, float]) -> str:
    """The lead where several ranks arrive last at the collectives (rank -> steps it was last in)."""
    steps = int(sum(last_counts.values()))
    who = ", ".join(f"rank {esc(r)} in {n:.0f}" for r, n in sorted(last_counts.items()))
    return (f"No rank is consistently the last to arrive at the collectives: {who} of {steps} steps. No straggler "
            "holds the others back; the measured lateness and waits per rank are in the table.")
