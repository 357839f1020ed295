"""argparse types shared by perfscope's commands: every number with its range, no empty paths.

An absurd value is refused at once with the allowed range in one line, rather than sizing a
loop, a timeout or an allocation by it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from perfscope.collect.nodes import MAX_NPROC_PER_NODE  # noqa: F401 - the CLI's bound, owned by the launch
# Worker processes for an analysis: beyond the largest machines' core counts a number is a typo.
MAX_JOBS = 1_024


def one_line_errors(command: str):
    """An ``ArgumentParser.error`` for ``perfscope COMMAND``: ``perfscope: error: ...`` on stderr,
    exit status 2, no usage block (the message names the option and its range)."""

    def error(message: str) -> None:
        import sys

        from perfscope.text import safe

        print(f"perfscope: error: {safe(message)} (see perfscope {command} --help)", file=sys.stderr)
        raise SystemExit(2)

    return error


def quoted(text: str, limit: int = 40) -> str:
    """``text`` quoted for a message, cut to ``limit`` characters (a pasted megabyte stays out)."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def whole(low: int, high: int):
    """An argparse type: a whole number in ``low..high`` (inclusive); the message gives the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be a whole number from {low:,} to {high:,}, got {quoted(text)}")
        return value

    return parse


def number(low: float, high: float, what: str, *, high_open: bool = False):
    """An argparse type: a finite number in ``low..high`` (``high`` excluded with ``high_open``);
    ``what`` names it in the message (e.g. ``a number of seconds``). NaN and infinities are refused."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        inside = low <= value < high if high_open else low <= value <= high  # False for nan
        if not inside:
            upper = f"below {high:g}" if high_open else f"{high:g}"
            raise argparse.ArgumentTypeError(f"must be {what} from {low:g} to {upper}, got {quoted(text)}")
        return value

    return parse


def not_empty(text: str) -> str:
    """An argparse type: any text but an empty (or blank) one."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def out_path(text: str) -> Path:
    """``--out``: a non-empty path (an empty one would write into the current directory)."""
    return Path(not_empty(text))


def add_node_options(parser: argparse.ArgumentParser, what: str) -> None:
    """``--nnodes``, ``--node-rank`` and ``--rdzv-endpoint`` of a job over several nodes (the same
    command run on every node, as torchrun is); ``what`` says what the endpoint serves."""
    parser.add_argument("--nnodes", type=whole(1, 4096), default=None, metavar="N",
                        help="a job over N nodes: run the same command on every node, with its --node-rank")
    parser.add_argument("--node-rank", type=whole(0, 4095), default=None, metavar="R",
                        help="this node's index in the job (0 hosts the rendezvous)")
    parser.add_argument("--rdzv-endpoint", type=not_empty, default=None, metavar="HOST:PORT",
                        help=f"node 0's address and a free port: {what}")


def node_launch(args):
    """The node options of ``args`` as a :class:`perfscope.collect.nodes.NodeLaunch`, or None.

    Raises:
        CollectError: an incomplete set (see :func:`perfscope.collect.nodes.from_options`).
    """
    from perfscope.collect.nodes import from_options

    return from_options(args.nnodes, args.node_rank, args.rdzv_endpoint, args.nproc_per_node)


# A price an hour above this is a typo (the dearest accelerator instances list a few hundred USD
# an hour for a whole machine).
MAX_PRICE_PER_HOUR = 100_000.0


def add_price_option(parser: argparse.ArgumentParser) -> None:
    """``--price-per-hour USD``: the cost per step, per 1,000 samples and per run (``details.cost``)."""
    parser.add_argument("--price-per-hour", type=number(0.0, MAX_PRICE_PER_HOUR, "a price in USD"), default=None,
                        metavar="USD", help="what one device costs an hour (a GPU; the whole machine for CPU runs): "
                        "adds the cost per step, per 1,000 samples and per run, and what the idle and removable "
                        "shares cost, to the console, summary.json and the report")
