"""Benchmark: does ``perfscope tune`` find and prove the faster configuration on a busy machine?

The acceptance check of the tuner's measurement: an io-bound script (``bench/io_latency.py``: 8 ms
of latency per sample, batches of 32, no DataLoader workers by default) is tuned by
``perfscope tune SCRIPT --trials 8`` while ``--burners`` processes keep every core busy (a pure
Python loop each, started before and stopped after all studies). Each of ``--studies`` studies
starts afresh (its own output folder). Its recommendation is then checked independently of
perfscope: the script itself is run with its own options -- as the user runs it, and with the
recommended ``num_workers``/``prefetch_factor``/``intra_op_threads`` passed as its
``--num-workers``/``--prefetch-factor``/``--threads`` -- interleaved A B A B for ``--rounds`` rounds
(alternating which goes first), still under the burners, and the speed-up is the median of the
per-round ratios of the script's own printed throughput. A study passes when that speed-up is at
least ``--target`` (2x). Target: at least 4 of 5 studies pass.

Run (about 6 minutes per study on 2 busy cores)::

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
SCRIPT = ROOT / "bench" / "io_latency.py"
_THROUGHPUT = re.compile(r"throughput: ([0-9.]+) samples/s")
_OPTIONS = {"num_workers": "--num-workers", "prefetch_factor": "--prefetch-factor", "intra_op_threads": "--threads"}


def burners(n: int) -> list[subprocess.Popen]:
    """``n`` processes spinning a core each (other work on the machine)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def tune(out: Path, trials: int, steps: int, seed: int) -> tuple[dict | None, float, str]:
    """One fresh study; (tune.json or None, wall seconds, the last lines of its output)."""
    cmd = [sys.executable, "-m", "perfscope", "tune", str(SCRIPT), "--trials", str(trials), "--out", str(out),
           "--no-progress", "--seed", str(seed), "--", "--steps", str(steps)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    record = out / "tune.json"
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
    return (json.loads(record.read_text()) if proc.returncode == 0 and record.is_file() else None), wall, tail


def script_throughput(args: list[str]) -> float | None:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=900)
    m = _THROUGHPUT.search(proc.stdout)
    return float(m.group(1)) if proc.returncode == 0 and m else None


def side_by_side(config: dict, rounds: int, steps: int) -> tuple[float | None, list[float]]:
    """Median of per-round ratios (recommended / as-is) of the script's own throughput."""
    options = [str(x) for k, v in config.items() if k in _OPTIONS for x in (_OPTIONS[k], v)]
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
    ap.add_argument("--studies", type=int, default=5)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--burners", type=int, default=os.cpu_count() or 2, help="busy processes (default: one per core)")
    ap.add_argument("--rounds", type=int, default=3, help="side-by-side rounds per study (default 3)")
    ap.add_argument("--steps", type=int, default=400, help="the script's --steps in the studies (default 400)")
    ap.add_argument("--check-steps", type=int, default=80, help="its --steps in the side-by-side check (default 80)")
    ap.add_argument("--target", type=float, default=2.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.studies < 1 or args.trials < 2 or args.burners < 0 or args.rounds < 1:
        ap.error("--studies >= 1, --trials >= 2, --burners >= 0, --rounds >= 1")
    print(f"{args.studies} studies of `perfscope tune {SCRIPT.name} --trials {args.trials}` with {args.burners} "
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
                           passed=bool(check is not None and check >= args.target and rec["status"] == "faster"))
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
    print(f"\n{passed} of {args.studies} studies recommended a configuration confirmed at >= {args.target:g}x side by "
          f"side (target: {need} of {args.studies}): {'met' if passed >= need else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
