"""Per-step breakdown: one stacked bar per step and rank (the partition of its time) and the table."""

from __future__ import annotations

from perfscope.record.view import Record, record_of
from perfscope.reports import model
from perfscope.reports.html import esc, figure, legend, ms, pct, section, table
from perfscope.reports.palette import DARK as OUTLINE_COLOUR
from perfscope.reports.palette import part_us, parts
from perfscope.reports.plots import stacked_columns

SHORT = {"io-bound": "io", "comm-bound": "comm", "launch-bound": "launch", "compute-bound": "compute"}
# Under the bar of a step the verdict leaves out: why, in a word.
SHORT_STATUS = {"incomplete": "incompl.", "initialisation": "init", "host-contended": "host"}


def _label(s: dict) -> str:
    if model.is_counted(s):
        return SHORT.get(s.get("verdict"), "-")
    return SHORT_STATUS.get(s.get("status"), "cut")


def _status(s: dict) -> str:
    """How a left-out step is named in the table and the tooltips."""
    if s.get("status") and s.get("status") != "ok":
        return str(s["status"])
    return "cut off"

# The table shows every column of the partition (docs/metrics.md), not only the bar groups.
GPU_COLUMNS = (
    ("compute_frac", "compute"), ("exposed_comm_frac", "exposed comm"), ("exposed_h2d_frac", "exposed H2D"),
    ("exposed_other_mem_frac", "other copies"), ("input_wait_frac", "input wait"), ("h2d_wait_frac", "H2D wait"),
    ("launch_wait_frac", "launch wait"), ("kernel_wait_frac", "kernel wait"), ("other_idle_frac", "other idle"),
)
CPU_COLUMNS = (
    ("operator_frac", "operators"), ("exposed_comm_frac", "exposed comm"), ("dataloader_frac", "DataLoader"),
    ("framework_overhead_frac", "framework overhead"),
)


def _bar_title(s: dict) -> str:
    """A step's bar tooltip: rank, step, time, verdict, and why it is not counted where it is not."""
    title = f"rank {s.get('rank')} step {s.get('step')}: {ms(s.get('step_time_us'))}, {s.get('verdict') or '-'}"
    if not model.is_counted(s):
        title += f" ({_status(s)}, not counted" + (f": {s['status_reason']}" if s.get("status_reason") else "") + ")"
    return title


def _rank_groups(steps: list[dict]) -> list[tuple[int, int, str]]:
    """(first bar, last bar, ``"rank R"``) of each run of consecutive bars of one rank."""
    groups = []
    for i, s in enumerate(steps):
        if groups and groups[-1][2] == f"rank {s.get('rank')}":
            groups[-1] = (groups[-1][0], i, groups[-1][2])
        else:
            groups.append((i, i, f"rank {s.get('rank')}"))
    return groups


def chart(steps: list[dict], mode: str, y_max: float | None = None, key: str = "steps") -> str:
    """The stacked columns of ``steps`` with their caption and legend; ``key``: the chart's id prefix
    (unique in the page: the diff draws two)."""
    groups_def = parts(mode)
    bars = []
    multi_rank = len({s.get("rank") for s in steps}) > 1
    for s in steps:
        values = [part_us(s, cols) / 1000.0 for _, _, _, cols in groups_def]
        wall = s.get("wall_step_time_us")
        bars.append({"values": values, "label": str(s.get("step")), "sub": _label(s), "title": _bar_title(s),
                     "faded": not model.is_counted(s),
                     "outline": wall / 1000.0 if isinstance(wall, (int, float)) else None})
    svg = stacked_columns(key, bars, [(label, colour) for _, label, colour, _ in groups_def], "step time (ms)",
                          "per-step breakdown of step time", groups=_rank_groups(steps) if multi_rank else None,
                          y_max=y_max)
    caption = (
        "Step time (ms) of each step" + (" and rank" if multi_rank else "") + ", split into the parts of the "
        "step partition (docs/metrics.md); under each bar its step number and verdict. Faded bars are steps "
        "the verdict leaves out (incomplete, initialisation or host-contended; the Data quality section says why)."
    )
    keys = [(label, colour) for _, label, colour, _ in groups_def]
    if any(b["outline"] is not None for b in bars):
        caption += (" On a provisional verdict's clock, each stack is the step without its waits for a core, and "
                    "the dashed column around it the step as measured, waits included.")
        keys.append(("as measured (dashed)", OUTLINE_COLOUR))
    return figure(svg, caption) + legend(keys)


# A page stays readable (and small) however many steps a trace holds: beyond this the chart and the
# table show the first and last halves; summary.json keeps every step.
MAX_SHOWN = 300


def shown_steps(steps: list[dict]) -> tuple[list[dict], str]:
    """The steps the section draws, and a note saying what was left out (empty when nothing was)."""
    if len(steps) <= MAX_SHOWN:
        return steps, ""
    half = MAX_SHOWN // 2
    return steps[:half] + steps[-half:], (f"{len(steps):,} steps: the chart and the table show the first {half} "
                                           f"and the last {half}; summary.json holds every one.")


def _step_row(s: dict, columns, measured: bool = False) -> tuple[str, list[str]]:
    """A step's table row (class ``cut`` where the verdict leaves it out): rank, step, time (and,
    ``measured``, the time as measured), shares, verdict, runner-up."""
    cut = not model.is_counted(s)
    cells = [esc(s.get("rank")), esc(s.get("step")) + (f" ({esc(_status(s))})" if cut else ""),
             ms(s.get("step_time_us"), unit=False)]
    if measured:
        cells.append(ms(s.get("wall_step_time_us"), unit=False) if "wall_step_time_us" in s else "-")
    cells += [pct(s.get(c)) for c, _ in columns]
    cells += [esc(s.get("verdict") or "-"), esc(s.get("runner_up") or "-")]
    return ("cut" if cut else "", cells)


def render(summary: dict | Record) -> str:
    record = record_of(summary)
    mode = model.mode(record)
    all_steps = model.steps_on_verdict_clock(record)
    if not all_steps:
        return section("steps", "Per-step breakdown", '<p class="muted">The summary holds no steps.</p>')
    steps, left_out = shown_steps(all_steps)
    columns = GPU_COLUMNS if mode == "gpu" else CPU_COLUMNS
    measured = any("wall_step_time_us" in s for s in steps)
    headers = [("rank", ""), ("step", ""), ("step time (ms)", "")] + ([("as measured (ms)", "")] if measured else []) + [
        (h, "") for _, h in columns] + [("verdict", "l"), ("runner-up", "l")]
    rows = [_step_row(s, columns, measured) for s in steps]
    tab = table(headers, rows, "Step time in milliseconds; the other columns are shares of each step's time "
                "and add up to 100% (definitions in docs/metrics.md).")
    extra = f'<p class="muted">{esc(left_out)}</p>' if left_out else ""
    if model.overall(record).provisional is True:
        extra += ('<p class="muted">The provisional verdict\'s steps are drawn on its clock, without their waits for '
                  "a core (step time); the dashed columns and the \"as measured\" column give each step as measured, "
                  "waits included.</p>")
    rep, per_step = model.representative_step(record), model.step_time(record)
    if rep is not None and per_step is not None:
        extra += (f'<p class="muted">Step time {ms(per_step)}: the mean over the counted steps of each step\'s '
                  f"slowest rank (the window over its steps); the representative step, nearest to it, is step "
                  f"{esc(rep)} (docs/metrics.md, Step time).</p>")
    return section("steps", "Per-step breakdown", chart(steps, mode) + extra + tab)
