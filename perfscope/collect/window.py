"""The profiler's window, lengthened while the machine keeps the training thread off its cores.

On a busy machine most steps of a 5-step window wait for a core (``host-contended`` in
:mod:`perfscope.analysis.evidence`) and are left out of the verdict. Rather than ask the user to
profile again with more steps, :class:`Window` records more steps itself: from the last planned
step on, each step is recorded and the window closes at the first step that, if it runs clean
too, gives ``active`` clean steps -- or when the time cap (``ProfileSchedule.extend_s``) or the
step cap (:func:`max_recorded`) is reached. On a quiet machine the window is exactly the planned
one. A step is clean when its host record says it waited for a core less than
:data:`perfscope.record.host_steps.RUN_QUEUE_SHARE` of its time (:func:`perfscope.record.host_steps.waited_for_core`);
a record without the kernel's run-queue figure cannot tell, and the window is not lengthened for it.

The window is the ``schedule`` callable of ``torch.profiler.profile``: the profiler asks it for the
action of each step as the step begins, when the host record of every earlier step is written
(:class:`perfscope.collect.host.HostStepRecorder` records before it steps the profiler).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable

from perfscope.collect.host import cuda_in_use
from perfscope.collect.schedule import MAX_ACTIVE, ProfileSchedule
from perfscope.record.host_steps import MAX_STEPS as HOST_RECORD_STEPS
from perfscope.record.host_steps import HostStep, host_step, waited_for_core

# A lengthened window records at most this many times the planned steps (and at least 20 in all):
# the profiler keeps every event of the window in memory until it is written.
EXTEND_FACTOR = 4
EXTEND_MIN_STEPS = 20
# The host record keeps its last HOST_RECORD_STEPS entries; the window's steps and a few warm-up
# steps before them must fit, or the first recorded steps lose the record that judges them.
_RECORD_MARGIN = 16
# A progress line at least this often while the window is lengthened (seconds).
PROGRESS_S = 10.0


def max_recorded(schedule: ProfileSchedule) -> int:
    """The most steps a lengthened window may record: :data:`EXTEND_FACTOR` times ``active``, at
    least :data:`EXTEND_MIN_STEPS`, within :data:`~perfscope.collect.schedule.MAX_ACTIVE` and what
    the host record keeps -- never fewer than ``active``."""
    cap = min(max(EXTEND_FACTOR * schedule.active, EXTEND_MIN_STEPS), MAX_ACTIVE, HOST_RECORD_STEPS - _RECORD_MARGIN)
    return max(cap, schedule.active)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Window:
    """``torch.profiler.profile``'s schedule for a :class:`ProfileSchedule`, lengthened as the
    module docstring says when ``extend`` holds.

    Profiler step 0 is the script's set-up; steps ``1 .. skip_first`` are not traced, the next
    ``warmup`` are traced and dropped, and recording starts at profiler step
    ``skip_first + warmup + 1``.

    Args:
        torch: The torch module (for ``torch.profiler.ProfilerAction``).
        schedule: The planned window; its ``extend_s`` is the time cap.
        records: Returns the host record's entries so far (dicts with ``step``, ``wall_us``,
            ``thread_cpu_us``, ``run_queue_us``): :attr:`HostStepRecorder.steps`.
        extend: Whether the window may be lengthened (single-process runs with ``extend_s > 0``).
        clock: Seconds, monotonic (``time.monotonic``; tests pass their own).
        say: Writes one progress line (default: stderr).

    Attributes:
        last: Profiler step number of the last recorded step, once decided (None before).
        outcome: Once the window was lengthened and closed, what happened (:meth:`outcome_dict`).
    """

    def __init__(self, torch, schedule: ProfileSchedule, *, records: Callable[[], Iterable[dict]], extend: bool,
                 clock: Callable[[], float] = time.monotonic, say: Callable[[str], None] = _stderr) -> None:
        self._actions = torch.profiler.ProfilerAction
        self._cuda = torch.cuda
        self._first = schedule.skip_first + 1 + schedule.warmup
        self._warmup_from = schedule.skip_first + 1
        self._planned_last = self._first + schedule.active - 1
        self._need = schedule.active
        self._cap_s = float(schedule.extend_s)
        limit = self._first + max_recorded(schedule) - 1
        if schedule.stop_after is not None and schedule.max_steps:  # the user's own end comes first
            limit = min(limit, max(schedule.max_steps, self._planned_last))
        self._limit = limit
        self._records = records
        self._read: dict[int, tuple[dict, HostStep]] = {}  # id -> (entry, read); holding it keeps its id its own
        self._clock, self._say = clock, say
        self.last: int | None = None if extend and schedule.extend_s > 0 and limit > self._planned_last \
            else self._planned_last
        self._answered: dict[int, object] = {}
        self._since: float | None = None
        self._said_at = 0.0
        self._clean = 0
        self._why = ""
        self._seconds = 0.0

    @property
    def steps_added(self) -> int:
        """Steps recorded beyond the planned window so far (0 on a quiet machine)."""
        top = self.last if self.last is not None else max(self._answered, default=self._planned_last)
        return max(0, top - self._planned_last)

    def __call__(self, step: int):
        a = self._actions
        if step < self._warmup_from:
            return a.NONE
        if step < self._first:
            return a.WARMUP
        if self.last is not None:
            return a.RECORD if step < self.last else a.RECORD_AND_SAVE if step == self.last else a.NONE
        if step < self._planned_last:
            return a.RECORD
        if step not in self._answered:  # asked again for the same step: the same answer
            self._answered[step] = self._decide(step)
        return self._answered[step]

    def _host_steps(self) -> list[HostStep]:
        """The host record's entries so far, each read once: the decisions of later steps see the
        same entries again, and the training thread waits for them."""
        read = self._read
        self._read = {id(r): read.get(id(r)) or (r, host_step(r)) for r in self._records()}
        return [entry for _, entry in self._read.values()]

    def _decide(self, step: int):
        """The action of ``step`` (at or after the planned last step), from the steps before it."""
        now = self._clock()
        # A GPU run's math is not on the intra-op workers: their waits do not make its steps unclean.
        workers = not cuda_in_use(self._cuda)
        judged = [waited_for_core(r, workers=workers) for r in self._host_steps()
                  if r.step is not None and self._first <= r.step < step]
        self._clean = sum(j is False for j in judged)
        unknown = any(j is None for j in judged)
        if self._since is None:
            self._since = self._said_at = now
        elapsed = now - self._since
        if unknown or self._clean + 1 >= self._need:
            self._why = "the record cannot tell waits for a core" if unknown else "enough clean steps"
        elif step >= self._limit:
            self._why = f"the step cap of {self._limit - self._first + 1} recorded steps"
        elif elapsed >= self._cap_s:
            self._why = f"the time cap of {self._cap_s:g} s"
        else:
            if step == self._planned_last:
                self._say(f"perfscope: {len(judged) - self._clean} of the {len(judged)} recorded steps waited for a "
                          f"core (the machine is busy); recording more steps until {self._need} are clean "
                          f"(at most {self._cap_s:g} s)")
            elif now - self._said_at >= PROGRESS_S:
                self._said_at = now
                self._say(f"perfscope: {self._clean} of {self._need} clean steps after {step - self._first} "
                          f"recorded ({elapsed:.0f} s of at most {self._cap_s:g} s)")
            return self._actions.RECORD
        self.last = step
        self._seconds = elapsed
        if step > self._planned_last:
            self._say(f"perfscope: window lengthened by {step - self._planned_last} steps to "
                      f"{step - self._first + 1}; {self._clean} clean before the last ({self._why})")
        return self._actions.RECORD_AND_SAVE

    def outcome_dict(self) -> dict | None:
        """What lengthening did, for ``run_info["window_extension"]``: ``planned`` and
        ``recorded`` steps, ``clean`` steps before the last one recorded, ``needed``, ``seconds``
        spent and ``reason`` it stopped (``"script ended"`` when the script ended first); None
        when the planned window was recorded as planned."""
        added = self.steps_added
        if added == 0:
            return None
        recorded = self._need + added
        seconds = self._seconds if self.last is not None else self._clock() - (self._since or self._clock())
        return {"planned": self._need, "recorded": recorded, "clean": self._clean, "needed": self._need,
                "seconds": round(seconds, 3), "reason": self._why or "script ended"}
