"""The measurement runner's command line (:mod:`perfscope.measure.runner`):
``[--opt value]... -- SCRIPT ARGS...``, every option checked, the script's own never read.

Hand-parsed rather than with argparse because everything after the runner's options belongs to
the script, with or without ``--``, and no option of the script may be taken for the runner's.
"""

from __future__ import annotations

from collections.abc import Sequence

from perfscope.collect.schedule import MAX_ACTIVE, MAX_STEPS

_INT_OPTIONS = {"--warmup-steps": 0, "--measure-steps": 1, "--profile-steps": 0, "--seed": 0}  # name -> minimum
_FLOAT_OPTIONS = {"--target-rse": (0.0, 1.0), "--measure-cap": (0.0, 86400.0)}  # name -> open/closed range
_OPTIONS = ("--record-dir", "--config", *_INT_OPTIONS, *_FLOAT_OPTIONS)
_FLAGS = ("--drain-prefetch", "--energy")
_MAX_SEED = 2**32 - 1  # NumPy's legacy seed range


class UsageError(ValueError):
    """A bad command line (exit status 2)."""


def parse_argv(argv: Sequence[str]) -> tuple[dict, str, list[str]]:
    """Split ``[--opt value]... -- SCRIPT ARGS...``; the script's own options are never read.

    Returns:
        (options: record_dir, config, warmup_steps, measure_steps, profile_steps, seed,
        drain_prefetch, energy, target_rse, measure_cap_s; script; script args).

    Raises:
        UsageError: an unknown or repeated option, a missing or bad value, no script.
    """
    raw, argv = _split(list(argv))
    _check_present(raw, argv)
    options: dict = {"record_dir": raw["--record-dir"], "config": raw.get("--config"), "profile_steps": 0,
                     "seed": 0, "drain_prefetch": "--drain-prefetch" in raw,
                     "energy": "--energy" in raw, "target_rse": None, "measure_cap_s": None}
    for name, (low, high) in _FLOAT_OPTIONS.items():
        if name in raw:
            options["target_rse" if name == "--target-rse" else "measure_cap_s"] = _number(name, raw[name], low, high)
    for name, minimum in _INT_OPTIONS.items():
        if name in raw:
            maximum = _MAX_SEED if name == "--seed" else MAX_ACTIVE if name == "--profile-steps" else MAX_STEPS
            options[name[2:].replace("-", "_")] = _integer(name, raw[name], minimum, maximum)
    return options, argv[0], argv[1:]


def _split(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """The options before the script (``""`` for a flag) and the rest from the script on.

    Raises:
        UsageError: an unknown or repeated option, or one without its value.
    """
    raw: dict[str, str] = {}
    while argv and argv[0].startswith("-") and argv[0] != "--":  # without "--", the script ends them
        name = argv.pop(0)
        if name in raw:
            raise UsageError(f"option {name} given twice")
        if name in _FLAGS:
            raw[name] = ""
        elif name not in _OPTIONS:
            raise UsageError(f"unknown option {name}")
        elif not argv:
            raise UsageError(f"option {name} needs a value")
        else:
            raw[name] = argv.pop(0)
    return raw, argv[1:] if argv and argv[0] == "--" else argv


def _check_present(raw: dict[str, str], script: list[str]) -> None:
    """UsageError unless the script, the required options and both or neither of the pair that
    bounds a measurement's length are there."""
    if not script:
        raise UsageError("missing SCRIPT (after --)")
    for name in ("--record-dir", "--warmup-steps", "--measure-steps"):
        if name not in raw:
            raise UsageError(f"missing {name}")
    if not raw["--record-dir"]:
        raise UsageError("--record-dir must not be empty")
    if ("--target-rse" in raw) != ("--measure-cap" in raw):
        raise UsageError("--target-rse and --measure-cap go together")


def _number(name: str, text: str, low: float, high: float) -> float:
    """``text`` as a number in (low, high]; UsageError naming the option otherwise."""
    try:
        number = float(text)
    except ValueError:
        raise UsageError(f"{name} must be a number, got {text!r}") from None
    if not low < number <= high:
        raise UsageError(f"{name} must be above {low:g} and at most {high:g}, got {text}")
    return number


def _integer(name: str, text: str, minimum: int, maximum: int) -> int:
    """``text`` as an integer in [minimum, maximum]; UsageError naming the option otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{name} must be an integer, got {text!r}") from None
    if not minimum <= value <= maximum:
        raise UsageError(f"{name} must be {minimum}..{maximum:,}, got {value:,}")
    return value
