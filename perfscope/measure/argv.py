"""The measurement runner's command line (:mod:`perfscope.measure.runner`):
``[--opt value]... [--] SCRIPT ARGS...``, every option checked, the script's own never read.

argparse with a ``REMAINDER`` positional: parsing stops at the script, so everything from there on
(with or without ``--``) belongs to the script and none of its options is taken for the runner's.
Every error is a :class:`UsageError` (exit status 2 with one line), never argparse's own exit.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from perfscope.collect.schedule import MAX_ACTIVE, MAX_STEPS

_MAX_SEED = 2**32 - 1  # NumPy's legacy seed range
# name -> (lowest, highest), both inclusive
_INTEGERS = {"--warmup-steps": (0, MAX_STEPS), "--measure-steps": (1, MAX_STEPS), "--profile-steps": (0, MAX_ACTIVE),
             "--seed": (0, _MAX_SEED)}
# name -> (lowest, excluded; highest, included)
_NUMBERS = {"--target-rse": (0.0, 1.0), "--measure-cap": (0.0, 86400.0)}
_FLAGS = ("--drain-prefetch", "--energy")


class UsageError(ValueError):
    """A bad command line (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print the usage and exit
        raise UsageError(message)


class _Once(argparse.Action):
    """An option given twice is refused (argparse would keep the last)."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = namespace.__dict__.setdefault("_given", set())
        if self.dest in seen:
            raise UsageError(f"option {option_string} given twice")
        seen.add(self.dest)
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def _integer(name: str):
    low, high = _INTEGERS[name]

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{name} must be {low}..{high:,}, got {value:,}")
        return value

    return parse


def _number(name: str):
    low, high = _NUMBERS[name]

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not low < value <= high:
            raise argparse.ArgumentTypeError(f"{name} must be above {low:g} and at most {high:g}, got {text}")
        return value

    return parse


def _parser() -> _Parser:
    p = _Parser(prog="perfscope.measure", add_help=False, allow_abbrev=False)
    p.add_argument("--record-dir", action=_Once)
    p.add_argument("--config", action=_Once)
    for name in _INTEGERS:
        p.add_argument(name, action=_Once, type=_integer(name))
    for name in _NUMBERS:
        p.add_argument(name, action=_Once, type=_number(name))
    for name in _FLAGS:
        p.add_argument(name, action=_Once, nargs=0, default=False)
    p.add_argument("script", nargs=argparse.REMAINDER)
    return p


def parse_argv(argv: Sequence[str]) -> tuple[dict, str, list[str]]:
    """Split ``[--opt value]... [--] SCRIPT ARGS...``; the script's own options are never read.

    Returns:
        (options: record_dir, config, warmup_steps, measure_steps, profile_steps, seed,
        drain_prefetch, energy, target_rse, measure_cap_s; script; script args).

    Raises:
        UsageError: an unknown or repeated option, a missing or bad value, no script.
    """
    ns = _parser().parse_args(list(argv))
    script = ns.script[1:] if ns.script[:1] == ["--"] else ns.script
    if script[:1] and script[0].startswith("-"):
        raise UsageError(f"unknown option {script[0]}")
    if not script:
        raise UsageError("missing SCRIPT (after --)")
    for name in ("record_dir", "warmup_steps", "measure_steps"):
        if getattr(ns, name) is None:
            raise UsageError(f"missing --{name.replace('_', '-')}")
    if not ns.record_dir:
        raise UsageError("--record-dir must not be empty")
    if (ns.target_rse is None) != (ns.measure_cap is None):
        raise UsageError("--target-rse and --measure-cap go together")
    options = {"record_dir": ns.record_dir, "config": ns.config, "warmup_steps": ns.warmup_steps,
               "measure_steps": ns.measure_steps, "profile_steps": ns.profile_steps or 0, "seed": ns.seed or 0,
               "drain_prefetch": ns.drain_prefetch, "energy": ns.energy, "target_rse": ns.target_rse,
               "measure_cap_s": ns.measure_cap}
    return options, script[0], script[1:]
