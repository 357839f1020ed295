"""The progress of a running search: a bar (trials done, best so far, time left; tqdm, on stderr),
or, without the bar (``--no-progress``, a log file), one plain line per trial on stdout."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import optuna

from perfscope.tuner.attrs import trial_mark


class Progress:
    """A tqdm bar advanced by an Optuna callback after each trial.

    Args:
        session: The :class:`perfscope.tuner.study.TuningStudy` (for the best value and the unit).
        options: The :class:`perfscope.tuner.tune.TuneOptions` (trial target and time budget).
        started: ``clock()`` at the start of the tuning (the budget counts from it).
        enabled: False: no bar; a line per finished trial instead (a log still shows progress).
        clock: The clock of the budget (the trial runner's; seconds).
    """

    def __init__(self, session, options, started: float, *, enabled: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.session = session
        self.options = options
        self.started = started
        self.clock = clock
        self.enabled = enabled
        self.bar = None

    def __enter__(self):
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=self.options.trials, initial=self.session.finished_count(), unit="trial",
                            desc="perfscope tune", file=sys.stderr, dynamic_ncols=True, leave=True)
            self._postfix()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()

    def update(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """Optuna callback: one more trial ended."""
        if self.bar is None:
            print(self.line(trial), flush=True)
            return
        self.bar.n = min(self.options.trials, self.session.finished_count())
        self._postfix(trial)
        self.bar.refresh()

    def line(self, trial: optuna.trial.FrozenTrial) -> str:
        """``perfscope: trial 3 (2/8 done): 212.4 samples/s; best 250.1 samples/s`` (or its failure)."""
        from perfscope.text import safe
        from perfscope.tuner.pruner import best_feasible_value

        unit = _unit(self.session)
        failure = trial_mark(trial).failure_kind
        if failure:
            what = f"failed ({failure})"
        elif trial.state == optuna.trial.TrialState.PRUNED:
            what = "pruned (slower than the best so far)"
        elif trial.value is not None:
            what = f"{trial.value:.4g} {unit}"
        else:
            what = trial.state.name.lower()
        best = best_feasible_value(self.session.study)
        done = min(self.options.trials, self.session.finished_count())
        return safe(f"perfscope: trial {trial.number} ({done}/{self.options.trials} done): {what}; best "
                    + (f"{best:.4g} {unit}" if best is not None else "-"))

    def _postfix(self, trial: optuna.trial.FrozenTrial | None = None) -> None:
        from perfscope.tuner.pruner import best_feasible_value

        unit = _unit(self.session)
        best = best_feasible_value(self.session.study)
        parts = {"best": f"{best:.4g} {unit}" if best is not None else "-"}
        if self.options.time_budget_s is not None:
            left = self.options.time_budget_s - (self.clock() - self.started)
            parts["left"] = f"{max(0.0, left):.0f} s"
        if trial is not None:
            parts["last"] = trial_mark(trial).failure_kind or trial.state.name.lower()
        self.bar.set_postfix(parts, refresh=False)


def _unit(session) -> str:
    """The objective's unit: the baseline's (``samples/s`` until it is known)."""
    return session.baseline.unit if session.baseline is not None else "samples/s"


def still_running(what: str):
    """A :func:`perfscope.tuner.trial.run_trial` ``on_progress`` that says ``what`` is still running, so
    that no phase is silent for longer than :data:`perfscope.tuner.trial.PROGRESS_S`."""
    def say(seconds: float, steps: int) -> None:
        print(f"perfscope: {what}: still running ({seconds:.0f} s, {steps} measured step(s) so far)", flush=True)
    return say
