"""Times every training step of a profiled run, outside the profiler, in phases.

:class:`RunTimer` is driven by the :class:`~perfscope.collect.steps.StepTracker`'s hooks, which
run on every step anyway (DataLoader fetch, ``torch.autograd.backward``, optimizer pre/post hooks):
each adds two ``time.perf_counter_ns`` reads. At each step's end the timer reads the memory (at
most every :data:`MEMORY_EVERY_S`) and keeps one :class:`~perfscope.record.run_steps.RunStep`;
lines are written to the record beside the trace at most every :data:`FLUSH_EVERY_S` and when
the run ends. The forward starts at the model's call (its outermost module, found in the first
step), or else where the fetch or the last backward ended; time outside the four phases is
*other*. Phases are host time on the training thread: on a GPU they are the time the host
spent issuing the work (the step's wall time is the GPU's pace once the loop waits for it).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from perfscope.record.run_steps import MAX_LINES, RunStep, encode_run_step

# Memory is read at a step's end when this long has passed since the last read: /proc/self/statm
# costs ~10 µs, 1% of a 1 ms step; every 50 ms still gives a 10-minute run 12,000 points.
MEMORY_EVERY_S = 0.05
FLUSH_EVERY_S = 1.0  # what a killed run can lose
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _s(ns: int) -> float:
    """Nanoseconds as seconds, cut to the microsecond (what a line needs, in fewer digits; an
    integer division is a third of ``round``'s cost, paid seven times a step)."""
    return (ns // 1000) / 1e6


def _rss_bytes() -> int | None:
    """The process's resident set now (``/proc/self/statm``'s second field, in pages)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _device_bytes() -> tuple[int | None, int | None]:
    """(allocated, reserved) CUDA bytes of the current device, where the script uses CUDA (never
    initialises it)."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return None, None
        return int(cuda.memory_allocated()), int(cuda.memory_reserved())
    except Exception:  # noqa: BLE001 - a broken CUDA install must not stop the profiled run
        return None, None


class RunTimer:
    """Accumulates one step's phases and writes a line per step.

    Args:
        path: The record to write (created, or emptied, at the first step's start).
        traced: Called at each step's end: whether the profiler traced the step; None: never.

    Attributes:
        steps: Steps written so far.
        error: Why the record could not be written (one line), or None.
    """

    def __init__(self, path: Path, traced: Callable[[], bool] | None = None) -> None:
        self.path = Path(path)
        self._traced = traced
        self._profiler = 0
        self._profiler_at: int | None = None
        self.steps = 0
        self.error: str | None = None
        self._origin: int | None = None
        self._start: int | None = None
        self._buffer: list[bytes] = []
        self._flushed = 0
        self._memory_at = -1 << 62
        self._rss: int | None = None
        self._phase = [0, 0, 0, 0]  # input, forward, backward, optimizer (ns)
        self._forward_from: int | None = None
        # Once the model's outermost module is known (see forward_begin), the forward starts at its
        # call: what runs before it (making a batch without a DataLoader, moving it) is other.
        self._forward_begun = False
        self._fetch_at: int | None = None
        self._backward_at: int | None = None
        self._backward_depth = 0
        self._optimizer_at: int | None = None
        # forward and backward run inside the optimizer's step where it takes a closure
        # (optimizer.step(closure): LBFGS, Lightning's automatic optimization): not the optimizer's
        self._inside_optimizer = 0

    # ----------------------------------------------------------------- phases
    def start(self) -> None:
        """The first step begins (the tracker's setup ended)."""
        now = time.perf_counter_ns()
        self._origin = self._start = self._forward_from = self._flushed = now
        self._forward_begun = False
        try:
            self.path.write_bytes(b"")
        except OSError as exc:
            self.error = f"could not write {self.path}: {exc.strerror or exc}"

    @property
    def fetching(self) -> bool:
        """A DataLoader fetch is under way (a module called now is the dataset's, not the model)."""
        return self._fetch_at is not None

    def fetch_begin(self) -> None:
        self._fetch_at = time.perf_counter_ns()

    def fetch_end(self) -> None:
        if self._fetch_at is not None:
            now = time.perf_counter_ns()
            self._phase[0] += now - self._fetch_at
            self._fetch_at = None
            self._forward_from = now
            self._forward_begun = False

    def forward_begin(self) -> None:
        """The model's outermost module was called: its forward starts now (the first call of a
        micro-batch only; a call inside a fetch or a backward, as activation checkpointing's
        recomputation, is not a forward start)."""
        if self._forward_from is not None and not self._forward_begun and self._fetch_at is None:
            self._forward_from = time.perf_counter_ns()
            self._forward_begun = True

    def backward_begin(self) -> None:
        self._backward_depth += 1
        if self._backward_depth == 1:
            now = self._backward_at = time.perf_counter_ns()
            if self._forward_from is not None:
                self._phase[1] += now - self._forward_from
                if self._optimizer_at is not None:  # a closure's forward, inside the optimizer's step
                    self._inside_optimizer += now - max(self._forward_from, self._optimizer_at)
                self._forward_from = None

    def backward_end(self) -> None:
        self._backward_depth = max(self._backward_depth - 1, 0)
        if self._backward_depth == 0 and self._backward_at is not None:
            now = time.perf_counter_ns()
            self._phase[2] += now - self._backward_at
            if self._optimizer_at is not None:
                self._inside_optimizer += now - max(self._backward_at, self._optimizer_at)
            self._backward_at = None
            self._forward_from = now  # accumulation: the next micro-batch's forward, if no fetch comes
            self._forward_begun = False

    def optimizer_begin(self) -> None:
        self._optimizer_at = time.perf_counter_ns()
        self._inside_optimizer = 0

    def optimizer_end(self) -> None:
        if self._optimizer_at is not None:
            spent = time.perf_counter_ns() - self._optimizer_at
            self._phase[3] += max(spent - self._inside_optimizer, 0)
            self._optimizer_at = None
            self._inside_optimizer = 0

    def profiler_begin(self) -> None:
        """The profiler's own work at a boundary begins (``prof.step()``, its stop and export)."""
        self._profiler_at = time.perf_counter_ns()

    def profiler_end(self) -> None:
        if self._profiler_at is None:
            return
        spent = time.perf_counter_ns() - self._profiler_at
        self._profiler += spent
        self._profiler_at = None
        # The phase running across the boundary (the forward, usually) does not get the profiler's work.
        if self._forward_from is not None:
            self._forward_from += spent
        if self._fetch_at is not None:
            self._fetch_at += spent
        if self._backward_at is not None:
            self._backward_at += spent
        if self._optimizer_at is not None:
            self._optimizer_at += spent

    # ----------------------------------------------------------------- steps
    def step_end(self) -> None:
        """A training step ended: keep its line (the first call without :meth:`start` starts)."""
        now = time.perf_counter_ns()
        if self._start is None or self._origin is None:
            self.start()
            return
        if self.error is None and self.steps < MAX_LINES:
            self.steps += 1
            rss = None
            device = (None, None)
            if now - self._memory_at >= MEMORY_EVERY_S * 1e9:
                self._memory_at = now
                rss, device = _rss_bytes(), _device_bytes()
            i, f, b, o = self._phase
            line = RunStep(step=self.steps, end=_s(now - self._origin), seconds=_s(now - self._start),
                           input=_s(i), forward=_s(f), backward=_s(b), optimizer=_s(o), profiler=_s(self._profiler),
                           traced=bool(self._traced()) if self._traced is not None else False, rss=rss,
                           device_allocated=device[0], device_reserved=device[1], last=self.steps == MAX_LINES)
            self._buffer.append(encode_run_step(line))
            if now - self._flushed >= FLUSH_EVERY_S * 1e9:
                self.flush()
        self._phase = [0, 0, 0, 0]
        self._start = self._forward_from = now
        self._forward_begun = False
        # The timer's own work (this line, a flush) falls in the next step, as perfscope's work there.
        self._profiler = time.perf_counter_ns() - now

    def flush(self) -> None:
        """Append the buffered lines to the record (never raises: a failure is kept in ``error``)."""
        self._flushed = time.perf_counter_ns()
        if not self._buffer or self.error is not None:
            return
        data, self._buffer = b"".join(self._buffer), []
        try:
            with open(self.path, "ab") as f:
                f.write(data)
        except OSError as exc:
            self.error = f"could not write {self.path}: {exc.strerror or exc}"
