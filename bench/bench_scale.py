"""Benchmark: `perfscope analyze` at scale, one rank of many GB and many ranks, in one run.

a. large: one single-rank trace of ``--size-gb`` GB (10^9 bytes) of JSON text, the steps of TRACE
   repeated with shifted timestamps, step numbers and ids (``bench/tracecopy.py``), written as
   plain .json to a temporary directory. ``perfscope analyze FILE`` (default jobs) once, as a
   process of its own: peak RSS of all its processes (target < 1.5 GiB), wall time, throughput in
   MB of text per second; checks that the analysis saw every step.
b. ranks: ``--ranks`` gzip copies of TRACE with ``distributedInfo`` rank 0..N-1 and world size N.
   ``perfscope analyze DIR --jobs 1`` (serial) and ``perfscope analyze DIR`` (default jobs: one
   process per core), alternating, ``--repeat`` rounds, medians; with ``--baseline-tree DIR`` (a
   checkout of the previous perfscope, which analyzes ranks one after the other) its run joins
   each round. Target: the default-jobs run at least 1.8x faster than the previous version's
   serial run, and its peak RSS (all its processes) under 1 GiB. With ``--hta``, Holistic Trace
   Analysis on the same directory once (time and peak RSS).

Peak RSS is the sampled total of a command's processes, or the kernel's figure for its largest
process when higher (``peakmem.measure``). The synthetic files are removed at the end unless
``--keep``.

    python bench/bench_scale.py [TRACE] [--size-gb 10] [--ranks 32] [--repeat 3]
                                [--baseline-tree DIR] [--hta] [--keep] [--skip-large] [--skip-ranks]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from bench_analyze import DEFAULT_TRACE, HTA_SCRIPT, check_tree, code_state, env_for, fmt_mib, met  # noqa: E402
from peakmem import GiB, measure  # noqa: E402
from tracecopy import Template  # noqa: E402

LARGE_RSS_TARGET = 1.5 * GiB
RANKS_RSS_TARGET = 1 * GiB
SPEEDUP_TARGET = 1.8


def fmt_gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def analyze_cmd(path: Path, out: Path, jobs: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "perfscope", "analyze", str(path), "--out", str(out)]
    return cmd + (["--jobs", str(jobs)] if jobs is not None else [])


def read_summary(out: Path) -> dict | None:
    try:
        return json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def describe(m) -> str:
    return (f"{m.wall_s:.2f} s, peak RSS {fmt_mib(m.peak)} (largest process {fmt_mib(m.max_rss)}, "
            f"{m.processes} process(es), PSS {fmt_mib(m.tree_pss)})")


def part_large(t: Template, trace: Path, work: Path, args) -> None:
    print(f"\na. one rank, {args.size_gb:g} GB of JSON text", flush=True)
    copies = t.copies_for(int(args.size_gb * 1e9))
    path = work / "large.json"
    t0 = time.perf_counter()
    size = t.write(path, copies)
    build = time.perf_counter() - t0
    events = copies * t.events_per_copy + len(t.once)
    print(f"built {path.name}: {size / 1e9:.2f} GB of text, {copies} copies of the {t.steps} steps of {trace.name} "
          f"({copies * t.steps} steps, {events:,} events, {copies * t.x_per_copy + t.x_once:,} of them complete "
          f"'X' events) in {build:.0f} s ({size / 1e6 / build:.0f} MB/s)", flush=True)
    free = _mem_available()
    limit = int(args.mem_limit_gb * GiB) if args.mem_limit_gb else int(0.8 * free)
    print(f"memory available now: {fmt_gib(free)}; the run is stopped if its processes hold more than "
          f"{fmt_gib(limit)}", flush=True)
    out = work / "out-large"
    m = measure(analyze_cmd(path, out), env=env_for(ROOT), cwd=work, mem_limit=limit, interval=0.1)
    s = read_summary(out)
    if m.rc != 0 or s is None:
        why = m.stopped or f"exit status {m.rc}"
        print(f"perfscope analyze {path.name}: FAILED ({why}) after {describe(m)}")
        print("its last output:\n  " + "\n  ".join(m.output.strip().splitlines()[-15:]))
        print(f"target peak RSS < {fmt_gib(LARGE_RSS_TARGET)}: NOT met (the analysis did not finish)")
    else:
        steps = len(s["steps"])
        seen = sum(tr.get("events", 0) for tr in s["traces"])
        print(f"perfscope analyze {path.name} (default jobs): {describe(m)}")
        print(f"throughput: {size / 1e6 / m.wall_s:.0f} MB/s of text; {seen:,} events analyzed; "
              f"peak RSS per analyzed event: {m.peak / max(seen, 1):.1f} bytes")
        print(f"steps seen: {steps} of {copies * t.steps} expected: {'ok' if steps == copies * t.steps else 'WRONG'}; "
              f"verdict {s['overall'].get('verdict')}")
        print(f"target peak RSS < {fmt_gib(LARGE_RSS_TARGET)}: {fmt_gib(m.peak)}, {met(m.peak < LARGE_RSS_TARGET)}")
    if not args.keep:
        path.unlink()
    shutil.rmtree(out, ignore_errors=True)


_TEMPLATE: Template | None = None


def _load_template(trace: Path) -> None:
    global _TEMPLATE
    _TEMPLATE = Template.from_file(trace)


def _write_rank(job: tuple) -> int:
    path, rank, world = job
    return _TEMPLATE.write(path, 1, rank=rank, world_size=world)


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 * GiB


def part_ranks(t: Template, trace: Path, work: Path, args) -> None:
    n = args.ranks
    print(f"\nb. {n} ranks", flush=True)
    d = work / f"ranks{n}"
    d.mkdir()
    t0 = time.perf_counter()
    jobs = [(d / f"worker{r:02d}.pt.trace.json.gz", r, n) for r in range(n)]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1, initializer=_load_template, initargs=(trace,)) as pool:
        text = sum(pool.map(_write_rank, jobs))
    disk = sum(f.stat().st_size for f in d.iterdir())
    print(f"built {d.name}/: {n} gzip copies of {trace.name} (ranks 0..{n - 1}, world size {n}): "
          f"{text / 1e9:.2f} GB of text, {disk / 1e6:.0f} MB on disk, in {time.perf_counter() - t0:.0f} s", flush=True)
    runs = {"serial": [], "parallel": [], "baseline": []}
    summaries = {}
    labels = {"serial": "perfscope analyze DIR --jobs 1", "parallel": "perfscope analyze DIR (default jobs)",
              "baseline": "previous version, perfscope analyze DIR (serial)"}
    if args.baseline_tree is not None:
        check_tree(args.baseline_tree, work)
    order = ["serial", "parallel"] + (["baseline"] if args.baseline_tree is not None else [])
    for i in range(args.repeat):
        for kind in order if i % 2 == 0 else order[::-1]:  # alternating order, so drift affects all alike
            out = work / f"out-{kind}-{i}"
            if kind == "baseline":
                m = measure(analyze_cmd(d, out), env=env_for(args.baseline_tree), cwd=work)
            else:
                m = measure(analyze_cmd(d, out, 1 if kind == "serial" else None), env=env_for(ROOT), cwd=work)
            s = read_summary(out)
            if m.rc != 0 or s is None:
                raise SystemExit(f"bench: {labels[kind]} failed (exit {m.rc}):\n{m.output[-3000:]}")
            summaries[kind] = s
            runs[kind].append(m)
            print(f"  round {i + 1}: {labels[kind]}: {describe(m)}; {s['run']['ranks_analyzed']} ranks, "
                  f"{len(s['steps'])} steps", flush=True)
            shutil.rmtree(out, ignore_errors=True)
    hta = None
    if args.hta:
        try:
            import hta as _hta  # noqa: F401
        except ImportError:
            print("  HTA: not importable, not measured")
        else:
            hta = measure([sys.executable, "-c", HTA_SCRIPT, str(d)], cwd=work)
            if hta.rc != 0:
                print(f"  HTA failed (exit {hta.rc}):\n{hta.output[-2000:]}")
                hta = None
            else:
                print(f"  HTA TraceAnalysis + temporal breakdown, once: {describe(hta)}", flush=True)

    def med(kind: str, attr: str) -> float:
        return statistics.median(getattr(m, attr) for m in runs[kind])

    print(f"\n{n} ranks, medians of {args.repeat} rounds ({text / 1e9:.2f} GB of text):")
    for kind in order:
        print(f"  {labels[kind]}: {med(kind, 'wall_s'):.2f} s ({text / 1e6 / med(kind, 'wall_s'):.0f} MB/s), "
              f"peak RSS {fmt_mib(med(kind, 'peak'))}")
    if hta is not None:
        print(f"  HTA (once): {hta.wall_s:.2f} s, peak RSS {fmt_mib(hta.peak)}")
    same = summaries["serial"]["steps"] == summaries["parallel"]["steps"]
    got, ranks = len(summaries["parallel"]["steps"]), summaries["parallel"]["run"]["ranks_analyzed"]
    print(f"  steps seen (default jobs): {got} of {n * t.steps} expected, {ranks} of {n} ranks: "
          f"{'ok' if got == n * t.steps and ranks == n else 'WRONG'}; serial and default-jobs summaries hold the same "
          f"steps and numbers: {'yes' if same else 'NO'}")
    par, ser = med("parallel", "wall_s"), med("serial", "wall_s")
    print(f"  default jobs vs --jobs 1 (this version): {ser / par:.2f}x faster")
    if "baseline" in order:
        old = med("baseline", "wall_s")
        print(f"  --jobs 1 vs the previous version's serial run: {old / ser:.2f}x faster")
        print(f"  target default jobs >= {SPEEDUP_TARGET}x faster than the previous serial run: {old / par:.2f}x, "
              f"{met(old / par >= SPEEDUP_TARGET)}")
    else:
        print(f"  target default jobs >= {SPEEDUP_TARGET}x faster than the previous serial run: not measured "
              "(no --baseline-tree)")
    if hta is not None:
        print(f"  HTA / default jobs: {hta.wall_s / par:.2f}x the time, {hta.peak / med('parallel', 'peak'):.2f}x "
              "the peak RSS")
    pk = max(m.peak for m in runs["parallel"])
    print(f"  target peak RSS of the default-jobs run < {fmt_gib(RANKS_RSS_TARGET)}: highest of the rounds "
          f"{fmt_mib(pk)}, {met(pk < RANKS_RSS_TARGET)}")
    if not args.keep:
        shutil.rmtree(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--size-gb", type=float, default=10.0, help="GB (10^9 bytes) of text of the large trace (default 10)")
    ap.add_argument("--ranks", type=int, default=32, help="rank copies of the trace (default 32)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of the rank runs (default 3)")
    ap.add_argument("--baseline-tree", type=Path, help="a checkout of the previous perfscope, for its serial run")
    ap.add_argument("--hta", action="store_true", help="also run Holistic Trace Analysis on the rank directory once")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic traces (their directory is printed)")
    ap.add_argument("--work-dir", type=Path, help="where to write the synthetic traces (default: a new temporary directory)")
    ap.add_argument("--mem-limit-gb", type=float, help="stop the large run when its processes hold more than this "
                                                       "(default: 80%% of the memory available when it starts)")
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--skip-ranks", action="store_true")
    args = ap.parse_args()
    trace = args.trace.resolve()
    if not trace.is_file():
        raise SystemExit(f"bench_scale: {trace} not found (pass a trace path)")
    if args.baseline_tree is not None:
        args.baseline_tree = args.baseline_tree.resolve()
    parent = args.work_dir
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=parent))
    print(f"trace: {trace}; {os.cpu_count()} cores; python {sys.version.split()[0]}; code: {code_state()}", flush=True)
    print(f"work directory: {work}", flush=True)
    t = Template.from_file(trace)
    print(f"one copy: {t.steps} steps, {t.events_per_copy:,} events, {t.body_bytes / 1e6:.1f} MB of text; "
          f"ts shift per copy {t.step_span_us:,} us", flush=True)
    try:
        if not args.skip_large:
            part_large(t, trace, work, args)
        if not args.skip_ranks:
            part_ranks(t, trace, work, args)
    finally:
        if args.keep:
            print(f"\nkept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
