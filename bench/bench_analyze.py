"""Benchmark: `perfscope analyze` of one trace against the parse floor, and its peak memory.

1. Time, in this process, alternating: ``perfscope.analyze(TRACE)`` (read, gunzip, decode, columns,
   steps, metrics, verdicts) and the parse floor, reading the file, gunzipping it and
   ``orjson.loads`` of its text with the garbage collector off (the cheapest way to a JSON tree in
   Python; no analysis at all). Prints the medians and their ratio. Target: analyze / floor
   <= 1.3x; goal beyond it: < 1.0x (the analysis faster than the floor).
2. Peak RSS of a whole ``perfscope analyze TRACE --out DIR`` process (summary.json and
   report.html written), the median over ``--rss-runs`` runs, each a fresh process measured by
   ``bench/peakmem.py``'s ``measure``. Target: <= 150 MiB. For comparison, in the same way:
   the interpreter with perfscope's analysis modules imported and nothing analyzed; Holistic Trace
   Analysis (``TraceAnalysis`` on a directory holding only TRACE, then its temporal breakdown)
   when ``hta`` is importable; with ``--baseline-tree DIR`` (a checkout of an older perfscope),
   that version's ``perfscope analyze``.

    python bench/bench_analyze.py [TRACE] [--repeat 9] [--rss-runs 5] [--baseline-tree DIR] [--no-hta] [--profile]

``--profile`` prints the 10 most expensive functions of one in-process analysis (cProfile,
internal time) and exits.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import perfscope  # noqa: E402
from peakmem import MiB, measure  # noqa: E402

DEFAULT_TRACE = ROOT.parent / "shared/traces/hta/a100_rank3_of8_train.json.gz"
ANALYZE_TARGET, ANALYZE_GOAL, RSS_TARGET_MIB = 1.3, 1.0, 150

# HTA in a process of its own: parse and align the traces of a directory, then one analysis.
HTA_SCRIPT = """
import logging, os, sys, warnings
os.environ.setdefault("HTA_DISABLE_NS_ROUNDING", "1")
logging.disable(logging.WARNING)  # HTA logs every parsing step at WARNING
warnings.simplefilter("ignore")
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)
tb = ta.get_temporal_breakdown(visualize=False)
print("hta ranks:", len(ta.t.traces), "rows:", sum(len(df) for df in ta.t.traces.values()))
"""
IMPORTS_ONLY = "import numpy, pandas, orjson, msgspec; import perfscope.analysis.run, perfscope.record"
# The whole command's imports (analysis, record, report and its charts), nothing analyzed.
COMMAND_IMPORTS = IMPORTS_ONLY + "; import perfscope.cli, perfscope.reports.bottleneck, perfscope.reports.charts, matplotlib.figure"
# The parse floor as a process of its own: the interpreter, orjson, and one read of the trace.
FLOOR_SCRIPT = "import gzip, sys, orjson; d = open(sys.argv[1], 'rb').read(); orjson.loads(gzip.decompress(d) if d[:2] == b'\\x1f\\x8b' else d)"
WHOLE_TARGET = 2.0


def parse_floor(path: Path) -> float:
    """Seconds to read, gunzip and orjson.loads the file, gc off (freeing the tree not counted)."""
    gc.disable()
    try:
        t0 = time.perf_counter()
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        tree = orjson.loads(data)
        t = time.perf_counter() - t0
    finally:
        gc.enable()
    del tree, data
    return t


def analyze_once(path: Path) -> float:
    """Seconds of one perfscope.analyze (freeing the result not counted)."""
    t0 = time.perf_counter()
    a = perfscope.analyze(path)
    t = time.perf_counter() - t0
    del a
    return t


def env_for(tree: Path) -> dict:
    """The environment that makes ``python -m perfscope`` import the perfscope of ``tree``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def check_tree(tree: Path, cwd: Path) -> None:
    """Refuse a baseline tree whose perfscope is not the one imported."""
    m = measure([sys.executable, "-c", "import perfscope; print(perfscope.__file__)"], env=env_for(tree), cwd=cwd)
    if m.rc != 0 or not Path(m.output.strip().splitlines()[-1]).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"bench: {tree} does not provide the perfscope imported ({m.output.strip()})")


def code_state() -> str:
    """The commit of this checkout, and whether perfscope's files differ from it."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--", "perfscope", "reports"], cwd=ROOT,
                                 capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (f" + uncommitted changes to {len(changed)} file(s) of perfscope/reports" if changed else "")


def fmt_mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB"


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def rss_runs(label: str, cmd_for, runs: int, env: dict, cwd: Path, check=None) -> tuple[float, float]:
    """Median peak (bytes) and median wall time of ``runs`` runs; prints each run."""
    peaks, walls = [], []
    for i in range(runs):
        m = measure(cmd_for(i), env=env, cwd=cwd)
        if m.rc != 0:
            raise SystemExit(f"bench: {label} failed (exit {m.rc}):\n{m.output[-3000:]}")
        if check is not None:
            check(m)
        peaks.append(m.peak)
        walls.append(m.wall_s)
        print(f"  {label} run {i + 1}: peak RSS {fmt_mib(m.peak)} (largest process {fmt_mib(m.max_rss)}, "
              f"{m.processes} process(es), PSS {fmt_mib(m.tree_pss)}), {m.wall_s:.2f} s", flush=True)
    return statistics.median(peaks), statistics.median(walls)


def profile(trace: Path) -> None:
    import cProfile
    import pstats

    perfscope.analyze(trace)  # warm: imports, caches
    prof = cProfile.Profile()
    prof.enable()
    perfscope.analyze(trace)
    prof.disable()
    print(f"cProfile of perfscope.analyze({trace.name}), top 10 by internal time:")
    pstats.Stats(prof, stream=sys.stdout).strip_dirs().sort_stats("tottime").print_stats(10)


def whole_processes(trace: Path, rounds: int) -> None:
    """Wall time of three processes in alternating rounds (medians): the parse floor, the command's
    imports alone, and ``perfscope analyze TRACE --out DIR``; the command over the floor against
    :data:`WHOLE_TARGET`, and how much of it the imports are."""
    import subprocess

    def timed(cmd) -> float:
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=env_for(ROOT), cwd=ROOT)
        return time.perf_counter() - t0

    floor, imports, command = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-whole-") as tmp:
        for i in range(rounds):
            floor.append(timed([sys.executable, "-c", FLOOR_SCRIPT, str(trace)]))
            imports.append(timed([sys.executable, "-c", COMMAND_IMPORTS]))
            command.append(timed([sys.executable, "-m", "perfscope", "analyze", str(trace), "--out", f"{tmp}/o{i}"]))
    f, m, c = statistics.median(floor), statistics.median(imports), statistics.median(command)
    print(f"\n2. whole processes, {rounds} alternating rounds (medians)")
    print(f"parse-floor process (python, orjson, read + gunzip + loads): {f:.3f} s")
    print(f"the command's imports alone (analysis, record, report, matplotlib): {m:.3f} s")
    print(f"perfscope analyze TRACE --out DIR: {c:.3f} s  ({c / f:.2f}x the floor; target <= {WHOLE_TARGET}x: "
          f"{met(c / f <= WHOLE_TARGET)}); its imports are {m / c:.0%} of it", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--repeat", type=int, default=9, help="in-process rounds of analyze and floor (default 9)")
    ap.add_argument("--rss-runs", type=int, default=5, help="processes measured for peak RSS (default 5)")
    ap.add_argument("--baseline-tree", type=Path, help="a checkout of an older perfscope to measure too")
    ap.add_argument("--no-hta", action="store_true", help="skip Holistic Trace Analysis even when importable")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one analysis and exit")
    ap.add_argument("--whole", type=int, default=5, help="rounds of the three whole processes (default 5)")
    args = ap.parse_args()
    trace = args.trace.resolve()
    if not trace.is_file():
        raise SystemExit(f"bench_analyze: {trace} not found (the default is the A100 trace in ../shared/traces; "
                         "pass a trace path)")
    if args.profile:
        profile(trace)
        return
    text_mb = len(gzip.decompress(trace.read_bytes()) if trace.name.endswith(".gz") else trace.read_bytes()) / 1e6
    print(f"trace: {trace} ({trace.stat().st_size / 1e6:.1f} MB on disk, {text_mb:.1f} MB of text)")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; code: {code_state()}", flush=True)

    # 1. in-process time against the parse floor
    parse_floor(trace)
    analyze_once(trace)  # warm both: imports, caches, page cache
    floor_s, analyze_s = [], []
    for i in range(args.repeat):  # alternating, and which goes first alternates too
        if i % 2:
            analyze_s.append(analyze_once(trace))
            floor_s.append(parse_floor(trace))
        else:
            floor_s.append(parse_floor(trace))
            analyze_s.append(analyze_once(trace))
    f, a = statistics.median(floor_s), statistics.median(analyze_s)
    ratio = a / f
    print(f"\n1. in process, {args.repeat} rounds alternating (medians)")
    print(f"parse floor (read + gunzip + orjson.loads, gc off): {f:.3f} s  (runs: {', '.join(f'{x:.3f}' for x in floor_s)})")
    print(f"perfscope.analyze:                                 {a:.3f} s  (runs: {', '.join(f'{x:.3f}' for x in analyze_s)})")
    print(f"ratio analyze / floor: {ratio:.2f}x  target <= {ANALYZE_TARGET}x: {met(ratio <= ANALYZE_TARGET)}; "
          f"goal < {ANALYZE_GOAL}x: {met(ratio < ANALYZE_GOAL)}", flush=True)

    # 2. whole processes: the command against the parse-floor process (issue 38, part 7)
    whole_processes(trace, args.whole)

    # 3. peak RSS of whole processes
    print(f"\n3. peak RSS of a whole process, median of {args.rss_runs} runs each")
    with tempfile.TemporaryDirectory(prefix="bench-analyze-") as tmp:
        tmp = Path(tmp)
        base, _ = rss_runs("imports only", lambda i: [sys.executable, "-c", IMPORTS_ONLY], args.rss_runs,
                           env_for(ROOT), tmp)

        def expect_summary(m) -> None:
            if "summary.json" not in m.output:
                raise SystemExit(f"bench: perfscope analyze wrote no summary:\n{m.output[-3000:]}")

        ours, ours_wall = rss_runs("perfscope analyze", lambda i: [sys.executable, "-m", "perfscope", "analyze", str(trace),
                                                                   "--out", str(tmp / f"out-{i}")],
                                   args.rss_runs, env_for(ROOT), tmp, expect_summary)
        old = hta = None
        if args.baseline_tree is not None:
            check_tree(args.baseline_tree, tmp)
            old, old_wall = rss_runs("baseline perfscope analyze",
                                     lambda i: [sys.executable, "-m", "perfscope", "analyze", str(trace),
                                                "--out", str(tmp / f"old-{i}")],
                                     args.rss_runs, env_for(args.baseline_tree), tmp, expect_summary)
        # A module lookup, not an import: `import hta` here would bind the name this result uses.
        have_hta = not args.no_hta and importlib.util.find_spec("hta") is not None
        if have_hta:
            one = tmp / "hta-dir"
            one.mkdir()
            os.symlink(trace, one / trace.name)
            hta, hta_wall = rss_runs("HTA TraceAnalysis", lambda i: [sys.executable, "-c", HTA_SCRIPT, str(one)],
                                     args.rss_runs, dict(os.environ), tmp)
    print(f"interpreter + numpy, pandas and perfscope's analysis modules, nothing analyzed: {fmt_mib(base)}")
    print(f"perfscope analyze (summary.json + report.html): peak RSS {fmt_mib(ours)}, {ours_wall:.2f} s  "
          f"target <= {RSS_TARGET_MIB} MiB: {met(ours <= RSS_TARGET_MIB * MiB)}")
    if old is not None:
        print(f"baseline perfscope analyze ({args.baseline_tree}): peak RSS {fmt_mib(old)}, {old_wall:.2f} s  "
              f"(ratio {old / ours:.2f}x ours)")
    if hta is not None:
        print(f"HTA TraceAnalysis + temporal breakdown: peak RSS {fmt_mib(hta)}, {hta_wall:.2f} s  "
              f"(ratio {hta / ours:.2f}x ours)")
    elif not args.no_hta:
        print("HTA: not importable, not measured")


if __name__ == "__main__":
    main()
