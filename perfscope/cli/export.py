"""``perfscope export DIR --to mlflow|wandb``, and ``--export`` on ``profile`` and ``tune``."""

from __future__ import annotations

import sys
from pathlib import Path

from perfscope.cli.args import not_empty
from perfscope.export.registry import TRACKERS
from perfscope.text import safe

DEFAULT_EXPERIMENT = "perfscope"


def add_export_options(parser) -> None:
    """``--export TRACKER`` and ``--experiment NAME`` for a command that writes an output folder."""
    parser.add_argument("--export", choices=TRACKERS, default=None, metavar="TRACKER",
                        help="when done, log the run to an experiment tracker: mlflow (the store MLFLOW_TRACKING_URI "
                        "names) or wandb (offline without a login); same as perfscope export")
    parser.add_argument("--experiment", type=not_empty, default=DEFAULT_EXPERIMENT, metavar="NAME",
                        help=f"the MLflow experiment or W&B project (default {DEFAULT_EXPERIMENT})")


def add_export_parser(sub) -> None:
    """Add ``export`` to the ``perfscope`` sub-commands."""
    e = sub.add_parser(
        "export",
        help="log a profile, analysis or tune to MLflow or Weights & Biases",
        description="Log the run in DIR (the --out folder of perfscope profile, analyze or tune) to an experiment "
        "tracker: parameters (script, arguments, configuration), tags (verdict, provisional, perfscope version), "
        "step metrics (step time, the shares, the whole run's phases), summary values (median step, MFU, memory "
        "peak, cost, energy) and report.html and summary.json as artifacts; a tune is one parent run and a child "
        "run per trial. MLflow: the store MLFLOW_TRACKING_URI names. W&B: online with WANDB_API_KEY (or "
        "WANDB_MODE), else an offline run folder under WANDB_DIR for wandb sync.",
    )
    e.add_argument("dir", metavar="DIR", help="an output folder of perfscope profile, analyze or tune")
    e.add_argument("--to", choices=TRACKERS, required=True, help="the tracker")
    e.add_argument("--experiment", type=not_empty, default=DEFAULT_EXPERIMENT, metavar="NAME",
                   help=f"the MLflow experiment or W&B project (default {DEFAULT_EXPERIMENT})")


def export(folder: Path, to: str, experiment: str) -> str:
    """Log the output folder to the tracker; returns where it went.

    Raises:
        PerfscopeError: the folder holds no record, or the tracker is unavailable or refuses.
    """
    from perfscope.export import read_export, tracker

    return tracker(to).log(read_export(folder), experiment=experiment)


def run(args) -> int:
    """``perfscope export``."""
    print(safe(f"exported: {export(Path(args.dir), args.to, args.experiment)}"))
    return 0


def export_after(args, folder: Path, status: int) -> int:
    """``--export`` at the end of ``profile`` or ``tune``: the outputs are written whatever
    happens here; a failure is one line and exit status 1 (unless the command already failed)."""
    if getattr(args, "export", None) is None:
        return status
    from perfscope.errors import PerfscopeError

    try:
        print(safe(f"exported: {export(folder, args.export, args.experiment)}"), file=sys.stderr)
    except PerfscopeError as e:
        print(f"perfscope: export to {args.export} failed: {safe(str(e))} (the outputs in {safe(folder)} are kept; "
              f"perfscope export {safe(folder)} --to {args.export} tries again)", file=sys.stderr)
        return status or 1
    return status
