"""Benchmark: does ``perfscope profile`` give each shipped example its class on a busy machine?

Each example is profiled ``--runs`` times while ``--burners`` processes keep the cores busy (a pure
Python loop each, niced 0, started before and killed after each example's runs: the load is known,
not hoped for), and once with no burner of ours. A run passes when its verdict -- provisional or
not -- is the class the example is written to show. Prints one row per example and load, and writes
the runs to ``--json``.

Run (a few minutes per example on 2 cores)::

    python bench/bench_busy_verdicts.py [--runs 5] [--burners 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# example, its arguments for perfscope profile, the class it is written to show
EXAMPLES = {
    "io_bound": ([], "io-bound"),
    "compute_bound": ([], "compute-bound"),
    "launch_bound": ([], "launch-bound"),
    "comm_bound": (["--nproc-per-node", "2"], "comm-bound"),
}


def burners(n: int) -> list[subprocess.Popen]:
    """``n`` processes spinning a core each (other work on the machine)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def profile(name: str, args: list[str], out: Path) -> dict:
    """One ``perfscope profile`` of ``examples/<name>.py``; its verdict, or why there is none."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "perfscope", "profile", *args, str(ROOT / "examples" / f"{name}.py"),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    try:
        overall = json.loads((out / "summary.json").read_text())["overall"]
    except (OSError, ValueError, KeyError):
        return {"verdict": None, "error": (done.stderr.strip().splitlines() or ["no summary"])[-1], "wall_s": wall}
    return {"verdict": overall.get("verdict"), "provisional": bool(overall.get("provisional")),
            "core_wait_share": overall.get("core_wait_share"), "reason": overall.get("reason"), "wall_s": wall}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="loaded runs per example (default 5)")
    p.add_argument("--burners", type=int, default=2 * (os.cpu_count() or 1),
                   help="busy processes while loaded (default: 2 per core)")
    p.add_argument("--examples", default=",".join(EXAMPLES), help="comma-separated (default: all)")
    p.add_argument("--json", default=None, help="write every run here")
    a = p.parse_args()
    rows, runs = [], []
    with tempfile.TemporaryDirectory(prefix="perfscope-busy-") as tmp:
        for name in a.examples.split(","):
            args, expected = EXAMPLES[name]
            for load, count in (("quiet", 1), (f"{a.burners} busy", a.runs)):
                procs = burners(a.burners) if load != "quiet" else []
                try:
                    results = [profile(name, args, Path(tmp) / f"{name}-{load.split()[0]}-{i}") for i in range(count)]
                finally:
                    stop(procs)
                for r in results:
                    runs.append({"example": name, "load": load, "expected": expected, **r})
                right = sum(r["verdict"] == expected for r in results)
                provisional = sum(bool(r.get("provisional")) for r in results)
                shares = [r["core_wait_share"] for r in results if r.get("core_wait_share") is not None]
                rows.append((name, load, f"{right}/{count}", provisional,
                             f"{min(shares):.0%}-{max(shares):.0%}" if shares else "-",
                             ", ".join(sorted({str(r["verdict"]) for r in results}))))
                print(f"{name:14} {load:8} right {right}/{count}  provisional {provisional}  "
                      f"waits {rows[-1][4]:9}  verdicts {rows[-1][5]}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(runs, indent=1))
    return 0 if all(r[2].split("/")[0] == r[2].split("/")[1] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
