"""``perfscope tune``: the command's options and its glue to :mod:`tuner.tune`."""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

from perfscope.errors import PerfscopeError

DEFAULT_OUT_ROOT = Path("perfscope-out")


def add_tune_parser(sub, positive, nonneg, positive_float) -> None:
    """Add the ``tune`` sub-command to the ``perfscope`` parser (argument types from cli.py)."""
    _positive, _nonneg, _positive_float = positive, nonneg, positive_float
    t = sub.add_parser(
        "tune",
        allow_abbrev=False,  # a script's --steps must not pass for --steps-per-trial
        help="search the acceleration configuration that makes SCRIPT fastest, guided by its profile",
        description="Profile SCRIPT, search DataLoader, precision and communication knobs with Optuna (each trial "
        "in its own process), confirm the winner against the baseline, and write best.yaml, tune.json and "
        "report.html. Script arguments go after `--`. See docs/tune.md.",
        usage="perfscope tune SCRIPT [options] [-- script args]",
    )
    t.add_argument("script", help="the training script (.py)")
    t.add_argument("--trials", type=_positive, default=12, help="trials in the study, the baseline included (default 12)")
    t.add_argument("--time-budget", type=_positive_float, default=None, metavar="S",
                   help="start no new trial after S seconds (default: no limit)")
    t.add_argument("--steps-per-trial", type=_positive, default=8, metavar="K", help="measured steps per trial (default 8)")
    t.add_argument("--warmup-steps", type=_nonneg, default=3, metavar="W", help="uncounted steps first (default 3)")
    t.add_argument("--profile-steps", type=_nonneg, default=2, metavar="P",
                   help="steps profiled after the measured ones, for each trial's verdict (default 2; 0: none)")
    t.add_argument("--nproc-per-node", type=_positive, default=None, help="run each trial as N ranks (torch.distributed.run)")
    t.add_argument("--storage", default=None, metavar="URL",
                   help="study storage: an RDB URL (postgresql://...) or journal:PATH (default: sqlite in the output folder)")
    t.add_argument("--study-name", default=None, metavar="NAME", help="study name (default: tune-<script>)")
    t.add_argument("--out", type=Path, default=None, metavar="DIR_OR_YAML",
                   help="output folder, or the .yaml file for the best configuration (default: perfscope-out/tune-<script>/)")
    t.add_argument("--seed", type=_seed, default=0, help="seed for the script and the sampler (default 0)")
    t.add_argument("--confirm-top", type=_positive, default=2, metavar="N", help="candidates to confirm (default 2)")
    t.add_argument("--confirm-rounds", type=_positive, default=5, metavar="R",
                   help="interleaved baseline/candidate rounds (default 5, at least 2)")
    t.add_argument("--min-gain", type=float, default=0.02, help="gain the speed-up's interval must clear (default 0.02)")
    t.add_argument("--trial-timeout", type=_positive_float, default=None, metavar="S",
                   help="limit of one trial (default: from the baseline's duration)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--open", action="store_true", help="open report.html in the web browser when done")


def _seed(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= value < 2**32:  # NumPy's seed range; the script's generators are seeded with it
        raise argparse.ArgumentTypeError(f"must be in 0..{2**32 - 1}, got {value}")
    return value


def _outputs(out: Path | None, stem: str) -> tuple[Path, Path]:
    """(output folder, best configuration file) from ``--out``: a folder, or a .yaml/.yml file."""
    if out is None:
        folder = (DEFAULT_OUT_ROOT / f"tune-{stem}").resolve()
        return folder, folder / "best.yaml"
    out = out.resolve()
    if out.suffix in (".yaml", ".yml"):
        return out.parent, out
    if out.exists() and not out.is_dir():
        raise PerfscopeError(f"--out {out}: is a file; give a folder or a .yaml file for the best configuration")
    return out, out / "best.yaml"


def _shown(path: Path) -> str:
    """A path as the user would type it: relative to the current folder when inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def cmd_tune(args, script_args: list[str], open_in_browser) -> int:
    """Run ``perfscope tune``; returns the exit status (130 after Ctrl-C)."""
    from perfscope.collect.script import check_script
    from perfscope.outputs import ensure_writable_dir
    from perfscope.siblings import import_sibling

    script = check_script(args.script)  # one-line error before anything is created
    if args.confirm_rounds < 2:
        raise PerfscopeError("--confirm-rounds must be at least 2 (an interval needs two rounds)")
    if not 0 <= args.min_gain < 10:
        raise PerfscopeError(f"--min-gain must be a fraction >= 0 (0.02 = 2%), got {args.min_gain}")
    if args.trials < 2:
        raise PerfscopeError("--trials must be at least 2 (the baseline is trial 0)")
    try:
        import_sibling("tuner")
        tune_mod = importlib.import_module("tuner.tune")
    except ImportError as e:
        missing = getattr(e, "name", None) or str(e)
        raise PerfscopeError(f"perfscope tune needs the 'tune' extra ({missing} is missing): "
                             "pip install 'perfscope-torch[tune]'") from None
    stem = Path(script).stem
    out_dir, best_path = _outputs(args.out, stem)
    ensure_writable_dir(out_dir)
    options = tune_mod.TuneOptions(
        script=os.path.abspath(script), script_args=tuple(script_args), out_dir=out_dir, best_path=best_path,
        study_name=args.study_name or f"tune-{stem}", trials=args.trials, time_budget_s=args.time_budget,
        warmup_steps=args.warmup_steps, measure_steps=args.steps_per_trial, profile_steps=args.profile_steps,
        nproc_per_node=args.nproc_per_node, storage=args.storage, seed=args.seed, confirm_top=args.confirm_top,
        confirm_rounds=args.confirm_rounds, min_gain=args.min_gain, trial_timeout_s=args.trial_timeout,
        progress=not args.no_progress,
    )
    started = time.time()
    try:
        record = tune_mod.tune(options)
    except KeyboardInterrupt:
        record_file = out_dir / "tune.json"
        written = record_file.is_file() and record_file.stat().st_mtime >= started
        where = f" ({record_file} holds what finished)" if written else " (no trial had finished)"
        print("perfscope: interrupted; finished trials are kept in the study. Run the same command again to "
              f"resume{where}", file=sys.stderr)
        return 130
    rec = record["recommendation"]
    print(f"\n{rec['line']}")
    if rec["status"] == "faster":
        changes = ", ".join(f"{k}={v!r}" for k, v in rec["config"].items())
        print(f"best configuration ({changes}): {_shown(best_path)}")
        after = record.get("after") or {}
        if after.get("verdict"):
            print(f"verdict before: {record['baseline']['verdict']}; after: {after['verdict']}")
        if rec.get("hint"):
            print(f"next: {rec['hint']}")
    print(f"wrote {_shown(best_path)}, {_shown(out_dir / 'tune.json')} and {_shown(out_dir / 'report.html')}")
    if args.open:
        open_in_browser(out_dir / "report.html")
    return 0
