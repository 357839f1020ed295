"""Steady-state warm-up of ``perfscope.measure --drain-prefetch``.

DataLoader workers fill their prefetch queues while the script sets up (and while a loaded machine
slows the first steps); batches that are ready when the measured window begins are consumed for
free and make a short window look faster than a long run. With ``--drain-prefetch`` the warm-up
does not end after exactly W steps: from step W on, it goes on while the loader is still draining
its buffer of ready batches (at most :data:`MAX_EXTRA_WARMUP_STEPS` more steps). Read before each
fetch of the training thread, the count of ready batches tells the two steady states apart:

- producer-bound: the buffer empties (see :meth:`DrainWarmup._drained` for where the window then
  starts, so that it holds whole rounds of the workers' deliveries);
- consumer-bound: the buffer stays full -- the count has not decreased over the last
  ``workers + 1`` fetches, while one round of the workers delivers at most ``workers`` batches.

Without workers (or on a loader whose state cannot be read) the warm-up is exactly W steps.

Since the warm-up's end is only known while the run goes on, the profiler's schedule asks the
recorder where the measured window ends (:func:`window_profiler`).
"""

from __future__ import annotations

import weakref
from typing import Any

from torch.utils.data import dataloader

MAX_EXTRA_WARMUP_STEPS = 64


def ready_batches(iterator: Any) -> tuple[int | None, int]:
    """(batches ``iterator`` could return now without waiting, or None when unknown; its workers).

    For ``torch.utils.data.dataloader._MultiProcessingDataLoaderIter`` (torch 2.4 - 2.13):
    batches in its result queues (``_data_queue``, which is the pin-memory thread's output when
    there is one, and ``_worker_result_queue`` before it) plus those received out of order and
    kept in ``_task_info`` (``(worker, data)`` entries at or after ``_rcvd_idx``). Private
    attributes: any missing one, or a queue without ``qsize()`` (macOS), gives None.
    """
    workers = getattr(iterator, "_num_workers", 0)
    workers = workers if isinstance(workers, int) and workers > 0 else 0
    if not workers or not isinstance(iterator, dataloader._MultiProcessingDataLoaderIter):
        return None, workers
    data_queue = getattr(iterator, "_data_queue", None)
    result_queue = getattr(iterator, "_worker_result_queue", data_queue)
    task_info = getattr(iterator, "_task_info", None)
    received = getattr(iterator, "_rcvd_idx", None)
    if data_queue is None or not isinstance(task_info, dict) or not isinstance(received, int):
        return None, workers
    try:
        ready = data_queue.qsize()
        if result_queue is not None and result_queue is not data_queue:
            ready += result_queue.qsize()
    except (NotImplementedError, OSError, ValueError, AttributeError):
        return None, workers
    for index, info in list(task_info.items()):
        if isinstance(info, tuple) and len(info) == 2 and isinstance(index, int) and index >= received:
            ready += 1
    return max(0, int(ready)), workers


class DrainWarmup:
    """Decides, at each step boundary after the W-th step, whether the step starting there is
    still warm-up.

    :meth:`note_fetch` runs before every fetch of the training thread (its count is also what
    the step lines report); :meth:`extends` runs at the boundary that would start the first
    measured step, and again at the next one while it answers True.

    Args:
        enabled: False: never extends (a fixed warm-up, as several ranks need).

    Attributes:
        extra: Steps added to the warm-up so far.
        done: The warm-up's end is decided.
        ready, workers: The count of ready batches (None: unknown) and the workers of the
            iterator at the latest fetch.
    """

    def __init__(self, *, enabled: bool) -> None:
        self.done = not enabled
        self.extra = 0
        self.ready: int | None = None
        self.workers = 0
        self._iterator: weakref.ref | None = None
        self._counts: list[int] = []  # counts of the iterator's fetches (since the first decision)
        self._empty = 0  # fetches since the first decision that found the buffer empty

    def note_fetch(self, iterator: Any) -> int | None:
        """Read the ready batches of ``iterator`` before a fetch; returns the count (None: unknown)."""
        ready, workers = ready_batches(iterator)
        if self.done:
            return ready
        try:
            same = self._iterator is not None and self._iterator() is iterator
            if not same:
                self._iterator = weakref.ref(iterator)
        except TypeError:  # not weak-referenceable: no history across fetches
            same, self._iterator = False, None
        if not same or ready is None:
            self._counts, self._empty = [], 0
        self.ready, self.workers = ready, workers
        if ready is not None:
            self._counts.append(ready)
            del self._counts[: -(2 * MAX_EXTRA_WARMUP_STEPS)]
            if self.extra and ready == 0:
                self._empty += 1
        return ready

    def extends(self) -> bool:
        """Whether the step starting at this boundary is one more warm-up step (else: measured)."""
        if self.done:
            return False
        if self.extra == 0:  # the first decision: counts seen during the warm-up do not count
            self._counts = self._counts[-1:]
            self._empty = int(self.ready == 0)
        if (self.ready is None or not self.workers or self.extra >= MAX_EXTRA_WARMUP_STEPS
                or self._drained() or self._kept_up()):
            self.done = True
            return False
        self.extra += 1
        return True

    def _drained(self) -> bool:
        """The producers are the limit: the buffer is empty, for the second time.

        Workers started together deliver their batches in rounds, nearly together. The first
        empty buffer can come at any point of a round, the second one right before the next
        round is due, as in a long run: from there a window of whole rounds (the tuner rounds the
        measured steps up to a multiple of the workers) waits for each round once and holds as
        many batches as the workers deliver in its time.
        """
        return self.ready == 0 and self._empty >= 2

    def _kept_up(self) -> bool:
        """The consumer is the limit: the count has not decreased over the last ``workers + 1``
        fetches (they took ``workers + 1`` batches, more than one round delivers)."""
        span = self.workers + 1
        return len(self._counts) > span and self._counts[-1] >= self._counts[-1 - span]


def window_profiler(torch: Any, recorder: Any, profile_steps: int, on_trace_ready: Any):
    """The ``torch.profiler.profile`` of the measurement: CPU activity, plus CUDA where available;
    the profiler's warm-up step right after the recorder's last measured step (its
    ``measured_end``, read at every step), then ``profile_steps`` recorded and handed to
    ``on_trace_ready``. Profiler step N is training step N, as with ``session.build_profiler``.
    """
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    action = torch.profiler.ProfilerAction

    def schedule(step: int):
        first = recorder.measured_end + 1
        if step == first:
            return action.WARMUP
        if first < step < first + profile_steps:
            return action.RECORD
        return action.RECORD_AND_SAVE if step == first + profile_steps else action.NONE

    return torch.profiler.profile(activities=activities, schedule=schedule, on_trace_ready=on_trace_ready)
