"""What ``perfscope tune`` is asked: one validated keyword-only dataclass, and the ranges of its numbers.

The ranges live here, with the options they bound; the command line (``perfscope/cli/tune.py``)
derives its checks and messages from :data:`LIMITS`, so a program that builds
:class:`TuneOptions` itself gets the same refusals as a user typing the command. This module
imports neither Optuna nor torch: the command line reads it to build its parser.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from perfscope.collect.nodes import MAX_NPROC_PER_NODE, NodeLaunch  # as `perfscope profile --nproc-per-node`
from perfscope.errors import PerfscopeError
from perfscope.tuner.objective import OBJECTIVES
from perfscope.tuner.window import DEFAULT_MEASURE_CAP_S, DEFAULT_TARGET_RSE

# Confirmation rounds (tuner/confirm.py): the most, and those before the first decision (fewer
# when fewer rounds are asked).
DEFAULT_ROUNDS = 12
DEFAULT_MIN_ROUNDS = 3

# field -> (command-line option, lowest, highest), both inclusive: an absurd value is refused at
# once with the range, rather than sizing a loop, a timeout or a progress bar by it.
LIMITS: dict[str, tuple[str, float, float]] = {
    "trials": ("--trials", 2, 10_000),  # the baseline is trial 0: a search needs one more
    "time_budget_s": ("--time-budget", 1.0, 30 * 86_400.0),
    "measure_steps": ("--steps-per-trial", 1, 100_000),
    "warmup_steps": ("--warmup-steps", 0, 100_000),
    "profile_steps": ("--profile-steps", 0, 100),  # each profiled step adds to a trace file of every trial
    "nproc_per_node": ("--nproc-per-node", 1, MAX_NPROC_PER_NODE),
    "seed": ("--seed", 0, 2**32 - 1),  # NumPy's seed range; the script's generators are seeded with it
    "confirm_top": ("--confirm-top", 1, 100),
    "confirm_rounds": ("--confirm-rounds", 2, 1_000),  # an interval needs two rounds
    "confirm_min_rounds": ("--confirm-min-rounds", 2, 1_000),
    "confirm_budget_s": ("--confirm-budget", 1.0, 30 * 86_400.0),
    "min_gain": ("--min-gain", 0.0, 10.0),
    "trial_timeout_s": ("--trial-timeout", 1.0, 7 * 86_400.0),
    "target_rse": ("--target-rse", 0.0, 1.0),  # 0 on the command line: a fixed window of K steps (None here)
    "measure_cap_s": ("--measure-cap", 1.0, 86_400.0),
    "run_steps": ("--run-steps", 1, 10**12),  # the training run's length: weighs compile time against the gain
}
_WHOLE = {"trials", "measure_steps", "warmup_steps", "profile_steps", "nproc_per_node", "seed", "confirm_top",
          "confirm_rounds", "confirm_min_rounds", "run_steps"}
_OPTIONAL = {"time_budget_s", "nproc_per_node", "confirm_budget_s", "trial_timeout_s", "target_rse",
             "confirm_min_rounds", "run_steps"}
_OPEN_LOW = {"target_rse"}  # the lowest value itself is not allowed (0 means "no target": None)
_OPEN_HIGH = {"min_gain"}  # nor the highest (a gain of 10x or more cannot be asked)


class TuneOptionsError(PerfscopeError, ValueError):
    """An option out of its range, of the wrong type, or two options that contradict each other."""


# The limit of the baseline trial when --trial-timeout is not given: its duration is what later
# trials' limits are derived from, so it cannot be derived itself. Fifteen minutes hold the start-up
# and measured steps of every shipped example many times over on a busy 2-core machine.
BASELINE_TIMEOUT_S = 900.0


@dataclasses.dataclass(kw_only=True)
class TuneOptions:
    """What ``perfscope tune`` was asked.

    Attributes:
        script, script_args: The training script and its arguments.
        out_dir: Output folder; ``best_path`` the configuration file to write (in it by default).
        study_name: The study's name in its storage.
        trials: Trials in the study, baseline included (the study-wide total).
        time_budget_s: Seconds after which no new trial starts (None: no limit).
        warmup_steps, measure_steps, target_rse, measure_cap_s, profile_steps: Per trial (see
            :class:`perfscope.tuner.trial.TrialSpec`); ``target_rse`` None measures exactly ``measure_steps``.
        nproc_per_node: Ranks per trial, or None.
        storage: Study storage URL (None: SQLite in ``out_dir``).
        seed: Seed for the script and the sampler.
        confirm_top, confirm_rounds (the most rounds), confirm_min_rounds (None: 3, or
            confirm_rounds when fewer), confirm_budget_s (seconds
            after which no new round starts; None: no limit), min_gain, confidence: The
            confirmation step (:func:`perfscope.tuner.confirm.confirm_candidates`).
        trial_timeout_s: Limit of one trial (None: from the baseline's duration).
        run_steps: The length of the user's training run in steps (None: not stated): a winner
            with a start-up cost (compile time) must be faster over that many steps
            (:mod:`perfscope.tuner.startup`).
        progress: Show the progress bar.
        nodes: This node's part of a job over several nodes (:mod:`perfscope.tuner.nodes`; needs
            ``nproc_per_node``), or None.
        command: The command line as typed (``perfscope tune ...``), for the line that says how to
            resume an interrupted run; empty when called from Python.
        objective: ``time`` or ``cost`` (:mod:`perfscope.tuner.objective`).
        price_per_hour: USD an hour per device (GPU), or per machine for CPU runs; None: no cost.

    Raises:
        TuneOptionsError: a number outside its range in :data:`LIMITS` (the message names the
            command-line option), ``confirm_min_rounds`` above ``confirm_rounds``, or a
            confidence outside (0, 1).
    """

    script: str
    script_args: tuple[str, ...]
    out_dir: Path
    best_path: Path
    study_name: str
    trials: int = 12
    time_budget_s: float | None = None
    warmup_steps: int = 3
    measure_steps: int = 8
    target_rse: float | None = DEFAULT_TARGET_RSE
    measure_cap_s: float = DEFAULT_MEASURE_CAP_S
    profile_steps: int = 2
    nproc_per_node: int | None = None
    storage: str | None = None
    seed: int = 0
    confirm_top: int = 2
    confirm_rounds: int = DEFAULT_ROUNDS
    confirm_min_rounds: int | None = None
    confirm_budget_s: float | None = None
    min_gain: float = 0.02
    confidence: float = 0.95
    trial_timeout_s: float | None = None  # the baseline gets BASELINE_TIMEOUT_S
    run_steps: int | None = None
    progress: bool = True
    nodes: NodeLaunch | None = None
    command: tuple[str, ...] = ()
    objective: str = "time"
    price_per_hour: float | None = None

    def __post_init__(self) -> None:
        self.script_args = tuple(self.script_args)
        self.command = tuple(self.command)
        if self.confirm_min_rounds is None and isinstance(self.confirm_rounds, int):
            self.confirm_min_rounds = min(DEFAULT_MIN_ROUNDS, max(2, self.confirm_rounds))
        if not all(isinstance(a, str) for a in self.script_args):
            raise TuneOptionsError("the script's arguments must be strings")
        for name in LIMITS:
            value = getattr(self, name)
            if value is not None or name not in _OPTIONAL:
                check_limit(name, value)
        self._check_together()

    def _check_together(self) -> None:
        """Refuse options that contradict each other, and a confidence outside (0, 1)."""
        if self.confirm_min_rounds > self.confirm_rounds:
            raise TuneOptionsError(f"--confirm-min-rounds {self.confirm_min_rounds} is above --confirm-rounds "
                                   f"{self.confirm_rounds}: the first decision would come after the last round")
        if self.nodes is not None and self.nproc_per_node is None:
            raise TuneOptionsError("a job over several nodes (--nnodes) needs --nproc-per-node: the ranks of each node")
        if self.objective not in OBJECTIVES:
            raise TuneOptionsError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.objective == "energy" and self.nodes is not None:
            raise TuneOptionsError("--objective energy reads each node's counter in its own trials: it is not "
                                   "available for a job over several nodes yet; use --objective time")
        if self.objective == "cost" and self.price_per_hour is None:
            raise TuneOptionsError("--objective cost needs --price-per-hour USD (what one device costs an hour)")
        if self.price_per_hour is not None and not (isinstance(self.price_per_hour, (int, float))
                                                    and math.isfinite(self.price_per_hour) and self.price_per_hour >= 0):
            raise TuneOptionsError(f"--price-per-hour must be a price in USD, got {self.price_per_hour!r}")
        if not (isinstance(self.confidence, float) and 0 < self.confidence < 1):
            raise TuneOptionsError(f"confidence must lie in (0, 1), got {self.confidence!r}")


def _in_range(name: str, value, whole: bool, low: float, high: float) -> bool:
    """Whether ``value`` is a number of the field's kind (not a bool) within its (open or closed) range."""
    ok = isinstance(value, int) if whole else isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and not isinstance(value, bool) and low <= value <= high
    return ok and not (name in _OPEN_LOW and value == low) and not (name in _OPEN_HIGH and value == high)


def check_limit(name: str, value) -> None:
    """Refuse ``value`` for the field ``name`` unless it is a number of the right kind in its range.

    Raises:
        TuneOptionsError: naming the command-line option and the range.
    """
    flag, low, high = LIMITS[name]
    whole = name in _WHOLE
    kind = "a whole number" if whole else "a number"
    if not _in_range(name, value, whole, low, high):
        above = "above" if name in _OPEN_LOW else "from"
        below = "below" if name in _OPEN_HIGH else "to"
        raise TuneOptionsError(f"{flag} must be {kind} {above} {low:,g} {below} {high:,g}, got {value!r}")
