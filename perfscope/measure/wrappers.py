"""The wrappers that feed the measurement's :class:`~perfscope.measure.hooks.Recorder`: the
DataLoader fetch (samples, data wait), ``torch.autograd.backward`` (the loss) and the constructors
it learns facts from. Each calls the script's own function first or around it and never lets a
fact it could not take break that call (:func:`safely`)."""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

class Recorder(Protocol):
    """What the wrappers feed (:class:`perfscope.measure.hooks.Recorder` is it; a protocol here so
    that this module does not import the one that imports it)."""

    thread: int  # the training loop's thread
    backward_depth: int  # backward calls in progress on it
    warmup: Any  # its DrainWarmup

    def fetched(self, iterator: Any, start: float, end: float, batch: Any, ended: bool, ready: Any = None) -> None: ...

    def note_autograd_loss(self, loss: Any) -> None: ...


_is_compiling: Callable[[], bool] = torch.compiler.is_compiling
_RUNTIME_PACKAGE = "perfscope.runtime"


def wrap_fetch(recorder: Recorder, original: Callable) -> Callable:
    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        if threading.get_ident() != recorder.thread:
            return original(self)  # prefetch threads of the script's: not the training loop
        ready = safely(recorder.warmup.note_fetch, self)  # before the boundary the fetch may take
        start = time.perf_counter()
        try:
            batch = original(self)
        except StopIteration:
            safely(recorder.fetched, self, start, time.perf_counter(), None, True)
            raise
        safely(recorder.fetched, self, start, time.perf_counter(), batch, False, ready)
        return batch

    return __next__


def wrap_backward(recorder: Recorder, original: Callable) -> Callable:
    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        # Nested calls (a reentrant checkpoint's backward inside the script's) are not losses.
        if recorder.backward_depth or threading.get_ident() != recorder.thread or _is_compiling():
            return original(*args, **kwargs)
        loss = safely(_scalar, args[0] if args else kwargs.get("tensors"))
        if loss is not None and not _called_from_runtime():
            safely(recorder.note_autograd_loss, loss)  # perfscope.backward reported it undivided already
        recorder.backward_depth += 1
        try:
            return original(*args, **kwargs)
        finally:
            recorder.backward_depth -= 1

    return backward


def wrap_init(note: Callable[[Any, tuple, dict], None], original: Callable) -> Callable:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        safely(note, self, args, kwargs)

    return __init__


def safely(fn: Callable, *args: Any) -> Any:
    """``fn(*args)``, or None if it raised: measuring must never break the script's own calls."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - an odd batch, loss or loader type: that fact is lost
        return None


def _scalar(tensors: Any) -> torch.Tensor | None:
    if isinstance(tensors, (list, tuple)) and len(tensors) == 1:
        tensors = tensors[0]
    if isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
        return tensors
    return None


def _called_from_runtime() -> bool:
    """Whether the backward being wrapped was called by ``perfscope.runtime`` (its backward())."""
    frame = sys._getframe(2)  # 0: here, 1: the wrapper
    while frame is not None:
        name = frame.f_globals.get("__name__", "") or ""
        if name == "torch" or name.startswith("torch."):
            frame = frame.f_back  # Tensor.backward, __torch_function__ dispatch
            continue
        return name == _RUNTIME_PACKAGE or name.startswith(_RUNTIME_PACKAGE + ".")
    return False
