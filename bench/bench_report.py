"""Benchmark: page size and render time of the reports against an earlier version of the code.

The charts of the reports are drawn by matplotlib; before, by hand-written SVG. The goal is that
pages and render times stay within 1.5x of the hand-written version. This bench checks out that
version (``--baseline-ref``, default: the last commit with hand-written charts) into a temporary git
worktree and renders the same inputs with both trees, interleaved (baseline, current, baseline, ...)
so that the machine's load drifts across both alike. Each render is a fresh Python process, as
``perfscope report`` is; it reports:

- ``process_s``: the whole process (interpreter start, imports, trace loading, rendering, writing);
- ``render_s``: the render call alone, in that process (matplotlib's import included: a report pays
  for it once);
- ``bytes``: the page's size.

Inputs: the A100 trace of ``../shared/traces`` analyzed by the current tree (one rank, 6 steps),
its two-rank sample (2 ranks), the same A100 summary with its steps repeated to 300 (the most the
per-step chart draws; rendered without traces), a tuning record (the tests' realistic one), and
``perfscope analyze`` of the A100 trace (the command users run, analysis and report together; its
``render_s`` is the whole command in process).
Prints the medians and the ratios current / baseline and writes them as JSON (``--json``).

    python bench/bench_report.py [--runs 9] [--baseline-ref REF] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces" / "hta"
# The last commit whose report charts were hand-written SVG (reports/svg.py).
BASELINE_REF = "7aa471445a0776cd111aed48ec4b9a9b23256f34"

RENDER = """
import json, sys, time
t0 = time.perf_counter()
kind, src, out = sys.argv[1:4]
record = json.load(open(src)) if src.endswith(".json") else None
if kind == "analyze":  # the whole command that writes the report, analysis included
    import shutil
    from perfscope.cli import main
    shutil.rmtree(out + ".d", ignore_errors=True)  # analyze never writes over an earlier result
    if main(["analyze", src, "--out", out + ".d"]):
        raise SystemExit("analyze failed")
    shutil.copy(out + ".d/report.html", out)
elif kind == "tuning":
    from perfscope.reports import write_tuning
    write_tuning(record, out)
else:
    from perfscope.reports import write_report
    write_report(record, out, base_dir=sys.argv[4] if len(sys.argv) > 4 else None,
                 find_traces=len(sys.argv) > 4)
from perfscope import reports
print(json.dumps({"render_s": time.perf_counter() - t0, "module": reports.__file__}))
"""


def _prepare(work: Path) -> dict[str, tuple[str, str, str | None]]:
    """case -> (kind, input JSON, base dir or None)."""
    cases = {}
    for name, trace in (("a100", TRACES / "a100_rank3_of8_train.json.gz"), ("two-ranks", TRACES / "two_ranks")):
        out = work / name
        subprocess.run([sys.executable, "-m", "perfscope.cli", "analyze", str(trace), "--out", str(out)],
                       cwd=ROOT, check=True, capture_output=True)
        cases[name] = ("bottleneck", str(out / "summary.json"), str(out))
    summary = json.loads((work / "a100" / "summary.json").read_text())
    steps = summary["steps"]
    many = [dict(copy.deepcopy(steps[i % len(steps)]), step=i) for i in range(300)]
    summary["steps"] = many
    (work / "many.json").write_text(json.dumps(summary))
    cases["300-steps"] = ("bottleneck", str(work / "many.json"), None)
    sys.path.insert(0, str(ROOT / "tests"))
    from tunereportkit import realistic

    (work / "tune.json").write_text(json.dumps(realistic()))
    cases["tuning"] = ("tuning", str(work / "tune.json"), None)
    cases["analyze"] = ("analyze", str(TRACES / "a100_rank3_of8_train.json.gz"), None)
    return cases


def _render(tree: Path, case: tuple[str, str, str | None], out: Path) -> dict:
    kind, src, base = case
    args = [sys.executable, "-c", RENDER, kind, src, str(out)] + ([base] if base else [])
    t0 = time.perf_counter()
    done = subprocess.run(args, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                          check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if not got["module"].startswith(str(tree)):
        raise SystemExit(f"rendered with {got['module']}, not the tree {tree}")
    return {"process_s": wall, "render_s": got["render_s"], "bytes": out.stat().st_size}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--baseline-ref", default=BASELINE_REF)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not TRACES.is_dir():
        raise SystemExit(f"{TRACES}: the shared traces are needed")
    with tempfile.TemporaryDirectory(prefix="perfscope-bench-report-") as tmp:
        work = Path(tmp)
        base_tree = work / "baseline"
        added = subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.baseline_ref], cwd=ROOT,
                               capture_output=True, text=True)
        if added.returncode:
            raise SystemExit(f"git worktree add {args.baseline_ref}: {added.stderr.strip()}")
        try:
            cases = _prepare(work)
            trees = {"baseline": base_tree, "current": ROOT}
            for name, tree in trees.items():  # once each, unmeasured: caches (bytecode, matplotlib's fonts) warm
                for case in cases.values():
                    _render(tree, case, work / f"warm-{name}.html")
            seen = {(t, c): [] for t in trees for c in cases}
            for _ in range(args.runs):
                for c, case in cases.items():
                    for t, tree in trees.items():
                        seen[(t, c)].append(_render(tree, case, work / f"{t}-{c}.html"))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, capture_output=True)
    result = {"baseline_ref": args.baseline_ref, "runs": args.runs, "cases": {}}
    print(f"{'case':<10} {'measure':<10} {'baseline':>10} {'current':>10} {'ratio':>7}")
    for c in cases:
        row = {}
        for m in ("process_s", "render_s", "bytes"):
            b = statistics.median(r[m] for r in seen[("baseline", c)])
            n = statistics.median(r[m] for r in seen[("current", c)])
            row[m] = {"baseline": b, "current": n, "ratio": n / b}
            fmt = (lambda v: f"{v / 1024:.0f} KiB") if m == "bytes" else (lambda v: f"{v:.3f} s")
            print(f"{c:<10} {m:<10} {fmt(b):>10} {fmt(n):>10} {n / b:>6.2f}x")
        result["cases"][c] = row
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
