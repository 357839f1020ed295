"""A profiler range around every ``nn.Module`` call of the traced steps, named by module path.

:class:`ModuleRanges` is switched on by :class:`~perfscope.collect.host.HostStepRecorder` for the
steps the profiler traces (its warm-up and recorded window) and off after them: global forward
pre- and post-hooks open and close a ``record_function`` range ``nn.Module: <path> (<class>)``,
the path from the outermost module the call is made under (``ResNet.layer1.0.conv1``). The
analysis nests them into time per module (:mod:`perfscope.analysis.module_view`). Asked for
with ``perfscope profile --modules`` (``ProfileSchedule.modules``): each range costs host time
in the traced steps (measured in ``docs/metrics.md``, Modules), which the verdict is read from.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from torch.nn.modules import module as module_mod

from perfscope import control

PREFIX = "nn.Module: "
_is_compiling = torch.compiler.is_compiling
# record_function: a user annotation, as every trace viewer reads it (torch's cheaper C++ range,
# _RecordFunctionFast, writes a cpu_op, which other tools would count as an operator).
_Range = torch.autograd.profiler.record_function


class ModuleRanges:
    """Opens and closes the module ranges (see the module docstring)."""

    def __init__(self) -> None:
        self._names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._local = threading.local()
        self._handles: list = []

    @property
    def on(self) -> bool:
        return bool(self._handles)

    def switch(self, on: bool) -> None:
        """Hooks in place when ``on``, removed otherwise (idempotent)."""
        if on and not self._handles:
            self._handles = [module_mod.register_module_forward_pre_hook(self._enter),
                             module_mod.register_module_forward_hook(self._exit, always_call=True)]
        elif not on and self._handles:
            for h in self._handles:
                h.remove()
            self._handles = []
            self._local = threading.local()  # ranges still open on a thread are the profiler's to close

    def _stack(self) -> list:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _name(self, module: Any, stack: list) -> str:
        name = self._names.get(module)
        if name is not None:
            return name
        cls = type(module).__name__
        if not stack:  # an outermost call: name its whole tree (again: a child seen first was named as a root)
            for path, sub in module.named_modules():
                self._names[sub] = f"{cls}.{path}" if path else cls
            return self._names.get(module, cls)
        return f"{stack[-1][0]}.{cls}"  # a module outside its caller's tree (made on the fly)

    def _enter(self, module: Any, args: Any) -> None:
        if _is_compiling():
            return None
        # A step boundary waiting for this call is taken first, so that no module range straddles
        # a ProfilerStep# (this hook may run before the step tracker's own).
        tracker = control.active
        if tracker is not None and tracker.point_armed:
            tracker.iteration_point()
            if not self.on:  # the boundary closed the window and switched the ranges off
                return None
        stack = self._stack()
        try:
            name = self._name(module, stack)
            rf = _Range(f"{PREFIX}{name} ({type(module).__name__})")
            rf.__enter__()
        except Exception:  # noqa: BLE001 - a name or range that cannot be made: the call runs unranged
            stack.append((None, None))
            return None
        stack.append((name, rf))
        return None

    def _exit(self, module: Any, args: Any, output: Any) -> None:
        if _is_compiling():
            return None
        stack = self._stack()
        if stack:
            _, rf = stack.pop()
            if rf is not None:
                try:
                    rf.__exit__(None, None, None)
                except Exception:  # noqa: BLE001
                    pass
        return None
