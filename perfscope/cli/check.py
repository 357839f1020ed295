"""``perfscope check RUN --baseline BASELINE``: the CI regression gate (``docs/check.md``).

Exit status: 0 when the run passes, 1 on a regression (step time beyond the noise, or the verdict
moved to a worse class), 2 when the runs cannot be compared (bad input, too few steps).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from perfscope.cli.args import one_line_errors, out_path
from perfscope.errors import PerfscopeError
from perfscope.check.gate import ALPHA, DEFAULT_MAX_REGRESSION
from perfscope.text import safe

if TYPE_CHECKING:
    from perfscope.record.view import Record


def _percent(low: float, high: float):
    """argparse type: a percentage, with or without ``%`` (``5%`` and ``5`` are both 5%); the
    result is a fraction (0.05). A bare number up to 1 (``0.05``) is refused: it reads as a
    fraction to some and as a percentage to others."""

    def parse(text: str) -> float:
        t = text.strip().removesuffix("%").strip()
        try:
            value = float(t)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a percentage (e.g. 5%)") from None
        if not text.strip().endswith("%") and 0 < value <= 1:
            raise argparse.ArgumentTypeError(f"{text!r} is ambiguous: write {value * 100:g}% for a fraction of "
                                             f"{value:g}, or {value:g}% for {value:g} percent")
        if not (low < value < high):
            raise argparse.ArgumentTypeError(f"{text!r}: give a percentage above {low:g}% and below {high:g}%")
        return value / 100

    return parse


def _side(texts: list[str], load) -> list[tuple[Path, Record]]:
    """Every run one side names: summaries, output directories, and folders of output directories."""
    out = []
    for text in texts:
        path = Path(text)
        if path.is_dir() and not (path / "summary.json").is_file():
            inner = sorted(p for p in path.iterdir() if (p / "summary.json").is_file())
            if not inner:
                raise PerfscopeError(f"{text}: holds no summary.json, nor output directories holding one")
            out += [load(str(p)) for p in inner]
        else:
            out.append(load(text))
    return out



def _refuse_duplicates(loaded: list[tuple[Path, Record]]) -> None:
    """The same run given twice (one file, a copy, or two analyses of its traces) would pass for
    two runs of no spread: separate runs never hold the same step rows to the last digit."""
    seen: dict = {}
    for path, record in loaded:
        key = orjson.dumps(record.steps, option=orjson.OPT_SORT_KEYS)
        if key in seen:
            raise PerfscopeError(f"{path} and {seen[key]} are the same run; give each run once (repeated runs "
                                 "are separate profiles)")
        seen[key] = path


def add_check_parser(sub) -> None:
    """Add ``check`` to the ``perfscope`` sub-commands."""
    c = sub.add_parser(
        "check",
        help="CI gate: fail (exit 1) when a run's step time regressed beyond the noise against a baseline",
        description="Compare RUN with BASELINE (each a summary.json or an output directory of perfscope profile or "
        "analyze) step by step: a one-sided Mann-Whitney U test on the counted steps' times, and the slowdown "
        "against half of --max-regression; a verdict change from compute-bound to io/comm/launch-bound also "
        "fails. Prints what changed (class shares in ms per step, the kernels or operators that grew). Exit "
        "status 0: pass, 1: regression, 2: the runs cannot be compared. Several runs on a side are tested run by "
        "run (Welch's t-test; one run against several baselines: their prediction interval). Writes nothing unless "
        "--junit is given. "
        "Method and measured false-alarm rate and power: docs/check.md.",
    )
    c.error = one_line_errors("check")
    c.add_argument("run", nargs="+", metavar="RUN",
                   help="summary.json or output directory of the run to check; several: repeated runs of it")
    c.add_argument("--baseline", required=True, nargs="+", metavar="BASELINE",
                   help="summary.json or output directory of the reference run; several, or a folder of output "
                   "directories: repeated runs, which bring the drift between runs into the test")
    c.add_argument("--max-regression", type=_percent(0, 1000), default=DEFAULT_MAX_REGRESSION, metavar="PCT",
                   help=f"the step-time regression to catch (default {DEFAULT_MAX_REGRESSION * 100:.0f}%%); a slowdown "
                   "counts from half of it, when the test also finds it beyond the noise")
    c.add_argument("--alpha", type=_percent(0, 100), default=ALPHA, metavar="PCT",
                   help=f"the test's significance level (default {ALPHA * 100:.0f}%%)")
    c.add_argument("--all-steps", action="store_true",
                   help="compare every step of the whole runs (timed by perfscope profile outside the profiler) "
                   "instead of the profiled windows' counted steps: more steps, a smaller slowdown found; the drift "
                   "between runs is still not in a one-run test")
    c.add_argument("--junit", type=out_path, default=None, metavar="FILE",
                   help="also write the result as JUnit XML (test results in CI systems)")


def run(args, load) -> int:
    """Compare, print, write the JUnit file if asked; the exit status.

    Args:
        load: ``text -> (path, summary)``, the CLI's summary loader (one-line errors).
    """
    from perfscope.check import CheckInputError, compare, report_lines
    from perfscope.outputs import checked_output_file

    baselines, runs = _side(args.baseline, load), _side(args.run, load)
    _refuse_duplicates(baselines + runs)
    if args.junit is not None:  # before anything is printed: a bad path is bad input
        checked_output_file(args.junit, "--junit", [p for p, _ in baselines + runs])
    try:
        result = compare([s for _, s in baselines], [s for _, s in runs], max_regression=args.max_regression,
                         alpha=args.alpha, all_steps=args.all_steps)
    except CheckInputError as e:
        raise PerfscopeError(f"cannot compare {' '.join(args.run)} with {' '.join(args.baseline)}: {e}") from None
    for line in report_lines(result):
        print(safe(line))
    if args.junit is not None:
        _write_junit(result, args.junit, runs[0][0])
    return 1 if result.failed else 0


def _write_junit(result, path, run_path) -> None:
    """Write the result as JUnit XML and say so.

    Raises:
        PerfscopeError: the file cannot be written.
    """
    from perfscope.check import write_junit

    try:
        written = write_junit(result, path, str(run_path))
    except OSError as e:
        raise PerfscopeError(f"--junit {path}: cannot write it ({e.strerror or e})") from None
    print(f"wrote {safe(written)}")
