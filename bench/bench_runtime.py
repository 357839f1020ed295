"""Benchmark: the io example with its default loader vs with a runtime configuration patched in.

Runs ``examples/io_bound.py`` unmodified, alternating, a few rounds each:

* default: ``python examples/io_bound.py`` (num_workers 0);
* configured: the same script run under ``perfscope.runtime.patching.patched(CONFIG)`` (the
  zero-code-change subset ``perfscope profile --config`` applies), default CONFIG
  ``num_workers: 4, pin_memory: true, prefetch_factor: 4, persistent_workers: true``.

Prints samples per second (median of the rounds) for each and the ratio, all from runs made in
this invocation::

    python bench/bench_runtime.py [--rounds 3] [--steps 40] [--num-workers 4]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "io_bound.py"
BATCH = 16  # io_bound.py's default --batch-size

# Runs the script under patched(config) in a fresh interpreter, as `perfscope profile --config` would.
RUNNER = """
import sys
sys.path.insert(0, {root!r})
from perfscope.collect.script import run_script
from perfscope.runtime.patching import patched
with patched(sys.argv[1]) as report:
    outcome = run_script(sys.argv[2], sys.argv[3:])
print("loaders patched:", report.loaders)
sys.exit(outcome.exit_code)
"""


def run(config: Path | None, steps: int) -> float:
    """Samples per second of one run of the io example."""
    args = ["--steps", str(steps)]
    if config is None:
        cmd = [sys.executable, str(SCRIPT), *args]
    else:
        cmd = [sys.executable, "-c", RUNNER.format(root=str(ROOT)), str(config), str(SCRIPT), *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    if config is not None and "loaders patched: 1" not in out:
        raise SystemExit(f"the configuration was not applied:\n{out}")
    match = re.search(r"(\d+) steps in ([\d.]+) s", out)
    if not match:
        raise SystemExit(f"unexpected output from {SCRIPT.name}:\n{out}")
    return int(match.group(1)) * BATCH / float(match.group(2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--num-workers", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(f"num_workers: {args.num_workers}\npin_memory: true\nprefetch_factor: 4\n"
                          "persistent_workers: true\n")
        default, configured = [], []
        for i in range(args.rounds):  # alternating, so drift affects both alike
            default.append(run(None, args.steps))
            configured.append(run(config, args.steps))
            print(f"round {i + 1}: default {default[-1]:.0f} samples/s, configured {configured[-1]:.0f} samples/s",
                  flush=True)
    d, c = statistics.median(default), statistics.median(configured)
    print(f"\nio_bound.py, {args.steps} steps x {BATCH} samples, median of {args.rounds} rounds")
    print(f"default loader (num_workers 0):                       {d:8.0f} samples/s")
    print(f"patched config (num_workers {args.num_workers}, pin_memory, prefetch 4): {c:8.0f} samples/s")
    print(f"ratio configured/default: {c / d:.2f}x")


if __name__ == "__main__":
    main()
