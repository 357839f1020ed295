"""How the tuner runs a configuration: one small extension point.

Every run of the script the tuner makes -- the baseline, each search trial, each confirmation
run, the profile of the recommendation -- goes through :func:`run_configuration`, which hands it
to the :class:`TrialRunner` of the study's :class:`~perfscope.tuner.trial.TrialSpec`. The shipped
one, :class:`ProcessRunner`, runs the script in child processes; the tuner's own tests pass a
runner that simulates a workload (:mod:`perfscope.testing.trials`), so that the study's flow --
resuming, Ctrl-C, several workers, refusals -- is checked in seconds, and the real processes in a
few end-to-end tests.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from pathlib import Path

from perfscope.runtime.config import AccelConfig
from perfscope.tuner.trial import TrialOutcome, TrialSpec, run_trial


class TrialRunner(abc.ABC):
    """Runs one configuration of the script and measures it.

    The contract: failures of the script are outcomes (``status`` other than ``ok``, with a
    one-line ``reason``), never exceptions; ``on_step`` is called after each measured step with
    ``(index from 0, throughput so far)`` and may raise :class:`~perfscope.tuner.trial.Pruned`, after
    which the outcome's status is ``pruned``; a ``KeyboardInterrupt`` propagates after the run is
    stopped; ``work_dir`` is created (emptied first) and holds the run's files.
    :func:`perfscope.testing.trials.check_runner` checks all but the first on a working script
    (the shipped runners' failures have tests of their own: ``tests/test_tune_trials.py``,
    ``tests/test_tune_flow.py``).

    :meth:`clock` is the time the tuning's budgets are counted in (``--time-budget``,
    ``--confirm-budget``): the runner's own, so that a simulated one spends simulated seconds.
    """

    def clock(self) -> float:
        """Seconds on the clock the tuning's budgets count (monotonic; real time by default)."""
        return time.monotonic()

    @abc.abstractmethod
    def run(self, spec: TrialSpec, config: AccelConfig | None, work_dir: Path, *,
            on_step: Callable[[int, float], None] | None = None, profile_steps: int | None = None,
            loader_workers: int | None = None, prefetch_factor: int | None = None,
            on_progress: Callable[[float, int], None] | None = None) -> TrialOutcome:
        """Run ``config`` (None: the script as it is) as ``spec`` says; arguments as
        :func:`perfscope.tuner.trial.run_trial`'s, which documents each."""


class ProcessRunner(TrialRunner):
    """The script in its own process (or ``torch.distributed.run`` ranks), under a timeout and
    never left running: :func:`perfscope.tuner.trial.run_trial`."""

    def run(self, spec, config, work_dir, **kwargs) -> TrialOutcome:
        return run_trial(spec, config, work_dir, **kwargs)


PROCESS_RUNNER = ProcessRunner()


def runner_of(spec: TrialSpec) -> TrialRunner:
    """The spec's runner (None: :data:`PROCESS_RUNNER`)."""
    return spec.runner if spec.runner is not None else PROCESS_RUNNER


def run_configuration(spec: TrialSpec, config: AccelConfig | None, work_dir: Path, **kwargs) -> TrialOutcome:
    """Run ``config`` with the spec's runner (``spec.runner``; None: :data:`PROCESS_RUNNER`).

    Keyword arguments are :meth:`TrialRunner.run`'s. Raises what the runner raises
    (``KeyboardInterrupt``, ``OSError`` for an unwritable work folder,
    :class:`perfscope.tuner.board.NodeLost`).
    """
    return runner_of(spec).run(spec, config, Path(work_dir), **kwargs)
