"""`perfscope tune` of a simulated io-bound workload (perfscope.testing.trials), in its own process:
for the tests of what a study keeps when its tuner is killed, and of several workers sharing one.

Usage: simulated_tune.py OUT [--trials N] [--storage URL] [--study-name NAME] [--kill-at-run K]
[--pace S]. Exit status 0, or 130 after Ctrl-C; ``--kill-at-run K`` sends this process SIGKILL as
its K-th run (from 0) starts, while the study holds that trial as running.
"""

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from perfscope.testing.trials import SimulatedRunner
from perfscope.tuner.options import TuneOptions
from perfscope.tuner.tune import tune


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--storage", default=None)
    p.add_argument("--study-name", default="tune-train")
    p.add_argument("--kill-at-run", type=int, default=None)
    p.add_argument("--pace", type=float, default=0.0)
    args = p.parse_args()

    def on_run(index: int, changes: dict, work_dir: Path) -> None:
        if index == args.kill_at_run:
            print(f"killed at run {index}: {work_dir.name}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    runner = SimulatedRunner(on_run=on_run, sleep=time.sleep, pace_s=args.pace)
    options = TuneOptions(script=str(args.out.parent / "train.py"), script_args=("--steps", "100"), out_dir=args.out,
                          best_path=args.out / "best.yaml", study_name=args.study_name, storage=args.storage,
                          trials=args.trials, warmup_steps=2, measure_steps=4, profile_steps=0, confirm_top=1,
                          confirm_rounds=4, progress=False)
    try:
        tune(options, runner=runner)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
