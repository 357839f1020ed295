"""Top kernels (GPU) or top-level operators (CPU) by total time, and kernel launch statistics."""

from __future__ import annotations

from perfscope.reports import model
from perfscope.reports.html import count, dur, esc, ms, note, num, pct, section, table, truncate

NAME_LIMIT = 160


def _top_table(entries: list, what: str) -> str:
    rows = []
    for k, e in enumerate(entries, 1):
        if not isinstance(e, dict):
            continue
        share = num(e.get("share")) or 0.0
        name = str(e.get("name", ""))
        rows.append(("", [
            str(k), f'<span title="{esc(truncate(name, 2000))}">{esc(truncate(name, NAME_LIMIT))}</span>', count(e.get("count")),
            ms(e.get("total_us"), unit=False), dur(e.get("mean_us")),
            f'{pct(share)}<span class="sharebar" style="width:{min(max(share, 0.0), 1.0) * 4:.2f}rem"></span>',
        ]))
    headers = [("#", ""), (what, "name"), ("count", ""), ("total (ms)", ""), ("mean", ""), ("share", "l")]
    return table(headers, rows, f"The {len(rows)} {what}s with the largest total time over the counted steps "
                 f"(all ranks); share is of all {what} time.")


def render_top(summary: dict) -> str:
    d = model.details(summary)
    gpu = summary.get("mode") == "gpu"
    title = "Top kernels" if gpu else "Top operators"
    entries = d.get("top_kernels" if gpu else "top_operators")
    if not d:
        return section("kernels", title, note("This summary has no details section (written by an older "
                                              "perfscope); run perfscope analyze on the traces again."))
    if not entries:
        return section("kernels", title, note("No kernels in the counted steps." if gpu else "No operators in the counted steps."))
    return section("kernels", title, model.withheld_note(summary) + efficiency(d.get("gpu_efficiency")) + utilisation(d.get("mfu"))
                   + _top_table(entries, "kernel" if gpu else "top-level operator"))


def utilisation(view) -> str:
    """Model FLOPs utilisation (``details.mfu``) with its assumptions; "" without it."""
    from perfscope.analysis.mfu import mfu_line

    if not isinstance(view, dict) or num(view.get("flops_per_step")) is None:
        return ""
    rows = _flop_rows(view.get("top_operators") or [])
    assumptions = "".join(f"<li>{esc(a)}</li>" for a in view.get("assumptions") or [] if isinstance(a, str))
    return (f"<h3>Model FLOPs utilisation</h3><p>{esc(mfu_line(view))}.</p>"
            + (f'<ul class="muted">{assumptions}</ul>' if assumptions else "")
            + table([("operator", "l"), ("GFLOP a step", ""), ("share", "")], rows,
                    "The operators the FLOPs were counted in (docs/metrics.md, Model FLOPs utilisation)."))


def _flop_rows(operators: list) -> list:
    """Table rows of the operators the FLOPs were counted in: name, GFLOP a step, share."""
    return [("", [esc(o.get("name")), f"{(num(o.get('flops')) or 0) / 1e9:,.2f}", pct(o.get("share"), 0)])
            for o in operators if isinstance(o, dict)]


def efficiency(e) -> str:
    """The kernels' use of the GPU (``details.gpu_efficiency``) as a line and a table; "" without it."""
    if not isinstance(e, dict) or num(e.get("kernel_us")) is None:
        return ""
    cap = num(e.get("capability"))
    rows = [("", ["estimated SM efficiency", pct(e.get("sm_efficiency"), 0),
                  "kernel time weighted by blocks per SM (at most 1), over the steps' time: below 100% some SMs "
                  "sat idle while kernels ran (grids smaller than the GPU, or no kernel at all)"]),
            ("", ["estimated achieved occupancy", pct(e.get("achieved_occupancy"), 0),
                  "resident warps over the SM's maximum, weighted by kernel time: low values leave latency unhidden"]),
            ("hl" if e.get("no_tensor_cores") else "", [
                "Tensor Core share", pct(e.get("tensor_core_share"), 0),
                f"kernel time in {count(e.get('tensor_core_kernels'))} kernels whose names say they run on Tensor Cores"
                + (f"; this GPU (compute capability {cap:.1f}) has them: AMP, or TF32 for fp32 matmuls, puts the math "
                   "on them" if e.get("no_tensor_cores") and cap is not None else "")])]
    figured = num(e.get("figured_share"))
    caption = ("From the launch figures the profiler writes per kernel (estimates from the grid and the device, not "
               "hardware counters)" + (f", present for {pct(figured, 0)} of kernel time" if figured is not None and
                                       figured < 0.999 else "") + ". Counted steps, all ranks.")
    return table([("GPU efficiency", "l"), ("", ""), ("what it means", "l")], rows, caption)


def _launch_rows(ls: dict) -> list[tuple[str, str]]:
    """(statistic, value) rows of ``details.launch_stats``."""
    kernels = num(ls.get("kernels")) or 0
    short, long_ = num(ls.get("short_kernels")), num(ls.get("long_delay_kernels"))
    short_us, long_us = (f"{num(ls.get(k)) or d:g}" for k, d in (("short_kernel_us", 10), ("long_delay_us", 100)))

    def of_all(part):
        return f"{count(part)} ({pct(part / kernels if kernels and part is not None else None)})"

    rows = [
        ("kernels launched in the counted steps", count(kernels)),
        (f"short kernels (under {esc(short_us)} µs)", of_all(short)),
        ("median launch delay", dur(ls.get("median_launch_delay_us"))),
        ("90th percentile launch delay", dur(ls.get("p90_launch_delay_us"))),
        (f"kernels starting over {esc(long_us)} µs after their launch call", of_all(long_)),
    ]
    graph = num(ls.get("graph_kernels"))
    if graph:
        rows.append(("kernels replayed from CUDA graphs (no launch delay of their own)", count(graph)))
    return rows


def render_launch(summary: dict) -> str:
    title = "Kernel launch statistics"
    if summary.get("mode") != "gpu":
        return section("launch", title, note("CPU-only run: no GPU kernels are launched."))
    ls = model.details(summary).get("launch_stats")
    if not isinstance(ls, dict):
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
    return section("launch", title, model.withheld_note(summary) + tab + how)
