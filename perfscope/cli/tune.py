"""``perfscope tune``: the command's options and its glue to :mod:`perfscope.tuner.tune`."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from pathlib import Path

from perfscope.cli.args import (add_node_options, add_price_option, node_launch, not_empty, number, one_line_errors,
                                out_path, whole)
from perfscope.errors import PerfscopeError
from perfscope.outputs import DEFAULT_OUT_ROOT
from perfscope.redact import redact
from perfscope.text import safe
from perfscope.tuner.objective import OBJECTIVES, cost_line



def _limits() -> dict[str, tuple[float, float]]:
    """The range of each numeric option, by its flag: the tuner's own (``tuner/options.py``)."""
    from perfscope.tuner.options import LIMITS

    return {flag: (low, high) for flag, low, high in LIMITS.values()}


def _defaults() -> dict:
    """TuneOptions' field defaults: the CLI's defaults and help derive from them (one definition)."""
    import dataclasses

    from perfscope.tuner.options import DEFAULT_MIN_ROUNDS, TuneOptions

    found = {f.name: f.default for f in dataclasses.fields(TuneOptions) if f.default is not dataclasses.MISSING}
    return {**found, "min_rounds": DEFAULT_MIN_ROUNDS}  # confirm_min_rounds' default when unset


def add_tune_parser(sub) -> None:
    """Add the ``tune`` sub-command to the ``perfscope`` parser (every numeric option with its
    range from ``tuner.options.LIMITS``).

    Args:
        sub: The ``add_subparsers`` object of the ``perfscope`` parser.
    """
    t = sub.add_parser(
        "tune",
        allow_abbrev=False,  # a script's --steps must not pass for --steps-per-trial
        help="search the acceleration configuration that makes SCRIPT fastest, guided by its profile",
        description="Profile SCRIPT, search DataLoader, precision and communication knobs with Optuna (each trial "
        "in its own process), confirm the winner against the baseline, and write best.yaml, tune.json and "
        "report.html. Script arguments go after `--`. See docs/tune.md.",
        usage="perfscope tune SCRIPT [options] [-- script args]",
    )
    d = _defaults()
    t.error = one_line_errors("tune")  # the project's form of bad input: one line, exit status 2
    t.add_argument("script", help="the training script (.py)")
    t.add_argument("--trials", type=_whole("--trials"), default=d["trials"],
                   help=f"trials in the study, the baseline included (default {d['trials']}; 2..10,000)")
    t.add_argument("--time-budget", type=_number("--time-budget", "a number of seconds"), default=None, metavar="S",
                   help="start no new trial after S seconds (default: no limit)")
    t.add_argument("--steps-per-trial", type=_whole("--steps-per-trial"), default=d["measure_steps"], metavar="K",
                   help=f"measured steps per trial (default {d['measure_steps']})")
    t.add_argument("--target-rse", type=_number("--target-rse", "a fraction (0.05 = 5%)"), default=d["target_rse"],
                   metavar="R", help="measure each trial beyond K steps until its throughput's relative standard "
                                     f"error is at most R (default {d['target_rse']:g}; 0: exactly K steps)")
    t.add_argument("--measure-cap", type=_number("--measure-cap", "a number of seconds"), default=d["measure_cap_s"],
                   metavar="S", help=f"end a trial's measured window after S seconds whatever its error "
                                     f"(default {d['measure_cap_s']:g})")
    t.add_argument("--warmup-steps", type=_whole("--warmup-steps"), default=d["warmup_steps"], metavar="W",
                   help=f"uncounted steps first (default {d['warmup_steps']})")
    t.add_argument("--profile-steps", type=_whole("--profile-steps"), default=d["profile_steps"], metavar="P",
                   help=f"steps profiled after the measured ones, for each trial's verdict (default "
                        f"{d['profile_steps']}; 0: none)")
    t.add_argument("--nproc-per-node", type=_whole("--nproc-per-node"), default=None,
                   help="run each trial as N ranks (torch.distributed.run)")
    add_node_options(t, "the nodes' board, and (the ports above it) each trial's rendezvous; node 0 drives "
                     "the study and writes the results")
    t.add_argument("--storage", default=None, metavar="URL",
                   help="study storage: an RDB URL (postgresql://...) or journal:PATH (default: sqlite in the output folder)")
    t.add_argument("--study-name", type=not_empty, default=None, metavar="NAME",
                   help="study name (default: tune-<script>)")
    t.add_argument("--out", type=out_path, default=None, metavar="DIR_OR_YAML",
                   help="output folder, or the .yaml file for the best configuration (default: perfscope-out/tune-<script>/)")
    t.add_argument("--seed", type=_whole("--seed"), default=d["seed"],
                   help=f"seed for the script and the sampler (default {d['seed']})")
    t.add_argument("--confirm-top", type=_whole("--confirm-top"), default=d["confirm_top"], metavar="N",
                   help=f"candidates to confirm (default {d['confirm_top']})")
    t.add_argument("--confirm-rounds", type=_whole("--confirm-rounds"), default=d["confirm_rounds"], metavar="R",
                   help=f"the most interleaved baseline/candidate rounds (default {d['confirm_rounds']}); rounds "
                        "stop once every candidate is decided")
    t.add_argument("--confirm-min-rounds", type=_whole("--confirm-min-rounds"), default=None, metavar="M",
                   help=f"rounds before the first decision (default {d['min_rounds']}, or --confirm-rounds when "
                        "fewer; at least 2)")
    t.add_argument("--confirm-budget", type=_number("--confirm-budget", "a number of seconds"), default=None,
                   metavar="S", help="start no new confirmation round after S seconds (default: no limit)")
    t.add_argument("--min-gain", type=_number("--min-gain", "a fraction (0.02 = 2%)", high_open=True), default=d["min_gain"],
                   help=f"gain the speed-up's interval must clear (default {d['min_gain']:g} = {100 * d['min_gain']:g}%%)")
    t.add_argument("--trial-timeout", type=_number("--trial-timeout", "a number of seconds"), default=None, metavar="S",
                   help="limit of one trial (default: from the baseline's duration)")
    t.add_argument("--run-steps", type=_whole("--run-steps"), default=None, metavar="N",
                   help="steps of the training run you will launch: a winner that takes time to start "
                        "(torch.compile) must be faster over N steps, its compile time included (default: "
                        "not weighed; the break-even run length is printed)")
    t.add_argument("--objective", choices=OBJECTIVES, default="time",
                   help="what to rank and prove candidates on: time (throughput; the default), cost (USD per "
                   "1,000 samples at --price-per-hour: with the devices fixed, the proven faster configuration "
                   "is the proven cheaper one, and the answer states both costs) or energy (samples per joule, "
                   "each trial reading NVML's or RAPL's energy counter; refused where neither is readable)")
    add_price_option(t)
    from perfscope.cli.export import add_export_options

    add_export_options(t)
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--open", action="store_true", help="open report.html in the web browser when done")


def _whole(option: str):
    """A whole number in the option's range (:func:`_limits`)."""
    return whole(*_limits()[option])


def _number(option: str, what: str, *, high_open: bool = False):
    """A finite number in the option's range (:func:`_limits`), ``what`` naming it in the message."""
    return number(*_limits()[option], what, high_open=high_open)



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


def _tuner():
    """The tuner module (PerfscopeError naming what is missing where its dependencies are not
    installed)."""
    try:
        return importlib.import_module("perfscope.tuner.tune")
    except ImportError as e:
        missing = getattr(e, "name", None) or str(e)
        raise PerfscopeError(f"perfscope tune needs {missing}, a dependency of perfscope-torch that is not "
                             "installed here: pip install perfscope-torch (again) in this environment") from None


def _print_recommendation(record: dict, best_path: Path) -> None:
    """The recommendation line, and for a faster configuration where it was written, the verdict
    before and after, and the next step."""
    rec = record["recommendation"]
    print(f"\n{safe(rec['line'])}")
    cost = cost_line(record.get("cost"))
    if cost:
        print(safe(cost))
    if rec["status"] != "faster":
        return
    changes = ", ".join(f"{k}={v!r}" for k, v in rec["config"].items())
    print(safe(f"best configuration ({changes}): {_shown(best_path)}"))
    after = record.get("after") or {}
    if after.get("verdict"):
        print(safe(f"verdict before: {record['baseline']['verdict']}; after: {after['verdict']}"))
    if rec.get("hint"):
        print(f"next: {safe(rec['hint'])}")


def _options(tune_mod, args, script: str, script_args: list[str], nodes):
    """The :class:`perfscope.tuner.tune.TuneOptions` of the command line (checked by it)."""
    stem = Path(script).stem
    out_dir, best_path = _outputs(args.out, stem)
    return tune_mod.TuneOptions(
        script=os.path.abspath(script), script_args=tuple(script_args), out_dir=out_dir, best_path=best_path,
        study_name=args.study_name or f"tune-{stem}", trials=args.trials, time_budget_s=args.time_budget,
        warmup_steps=args.warmup_steps, measure_steps=args.steps_per_trial, profile_steps=args.profile_steps,
        target_rse=args.target_rse or None, measure_cap_s=args.measure_cap,
        nproc_per_node=args.nproc_per_node, storage=args.storage, seed=args.seed, confirm_top=args.confirm_top,
        confirm_rounds=args.confirm_rounds, confirm_min_rounds=args.confirm_min_rounds,
        confirm_budget_s=args.confirm_budget, min_gain=args.min_gain, trial_timeout_s=args.trial_timeout,
        run_steps=args.run_steps, progress=not args.no_progress, nodes=nodes, command=getattr(args, "command_line", ()),
        objective=args.objective, price_per_hour=args.price_per_hour,
    )


def _interrupted_line(options, started: float) -> str:
    """What an interrupted tune says last: how to resume, and whether ``tune.json`` holds what
    finished (written since ``started``, a ``time.time()``)."""
    from perfscope.tuner.record import resume_command

    record_file = options.out_dir / "tune.json"
    written = record_file.is_file() and record_file.stat().st_mtime >= started
    where = f" ({record_file} holds what finished)" if written else " (no trial had finished)"
    return safe(f"perfscope: interrupted; finished trials are kept in the study; to resume: "
                f"{resume_command(options)}{where}")


def cmd_tune(args, script_args: list[str], open_in_browser) -> int:
    """Run ``perfscope tune``; returns the exit status (130 after Ctrl-C)."""
    from perfscope.collect.script import check_script
    from perfscope.outputs import ensure_writable_dir

    script = check_script(args.script)  # one-line error before anything is created
    tune_mod = _tuner()
    nodes = node_launch(args)  # one-line errors for an incomplete set
    if nodes is not None and nodes.node_rank > 0:
        from perfscope.tuner.nodes import follow

        return follow(nodes, args.nproc_per_node, os.path.abspath(script), tuple(script_args))
    options = _options(tune_mod, args, script, script_args, nodes)
    out_dir, best_path = options.out_dir, options.best_path
    ensure_writable_dir(out_dir)  # after the options are known good: a refused command leaves nothing
    started = time.time()
    stopped_by: list[int] = []

    def stop(signum, frame) -> None:  # SIGTERM (a scheduler, `timeout`, kill) ends the tune as Ctrl-C does
        stopped_by.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        record = tune_mod.tune(options)
    except KeyboardInterrupt:
        print(_interrupted_line(options, started), file=sys.stderr)
        return 128 + signal.SIGTERM if stopped_by else 130
    except PerfscopeError as e:  # a storage's or a driver's words may quote a URL with its password
        raise PerfscopeError(redact(str(e))) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    _print_recommendation(record, best_path)
    print(safe(f"wrote {_shown(best_path)}, {_shown(out_dir / 'tune.json')} and {_shown(out_dir / 'report.html')}"))
    if args.open:
        open_in_browser(out_dir / "report.html")
    from perfscope.cli.export import export_after

    return export_after(args, out_dir, 0)
