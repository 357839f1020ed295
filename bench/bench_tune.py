"""Benchmark: what `perfscope tune` gains on examples/io_bound.py, and how fast its search finds it.

Two measurements, both reported as ratios, all from runs made in this invocation (or in the grid
cache it wrote earlier):

1. **Speed-up of the tuned configuration** (target: at least 2x). Runs the real
   ``perfscope tune examples/io_bound.py --trials 8 --out TMP --no-progress -- --steps 100``
   and reads its ``tune.json``: the confirmed speed-up and its 95% interval, which the tuner
   measured itself, baseline and candidates interleaved. Then re-measures, independently,
   the baseline against the written ``best.yaml`` side by side, A B A B for ``--rounds`` rounds,
   with ``tuner.trial.run_trial`` (no profiled steps; DataLoader settings passed as the tuner's
   ``TuningStudy.loader_settings`` does, so the warm-up drains the prefetched batches and the
   window is whole worker rounds), and reports the median of the per-round ratios.
2. **Search efficiency.** Profiles the baseline once as the tuner does and builds the tuner's
   search space from it (``tuner.space.build_space``). Measures every configuration of that space
   (num_workers 0..high x prefetch_factor, prefetch only with workers) ``--grid-repeats`` times
   (median) with ``run_trial``: a lookup table, cached in ``--cache``. Then replays ``--seeds``
   Optuna studies per search kind on the table, no script runs (the tuner's own
   ``TuningStudy.store_setup`` and ``TuningStudy.objective`` drive them, with ``run_trial``
   replaced by a table look-up): *guided* as ``perfscope tune`` (TPESampler(seed,
   n_startup_trials=4, multivariate=True), the baseline as trial 0, the rule-based guess
   enqueued, configurations already measured skipped), *tpe-no-guess* (the same without the
   guess, to separate the two), *random* (RandomSampler through the same objective, no guess)
   and *random-plain* (RandomSampler asked directly, the baseline as trial 0, repeats allowed),
   all with a budget of ``--budget`` trials, baseline included (as ``perfscope tune --trials``).
   For each study: the trials, baseline included, until a configuration worth >= 95% of the
   grid's best has been run (budget + 1 when never). No pruning is simulated. Done twice: the
   sampler sees the table's medians (no noise), and the medians times log-normal noise whose
   sigma is the grid repeats' pooled spread; reaching 95% is judged on the medians.

Run (about 5 minutes on 2 CPU cores; the grid is half of it)::

    python bench/bench_tune.py [--rounds 5] [--grid-repeats 2] [--max-workers N] [--seeds 50]
                               [--budget 12] [--cache bench-tune-grid.json] [--json out.json]
                               [--skip-tune] [--skip-search]

Reading the results: part 1's ratios are throughput of the tuned configuration over the
baseline's (samples/s); "2x target met" is judged on the tuner's confirmed speed-up (point and
interval) and on the independent median. Part 2's table gives, per search kind, the median and
mean trials to reach 95% of the best (lower is better) and the share of studies that reached it
within the budget; "random / guided" > 1 means the guided search needs fewer trials. No
wall-clock assertion is made: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import tune_grid  # bench/tune_grid.py, beside this file
from tune_grid import ROOT

from perfscope.runtime.config import load_config
from perfscope.tuner.trial import TrialSpec, run_trial

SCRIPT = ROOT / "examples" / "io_bound.py"
SCRIPT_ARGS = ("--steps", "100")
TUNE_TRIALS = 8
TARGET = 2.0
DECODE_MS = 3.0  # io_bound.py's default --decode-ms: each sample sleeps this long in a loader worker


def ceiling(workers: int) -> float:
    """Samples/s the loader cannot beat: each of max(1, workers) decoders sleeps DECODE_MS per sample."""
    return max(1, workers) * 1000.0 / DECODE_MS


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages (the machine is shared; they say how busy it was)."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]] if Path("/proc/loadavg").is_file() else []


KINDS = ("guided", "tpe-no-guess", "random", "random-plain")


def trial_spec() -> TrialSpec:
    """As ``perfscope tune`` runs trials by default (3 warm-up + 8 measured steps, seed 0)."""
    return TrialSpec(script=str(SCRIPT), script_args=SCRIPT_ARGS, warmup_steps=3, measure_steps=8, seed=0,
                     timeout_s=300.0)


# --------------------------------------------------------------------------- part 1
def run_tuner(out: Path) -> dict:
    """Run the real ``perfscope tune`` and return its tune.json."""
    cmd = [sys.executable, "-m", "perfscope", "tune", str(SCRIPT), "--trials", str(TUNE_TRIALS), "--out", str(out),
           "--no-progress", "--", *SCRIPT_ARGS]
    print("$ " + " ".join(["python", *cmd[1:]]), flush=True)
    proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True)
    print("\n".join("  | " + line for line in proc.stdout.strip().splitlines()), flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"perfscope tune exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads((out / "tune.json").read_text())


def side_by_side(facts: dict, best_yaml: Path, rounds: int, work: Path) -> dict:
    """Baseline vs best.yaml, A B A B, with run_trial; the per-round ratios and their median."""
    spec, best = trial_spec(), load_config(best_yaml)
    settings = {"baseline": tune_grid.loader_settings(facts, None), "best": tune_grid.loader_settings(facts, best)}
    base, tuned = [], []
    for i in range(rounds):
        for name, config, values in (("baseline", None, base), ("best", best, tuned)):
            outcome = run_trial(spec, config, work / name, profile_steps=0, **settings[name])
            if not outcome.ok or outcome.value is None:
                raise SystemExit(f"side-by-side run of {name} failed ({outcome.status}): {outcome.reason}")
            values.append(outcome.value)
        print(f"  round {i + 1}: baseline {base[-1]:7.1f} samples/s, best {tuned[-1]:7.1f} samples/s, "
              f"ratio {tuned[-1] / base[-1]:.2f}x", flush=True)
    ratios = [t / b for b, t in zip(base, tuned)]
    return {"config": best.changes() if best else {}, "loader_settings": settings, "baseline": base, "best": tuned,
            "ratios": ratios, "median_ratio": statistics.median(ratios)}


def part_speedup(args, facts: dict, tmp: Path) -> dict:
    out = Path(args.tune_out) if args.tune_out else tmp / "tune-io"
    record = run_tuner(out)
    rec = record["recommendation"]
    print(f"\nside by side, baseline vs {out / 'best.yaml'}, {args.rounds} rounds (run_trial, no profiling):", flush=True)
    sbs = side_by_side(facts, out / "best.yaml", args.rounds, tmp / "sbs")
    return {"command": f"perfscope tune examples/io_bound.py --trials {TUNE_TRIALS} --out OUT --no-progress -- "
                       + " ".join(SCRIPT_ARGS),
            "tuner": {"status": rec["status"], "config": rec["config"], "speedup": rec["speedup"],
                      "ci_low": rec["ci_low"], "ci_high": rec["ci_high"], "line": rec["line"],
                      "baseline_value": record["baseline"]["value"], "baseline_verdict": record["baseline"]["verdict"],
                      "confirmation": record.get("confirmation"),
                      "trials": [{k: t.get(k) for k in ("number", "role", "state", "config", "value")}
                                 for t in record["trials"]]},
            "side_by_side": sbs}


def print_speedup(res: dict) -> None:
    t, s = res["tuner"], res["side_by_side"]
    print("\n== 1. speed-up of the tuned configuration over the baseline (examples/io_bound.py) ==")
    print(f"tuner: {t['status']}, config {t['config'] or '{}'}")
    for c in (t["confirmation"] or {}).get("candidates", []):
        if c["speedup"] is not None:
            print(f"  confirmed trial {c['trial']} {c['config']}: {c['speedup']:.2f}x "
                  f"(95% interval {c['ci_low']:.2f}x-{c['ci_high']:.2f}x)")
    if t["speedup"] is not None:
        print(f"tuner's confirmed speed-up:            {t['speedup']:.2f}x (95% interval {t['ci_low']:.2f}x-"
              f"{t['ci_high']:.2f}x, measured interleaved by the tuner)")
    print(f"independent side by side, median ratio: {s['median_ratio']:.2f}x over {len(s['ratios'])} rounds "
          f"(per round: {', '.join(f'{r:.2f}' for r in s['ratios'])}; medians {statistics.median(s['best']):.1f} / "
          f"{statistics.median(s['baseline']):.1f} samples/s)")
    workers = s["loader_settings"]["best"]["loader_workers"] or 0
    print(f"decode ceiling of the best configuration ({workers} workers): {ceiling(workers):.0f} samples/s; "
          f"of the baseline: {ceiling(s['loader_settings']['baseline']['loader_workers'] or 0):.0f} samples/s")
    met = lambda x: "yes" if x is not None and x >= TARGET else "no"
    print(f"2x target met: tuner's speed-up {met(t['speedup'])}, its interval's lower bound {met(t['ci_low'])}, "
          f"independent median {met(s['median_ratio'])}")


# --------------------------------------------------------------------------- part 2
def cache_settings(args) -> dict:
    # "keys": the table's key format (tune_grid.key_of); a cache of another format is measured again.
    return {"script_args": list(SCRIPT_ARGS), "max_workers": args.max_workers, "grid_repeats": args.grid_repeats,
            "keys": 2}


def read_cache(args) -> dict | None:
    """The cached {settings, baseline, table} when it was made with these settings, else None."""
    cache = Path(args.cache) if args.cache else None
    if cache is None or not cache.is_file():
        return None
    data = json.loads(cache.read_text())
    if data.get("settings") != cache_settings(args):
        print(f"grid: {cache} was made with other settings ({data.get('settings')}); measuring again")
        return None
    return data


def measure_and_cache(args, base: dict, space, tmp: Path) -> dict:
    cache = Path(args.cache) if args.cache else None
    points = tune_grid.grid_params(space)
    print(f"grid: {len(points)} configurations x {args.grid_repeats} repeats (run_trial, no profiling)...", flush=True)
    table = tune_grid.measure_grid(trial_spec(), space, base["facts"], args.grid_repeats, tmp / "grid",
                                   log=lambda line: print(line, flush=True))
    if cache is not None:
        cache.write_text(json.dumps({"settings": cache_settings(args), "baseline": base, "table": table}, indent=1))
        print(f"grid: cached in {cache}")
    return table


def part_search(args, base: dict, tmp: Path) -> dict:
    cached = read_cache(args)
    if cached is not None:  # the grid was measured against its own baseline probe: search that space
        base = cached["baseline"]
    space = tune_grid.make_space(base, args.max_workers)
    print(f"space: {', '.join(f'{k.name} {k.choices_text()} (baseline {k.baseline})' for k in space.knobs)}; "
          f"verdict {base['verdict']}; guess {tune_grid.rule_based_guess(space, base['facts'])}", flush=True)
    if cached is not None:
        print(f"grid: read from {args.cache} (delete it to measure again)")
        table = cached["table"]
    else:
        table = measure_and_cache(args, base, space, tmp)
    sigma = tune_grid.noise_sigma(table)
    runs = {}
    for label, s in (("none", 0.0), ("lognormal", sigma)):
        runs[label] = tune_grid.simulate(space, base["facts"], table, kinds=KINDS, seeds=args.seeds,
                                         budget=args.budget, sigma=s)
    best_key = max(table, key=lambda k: table[k]["value"])
    return {"space": space.describe(), "table": table, "best": best_key, "noise_sigma": sigma, "budget": args.budget,
            "seeds": args.seeds, "target_share": tune_grid.TARGET_SHARE, "studies": runs}


def print_search(res: dict) -> None:
    table, best = res["table"], res["best"]
    top = table[best]["value"]
    print(f"\n== 2. trials to reach {res['target_share']:.0%} of the grid's best, budget {res['budget']} "
          f"(baseline included), {res['seeds']} seeds ==")
    print("grid (median samples/s; share of best; decode ceiling, '!' = a repeat above it; repeats):")
    for key, e in sorted(table.items(), key=lambda kv: -kv[1]["value"]):
        cap = ceiling(e["params"]["num_workers"])
        mark = " <- 95%" if e["value"] >= res["target_share"] * top else ""
        over = "!" if max(e["values"]) > cap else " "
        print(f"  {key:>8}  {e['value']:7.1f}  {e['value'] / top:5.2f}  {cap:6.0f}{over} "
              f"({', '.join(f'{v:.0f}' for v in e['values'])}){mark}")
    print(f"best: {best} {top:.1f} samples/s; repeats' pooled log spread sigma = {res['noise_sigma']:.3f}\n")
    print(f"{'noise seen by sampler':<22} {'search':<13} {'median':>6} {'mean':>6} {'reached':>8}")
    for label, runs in res["studies"].items():
        for kind, r in runs.items():
            print(f"{label:<22} {kind:<13} {r['median']:6.1f} {r['mean']:6.2f} {r['reached']:8.0%}")
        g = runs["guided"]
        for other in ("random", "random-plain"):
            r = runs[other]
            print(f"{'':<22} {other} / guided: median {r['median'] / g['median']:.2f}x, mean {r['mean'] / g['mean']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="side-by-side rounds of baseline vs best.yaml (default 5)")
    ap.add_argument("--tune-out", default=None, help="keep perfscope tune's outputs here (default: a temporary folder)")
    ap.add_argument("--grid-repeats", type=int, default=2, help="measurements per grid configuration (default 2)")
    ap.add_argument("--max-workers", type=int, default=None, help="limit num_workers in the grid and the searches")
    ap.add_argument("--seeds", type=int, default=50, help="simulated studies per search kind (default 50)")
    ap.add_argument("--budget", type=int, default=12, help="trials per simulated study, baseline included (default 12)")
    ap.add_argument("--cache", default=None, help="grid lookup table JSON: read if it matches, else written")
    ap.add_argument("--json", default=None, help="write all numbers to this JSON file")
    ap.add_argument("--skip-tune", action="store_true", help="skip part 1")
    ap.add_argument("--skip-search", action="store_true", help="skip part 2")
    args = ap.parse_args()
    keep = Path(args.tune_out) if args.tune_out else None
    if not args.skip_tune and keep is not None and keep.exists() and any(keep.iterdir()):
        raise SystemExit(f"--tune-out {keep} is not empty (perfscope tune would resume that study): pass a new folder")
    results: dict = {"load_start": load()}
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as d:
        tmp = Path(d)
        cached = read_cache(args) if args.skip_tune else None
        if cached is not None:
            base = cached["baseline"]  # part 2 only, from the cache: no probe run needed
        else:
            print("probing the baseline as perfscope tune profiles it...", flush=True)
            base = tune_grid.probe(trial_spec(), tmp / "probe")
            print(f"baseline: {base['value']:.1f} samples/s, verdict {base['verdict']}", flush=True)
        results["machine"] = {"cpu_count": base["facts"].get("cpu_count"), "torch": base["facts"].get("torch")}
        print(f"machine: {results['machine']['cpu_count']} CPU cores, torch {results['machine']['torch']}, "
              f"load averages {results['load_start']}", flush=True)
        if not args.skip_tune:
            results["speedup"] = part_speedup(args, base["facts"], tmp)
            print_speedup(results["speedup"])
            results["load_after_speedup"] = load()
        if not args.skip_search:
            results["search"] = part_search(args, base, tmp)
            results["load_after_search"] = load()
            print_search(results["search"])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
