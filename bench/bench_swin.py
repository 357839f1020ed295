"""Benchmark: the Swin example end to end, without and with ``fused_ops: true`` patched in.

Runs ``examples/swin.py`` unmodified, alternating (plain, fused, plain, fused ...), each run in a
fresh interpreter:

* plain: ``python examples/swin.py``;
* fused: the same script under ``perfscope.runtime.patching.patched({"fused_ops": True})``, as
  ``perfscope profile --config`` and a tuning trial apply it (the fused window attention swapped
  into the first model called).

The script prints its own time for its steps (after model and data set-up); samples per second
are taken from it. Prints the medians of the rounds and their ratio, all from this invocation::

    python bench/bench_swin.py [--rounds 5] [--steps 20] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "swin.py"

RUNNER = """
import sys
sys.path.insert(0, {root!r})
from perfscope.collect.script import run_script
from perfscope.runtime.patching import patched
with patched({{"fused_ops": True}}) as report:
    outcome = run_script(sys.argv[1], sys.argv[2:])
print("applied:", report.applied.get("fused_ops", report.not_applied.get("fused_ops")))
sys.exit(outcome.exit_code)
"""


def run(fused: bool, steps: int, batch: int) -> float:
    """Samples per second of one run."""
    args = ["--steps", str(steps), "--batch-size", str(batch)]
    cmd = ([sys.executable, "-c", RUNNER.format(root=str(ROOT)), str(SCRIPT), *args] if fused
           else [sys.executable, str(SCRIPT), *args])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    if fused and "fused window attention in" not in out:
        raise SystemExit(f"the fused operator was not swapped in:\n{out}")
    match = re.search(r"(\d+) steps in ([\d.]+) s", out)
    if not match:
        raise SystemExit(f"unexpected output from {SCRIPT.name}:\n{out}")
    return int(match.group(1)) * batch / float(match.group(2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args()
    plain, fused = [], []
    for i in range(args.rounds):  # alternating, so drift affects both alike
        plain.append(run(False, args.steps, args.batch_size))
        fused.append(run(True, args.steps, args.batch_size))
        print(f"round {i + 1}: plain {plain[-1]:.1f} samples/s, fused_ops {fused[-1]:.1f} samples/s", flush=True)
    p, f = statistics.median(plain), statistics.median(fused)
    print(f"\nswin.py, {args.steps} steps x {args.batch_size} samples, median of {args.rounds} rounds")
    print(f"plain:          {p:8.1f} samples/s")
    print(f"fused_ops true: {f:8.1f} samples/s")
    print(f"ratio fused/plain: {f / p:.2f}x")


if __name__ == "__main__":
    main()
