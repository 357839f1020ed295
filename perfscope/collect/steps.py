"""Finds training-step boundaries in an unmodified script and drives the profiler.

A step ends when the script's leading optimizer steps (the first one that
steps; see :meth:`StepTracker._leads` for when another takes over). The
optimizer-step post hook runs *inside* the optimizer's ``Optimizer.step#...``
profiler range, so calling ``prof.step()`` there would make ``ProfilerStep#N``
straddle that range. The hook therefore only marks the boundary as pending; it
is taken at the next *iteration point*, which lies outside any torch-opened
range:

* the next DataLoader fetch (before ``enumerate(DataLoader)#...`` opens),
* the next module forward (global forward pre-hook),
* the next ``torch.autograd.backward`` (loops built from plain tensors),
* ``perfscope.step()``,
* the end of an ``optimizer.step(closure)`` call's range (LBFGS and other
  closure optimizers run forward and backward *inside* their step, so the
  loop may have no other point outside it),
* last resort: the next step of the same optimizer (its pre-hook, which *is*
  inside ``Optimizer.step#``; only reached by loops with none of the above).

Fetches, forwards and backwards *inside* an optimizer step (a closure's) are
not iteration points. Inside-ness is counted from the global pre hook (which
runs inside the range) to the range's end, seen by wrapping
``record_function.__exit__``: unlike the post hook, that also runs when the
step raises.

Ending the script at ``max_steps`` waits for the same kind of point after the
last step, so that step's ``zero_grad``, scheduler and logging still run.

The code before the first iteration point (imports, model construction) is
the profiler's step 0 and is never traced: the torch schedule skips one more
step than the user asked for. So profiler step ``N`` is training step ``N``.

Every hook starts with O(1) flag checks, and the module forward hook is
registered only while a boundary is pending, so outside the profiled window
the cost is a Python function call per fetch / backward / optimizer step /
``record_function`` range.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Callable

import torch
import torch.autograd.profiler as profiler_mod
import torch.optim.optimizer as optim_mod
import torch.utils.data.dataloader as dataloader_mod
from torch.nn.modules import module as module_mod

from perfscope import control
from perfscope.patches import replace
from perfscope.collect.hooks import (
    _first_forward_hook,
    _forward_begin_hook,
    _forward_pre_hook,
    _optimizer_pre_hook,
    _has_closure,
    _optimizer_post_hook,
    _wrap_fetch,
    _wrap_backward,
    _wrap_range_exit,
    _wrap_scaler_step,
)
from perfscope.collect.schedule import ProfileSchedule


class StepTracker:
    """Counts training steps and places ``prof.step()`` calls between them.

    Args:
        prof: A ``torch.profiler.profile`` built with a schedule that skips
            ``schedule.skip_first + 1`` steps (step 0 is the script's setup).
        schedule: The user's schedule; decides when the window is done and
            when to end the script.
        window: The profiler's :class:`~perfscope.collect.window.Window` where it may lengthen
            the recording: the window then ends, and the script with it, that many steps later.
        timer: A :class:`~perfscope.collect.run_timer.RunTimer` that times every step of the run
            in phases, or None.

    Attributes:
        steps_seen: Training steps counted so far in this process.
        stopped_early: True once perfscope raised its stop signal.
        window_done: True once the active window was recorded (trace exported).
    """

    def __init__(self, prof: Any, schedule: ProfileSchedule, window: Any = None, timer: Any = None) -> None:
        self._prof = prof
        self.timer = timer
        self._schedule = schedule
        # A perfscope.collect.window.Window that may lengthen the recording, or None.
        self._window = window
        self._delayed = 0  # steps the window was moved later by (delay_window)
        self._thread = threading.get_ident()
        self.steps_seen = 0
        self.stopped_early = False
        self.window_done = False
        self._setup_done = False
        self._pending = False
        self._stop_pending = False
        self._explicit = False
        self._lead: weakref.ref | None = None
        # Another optimizer that stepped since the leader last did (see _leads).
        self._challenger: weakref.ref | None = None
        # Optimizer steps in progress on the script's thread (nested ones
        # count), and whether the outermost was called with a closure.
        self.step_depth = 0
        self._closure_step = False
        self._optimizer_calls = 0  # every optimizer step, for the GradScaler check
        self._undo = contextlib.ExitStack()  # what start() installed, undone by close()
        self._forward_hook: Any = None
        self._first_forward: Any = None  # the global hook that finds the model (first step only)
        # The one flag the per-fetch and per-backward hooks look at.
        self.point_armed = False

    # ----------------------------------------------------------------- life cycle
    def start(self) -> None:
        """Install the hooks and start the profiler (call right before the script)."""
        if control.active is not None:
            raise RuntimeError("another perfscope profiling session is active in this process")
        control.active = self
        self._undo.callback(_restore_active)
        handles = [
            optim_mod.register_optimizer_step_pre_hook(_optimizer_pre_hook),
            optim_mod.register_optimizer_step_post_hook(_optimizer_post_hook),
        ]
        for h in handles:
            self._undo.callback(h.remove)
        self._undo.callback(self._disarm)
        replace(self._undo, dataloader_mod._BaseDataLoaderIter, "__next__", _wrap_fetch)
        replace(self._undo, torch.autograd, "backward", _wrap_backward)
        replace(self._undo, torch.amp.GradScaler, "step", _wrap_scaler_step)
        replace(self._undo, profiler_mod.record_function, "__exit__", _wrap_range_exit)
        self._arm()  # the first iteration point ends the setup
        replace(self._undo, threading, "excepthook", _quiet_stop)
        try:
            self._prof.__enter__()
        except BaseException:
            self.window_done = True  # nothing to stop
            self.close()
            raise

    def close(self) -> None:
        """Remove the hooks and stop the profiler; exports a window cut short.

        Stopping inside the active window makes the profiler hand the steps
        recorded so far to its ``on_trace_ready`` callback.
        """
        self._undo.close()
        if self.timer is not None:
            self.timer.flush()
        if not self.window_done:
            self.window_done = True
            self._prof.__exit__(None, None, None)

    def _arm(self) -> None:
        """Watch for the next iteration point.

        The global forward pre-hook exists only while armed: with any global
        module hook registered, every ``Module.__call__`` takes torch's slow
        path (about 1 us per module call, 6% of a step of 400 tiny modules),
        so it is added when a boundary is pending and removed once taken.
        Removing it from inside the hook is safe: torch iterates a copy.
        """
        self.point_armed = True
        if self._forward_hook is None:
            self._forward_hook = module_mod.register_module_forward_pre_hook(_forward_pre_hook)

    def _watch_forward(self) -> None:
        """Find the model's outermost module in the first step, for the timer's forward start.

        A global hook for the first steps only (it puts every module call on torch's slow path);
        the module found gets a hook of its own, which costs one call per forward.
        """
        if self.timer is not None and self._first_forward is None:
            self._first_forward = module_mod.register_module_forward_pre_hook(_first_forward_hook)
            self._undo.callback(self._unwatch_forward)

    def _unwatch_forward(self) -> None:
        if self._first_forward:
            self._first_forward.remove()
            self._first_forward = False  # found, or given up: never installed again

    def first_forward(self, module: Any) -> None:
        """The first module called on the training thread after the setup (outside a fetch)."""
        timer = self.timer
        if timer is None or not self._on_script_thread() or timer.fetching:
            return
        self._unwatch_forward()
        handle = module.register_forward_pre_hook(_forward_begin_hook)
        self._undo.callback(handle.remove)
        timer.forward_begin()

    def _disarm(self) -> None:
        self.point_armed = False
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None

    # ----------------------------------------------------------------- events
    def _on_script_thread(self) -> bool:
        # Threads other than the training thread (DataParallel replicas,
        # prefetch threads) must not move the step boundary.
        return control.active is self and threading.get_ident() == self._thread

    def _adopt_training_thread(self) -> None:
        """An optimizer step or ``perfscope.step()`` on another thread before any training step
        on the script's: that thread trains (a loop run in a ``threading.Thread``), and the
        steps are counted there from now on.

        Only a step adopts a thread: a fetch or forward can come from a prefetch thread.
        """
        if (control.active is self and self.steps_seen == 0 and not self.step_depth
                and threading.get_ident() != self._thread):
            self._thread = threading.get_ident()

    def _acting(self) -> bool:
        return not self.stopped_early and self._on_script_thread()

    def iteration_point(self) -> None:
        """A fetch, forward or backward started: take a pending boundary.

        Ignored inside an optimizer step: there it is a closure's forward or
        backward, and a boundary would cut the ``Optimizer.step#`` range.
        """
        if self.step_depth or not self._acting():
            return
        self._take_point()

    def optimizer_entered(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """An optimizer step started (its pre hook, inside its range).

        Also the last-resort boundary for loops without any other point.
        """
        self._adopt_training_thread()
        if not self._on_script_thread():
            return
        self.step_depth += 1
        if self.step_depth == 1:
            self._closure_step = _has_closure(args, kwargs)
            if self.timer is not None:
                self.timer.optimizer_begin()
        if not self.point_armed or not self._acting():
            return
        if not self._setup_done:
            self._end_setup()
        elif self._is_lead(optimizer):
            # Only the leader's: another optimizer stepping later in the same
            # iteration (a head after the backbone) still belongs to it.
            if self._stop_pending:
                self._stop()
            if self._pending and not self.window_done:
                self._boundary()

    def optimizer_range_closed(self, failed: bool) -> None:
        """An ``Optimizer.step#`` range ended (normally or by an exception)."""
        if not self._on_script_thread() or not self.step_depth:
            return  # a step whose pre hook did not run (another thread, ...)
        self.step_depth -= 1
        if self.step_depth:
            return
        closure, self._closure_step = self._closure_step, False
        # A closure step ran the model inside: right after it is the only
        # place between iterations the loop may offer. Not while an exception
        # propagates: the stop signal must not replace the script's error.
        if closure and not failed and self.point_armed and self._acting():
            self._take_point()

    def optimizer_stepped(self, optimizer: Any) -> None:
        """An optimizer finished (or GradScaler skipped) its update."""
        if self.timer is not None and self.step_depth == 1 and self._on_script_thread():
            self.timer.optimizer_end()
        if not self._acting() or self._explicit or not self._leads(optimizer):
            return
        self._count(at_boundary=False)
        if not self.window_done:
            self._pending = True
            self._arm()

    def explicit_step(self) -> None:
        """``perfscope.step()``: the step ends here."""
        self._adopt_training_thread()
        if not self._acting():
            return
        if self._stop_pending:
            self._stop()  # the optimizer hook already counted the last step
        if not self._explicit:
            self._explicit = True  # optimizer hooks stop counting from now on
            if self._pending:
                # This iteration was already counted by the optimizer hook.
                self._boundary()
                return
            if not self._setup_done:
                # No fetch/forward/backward seen: the first step cannot be
                # told apart from the setup; it ends profiler step 0 (never
                # traced), so profiler step N is training step N + 1 here.
                self._end_setup()
                self._count(at_boundary=True, timed=False)  # the setup: profiler step 0
                return
        self._count(at_boundary=True)
        if not self.window_done:
            self._boundary()

    def delay_window(self, steps: int = 1) -> None:
        """End the window, and the script with it, ``steps`` steps later than the schedule says
        (the measurement runner lengthens its warm-up so; its profiler follows on its own)."""
        self._delayed += steps

    # ----------------------------------------------------------------- internals
    @property
    def _added(self) -> int | None:
        """Steps added to the planned window; None while the window is still deciding."""
        if self._window is None:
            return self._delayed
        return self._delayed + self._window.steps_added if self._window.last is not None else None

    @property
    def _window_end(self) -> int | None:
        """prof.step_num after the boundary that closes the last active step (None: not known yet)."""
        added = self._added
        return None if added is None else self._schedule.window_steps + 1 + added

    @property
    def _stop_after(self) -> int | None:
        if self._schedule.max_steps is not None:  # the user's own count (0: never)
            return self._schedule.stop_after
        added = self._added
        return None if added is None else self._schedule.window_steps + added

    def _take_point(self) -> None:
        if self._stop_pending:
            self._stop()
        if self.window_done:
            return
        if not self._setup_done:
            self._end_setup()
        elif self._pending:
            self._boundary()

    def _leads(self, optimizer: Any) -> bool:
        """Whether a step of ``optimizer`` is a training step; elects the leader.

        The first optimizer that steps leads. Another one takes over when it
        steps twice with no step of the leader in between: the leader was a
        warm-up optimizer of the setup (alive or garbage collected), not one
        of several optimizers updated in turn each iteration (backbone and
        head, a GAN's D and G), which alternate with the leader. The new
        leader's steps count from the one that made it take over.
        """
        lead = self._lead() if self._lead is not None else None
        challenger = self._challenger() if self._challenger is not None else None
        if lead is optimizer:
            self._challenger = None
            return True
        if lead is None or challenger is optimizer:
            self._lead, self._challenger = weakref.ref(optimizer), None
            return True
        self._challenger = weakref.ref(optimizer)
        return False

    def _is_lead(self, optimizer: Any) -> bool:
        return self._lead is not None and self._lead() is optimizer

    def _count(self, *, at_boundary: bool, timed: bool = True) -> None:
        self.steps_seen += 1
        if self.timer is not None and timed:
            self.timer.step_end()
            if self._first_forward and self.steps_seen >= 3:  # no module call: a functional model
                self._unwatch_forward()
        if self.window_done and self._stop_reached():
            if at_boundary:
                self._stop()
            else:
                # Counted from inside optimizer.step(): end the script at the
                # next point instead, after the rest of this iteration.
                self._stop_pending = True
                self._arm()

    def _end_setup(self) -> None:
        self._setup_done = True
        if not self._pending:
            self._disarm()
        self._prof.step()
        if self.timer is not None:
            self.timer.start()  # after the profiler's step: the first step is timed from here
            self._watch_forward()

    def _boundary(self) -> None:
        self._pending = False
        self._disarm()
        if self.timer is not None:
            self.timer.profiler_begin()
        self._prof.step()  # exports the trace when this closes the window
        end = self._window_end
        if end is not None and self._prof.step_num >= end:
            self.window_done = True
            # Stop now: the rest of the run costs only the counting hooks.
            self._prof.__exit__(None, None, None)
        if self.timer is not None:
            self.timer.profiler_end()
        if self.window_done and self._stop_reached():
            self._stop()

    def _stop_reached(self) -> bool:
        return self._stop_after is not None and self.steps_seen >= self._stop_after

    def _stop(self) -> None:
        self.stopped_early = True
        self._stop_pending = False
        self._disarm()
        raise control._StopScript()


def _restore_active() -> None:
    control.active = None


def _quiet_stop(original: Callable) -> Callable:
    """``threading.excepthook`` that lets perfscope's stop signal end a training thread quietly,
    as it ends the main thread (no "Exception in thread" traceback)."""

    def excepthook(args: Any) -> None:
        if not isinstance(args.exc_value, control._StopScript):
            original(args)

    return excepthook
