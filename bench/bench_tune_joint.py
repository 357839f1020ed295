"""Benchmark: does the profile-guided search earn its guidance on a joint space?

``bench/joint_ddp.py`` runs on 2 ranks (DDP over gloo) and is held back by three groups at once:
the DataLoader wait (input), the gradient all-reduce (communication) and the per-step all-reduce
that accumulation amortises. The benchmark profiles its baseline as ``perfscope tune`` does,
builds the tuner's own search space from the profile (``tuner.space.build_space``) and restricts
it to a grid that can be measured in half an hour on 2 cores: ``num_workers`` over its whole range,
``grad_accum_steps``, ``bucket_cap_mb`` 1/25/200 MiB and ``grad_compression`` none/fp16 (the
other searched knobs stay at the baseline). Every configuration of that grid is measured
``--grid-repeats`` times with ``tuner.trial.run_trial``, in rounds over the whole grid (order
reversed every other round), and the medians are cached in ``--cache``.

Then ``--seeds`` studies per search kind are replayed on the table (no script runs; the tuner's
own ``TuningStudy.store_setup``/``objective`` drive them, as ``bench/tune_grid.py`` describes):
*guided* (as ``perfscope tune``: the baseline as trial 0, the profile's rule-based guess
enqueued, then ``tuner.sampler.CoordinateSampler``: the knobs one at a time in the profile's
order around the best trial, then TPE), *tpe-guess* (the design before the walk: TPE after the
guess), *tpe-no-guess*, *random* (RandomSampler, same objective) and *grid* (Optuna's
GridSampler over the same grid, in a seeded random order: the exhaustive grid at the same budget).
Each study's figure is the trials, baseline included, until a configuration worth >= 95% of the
grid's best was run (budget + 1 when never), with and without log-normal noise of the measured
spread. Lower is better; "x / guided" > 1 means the guided search needs fewer trials.

    python bench/bench_tune_joint.py [--grid-repeats 2] [--seeds 50] [--budget 12]
                                     [--cache bench-tune-joint.json] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import tune_grid  # bench/tune_grid.py, beside this file
from tune_grid import ROOT

from perfscope.tuner.space import build_space, rule_based_guess
from perfscope.tuner.trial import TrialSpec

SCRIPT = ROOT / "bench" / "joint_ddp.py"
SCRIPT_ARGS = ("--steps", "80")
GRID = {"num_workers": None, "grad_accum_steps": [1, 2, 4], "bucket_cap_mb": [1.0, 25.0, 200.0],
        "grad_compression": ["none", "fp16"]}
KINDS = ("guided", "tpe-guess", "tpe-no-guess", "random", "grid")


def trial_spec() -> TrialSpec:
    """As ``perfscope tune --nproc-per-node 2`` runs trials (3 warm-up + 8 measured steps)."""
    return TrialSpec(script=str(SCRIPT), script_args=SCRIPT_ARGS, nproc_per_node=2, warmup_steps=3, measure_steps=8,
                     seed=0, timeout_s=300.0)


def table_for(args, tmp: Path) -> dict:
    """The probe and the measured grid: read from the cache when it was made with these settings,
    extended by the rounds it lacks when it holds fewer repeats."""
    settings = {"script_args": list(SCRIPT_ARGS), "grid": GRID}
    cache = Path(args.cache)
    data = json.loads(cache.read_text()) if cache.is_file() else {}
    if data.get("settings") == settings and data.get("repeats", 0) >= args.grid_repeats:
        print(f"grid read from {cache}", flush=True)
        return data
    if data.get("settings") == settings:
        base, table = data["base"], data["table"]
        print(f"grid read from {cache}: {data['repeats']} repeats, measuring up to {args.grid_repeats}", flush=True)
    else:
        base, table = tune_grid.probe(trial_spec(), tmp / "probe"), None
    print(f"baseline {base['value']:.1f} samples/s, verdict {base['verdict']}, fractions "
          + ", ".join(f"{k} {v:.0%}" for k, v in base["fractions"].items()), flush=True)
    space = tune_grid.restrict(build_space(base["facts"], base["fractions"], base["verdict"]), GRID)
    print(f"measuring {len(tune_grid.grid_params(space))} configurations x {args.grid_repeats}", flush=True)
    table = tune_grid.measure_grid(trial_spec(), space, base["facts"], args.grid_repeats, tmp / "grid", table=table)
    data = {"settings": settings, "repeats": args.grid_repeats, "base": base, "table": table}
    tmp_cache = cache.with_suffix(".tmp")
    tmp_cache.write_text(json.dumps(data, indent=1))
    tmp_cache.replace(cache)
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid-repeats", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--budget", type=int, default=12, help="trials per study, baseline included (as --trials)")
    ap.add_argument("--cache", default="bench-tune-joint.json")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="perfscope-bench-joint-") as tmp:
        data = table_for(args, Path(tmp))
    base, table = data["base"], data["table"]
    space = tune_grid.restrict(build_space(base["facts"], base["fractions"], base["verdict"]), GRID)
    best_key = max(table, key=lambda k: table[k]["value"])
    base_key = tune_grid.key_of(space, space.baseline_params)
    sigma = tune_grid.noise_sigma(table)
    guess = rule_based_guess(space, base["facts"], fractions=base["fractions"])
    print(f"grid: {len(table)} configurations; best {best_key} at {table[best_key]['value']:.1f} samples/s "
          f"= {table[best_key]['value'] / table[base_key]['value']:.2f}x the baseline; noise sigma {sigma:.3f}")
    guess_key = tune_grid.key_of(space, guess) if guess else base_key
    print(f"guess {guess_key}: {table[guess_key]['value'] / table[best_key]['value']:.0%} of the best")
    results = {}
    for label, s in (("no noise", 0.0), (f"noise sigma {sigma:.2f}", sigma)):
        runs = tune_grid.simulate(space, base["facts"], table, kinds=KINDS, seeds=args.seeds, budget=args.budget, sigma=s,
                                   fractions=base["fractions"])
        results[label] = runs
        print(f"\n{label}: trials to reach 95% of the grid's best (budget {args.budget}, {args.seeds} studies each)")
        print(f"  {'search':<14}{'median':>8}{'mean':>8}{'reached':>9}{'x / guided':>12}")
        for kind, r in runs.items():
            ratio = r["mean"] / runs["guided"]["mean"]
            print(f"  {kind:<14}{r['median']:>8g}{r['mean']:>8.2f}{r['reached']:>9.0%}{ratio:>11.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"grid": table, "best": best_key, "sigma": sigma, "guess": guess_key,
                                               "studies": results}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
