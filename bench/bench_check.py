"""Benchmark: ``perfscope check``'s false-alarm rate and power on repeated runs of a shipped example.

Profiles ``examples/compute_bound.py`` ``--runs`` times as it ships and ``--runs`` times with a
known regression (``--delay-ms``: host time added to every step, set to ``--regression`` of the
plain run's step time, measured first), the two kinds interleaved so that the machine's load
drifts across both alike. Then the gate is applied as CI would apply it, for each way of calling
it (one baseline run and one new run; a stored set of K baseline runs and one new run; K and K):

- false alarms: plain runs checked against other plain runs that fail the gate (target: at most 1%);
- power: regressed runs checked against plain runs that fail it (target: a 5% regression caught).

One-and-one uses every ordered pair; K-run sides are drawn at random (``--draws``, disjoint runs,
fixed seed). Prints the rates, the run-to-run spread of the plain runs, and writes the figures as
JSON (``--json``).

    python bench/bench_check.py [--runs 24] [--regression 0.05] [--active 20] [--k 8]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from perfscope.check import MIN_STEPS, compare, step_sample  # noqa: E402
from perfscope.record import load_summary  # noqa: E402

EXAMPLE = ROOT / "examples" / "compute_bound.py"


def profile(out: Path, active: int, delay_ms: float) -> dict:
    if (out / "summary.json").is_file():  # --keep of an earlier run: measure again only what is missing
        return load_summary(out)
    steps = active + 8  # perfscope profile's default skip-first and warmup, with room to spare
    cmd = [sys.executable, "-m", "perfscope", "profile", str(EXAMPLE), "--active", str(active), "--out", str(out),
           "--", "--steps", str(steps), "--delay-ms", f"{delay_ms:.3f}"]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"bench_check: profiling {out.name} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return load_summary(out)


def rate(pairs) -> float:
    return sum(compare(a, b).failed for a, b in pairs) / len(pairs)


def draws(plain: list, slow: list, k_base: int, k_run: int, n: int, seed: int) -> tuple[list, list]:
    """(identical, regressed) pairs of sides: ``k_base`` plain baseline runs against ``k_run``
    other plain runs, and against ``k_run`` regressed runs."""
    rng = random.Random(seed)
    same, regressed = [], []
    for _ in range(n):
        picked = rng.sample(range(len(plain)), k_base + k_run)
        base = [plain[i] for i in picked[:k_base]]
        same.append((base, [plain[i] for i in picked[k_base:]]))
        regressed.append((base, [slow[i] for i in rng.sample(range(len(slow)), k_run)]))
    return same, regressed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=24, help="runs of each kind (default 24)")
    ap.add_argument("--k", type=int, default=8, help="runs on a side of the several-run ways (default 8)")
    ap.add_argument("--draws", type=int, default=500, help="random sides drawn per several-run way (default 500)")
    ap.add_argument("--regression", type=float, default=0.05, help="the injected regression, a fraction (default 0.05)")
    ap.add_argument("--active", type=int, default=20, help="profiled steps per run (default 20)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    ap.add_argument("--keep", type=Path, default=None, help="keep the runs' output folders here (runs already there are reused)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or Path(scratch)
        first = profile(tmp / "calibrate", args.active, 0.0)
        delay_ms = args.regression * first["overall"]["step_time_us"] / 1000
        plain, slow = [], []
        for i in range(args.runs):
            plain.append(profile(tmp / f"plain{i}", args.active, 0.0))
            slow.append(profile(tmp / f"slow{i}", args.active, delay_ms))
            print(f"run {i + 1}/{args.runs}: plain {plain[-1]['overall']['step_time_us'] / 1000:.2f} ms, regressed "
                  f"{slow[-1]['overall']['step_time_us'] / 1000:.2f} ms", flush=True)
    usable = [len(step_sample(p)) >= MIN_STEPS for p in plain + slow]
    left_out = usable.count(False)
    # a run the gate refuses (its steps host-contended) is run again in CI: here, left out of the pool
    plain = [p for p in plain if len(step_sample(p)) >= MIN_STEPS]
    slow = [p for p in slow if len(step_sample(p)) >= MIN_STEPS]
    print(f"{left_out} of {len(usable)} runs refused by the gate (fewer than {MIN_STEPS} counted steps: host-contended)")
    levels = [p["overall"]["step_time_us"] for p in plain]
    spread = statistics.stdev(levels) / statistics.fmean(levels)
    figures = {"runs": args.runs, "active_steps": args.active, "delay_ms": delay_ms, "regression": args.regression,
               "run_to_run_cv": spread, "runs_refused": left_out, "ways": []}
    print(f"plain runs: step time {statistics.fmean(levels) / 1000:.2f} ms, run-to-run spread {spread:.1%} (CV)")
    ways = [("1 baseline run, 1 run", list(itertools.permutations(plain, 2)), [(a, b) for a in plain for b in slow])]
    for k_base, k_run in ((args.k, 1), (args.k // 2, args.k // 2)):
        same, regressed = draws(plain, slow, k_base, k_run, args.draws, seed=k_base * 100 + k_run)
        ways.append((f"{k_base} baseline runs, {k_run} run{'s' if k_run > 1 else ''}", same, regressed))
    for name, same, regressed in ways:
        fa, power = rate(same), rate(regressed)
        mde = [compare(a, b).detectable for a, b in same]
        mde = statistics.median(m for m in mde if m is not None) if any(m is not None for m in mde) else None
        figures["ways"].append({"way": name, "identical": len(same), "false_alarm_rate": fa,
                                "regressed": len(regressed), "power": power, "median_detectable_slowdown": mde})
        print(f"{name:<28} false alarms {fa:6.1%} of {len(same)}   {args.regression:.0%} regression caught "
              f"{power:6.1%} of {len(regressed)}" + (f"   detectable (80%): {mde:.1%}" if mde is not None else ""))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
