"""Top kernels (GPU) or top-level operators (CPU) by total time, and kernel launch statistics."""

from __future__ import annotations

from perfscope.record.schema import GpuEfficiency, LaunchStats, Mfu, TopRow
from perfscope.record.view import Record, record_of
from perfscope.reports import model
from perfscope.reports.html import count, dur, esc, ms, note, pct, section, table, truncate

NAME_LIMIT = 160


def _top_table(entries: list[TopRow], what: str) -> str:
    rows = []
    for k, e in enumerate(entries, 1):
        share = e.share or 0.0
        name = e.name or ""
        rows.append(("", [
            str(k), f'<span title="{esc(truncate(name, 2000))}">{esc(truncate(name, NAME_LIMIT))}</span>', count(e.count),
            ms(e.total_us, unit=False), dur(e.mean_us),
            f'{pct(share)}<span class="sharebar" style="width:{min(max(share, 0.0), 1.0) * 4:.2f}rem"></span>',
        ]))
    headers = [("#", ""), (what, "name"), ("count", ""), ("total (ms)", ""), ("mean", ""), ("share", "l")]
    return table(headers, rows, f"The {len(rows)} {what}s with the largest total time over the counted steps "
                 f"(all ranks); share is of all {what} time.")


def render_top(summary: dict | Record) -> str:
    record = record_of(summary)
    d = record.details
    gpu = record.mode == "gpu"
    title = "Top kernels" if gpu else "Top operators"
    if d is None:
        return section("kernels", title, note("This summary has no details section (written by an older "
                                              "perfscope); run perfscope analyze on the traces again."))
    entries = d.top_kernels if gpu else d.top_operators
    if not entries:
        return section("kernels", title, note("No kernels in the counted steps." if gpu else "No operators in the counted steps."))
    return section("kernels", title, model.withheld_note(record) + efficiency(d.gpu_efficiency) + utilisation(d.mfu)
                   + _top_table(entries, "kernel" if gpu else "top-level operator"))


def utilisation(view: Mfu | None) -> str:
    """Model FLOPs utilisation (``details.mfu``) with its assumptions; "" without it."""
    from perfscope.analysis.mfu import mfu_line

    if view is None or view.flops_per_step is None:
        return ""
    rows = [("", [esc(o.name), f"{(o.flops or 0) / 1e9:,.2f}", pct(o.share, 0)]) for o in view.top_operators or []]
    assumptions = "".join(f"<li>{esc(a)}</li>" for a in view.assumptions or [])
    return (f"<h3>Model FLOPs utilisation</h3><p>{esc(mfu_line(view))}.</p>"
            + (f'<ul class="muted">{assumptions}</ul>' if assumptions else "")
            + table([("operator", "l"), ("GFLOP a step", ""), ("share", "")], rows,
                    "The operators the FLOPs were counted in (docs/metrics.md, Model FLOPs utilisation)."))


def efficiency(e: GpuEfficiency | None) -> str:
    """The kernels' use of the GPU (``details.gpu_efficiency``) as a line and a table; "" without it."""
    if e is None or e.kernel_us is None:
        return ""
    cap = e.capability
    rows = [("", ["estimated SM efficiency", pct(e.sm_efficiency, 0),
                  "kernel time weighted by blocks per SM (at most 1), over the steps' time: below 100% some SMs "
                  "sat idle while kernels ran (grids smaller than the GPU, or no kernel at all)"]),
            ("", ["estimated achieved occupancy", pct(e.achieved_occupancy, 0),
                  "resident warps over the SM's maximum, weighted by kernel time: low values leave latency unhidden"]),
            ("hl" if e.no_tensor_cores else "", [
                "Tensor Core share", pct(e.tensor_core_share, 0),
                f"kernel time in {count(e.tensor_core_kernels)} kernels whose names say they run on Tensor Cores"
                + (f"; this GPU (compute capability {cap:.1f}) has them: AMP, or TF32 for fp32 matmuls, puts the math "
                   "on them" if e.no_tensor_cores and cap is not None else "")])]
    figured = e.figured_share
    caption = ("From the launch figures the profiler writes per kernel (estimates from the grid and the device, not "
               "hardware counters)" + (f", present for {pct(figured, 0)} of kernel time" if figured is not None and
                                       figured < 0.999 else "") + ". Counted steps, all ranks.")
    return table([("GPU efficiency", "l"), ("", ""), ("what it means", "l")], rows, caption)


def _launch_rows(ls: LaunchStats) -> list[tuple[str, str]]:
    """(statistic, value) rows of ``details.launch_stats``."""
    kernels = ls.kernels or 0
    short, long_ = ls.short_kernels, ls.long_delay_kernels
    short_us, long_us = f"{ls.short_kernel_us or 10:g}", f"{ls.long_delay_us or 100:g}"

    def of_all(part):
        return f"{count(part)} ({pct(part / kernels if kernels and part is not None else None)})"

    rows = [
        ("kernels launched in the counted steps", count(kernels)),
        (f"short kernels (under {esc(short_us)} µs)", of_all(short)),
        ("median launch delay", dur(ls.median_launch_delay_us)),
        ("90th percentile launch delay", dur(ls.p90_launch_delay_us)),
        (f"kernels starting over {esc(long_us)} µs after their launch call", of_all(long_)),
    ]
    graph = ls.graph_kernels
    if graph:
        rows.append(("kernels replayed from CUDA graphs (no launch delay of their own)", count(graph)))
    return rows


def render_launch(summary: dict | Record) -> str:
    record = record_of(summary)
    title = "Kernel launch statistics"
    if record.mode != "gpu":
        return section("launch", title, note("CPU-only run: no GPU kernels are launched."))
    ls = model.details(record).launch_stats
    if ls is None:
        return section("launch", title, note("No launch statistics in this summary."))
    tab = table([("statistic", "l"), ("value", "")], [("", [r[0], r[1]]) for r in _launch_rows(ls)],
                "Launch delay: kernel start minus the end of its launch call (runtime call matched by correlation id), "
                "as Holistic Trace Analysis defines it; kernels replayed from a CUDA graph wait in the graph, not in "
                "the launch queue, and are left out of it.")
    how = note("Many short kernels with short launch delays mean the GPU finishes each kernel before the host "
               "launches the next (launch-bound: fuse, batch, CUDA graphs). Long delays mean kernels wait in a "
               "queue: while they do, the host is ahead and launch overhead is hidden. A run can have both -- a "
               "full queue in one part of the step, an idle GPU waiting for the host in another -- so read this "
               "beside the verdict's launch share and the timeline.")
    return section("launch", title, model.withheld_note(record) + tab + how)
