"""The hooks and wrappers that tell the :class:`~perfscope.collect.steps.StepTracker` where a
training loop is: optimizer pre/post hooks, a module forward pre-hook, and wrappers around the
DataLoader fetch, ``torch.autograd.backward``, ``record_function.__exit__`` and
``GradScaler.step``.

"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from perfscope import control

_is_compiling: Callable[[], bool] = torch.compiler.is_compiling


# Hooks are module-level functions that look up the active tracker, so the
# same function objects can be registered and removed. Each begins with
# is_compiling(): under torch.compile dynamo inlines module hooks, and a
# constant-False branch keeps them from causing graph breaks.
def _forward_pre_hook(module: Any, args: Any) -> None:
    if _is_compiling():
        return None
    tracker = control.active
    if tracker is not None and tracker.point_armed:
        tracker.iteration_point()
        if tracker._first_forward:  # the setup ended at this call: the watch added now misses it
            tracker.first_forward(module)
    return None


def _first_forward_hook(module: Any, args: Any) -> None:
    # Global, for the first step only: the first module called is the outermost (a parent's
    # pre-hook runs before its children's), the model whose calls start each forward.
    if _is_compiling():
        return None
    tracker = control.active
    if tracker is not None:
        tracker.first_forward(module)
    return None


def _forward_begin_hook(module: Any, args: Any) -> None:
    # On the model alone: a hook on one module leaves every other module's call on torch's fast path.
    if _is_compiling():
        return None
    tracker = control.active
    timer = tracker.timer if tracker is not None else None
    if timer is not None and tracker._on_script_thread():
        timer.forward_begin()
    return None


def _optimizer_pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _is_compiling():
        return None
    tracker = control.active
    if tracker is not None:
        tracker.optimizer_entered(optimizer, args, kwargs)
    return None


def _has_closure(args: Any, kwargs: Any) -> bool:
    # The hooks get step()'s arguments with the optimizer first:
    # ``opt.step(closure)`` -> args (opt, closure).
    closure = args[1] if len(args) > 1 else kwargs.get("closure")
    return callable(closure)


def _optimizer_post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _is_compiling():
        return
    tracker = control.active
    if tracker is not None:
        tracker._optimizer_calls += 1
        tracker.optimizer_stepped(optimizer)


def _wrap_fetch(original: Callable) -> Callable:
    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        tracker = control.active
        if tracker is None:
            return original(self)
        if tracker.point_armed:
            tracker.iteration_point()  # before the fetch opens its range
        timer = tracker.timer
        if timer is None or tracker.step_depth or not tracker._on_script_thread():
            return original(self)
        timer.fetch_begin()
        try:
            return original(self)
        finally:
            timer.fetch_end()

    return __next__


def _wrap_backward(original: Callable) -> Callable:
    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        tracker = control.active
        if tracker is None or _is_compiling():
            return original(*args, **kwargs)
        if tracker.point_armed:
            tracker.iteration_point()
        timer = tracker.timer
        # inside an optimizer's step too: a closure's backward (the timer keeps it out of the optimizer's time)
        if timer is None or not tracker._on_script_thread():
            return original(*args, **kwargs)
        timer.backward_begin()
        try:
            return original(*args, **kwargs)
        finally:
            timer.backward_end()

    return backward


def _wrap_range_exit(original: Callable) -> Callable:
    # Every record_function range passes here; only the end of an optimizer
    # step that the pre hook saw (step_depth > 0) does more than two checks.
    @functools.wraps(original)
    def __exit__(self: Any, exc_type: Any, exc_value: Any, tb: Any) -> Any:
        result = original(self, exc_type, exc_value, tb)
        tracker = control.active
        if (
            tracker is not None
            and tracker.step_depth
            and str(getattr(self, "name", "")).startswith("Optimizer.step#")
        ):
            tracker.optimizer_range_closed(failed=exc_type is not None)
        return result

    return __exit__


def _wrap_scaler_step(original: Callable) -> Callable:
    # GradScaler.step skips optimizer.step() when the gradients hold inf/NaN,
    # so the post hook does not run; without this the skipped iteration would
    # merge into the next step and shift the window.
    @functools.wraps(original)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        tracker = control.active
        if tracker is None:
            return original(self, optimizer, *args, **kwargs)
        calls = tracker._optimizer_calls
        result = original(self, optimizer, *args, **kwargs)
        if tracker._optimizer_calls == calls:
            tracker.optimizer_stepped(optimizer)
        return result

    return step
