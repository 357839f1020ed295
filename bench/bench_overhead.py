"""Benchmark: how much slower steps run under `perfscope profile` outside the profiled window.

Runs bench/steady_loop.py plainly and under `perfscope profile` (every collector part on: the step
tracker's hooks, the whole-run timer, the host record, the profiler's schedule), alternating, on a
step of about 3 ms and one of about 0.5 ms. The profiled run's window (2 steps after 40 skipped)
splits it into steps before the window and steps after it; each side's median step is compared
with the same steps of the plain runs. Prints the ratio and the added microseconds a step (targets:
<= 1.01x on the 3 ms step, <= 20 us a step), and perfscope's own figure from the whole-run view.

Two clocks: each step's wall time, and the training thread's CPU time (``time.thread_time``).
perfscope's work outside the window is work on the training thread, which the CPU time holds
whole; the wall time adds every wait for a core, which on a shared machine varies from run to run
by more than the target (0.93-1.17x between runs of one tree at a load of ~1, 2026-12-07).

With ``--live`` it measures the live view instead: `perfscope profile` on a pseudo-terminal with
its live view (the script's output relayed through a pipe by a thread that redraws the status
line, ``perfscope/cli/watch.py``) against the same command with ``--no-live``, alternating.

    python bench/bench_overhead.py [--rounds N] [--live]
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import select
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOOP = HERE / "steady_loop.py"
STEPS = 100
SKIP = 40  # the window: steps 41-42 (with a warm-up step before them)
SIDES = {"before the window": slice(5, 35), "after the window": slice(55, 95)}
WIDTHS = {"3 ms step": 256, "0.5 ms step": 48}
CLOCKS = {"wall_s": "wall", "thread_cpu_s": "thread CPU"}


def on_a_terminal(cmd: list[str]) -> None:
    """Run ``cmd`` with its output on a pseudo-terminal, reading (and dropping) what it writes."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        try:
            if ready and not os.read(master, 65536):
                break
        except OSError:  # the terminal closed: the command is done
            break
    os.close(master)
    if proc.wait() != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd)


def run(profiled: bool, width: int, tmp: Path, i: int, live: bool | None = None) -> tuple[dict[str, list[float]], float | None]:
    """The loop's step times (s: ``wall_s``, ``thread_cpu_s``) and, profiled, the whole-run view's own
    cost (us a step); ``live`` True or False: profiled on a pseudo-terminal, with or without the live view."""
    timings = tmp / f"{'p' if profiled else 'plain'}{live}{width}-{i}.json"
    loop_args = ["--steps", str(STEPS), "--timings", str(timings), "--width", str(width)]
    out = tmp / f"out{live}{width}-{i}"
    if profiled:
        cmd = [sys.executable, "-m", "perfscope", "profile", str(LOOP), "--skip-first", str(SKIP - 1), "--warmup", "1",
               "--active", "2", "--max-steps", "0", "--out", str(out), *(["--no-live"] if live is False else []),
               "--", *loop_args]
    else:
        cmd = [sys.executable, str(LOOP), *loop_args]
    if live is None:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        on_a_terminal(cmd)
    own = None
    if profiled:
        views = json.loads((out / "summary.json").read_text())["details"].get("run_steps") or []
        own = views[0].get("own_cost_us") if views else None
    return json.loads(timings.read_text()), own


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--live", action="store_true", help="the live view against --no-live, on a pseudo-terminal")
    args = ap.parse_args()
    names = ("--no-live", "live view") if args.live else ("plain", "under perfscope")
    with tempfile.TemporaryDirectory() as d:
        for label, width in WIDTHS.items():
            plain: dict[tuple[str, str], list[float]] = {(s, c): [] for s in SIDES for c in CLOCKS}
            profiled: dict[tuple[str, str], list[float]] = {(s, c): [] for s in SIDES for c in CLOCKS}
            own: list[float] = []
            for i in range(args.rounds):  # alternate so drift on a noisy machine hits both alike
                a, _ = run(args.live, width, Path(d), i, False if args.live else None)
                b, cost = run(True, width, Path(d), i, True if args.live else None)
                for side, cut in SIDES.items():
                    for clock in CLOCKS:
                        plain[side, clock].append(statistics.median(a[clock][cut]))
                        profiled[side, clock].append(statistics.median(b[clock][cut]))
                if cost is not None:
                    own.append(cost)
            for clock, clock_label in CLOCKS.items():
                for side in SIDES:
                    p, q = statistics.median(plain[side, clock]), statistics.median(profiled[side, clock])
                    print(f"{label}, {side}, {clock_label}: {names[0]} {p * 1e3:.3f} ms, {names[1]} {q * 1e3:.3f} ms: "
                          f"{q / p:.3f}x, {(q - p) * 1e6:+.1f} us a step (median of {args.rounds} runs each)")
            if own:
                print(f"{label}: perfscope's own figure (whole-run view): {statistics.median(own):.1f} us a step")


if __name__ == "__main__":
    main()
