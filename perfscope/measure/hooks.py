"""What ``perfscope.measure`` records while the script runs (the wrappers feeding it:
:mod:`perfscope.measure.wrappers`).

:class:`StepClock` is the ``prof`` the StepTracker drives: it times every boundary (seconds,
``time.perf_counter()``) for the :class:`Recorder`, which writes a line per finished step. The
recorder is also ``control.observer`` (``perfscope.backward`` / ``accelerate`` report to it) and
wraps the DataLoader fetch (samples, data wait), ``torch.autograd.backward`` (the loss) and the
constructors it learns facts from (DataLoader iterators, DistributedDataParallel).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, BinaryIO

import torch

from perfscope import control
from perfscope.patches import replace
from perfscope.measure.facts import (
    backend_flags,
    batch_size,
    dist_snapshot,
    loader_settings,
    model_facts,
)
from perfscope.measure.protocol import StepLine, encode_step_line
from perfscope.measure.warmup import DrainWarmup
from perfscope.measure.window import SteadyWindow
from perfscope.measure.wrappers import safely, wrap_backward, wrap_fetch, wrap_init
from perfscope.runtime.model_scan import first_model
from perfscope.runtime.optimizer_impl import before_first_step



class NullProfiler:
    """Stands in for ``torch.profiler.profile`` when no step is profiled: counts steps only."""

    def __init__(self) -> None:
        self.step_num = 0

    def __enter__(self) -> NullProfiler:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def step(self) -> None:
        self.step_num += 1


class StepClock:
    """The ``prof`` a StepTracker drives: times each ``step()``, tells ``recorder``, then ``inner``.

    ``inner`` is a ``torch.profiler.profile`` or a :class:`NullProfiler`. Call *n* of ``step()``
    is boundary *n*: boundary 1 ends the setup, and training step *s* lasts from boundary *s* to
    boundary *s + 1*. The time is taken first, so what the profiler does at a boundary (start
    its warm-up, export) falls into the step that begins there.
    """

    def __init__(self, inner: Any, recorder: Recorder) -> None:
        self._inner = inner
        self._recorder = recorder

    @property
    def step_num(self) -> int:
        return self._inner.step_num

    def __enter__(self) -> StepClock:  # noqa: PYI034 - typing.Self needs Python 3.11
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> Any:
        return self._inner.__exit__(*exc)

    def step(self) -> None:
        now = time.perf_counter()
        safely(self._recorder.boundary, now)
        self._inner.step()


class _Bucket:
    """What happened in one training step."""

    __slots__ = ("fetches", "losses", "ready", "samples", "unknown", "wait_s")

    def __init__(self) -> None:
        self.samples = 0
        self.ready: int | None = None  # batches ready in the loader at the step's first fetch
        self.unknown = False  # a fetch whose batch size could not be told
        self.fetches = 0
        self.wait_s = 0.0
        # source -> detached loss tensors (converted to floats once, at the end: no sync per step)
        self.losses: dict[str, list] = {}


class Recorder:
    """Per-step times, samples, data waits and losses of one run, and facts about it.

    Args:
        warmup_steps: W; steps 1..W are not measured.
        measure_steps: K; steps W+1..W+K are measured.
        last_step: The last step anything is kept for (W+K, or W+K+1+P with profiling).
        steps_file: Open binary file receiving one :class:`~perfscope.measure.protocol.StepLine`
            per finished step (flushed at once: the tuner reads it while the script runs).
        drain_prefetch: Extend the warm-up while the DataLoader drains its prefetched batches
            (:class:`~perfscope.measure.warmup.DrainWarmup`); each step added moves
            ``warmup_steps``, ``measured_end`` and ``last_step`` by one and calls ``on_extend``.
        window: Extend the measured window until its throughput is known well enough
            (:class:`~perfscope.measure.window.SteadyWindow`), or None for exactly K
            steps; each step added moves ``measured_end`` and ``last_step`` and calls ``on_extend``.
        energy: Reads the energy counter at each boundary (joules, or None where it cannot be
            read; :meth:`perfscope.collect.energy.EnergyProbe.joules`), or None not to read it.

    Attributes:
        warmup_steps, measured_end, last_step: W (as extended), W+K and the last step kept.
        on_extend: Called with no argument when a step is added to the warm-up.
        current: Boundaries so far, i.e. the step in progress (0 = the setup).
        times: ``perf_counter()`` of each boundary (seconds); ``times[n-1]`` is boundary n.
        loader, ddp, dist, first_step, accelerate: Facts seen during the run (see measure.py).
        write_error: The OSError that stopped the steps file, if any.
    """

    def __init__(self, *, warmup_steps: int, measure_steps: int, last_step: int, steps_file: BinaryIO,
                 drain_prefetch: bool = False, window: SteadyWindow | None = None, energy=None) -> None:
        self.thread = threading.get_ident()
        self.energy = energy
        self.energy_at: list[float | None] = []
        self.window = window
        self.warmup_steps = warmup_steps
        self.measured_end = warmup_steps + measure_steps
        self.last_step = last_step
        self.warmup = DrainWarmup(enabled=drain_prefetch)
        self.on_extend: Callable[[], None] | None = None
        self._file: BinaryIO | None = steps_file
        self.write_error: OSError | None = None
        self.current = 0
        self.times: list[float] = []
        # By step, made on first use: memory follows the steps run, not the steps asked for.
        self.buckets: dict[int, _Bucket] = {}
        self.backward_depth = 0
        self.loader: dict | None = None
        self.ddp: dict | None = None
        self.ddp_backend: str | None = None
        self.dist: dict | None = None
        self.first_step: dict | None = None
        self.accelerate = {"called": False, "optimizer": False, "loader": False}
        self.model: dict | None = None
        self.optimizer: dict | None = None
        self._loader_settings: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------ boundaries
    def boundary(self, now: float) -> None:
        """Boundary ``current + 1`` at ``now``: step ``current`` ended, the next one starts."""
        self.current += 1
        self.times.append(now)
        if self.energy is not None:
            self.energy_at.append(self.energy())
        ended = self.current - 1
        if self.current == self.warmup_steps + 1 and self.warmup.extends():
            self.warmup_steps, self.measured_end, self.last_step = (
                self.warmup_steps + 1, self.measured_end + 1, self.last_step + 1)
            if self.on_extend is not None:
                self.on_extend()
        elif self.current == self.measured_end + 1 and self.window is not None and self.window.extends(
                *self.measured_steps(), self._round_steps()):
            self.measured_end, self.last_step = self.measured_end + 1, self.last_step + 1
            if self.on_extend is not None:
                self.on_extend()
        if self.current == 1:
            self.first_step = backend_flags()
        elif ended <= self.last_step:
            self._write_step(ended)
        if self.dist is None:
            self.dist = dist_snapshot()  # the script may destroy its group before the end

    def measured_steps(self) -> tuple[list[int | None], list[float]]:
        """(samples, seconds) of each measured step finished so far (None: samples unknown)."""
        samples, seconds = [], []
        for step in range(self.warmup_steps + 1, min(self.measured_end, self.current - 1) + 1):
            bucket = self.buckets.get(step) or _Bucket()
            samples.append(None if bucket.unknown or not bucket.fetches else bucket.samples)
            seconds.append(self.times[step] - self.times[step - 1])
        return samples, seconds

    def _round_steps(self) -> int:
        """Steps of one round of the DataLoader's workers (1 without workers)."""
        workers = (self.loader or {}).get("num_workers") or 0
        return max(1, int(workers)) if isinstance(workers, int) else 1

    def _write_step(self, step: int) -> None:
        if self._file is None:
            return
        bucket = self.buckets.get(step) or _Bucket()
        joules = None
        if len(self.energy_at) > step and self.energy_at[step] is not None and self.energy_at[step - 1] is not None:
            joules = max(0.0, self.energy_at[step] - self.energy_at[step - 1])
        line = StepLine(energy_j=joules,
            step=step, seconds=max(0.0, self.times[step] - self.times[step - 1]),
            samples=None if bucket.unknown or not bucket.fetches else bucket.samples,
            data_wait_s=max(0.0, bucket.wait_s), measured=self.warmup_steps < step <= self.measured_end,
            ready=bucket.ready, warmup=step <= self.warmup_steps, profiled=step > self.measured_end)
        try:
            self._file.write(encode_step_line(line))
            self._file.flush()
        except OSError as exc:  # a full disk must not look like a crash of the script
            self.write_error, self._file = exc, None

    def _bucket(self) -> _Bucket | None:
        step = self.current
        if not 1 <= step <= self.last_step:
            return None
        bucket = self.buckets.get(step)
        if bucket is None:
            bucket = self.buckets[step] = _Bucket()
        return bucket

    # ------------------------------------------------------------------ events
    def fetched(self, iterator: Any, start: float, end: float, batch: Any, ended: bool,
                ready: int | None = None) -> None:
        """A main-thread DataLoader fetch ran from ``start`` to ``end`` (``ended``: StopIteration);
        ``ready``: the batches ready in the loader before it (None: unknown)."""
        if self.loader is None:
            self.loader = self._loader_settings.get(iterator)
        bucket = self._bucket()
        if bucket is None:
            return
        # A boundary taken inside this fetch (the tracker's, before the fetch proper) starts the
        # step: only the time after it is this step's wait.
        last = self.times[-1] if self.times else start
        bucket.wait_s += end - max(start, last)
        if ended:
            return
        if not bucket.fetches:
            bucket.ready = ready
        bucket.fetches += 1
        size = batch_size(batch)
        if size is None:
            bucket.unknown = True
        else:
            bucket.samples += size

    def note_loss(self, loss: Any) -> None:
        """``control.note_loss``: the loss the script passed to ``perfscope.backward``."""
        safely(self._capture, "perfscope.backward", loss)

    def note_autograd_loss(self, loss: Any) -> None:
        """A scalar the script passed to ``loss.backward()`` / ``torch.autograd.backward``."""
        self._capture("autograd.backward", loss)

    def _capture(self, source: str, loss: Any) -> None:
        if threading.get_ident() != self.thread or not isinstance(loss, torch.Tensor):
            return
        bucket = self._bucket()
        if bucket is None:
            return
        kept = loss.detach()
        # A scalar view of a big tensor would keep all its storage alive for the whole run.
        if kept.untyped_storage().nbytes() > kept.element_size():
            kept = kept.clone()
        bucket.losses.setdefault(source, []).append(kept)

    def note_accelerate(self, model: Any, optimizer: Any, loader: Any) -> None:
        """``control.note_accelerate``: the script called ``perfscope.accelerate``."""
        self.accelerate["called"] = True
        self.accelerate["optimizer"] |= optimizer is not None
        self.accelerate["loader"] |= loader is not None
        if optimizer is not None:
            self.accelerate["optimizer_class"] = type(getattr(optimizer, "optimizer", optimizer)).__name__

    def note_model(self, model: Any) -> None:
        """The first module called that holds parameters (:mod:`perfscope.runtime.model_scan`)."""
        self.model = safely(model_facts, model)

    def note_optimizer(self, optimizer: Any) -> None:
        """An optimizer is about to take its first step (the first one is recorded): its class and
        implementation (:func:`perfscope.runtime.optimizer_impl.facts`)."""
        if self.optimizer is None:
            from perfscope.runtime.optimizer_impl import facts

            self.optimizer = safely(facts, optimizer)

    def note_iterator(self, iterator: Any, args: tuple, kwargs: dict) -> None:
        """A DataLoader iterator was built: keep its loader's settings for its first fetch."""
        if self.loader is None:
            self._loader_settings[iterator] = loader_settings(args[0] if args else kwargs.get("loader"))

    def note_ddp(self, ddp: Any, args: tuple, kwargs: dict) -> None:
        """A DistributedDataParallel was built (the first one is recorded)."""
        if self.ddp is not None:
            return
        cap = getattr(ddp, "bucket_bytes_cap", None)
        if isinstance(cap, (int, float)) and cap > 0:
            bucket_mb = cap / 2**20
        else:
            bucket_mb = float(kwargs.get("bucket_cap_mb") or 25.0)  # DDP's default
        static = getattr(ddp, "static_graph", kwargs.get("static_graph", False))
        self.ddp = {"bucket_cap_mb": float(bucket_mb), "static_graph": bool(static)}
        with contextlib.suppress(Exception):  # no group to ask: the end-of-run snapshot may know
            self.ddp_backend = str(torch.distributed.get_backend(getattr(ddp, "process_group", None)))
        if self.dist is None:
            self.dist = dist_snapshot()

    # ------------------------------------------------------------------ installing
    @contextlib.contextmanager
    def observing(self):
        """Be ``control.observer`` and watch the constructors, for the block.

        Enter it *before* ``patching.patched``: that patch finds who built a DataLoader/DDP by
        looking at its caller's frame, so its wrapper must stay the outermost.
        """
        if control.observer is not None:
            raise RuntimeError("another perfscope measurement is active in this process")
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import dataloader

        with contextlib.ExitStack() as stack:
            control.observer = self
            stack.callback(setattr, control, "observer", None)
            replace(stack, dataloader._BaseDataLoaderIter, "__init__", functools.partial(wrap_init, self.note_iterator))
            replace(stack, DistributedDataParallel, "__init__", functools.partial(wrap_init, self.note_ddp))
            stack.enter_context(first_model(self.note_model))
            stack.enter_context(before_first_step(self.note_optimizer))
            yield self

    @contextlib.contextmanager
    def hooks(self):
        """The fetch and backward wrappers, for the block.

        Enter it *after* ``StepTracker.start()``: the fetch wrapper must be outside the
        tracker's, so that the boundary is taken inside the timed fetch and seen at its return.
        """
        from torch.utils.data import dataloader

        with contextlib.ExitStack() as stack:
            replace(stack, dataloader._BaseDataLoaderIter, "__next__", functools.partial(wrap_fetch, self))
            replace(stack, torch.autograd, "backward", functools.partial(wrap_backward, self))
            yield self
