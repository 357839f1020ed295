"""Finding the model of an unmodified script: the first module called that holds parameters.

A launch-time knob that changes the model (``fused_ops``), and the measurement's fact of which
fusable modules a model has, need the script's model without the script passing it anywhere.
PyTorch's global forward pre-hook runs before every ``nn.Module`` call; the first call of a module
with parameters is the model's (or its wrapper's: DDP, ``torch.compile``), and its pre-hook runs
before any of its submodules, so changing them there takes effect in that very forward. The hook
then removes itself: global hooks put every later module call on PyTorch's slower hooked path,
which a launch-bound step would feel. A script whose first parametrised call is a part of the
model (``model.encoder(x)`` before ``model(x)``) is seen through that part only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from torch import nn
from torch.nn.modules import module as nn_module


class FirstModel:
    """The pre-hook: ``callback(module)`` runs once, on the first module called that holds
    parameters. ``seen`` is that module's class name once it ran (None before)."""

    def __init__(self, callback: Callable[[nn.Module], None]) -> None:
        self.callback = callback
        self.seen: str | None = None
        self.handle = None
        self._lock = threading.Lock()

    def __call__(self, module: nn.Module, args) -> None:
        if self.seen is not None or next(module.parameters(), None) is None:
            return
        with self._lock:
            if self.seen is not None:
                return
            self.seen = type(module).__name__
            if self.handle is not None:
                self.handle.remove()
        self.callback(module)


@contextlib.contextmanager
def first_model(callback: Callable[[nn.Module], None]) -> Iterator[FirstModel]:
    """Install :class:`FirstModel` for a ``with`` block (a script run); it is removed after its
    first call at the latest when the block ends."""
    hook = FirstModel(callback)
    hook.handle = nn_module.register_module_forward_pre_hook(hook)
    try:
        yield hook
    finally:
        hook.handle.remove()
