"""Which training steps `perfscope profile` records, and when it ends the script."""

from __future__ import annotations

import dataclasses

from perfscope.collect.errors import ScheduleError

# Upper bounds of step counts. No training run profiled by perfscope needs a billion steps before
# or after its window, and a typo of that size must be refused, not allocated for.
MAX_STEPS = 10**9
# Recorded steps: the profiler holds every event of the window in memory until the trace is
# written, so a window of thousands of steps exhausts memory long before it ends.
MAX_ACTIVE = 1000
# Seconds ``extend_s`` may ask for: an hour of extra recording is beyond any window worth reading.
MAX_EXTEND_S = 3600.0


def _check_int(name: str, value: object, minimum: int, allowed: str, maximum: int = MAX_STEPS) -> None:
    # bool is an int subclass; `active=True` is a typo, not a step count.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ScheduleError(f"ProfileSchedule.{name} must be {allowed}, got {value!r}")
    if value > maximum:
        raise ScheduleError(f"ProfileSchedule.{name} must be at most {maximum:,}, got {value:,}")


@dataclasses.dataclass(kw_only=True, frozen=True)
class ProfileSchedule:
    """The profiling window, counted in training steps.

    A step is one optimizer update (or one ``perfscope.step()`` call); see
    ``docs/collection.md``. The window is: ``skip_first`` steps run without the
    profiler tracing, then ``warmup`` steps traced and discarded, then ``active``
    steps recorded into the trace.

    Attributes:
        skip_first: Steps run unprofiled first, so that DataLoader workers have
            started, cuDNN autotuning and the caching allocator have warmed up.
        warmup: Steps traced but discarded; the profiler's own start-up cost
            lands in them instead of in the recorded steps.
        active: Steps recorded in the trace (1 to :data:`MAX_ACTIVE`).
        max_steps: End the script cleanly after this many steps. ``None``
            (default) ends it once the window is recorded, i.e. after
            ``skip_first + warmup + active`` steps; ``0`` lets the script run
            to its own end. Any other value must be at least the window, since
            stopping earlier would silently record fewer steps.
        extend_s: Seconds (0 to :data:`MAX_EXTEND_S`) the window may be lengthened by when too
            few of its steps are clean: while fewer than ``active`` recorded steps ran without
            waiting for a core, more steps are recorded, for at most this long and at most
            :func:`perfscope.collect.window.max_recorded` steps in all
            (:class:`perfscope.collect.window.Window`). 0 (the default here; ``perfscope
            profile`` asks for 60) records exactly ``active`` steps. Only single-process runs
            extend: ranks of one job must stop at the same step.
        modules: Record a range around every ``nn.Module`` call of the traced steps, for the
            time per module (:mod:`perfscope.collect.modules`). Off by default: each range adds
            host time to the very steps the verdict is read from.

    Every count is at most :data:`MAX_STEPS` (``active``: :data:`MAX_ACTIVE`).

    Raises:
        ValueError: A field is not an integer in its allowed range; the message
            names the field and the range. (A ``ScheduleError``, which is also
            a ``PerfscopeError``, so the CLI prints it as a one-line error.)
    """

    skip_first: int = 3
    warmup: int = 2
    active: int = 5
    max_steps: int | None = None
    extend_s: float = 0.0
    modules: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.modules, bool):
            raise ScheduleError(f"ProfileSchedule.modules must be True or False, got {self.modules!r}")
        _check_int("skip_first", self.skip_first, 0, "an integer >= 0")
        _check_int("warmup", self.warmup, 0, "an integer >= 0")
        _check_int("active", self.active, 1, "an integer >= 1", MAX_ACTIVE)
        e = self.extend_s
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not 0 <= e <= MAX_EXTEND_S:
            raise ScheduleError(f"ProfileSchedule.extend_s must be a number of seconds from 0 to {MAX_EXTEND_S:g}, "
                                f"got {e!r}")
        if self.max_steps is not None and self.max_steps != 0:
            window = self.window_steps
            _check_int(
                "max_steps",
                self.max_steps,
                window,
                f"None, 0 (run to the end) or an integer >= skip_first + warmup + active = {window}",
            )

    @property
    def window_steps(self) -> int:
        """Steps from the script's start to the end of the recorded window."""
        return self.skip_first + self.warmup + self.active

    @property
    def stop_after(self) -> int | None:
        """Steps after which perfscope ends the script; ``None`` = never."""
        if self.max_steps is None:
            return self.window_steps
        return self.max_steps or None

    def to_dict(self) -> dict:
        """The fields as a JSON-able dict (``max_steps`` as configured)."""
        return dataclasses.asdict(self)
