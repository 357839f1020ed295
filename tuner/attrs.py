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


class TrialAttrs(msgspec.Struct, kw_only=True):
    """A trial's user attributes as :class:`perfscope.tuner.study.TuningStudy` sets them (its
    module docstring lists them). Every field is None where the trial lacks it; numbers stay as
    stored (``int | float``), so ``tune.json`` writes them as they were measured."""

    role: str | None = None
    config: dict[str, Any] | None = None
    step_values: list[int | float] | None = None
    unit: str | None = None
    failure: Failure | None = None
    numerics: dict[str, Any] | None = None
    verdict: str | None = None
    fractions: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    duration_s: int | float | None = None
    window: dict[str, Any] | None = None
    threads: dict[str, Any] | None = None
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


def trial_attrs(trial) -> TrialAttrs:
    """``trial``'s (an Optuna trial, frozen or running) user attributes as :class:`TrialAttrs`."""
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


class BaselineUnreadable(PerfscopeError):
    """The study's stored baseline is not one perfscope wrote (hand-edited, or damaged)."""


def baseline_run(value: Any) -> BaselineRun:
    """The study's stored baseline as :class:`BaselineRun`.

    Raises:
        BaselineUnreadable: it lacks its value or holds a part of the wrong type.
    """
    try:
        run = msgspec.convert(value, BaselineRun)
    except msgspec.ValidationError as e:
        raise BaselineUnreadable(f"the study's stored baseline is unreadable ({e}); pass another --study-name or "
                                 "--out to start a new study") from None
    if run.value is None:
        raise BaselineUnreadable("the study's stored baseline is unreadable (it has no value); pass another "
                                 "--study-name or --out to start a new study")
    return run
