"""Benchmark: does ``perfscope tune`` find and prove the faster configuration on a busy machine?

The acceptance check of the tuner under load: an io-bound script -- by default the shipped
``examples/io_bound.py`` (3 ms of decoding per sample, no DataLoader workers), or
``--script io_latency`` (``bench/io_latency.py``) -- is tuned by ``perfscope tune SCRIPT`` (its
defaults, or ``--trials N``) while ``--burners`` processes (default two per core: a pure Python
loop each, niced 0, started before and killed after all studies) keep every core busy. Each of
``--studies`` studies starts afresh (its own output folder, seed = study number).

A study passes when tune *proves* its recommendation at least ``--target`` (2x) faster -- its
paired, interleaved confirmation's interval lies above 1 -- and an independent check agrees: the
script itself is run as the user runs it and with the recommended ``num_workers``,
``prefetch_factor``, ``intra_op_threads``, ``pin_memory`` passed as its own options, interleaved
A B / B A for ``--rounds`` rounds under the same burners, and the median of the per-round ratios of
its printed speed is at least the target too. Target: at least 4 of 5 studies pass.

Run (about 5-10 minutes per study on 2 busy cores)::

    python bench/bench_tune_busy.py [--studies 5] [--burners N] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The scripts tuned: the shipped example (the acceptance figure) and the bench's own io script. Each
# takes the knobs below as its own options, and prints its speed in a line the pattern reads
# (samples/s, or ms per step: inverted so that higher is faster).
SCRIPTS = {"io_bound": ROOT / "examples" / "io_bound.py", "io_latency": ROOT / "bench" / "io_latency.py"}
_THROUGHPUT = re.compile(r"throughput: ([0-9.]+) samples/s")
_MS_PER_STEP = re.compile(r"\(([0-9.]+) ms/step\)")
_OPTIONS = {"num_workers": "--num-workers", "prefetch_factor": "--prefetch-factor", "intra_op_threads": "--threads"}
SCRIPT = SCRIPTS["io_bound"]


def burners(n: int) -> list[subprocess.Popen]:
    """``n`` processes spinning a core each (other work on the machine)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def tune(out: Path, trials: int | None, steps: int | None, seed: int) -> tuple[dict | None, float, str]:
    """One fresh study; (tune.json or None, wall seconds, the last lines of its output)."""
    cmd = [sys.executable, "-m", "perfscope", "tune", str(SCRIPT), *(["--trials", str(trials)] if trials else []),
           "--out", str(out),
           "--no-progress", "--seed", str(seed), *(["--", "--steps", str(steps)] if steps else [])]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    record = out / "tune.json"
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
    return (json.loads(record.read_text()) if proc.returncode == 0 and record.is_file() else None), wall, tail


def script_throughput(args: list[str]) -> float | None:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        return None
    m = _THROUGHPUT.search(proc.stdout)
    if m:
        return float(m.group(1))
    m = _MS_PER_STEP.search(proc.stdout)
    return 1000.0 / float(m.group(1)) if m and float(m.group(1)) > 0 else None


def side_by_side(config: dict, rounds: int, steps: int) -> tuple[float | None, list[float]]:
    """Median of per-round ratios (recommended / as-is) of the script's own throughput."""
    options = [str(x) for k, v in config.items() if k in _OPTIONS for x in (_OPTIONS[k], v)]
    if config.get("pin_memory"):
        options.append("--pin-memory")
    ratios = []
    for r in range(rounds):
        order = [("base", []), ("tuned", options)]
        if r % 2:
            order.reverse()
        got = {name: script_throughput(["--steps", str(steps), *opts]) for name, opts in order}
        if got["base"] and got["tuned"]:
            ratios.append(got["tuned"] / got["base"])
    return (statistics.median(ratios) if ratios else None), ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--script", choices=sorted(SCRIPTS), default="io_bound",
                    help="examples/io_bound.py (default: the acceptance figure) or bench/io_latency.py")
    ap.add_argument("--studies", type=int, default=5)
    ap.add_argument("--trials", type=int, default=None, help="tune's --trials (default: tune's own)")
    ap.add_argument("--burners", type=int, default=2 * (os.cpu_count() or 1),
                    help="busy processes (default: two per core)")
    ap.add_argument("--rounds", type=int, default=3, help="side-by-side rounds per study (default 3)")
    ap.add_argument("--steps", type=int, default=None,
                    help="the script's --steps in the studies (default: tune's own choice)")
    ap.add_argument("--check-steps", type=int, default=80, help="its --steps in the side-by-side check (default 80)")
    ap.add_argument("--target", type=float, default=2.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    global SCRIPT
    SCRIPT = SCRIPTS[args.script]
    if args.studies < 1 or (args.trials is not None and args.trials < 2) or args.burners < 0 or args.rounds < 1:
        ap.error("--studies >= 1, --trials >= 2, --burners >= 0, --rounds >= 1")
    trials = f" --trials {args.trials}" if args.trials else ""
    print(f"{args.studies} studies of `perfscope tune {SCRIPT.name}{trials}` with {args.burners} "
          f"busy processes on {os.cpu_count()} cores; side-by-side check: {args.rounds} interleaved rounds", flush=True)
    results = []
    busy = burners(args.burners)
    try:
        with tempfile.TemporaryDirectory(prefix="perfscope-tune-busy-") as work:
            for i in range(args.studies):
                record, wall, tail = tune(Path(work) / f"study-{i}", args.trials, args.steps, seed=i)
                if record is None:
                    results.append({"study": i, "status": "failed", "wall_s": wall, "output": tail})
                    print(f"study {i}: FAILED after {wall:.0f} s:\n  " + tail.replace("\n", "\n  "), flush=True)
                    continue
                rec = record["recommendation"]
                row = {"study": i, "status": rec["status"], "config": rec.get("config") or {},
                       "speedup": rec.get("speedup"), "ci_low": rec.get("ci_low"), "ci_high": rec.get("ci_high"),
                       "confirm_rounds": (record.get("confirmation") or {}).get("rounds"), "wall_s": wall}
                check, ratios = (side_by_side(row["config"], args.rounds, args.check_steps)
                                 if row["config"] else (None, []))
                row.update(check=check, check_ratios=ratios,
                           passed=bool(rec["status"] == "faster" and (row["speedup"] or 0) >= args.target
                                       and (row["ci_low"] or 0) > 1 and check is not None and check >= args.target))
                results.append(row)
                said = (f"{row['speedup']:.2f}x ({row['ci_low']:.2f}x-{row['ci_high']:.2f}x, "
                        f"{row['confirm_rounds']} rounds)" if rec["status"] == "faster" else rec["line"])
                checked = f"{check:.2f}x (rounds {', '.join(f'{r:.2f}' for r in ratios)})" if check else "-"
                print(f"study {i}: {wall:.0f} s; recommends {row['config'] or 'no change'}: {said}; "
                      f"side by side {checked}; {'PASS' if row['passed'] else 'fail'}", flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    passed = sum(r.get("passed", False) for r in results)
    need = -(-4 * args.studies // 5)
    print(f"\n{passed} of {args.studies} studies proved a configuration >= {args.target:g}x (interval above 1), "
          f"confirmed side by side (target: {need} of {args.studies}): {'met' if passed >= need else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
