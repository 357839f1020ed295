"""Check what a user reads beside the verdict on a busy machine, on every shipped example.

Each example is profiled beside ``--burners`` busy processes (a pure Python loop each, started
before and killed after: 4 on a 2-core machine is 2 per core), then checked:

- the verdict, provisional or not, is the class the example is written to show (where it has one),
  or there is none and the reason says why (an abstention, never a wrong class);
- each what-if saves its class's share of the verdict's step time, within 10 points;
- MFU is taken over the verdict's step time;
- ``perfscope diff`` of the run against itself says when a side is provisional.

Prints one line per example and exits 1 when a check fails. Run (about a minute per example on
2 cores)::

    python scripts/check_busy_examples.py [--burners 4] [--only io_bound,launch_bound] [--keep DIR] [--one-thread]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# example: (its arguments for perfscope profile, the class it is written to show, or None)
EXAMPLES = {
    "io_bound": ([], [], "io-bound"),
    "compute_bound": ([], [], "compute-bound"),
    "launch_bound": ([], [], "launch-bound"),
    "comm_bound": (["--nproc-per-node", "2"], [], "comm-bound"),
    "small_batches": ([], [], "launch-bound"),
    "conv_net": ([], [], None),
    "many_tensors": ([], [], None),
    "swin": ([], [], None),
    "accelerated": ([], [], None),
    "vision_models": ([], ["--model", "resnet50", "--batch-size", "2", "--image-size", "64", "--steps", "20"], None),
}
POINTS = 0.10  # what-if saving against its class's share: within 10 points


def burners(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def check(name: str, out: Path, env: dict[str, str]) -> list[str]:
    """The problems of one profiled example (empty: every check passed)."""
    args, script_args, expected = EXAMPLES[name]
    done = subprocess.run([sys.executable, "-m", "perfscope", "profile", "--out", str(out), *args,
                           str(ROOT / "examples" / f"{name}.py"), *(["--", *script_args] if script_args else [])],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200, env=env)
    if done.returncode != 0:
        return [f"profile failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"]
    summary = json.loads((out / "summary.json").read_text())
    overall, details = summary["overall"], summary["details"]
    problems = []
    verdict, step = overall.get("verdict"), overall.get("step_time_us")
    if expected and verdict is not None and verdict != expected:
        problems.append(f"verdict {verdict}, expected {expected}")
    if verdict is None and not overall.get("reason"):
        problems.append("no verdict and no reason")
    for w in details.get("what_if") or []:
        share = (overall.get("fractions") or {}).get(w["class"])
        if share is None or not step:
            continue
        if abs(w["step_time_us"] - step) > 1e-6 * step:
            problems.append(f"what-if {w['class']} on a step time of {w['step_time_us']:.0f} us, verdict's {step:.0f}")
        saved = w["saved_us_per_step"] / step
        if abs(saved - share) > POINTS:
            problems.append(f"what-if {w['class']} saves {saved:.0%} of the step, its share is {share:.0%}")
    mfu = details.get("mfu") or {}
    if mfu.get("step_time_s") and step and abs(mfu["step_time_s"] * 1e6 - step) > 1e-3 * step:
        problems.append(f"MFU over {mfu['step_time_s'] * 1e6:.0f} us, the verdict's step time is {step:.0f} us")
    diff = subprocess.run([sys.executable, "-m", "perfscope", "diff", str(out), str(out), "--out",
                           str(out / "diff.html")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    if diff.returncode != 0:
        problems.append(f"diff failed: {(diff.stderr.strip().splitlines() or ['?'])[-1]}")
    elif overall.get("provisional") and "provisional" not in diff.stdout:
        problems.append("diff does not say that the sides are provisional")
    print(f"{name:14} {verdict or '-':14} provisional={bool(overall.get('provisional'))!s:5} "
          f"step {step / 1000 if step else float('nan'):8.2f} ms  "
          f"what-ifs {len(details.get('what_if') or [])}  mfu {'yes' if mfu.get('step_time_s') else 'no'}  "
          + ("ok" if not problems else "; ".join(problems))
          + (f" (abstained: {overall.get('reason')})" if verdict is None else ""), flush=True)
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burners", type=int, default=4)
    parser.add_argument("--only", default="", help="comma-separated example names")
    parser.add_argument("--keep", type=Path, help="keep the outputs in this folder")
    parser.add_argument("--one-thread", action="store_true", help="profile with OMP_NUM_THREADS=1 (one intra-op thread)")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(EXAMPLES)
    unknown = [n for n in names if n not in EXAMPLES]
    if unknown:
        parser.error(f"unknown example(s): {', '.join(unknown)}")
    base = args.keep or Path(tempfile.mkdtemp(prefix="perfscope-busy-"))
    env = {**os.environ, **({"OMP_NUM_THREADS": "1"} if args.one_thread else {})}
    failed = 0
    for name in names:
        procs = burners(args.burners)
        try:
            failed += bool(check(name, base / name, env))
        finally:
            for p in procs:
                p.kill()
                p.wait()
    print(f"{len(names) - failed} of {len(names)} examples passed beside {args.burners} busy processes")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
