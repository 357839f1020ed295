"""How every trial of a study runs the script (:class:`TrialSpec`) and what one trial gave
(:class:`TrialOutcome`): the records the trial's runner, its watcher and its judge share
(:mod:`perfscope.tuner.trial`, :mod:`perfscope.tuner.watch`, :mod:`perfscope.tuner.outcome`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from perfscope.tuner.objective import objective_value
from perfscope.tuner.options import BASELINE_TIMEOUT_S, TuneOptions
from perfscope.tuner.output import KEEP_BYTES, LIMIT_BYTES

# A trial's defaults are the study's (one definition: TuneOptions).
_TUNE = {f.name: f.default for f in dataclasses.fields(TuneOptions) if f.default is not dataclasses.MISSING}
# killed: SIGKILL from outside (the OOM killer, usually); output: too much output, or its log could
# not be written; lost: its worker stopped sending heartbeats (tuner/study.py).
# unmeasured: the run ended well but its measured window held no samples (e.g. all drawn from
# batches loaded before it).
FAILURE_KINDS = ("oom", "crash", "killed", "timeout", "output", "too-few-steps", "unmeasured", "unsafe",
                 "interrupted", "lost")


PRUNED_REASON = "clearly slower than the best trial so far"


class Pruned(Exception):
    """Raised by an ``on_step`` callback to stop a trial that is clearly slower."""


@dataclasses.dataclass(frozen=True)
class TrialSpec:
    """How every trial of a study runs the script.

    Attributes:
        script: Absolute path of the training script.
        script_args: Its arguments.
        nproc_per_node: Ranks launched through ``torch.distributed.run``, or None for one process.
        warmup_steps: Steps run first and not counted (worker start-up, allocator, autotuning).
        measure_steps: Steps whose throughput is measured (>= 1); the least, with a target_rse.
        target_rse: One process: measure on after ``measure_steps`` while the relative standard
            error of the window's throughput is above this fraction (None: exactly
            ``measure_steps``); ranks of a distributed run must stop together, so theirs is fixed.
        measure_cap_s: Seconds of measured steps after which the window ends whatever its error.
        profile_steps: Steps profiled after the measured ones (0: none) for the trial's verdict.
        seed: Seed of Python, NumPy and torch before the script runs.
        timeout_s: Wall-clock limit of one trial (seconds), start-up included.
        output_keep_bytes: Bytes of the script's output kept in ``output.log`` (the last ones).
        output_limit_bytes: Bytes of output after which the trial is stopped and failed.
        board: A job over several nodes (this being node 0): the :class:`perfscope.tuner.nodes.TrialBoard`
            that tells the other nodes each trial; None for one node.
        runner: The :class:`perfscope.tuner.runner.TrialRunner` that runs every trial (None: the
            script in child processes, :func:`run_trial`).
        objective: ``time``, ``cost`` or ``energy`` (:mod:`perfscope.tuner.objective`): with
            ``energy`` each trial reads the energy counter (``perfscope.measure --energy``).
    """

    script: str
    script_args: tuple[str, ...]
    nproc_per_node: int | None = None
    warmup_steps: int = _TUNE["warmup_steps"]
    measure_steps: int = _TUNE["measure_steps"]
    target_rse: float | None = _TUNE["target_rse"]
    measure_cap_s: float = _TUNE["measure_cap_s"]
    profile_steps: int = _TUNE["profile_steps"]
    seed: int = _TUNE["seed"]
    timeout_s: float = BASELINE_TIMEOUT_S
    output_keep_bytes: int = KEEP_BYTES
    output_limit_bytes: int = LIMIT_BYTES
    board: object | None = None
    runner: object | None = None
    objective: str = "time"

    @classmethod
    def of(cls, options: TuneOptions, *, board=None, runner=None) -> TrialSpec:
        """The trials' spec of a study asked ``options`` (the baseline's time limit where none is given)."""
        return cls(script=options.script, script_args=tuple(options.script_args), nproc_per_node=options.nproc_per_node,
                   warmup_steps=options.warmup_steps, measure_steps=options.measure_steps,
                   target_rse=options.target_rse, measure_cap_s=options.measure_cap_s,
                   profile_steps=options.profile_steps, seed=options.seed,
                   timeout_s=options.trial_timeout_s or BASELINE_TIMEOUT_S, board=board, runner=runner,
                   objective=options.objective)


@dataclasses.dataclass
class TrialOutcome:
    """What one trial measured, or why it failed.

    Attributes:
        status: ``ok`` or a failure kind: ``oom``, ``crash``, ``killed``, ``timeout``,
            ``output``, ``too-few-steps``, ``pruned``, ``interrupted``.
        reason: One line for a failure (None when ok).
        step_values: Throughput of each measured step seen (samples/s or steps/s).
        step_samples: Samples of each measured step over all ranks (None: unknown).
        step_seconds: Duration of each measured step, longest rank (seconds).
        unit: ``samples/s`` or ``steps/s``.
        losses: Rank 0's loss of every step from step 1 (None where none was seen).
        facts: Rank 0's facts about the run (see ``perfscope.measure``).
        trace_files: Traces of the profiled steps, one per rank that wrote one.
        data_wait: Share of rank 0's measured time spent waiting in DataLoader fetches.
        duration_s: Wall time of the trial (seconds).
        exit_code: Exit status of the process (or launcher).
        config_applied: Rank 0's report of what the configuration changed.
        drawn_samples: Samples the measured window drew from DataLoader queues filled before it
            (subtracted from its throughput; see :func:`drawn_from_queues`).
        window: Rank 0's record of its measured window (``target_rse``, ``rse``, ``steps``,
            ``seconds``, ``ended_by``...; :mod:`perfscope.measure.window`), None when fixed.
        step_energy: Joules of each measured step over all ranks (None: not read).
        objective: What :attr:`value` is (:mod:`perfscope.tuner.objective`): ``time`` and
            ``cost`` throughput, ``energy`` samples per joule.
    """

    status: str
    reason: str | None = None
    step_values: list[float] = dataclasses.field(default_factory=list)
    step_samples: list[int | None] = dataclasses.field(default_factory=list)
    step_seconds: list[float] = dataclasses.field(default_factory=list)
    unit: str = "samples/s"
    losses: list[float | None] = dataclasses.field(default_factory=list)
    facts: dict = dataclasses.field(default_factory=dict)
    trace_files: list[Path] = dataclasses.field(default_factory=list)
    data_wait: float | None = None
    duration_s: float = 0.0
    exit_code: int | None = None
    config_applied: dict | None = None
    drawn_samples: int = 0
    window: dict | None = None
    step_energy: list[float | None] = dataclasses.field(default_factory=list)
    objective: str = "time"

    @property
    def noise(self) -> float | None:
        """Relative standard error of the trial's throughput (None: not estimated)."""
        rse = (self.window or {}).get("rse")
        return float(rse) if isinstance(rse, (int, float)) else None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def value(self) -> float | None:
        """The trial's objective over its measured steps (None without any): throughput, or
        samples per joule for the energy objective."""
        return objective_value(self.objective, self.step_samples, self.step_seconds, self.step_energy,
                               self.drawn_samples)
