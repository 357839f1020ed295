"""Following a running trial: the measured steps its ranks have recorded so far
(:class:`Measured`) and the loop that waits for it to end (:func:`watch`) -- exit, too much
output, the timeout, a lost node -- with a clock and a sleeper that tests replace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from perfscope.measure.records import new_measured
from perfscope.tuner.failure import seconds_text
from perfscope.tuner.output import OutputLog
from perfscope.tuner.objective import objective_value

if TYPE_CHECKING:
    from perfscope.tuner.trial_spec import TrialSpec

POLL_S = 0.1
PROGRESS_S = 10.0  # at least one line this often while a long trial runs (on_progress)


class Measured:
    """The measured steps read so far from the ranks' step records, and their throughput."""

    def __init__(self, readers: list, round_steps: int, on_step: Callable[[int, float], None] | None,
                 objective: str = "time") -> None:
        self.readers, self.round_steps, self.on_step = readers, round_steps, on_step
        self.objective = objective
        self.values: list[float] = []
        self.samples: list[int | None] = []
        self.seconds: list[float] = []
        self.energy: list[float | None] = []
        self.unit = "samples/s"

    def take(self) -> None:
        """Read the steps measured since the last call; ``on_step`` after each whole round of
        DataLoader workers (part of a round holds the bursts' fast steps without their waiting one)."""
        for step_samples, step_seconds, step_joules in new_measured(self.readers, len(self.values)):
            self.samples.append(step_samples)
            self.seconds.append(step_seconds)
            self.energy.append(step_joules)
            self.values.append((step_samples if step_samples is not None else 1) / step_seconds)
            self.unit = "samples/s" if all(n is not None for n in self.samples) else "steps/s"
            if self.on_step is not None and len(self.values) % self.round_steps == 0:
                so_far = objective_value(self.objective, self.samples, self.seconds, self.energy)
                if so_far is not None:
                    self.on_step(len(self.values) - 1, so_far)

    def final_values(self) -> list[float]:
        """Each step's throughput; in steps/s throughout when a rank or step had no batch size."""
        return [1.0 / t for t in self.seconds] if self.unit == "steps/s" else self.values


def watch(proc, measured: Measured, log: OutputLog, spec: TrialSpec,
           on_progress: Callable[[float, int], None] | None, started: float,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
    """Follow the trial until it exits, fails its output, times out or loses a node:
    ``(status, reason)``, ``(None, None)`` when it exited. Raises what ``on_step`` raises."""
    said = started
    while True:
        exited = proc.poll() is not None
        measured.take()
        if log.problem is not None:
            return "output", log.problem
        if exited:
            return None, None
        if clock() - started > spec.timeout_s:
            return "timeout", f"no result within the trial timeout of {seconds_text(spec.timeout_s)}"
        if on_progress is not None and clock() - said >= PROGRESS_S:
            said = clock()
            on_progress(said - started, len(measured.values))
        gone = spec.board.lost() if spec.board is not None else None
        if gone is not None:  # its ranks will never join: stop now, not at the timeout
            return "lost", gone
        sleep(POLL_S)
