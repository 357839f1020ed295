"""The ``perfscope`` command line's parser: every command, what it writes, where its docs are."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perfscope.version import __version__
from perfscope.cli.args import (MAX_JOBS, MAX_NPROC_PER_NODE, add_node_options, add_price_option, not_empty, number,
                                out_path, whole)
from perfscope.collect.schedule import MAX_ACTIVE, MAX_EXTEND_S, MAX_STEPS
from perfscope.text import safe

EXIT_USAGE = 2  # bad input, as argparse uses
MAX_RANK_WAIT_S = 86400.0  # a day: the longest a rank's trace write can reasonably lag
JSON_HELP = ("print the answer as one JSON document on standard output instead of the table (for programs and agents: docs/answer.schema.json, docs/reading.md)")
CLASSES_TEXT = (
    "Each step is classified io-bound (waiting for input: DataLoader, host-to-device copies), comm-bound "
    "(exposed gradient communication), launch-bound (host launch and dispatch overhead: the GPU waits for "
    "work) or compute-bound (the math itself: the hardware is busy). io, comm and launch are removable: a knob "
    "takes them out. Definitions: docs/metrics.md; the summary's fields: docs/summary.md."
)
VIEWERS_TEXT = (
    "The traces under traces/ open in Perfetto (ui.perfetto.dev, Open trace file) or chrome://tracing; "
    "`perfscope merge OUT_DIR` puts every rank's trace in one file on one clock."
)


class _Parser(argparse.ArgumentParser):
    """argparse with its error messages escaped: they quote what was typed (``unrecognized
    arguments: ...``), which may hold terminal escapes. Sub-parsers are of this class too."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {safe(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="perfscope",
        description="Find what limits each PyTorch training step: io, compute, launch or communication.",
        epilog=CLASSES_TEXT + " Every command's --help says what it writes.",
    )
    parser.add_argument("--version", action="version", version=f"perfscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "profile",
        allow_abbrev=False,  # a script's own option must not pass for an abbreviation of ours
        help="run a training script under the PyTorch profiler and classify its steps",
        description="Run SCRIPT as `python SCRIPT ARGS` would, profile a window of its training steps, "
        "and write traces/, summary.json and report.html. Script arguments go after `--`.",
        epilog=CLASSES_TEXT + " Collection, and what profiling changes in the run: docs/collection.md. "
        "PyTorch's profiler library prints two lines of its own on stderr ('USDT: ... profiler_start' and "
        "'profiler_stop'): they mark where profiling began and ended. " + VIEWERS_TEXT,
        usage="perfscope profile SCRIPT [options] [-- script args]",
    )
    p.add_argument("script", help="the training script (.py)")
    p.add_argument("--out", type=out_path, help="output directory (default: perfscope-out/<script>-<time>)")
    p.add_argument("--skip-first", type=whole(0, MAX_STEPS), default=3, help="steps run unprofiled first (default 3)")
    p.add_argument("--warmup", type=whole(0, MAX_STEPS), default=2, help="steps traced then discarded (default 2)")
    p.add_argument("--active", type=whole(1, MAX_ACTIVE), default=5, help="steps recorded (default 5)")
    p.add_argument("--modules", action="store_true",
                   help="record a range around every nn.Module call of the profiled steps, for the time per module "
                   "(the report's Modules section); each range adds host time to those steps, so the launch share "
                   "can read higher (docs/metrics.md, Modules)")
    p.add_argument("--extend-s", type=number(0.0, MAX_EXTEND_S, "a number of seconds"), default=60.0, metavar="S",
                   help="on a busy machine, seconds spent recording more steps while fewer than --active of them "
                   "ran without waiting for a core (default 60; 0: record exactly --active; one process only)")
    p.add_argument(
        "--max-steps", type=whole(0, MAX_STEPS), default=None,
        help="end the script after this many steps (default: once profiling is done; 0: run to the end)",
    )
    p.add_argument("--nproc-per-node", type=whole(1, MAX_NPROC_PER_NODE), default=None,
                   help="launch N ranks with torch.distributed.run")
    add_node_options(p, "where the ranks of all nodes meet")
    p.add_argument("--rank-wait", type=number(0.0, MAX_RANK_WAIT_S, "a number of seconds"), default=120.0, metavar="S",
                   help="under torchrun: seconds rank 0 waits for the other ranks' traces (default 120)")
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="acceleration configuration (YAML) to run with: the knobs needing no code change are "
                   "patched in; PERFSCOPE_CONFIG is set for perfscope.accelerate in the script")
    p.add_argument("--open", action="store_true", help="open report.html in the web browser when done")
    p.add_argument("--json", action="store_true", help=JSON_HELP + "; the script's own standard output goes to "
                   "standard error meanwhile")
    add_price_option(p)
    from perfscope.cli.export import add_export_options

    add_export_options(p)
    p.add_argument("--no-live", action="store_true", help="no live view (it is on where standard output is a "
                   "terminal: step, median step time, phases, per rank; `perfscope watch DIR` shows the same "
                   "from another terminal)")

    a = sub.add_parser(
        "analyze",
        help="classify the steps of existing Kineto traces (a file or a directory of ranks)",
        description="Analyze a .json/.json.gz trace or a directory of per-rank traces; write summary.json and report.html.",
        epilog=CLASSES_TEXT + " Large traces and clusters: docs/cluster.md.",
    )
    a.add_argument("path", help="trace file or directory")
    a.add_argument("--out", type=out_path, help="output directory (default: perfscope-out/<name>-<time>)")
    where = a.add_mutually_exclusive_group()
    where.add_argument("--jobs", type=whole(1, MAX_JOBS), default=None, metavar="N",
                   help="worker processes (default: one per core for large traces, none for small ones)")
    where.add_argument("--dask", type=not_empty, default=None, metavar="SCHEDULER_ADDRESS",
                   help="run the per-rank analysis on a Dask cluster (tcp://host:8786); its workers must see "
                   "the trace files at the same paths")
    a.add_argument("--open", action="store_true", help="open report.html in the web browser when done")
    a.add_argument("--json", action="store_true", help=JSON_HELP)
    add_price_option(a)

    r = sub.add_parser(
        "report",
        help="render report.html again from a summary.json (and the traces, for the timeline)",
        description="Render the HTML report from SUMMARY (a summary.json or the output directory holding it). "
        "The timeline reads the traces from the output directory's traces/ folder or the paths the summary records.",
        epilog="Writes report.html (or --out). What each section shows: docs/report.md. " + VIEWERS_TEXT,
    )
    r.add_argument("summary", metavar="SUMMARY_OR_OUT_DIR", help="summary.json, or the output directory holding it")
    r.add_argument("--out", type=out_path, help="HTML file to write (default: report.html beside the summary)")
    r.add_argument("--step", type=int, default=None, metavar="N", help="step the timeline shows first (default: the representative step, nearest to the run's step time)")
    r.add_argument("--open", action="store_true", help="open the report in the web browser")

    d = sub.add_parser(
        "diff",
        help="compare two analyses (before/after): metric changes, verdict change, step time ratio",
        description="Compare two analyses A (before) and B (after), each a summary.json or an output directory: "
        "print a short comparison and write an HTML page with both side by side.",
        epilog="Writes the comparison page (--out). Step times compare as each run's window over its steps, the "
        "inverse of throughput (docs/metrics.md, Step time). For a pass/fail gate in CI: perfscope check.",
    )
    d.add_argument("a", metavar="A", help="summary.json or output directory of the first run")
    d.add_argument("b", metavar="B", help="summary.json or output directory of the second run")
    d.add_argument("--out", type=out_path, help="HTML file to write (default: perfscope-out/diff-<time>.html)")
    d.add_argument("--open", action="store_true", help="open the comparison in the web browser")

    from perfscope.cli.check import add_check_parser
    from perfscope.cli.forecast import add_forecast_parser
    from perfscope.cli.merge import add_merge_parser
    from perfscope.cli.tune import add_tune_parser
    from perfscope.cli.export import add_export_parser
    from perfscope.cli.watch import add_watch_parser

    for add in (add_tune_parser, add_forecast_parser, add_check_parser, add_merge_parser, add_watch_parser,
                add_export_parser):
        add(sub)
    return parser


