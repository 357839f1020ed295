"""What the tuner keeps in its Optuna study, read once into structs: each trial's user attributes
(:class:`TrialAttrs`) and the study's baseline (:class:`BaselineRun`).

Both come back from a storage that other workers, earlier perfscope versions or a hand share, as
JSON. A trial's attributes are read leniently (:mod:`perfscope.record.lenient`): an attribute of
the wrong type reads as absent and the trial is still counted, shown and written to ``tune.json``.
The baseline is read strictly: every trial is measured against it, so a damaged one stops the
run with one line (:class:`BaselineUnreadable`) rather than comparing with a wrong number.

Units: ``duration_s`` seconds, ``step_time_us`` microseconds, throughputs (``value``,
``step_values``) in ``unit`` (``samples/s`` or ``steps/s``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from perfscope.errors import PerfscopeError
from perfscope.record.lenient import lenient
from perfscope.record.tune_schema import Failure


class Worker(msgspec.Struct, kw_only=True):
    """The process that ran a trial or set the study up (:func:`perfscope.tuner.study.worker_id`)."""

    host: str | None = None
    pid: int | None = None


class TrialMark(msgspec.Struct, kw_only=True):
    """What the search reads of a trial's user attributes at every step (its role, configuration,
    failure, worker and feasibility): the few fields, so that a read over all trials stays cheap."""

    role: str | None = None
    config: dict[str, Any] | None = None
    failure: Failure | None = None
    worker: Worker | None = None
    feasible: bool | None = None

    @property
    def changes(self) -> dict[str, Any]:
        """The configuration's changes (``{}``: the script's own settings)."""
        return self.config or {}

    @property
    def failure_kind(self) -> str | None:
        """The failure's kind (``oom``, ``duplicate``...), None where the trial did not fail."""
        return self.failure.kind if self.failure is not None else None


class TrialAttrs(TrialMark, kw_only=True):
    """A trial's user attributes as :class:`perfscope.tuner.study.TuningStudy` sets them (its
    module docstring lists them), for its ``tune.json`` entry. Every field is None where the trial
    lacks it; numbers stay as stored (``int | float``), so ``tune.json`` writes them as they were
    measured."""

    step_values: list[int | float] | None = None
    unit: str | None = None
    numerics: dict[str, Any] | None = None
    verdict: str | None = None
    fractions: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    duration_s: int | float | None = None
    window: dict[str, Any] | None = None
    threads: dict[str, Any] | None = None


def trial_mark(trial) -> TrialMark:
    """``trial``'s (an Optuna trial, frozen or running) user attributes the search reads, as
    :class:`TrialMark`."""
    return lenient(trial.user_attrs, TrialMark)


def trial_attrs(trial) -> TrialAttrs:
    """``trial``'s user attributes, all of them, as :class:`TrialAttrs` (its ``tune.json`` entry)."""
    return lenient(trial.user_attrs, TrialAttrs)


def worker_of(value: Any) -> Worker:
    """A stored worker identity (``{"host", "pid"}``) as :class:`Worker`; anything else reads as
    a worker of no host and no pid."""
    return lenient(value, Worker)


class BaselineRun(msgspec.Struct, kw_only=True):
    """The baseline the study measured first (the user's own settings), as the first worker stored
    it in the study, so every worker and every resumed run compares with the same one."""

    value: float | None = None
    """Its throughput (None only for a record of a study whose baseline never finished)."""
    unit: str = "samples/s"
    step_values: list[float] = []
    losses: list[float | None] = []
    verdict: str | None = None
    fractions: dict[str, Any] | None = None
    facts: dict[str, Any] | None = None
    """The run's facts as ``perfscope.measure`` recorded them; read through
    :func:`perfscope.record.run_facts.run_facts`."""
    step_time_us: float | None = None
    duration_s: float | None = None
    data_wait: float | None = None
    window: dict[str, Any] | None = None
    summary: str | None = None
    report: str | None = None


class SetupUnreadable(PerfscopeError):
    """A part of the study's setup (its baseline, its search space) is not one perfscope wrote
    (hand-edited, or damaged): the run cannot compare its trials, so it stops before any."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"the study's stored {what} is unreadable ({why}); pass another --study-name or --out to "
                         "start a new study")


class BaselineUnreadable(SetupUnreadable):
    """The study's stored baseline is unreadable."""


def baseline_run(value: Any) -> BaselineRun:
    """The study's stored baseline as :class:`BaselineRun`.

    Raises:
        BaselineUnreadable: it lacks its value or holds a part of the wrong type.
    """
    try:
        run = msgspec.convert(value, BaselineRun)
    except msgspec.ValidationError as e:
        raise BaselineUnreadable("baseline", str(e)) from None
    if run.value is None:
        raise BaselineUnreadable("baseline", "it has no value")
    return run
