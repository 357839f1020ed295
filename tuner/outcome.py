"""A finished trial's status from its ranks' records: failed (a rank's error or the exit status:
``killed``, ``oom`` or ``crash``), ``too-few-steps``, ``unmeasured``, or left ``ok``.

The words of a failure come from the ranks' own records first, then from the end of the trial's
log (:mod:`perfscope.tuner.failure`).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING

from perfscope.errors import OOM_MESSAGE
from perfscope.measure.protocol import RankResult
from perfscope.tuner.failure import failure_line, killed_reason
from perfscope.tuner.window import steps_needed

if TYPE_CHECKING:
    from perfscope.tuner.trial_spec import TrialOutcome, TrialSpec


def judge_outcome(outcome: TrialOutcome, results: dict[int, RankResult], rank0: RankResult | None, log: Path,
                   spec: TrialSpec) -> None:
    """A run that ended: failed (a rank's error, or its exit), too few steps, or no sample measured."""
    failed = [res for _, res in sorted(results.items()) if res.error]
    if outcome.exit_code != 0 or failed:
        _failed(outcome, failed[0] if failed else None, log)
    elif len(outcome.step_values) < spec.measure_steps:
        _too_few_steps(outcome, rank0, spec)
    elif outcome.value is None or not outcome.value > 0:
        outcome.status = "unmeasured"
        outcome.reason = (f"the {len(outcome.step_seconds)} measured steps held no samples of their own "
                          f"({outcome.drawn_samples} were drawn from batches loaded before the window)")


def _failure_message(first: RankResult | None, tail: str | None, exit_code: int | None) -> str:
    """The failure in one line: the rank's own error, else the log's last error line, else the
    exit status (with the log's line where both exist, e.g. argparse's error)."""
    message = (first.error if first else None) or tail or f"exited with status {exit_code}"
    if "exited with status" in message and tail:
        message = f"{message}: {tail}"
    return message


def _failed(outcome: TrialOutcome, first: RankResult | None, log: Path) -> None:
    """The trial's process failed (``first``: the first rank that said why): killed, oom or crash."""
    tail = failure_line(log)
    message = _failure_message(first, tail, outcome.exit_code)
    killed = None if first is not None else killed_reason(outcome.exit_code, log)
    if killed is not None:
        outcome.status = "killed"
        outcome.reason = killed + (f"; its last output: {tail}" if tail else "")
        return
    if outcome.exit_code is not None and outcome.exit_code < 0:
        message = f"killed by {_signal_name(-outcome.exit_code)}; {message}"
    oom = (first is not None and first.error_kind == "oom") or OOM_MESSAGE.search(message)
    outcome.status, outcome.reason = ("oom" if oom else "crash"), message


def _too_few_steps(outcome: TrialOutcome, rank0: RankResult | None, spec: TrialSpec) -> None:
    seen = rank0.steps_seen if rank0 is not None else 0
    used = rank0.warmup_steps_used if rank0 is not None and rank0.warmup_steps_used is not None else spec.warmup_steps
    outcome.status = "too-few-steps"
    outcome.reason = (f"the script ended after {seen} steps; this trial needed {used} warm-up + "
                      f"{spec.measure_steps} measured steps")
    if seen == 0:
        outcome.reason += (" (no step was seen: a loop without a torch optimizer must call perfscope.step() "
                           "once per iteration)")
    else:  # the warm-up grows with the loader's workers: say what the script must run
        outcome.reason += f": give the script at least {steps_needed(used, spec.measure_steps)} steps (e.g. -- --steps N)"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time or unknown signal
        return f"signal {number}"
