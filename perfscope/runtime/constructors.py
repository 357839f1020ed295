"""How a knob group patches a constructor for a session, and how perfscope's own calls pass through.

The mechanism under :mod:`perfscope.runtime.patching`: a group's launch-time patch wraps a class's
``__init__`` with :func:`patch_init`; constructors called from ``perfscope.runtime`` itself
(``perfscope.accelerate`` rebuilding a loader or wrapping a model), or inside :func:`suspended`,
run unpatched; objects a patch changed carry :data:`PATCHED_ATTR`, and objects ``accelerate``
returned carry :data:`ACCELERATED_ATTR`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import sys
from collections.abc import Callable, Iterator

from perfscope.patches import replace

ACCELERATED_ATTR = "_perfscope_accelerated"
PATCHED_ATTR = "_perfscope_patched"

_RUNTIME_PACKAGE = "perfscope.runtime"
_suspended: contextvars.ContextVar[bool] = contextvars.ContextVar("perfscope_patching_suspended", default=False)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Within this block (this thread / task), loaders and DDP wrappers are built unpatched."""
    token = _suspended.set(True)
    try:
        yield
    finally:
        _suspended.reset(token)


def _called_from_runtime(depth: int = 2) -> bool:
    """True when the constructor was called by perfscope.runtime code (accelerate), not the script."""
    if _suspended.get():
        return True
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return False
    # Skip torch's own frames (a DataLoader subclass's super().__init__ chain) up to the real caller.
    while frame is not None:
        name = frame.f_globals.get("__name__", "") or ""
        if name == __name__:
            frame = frame.f_back
            continue
        if name.startswith("torch.") or name == "torch":
            frame = frame.f_back
            continue
        return name == _RUNTIME_PACKAGE or name.startswith(_RUNTIME_PACKAGE + ".")
    return False


@contextlib.contextmanager
def patch_init(cls, adjust: Callable) -> Iterator[None]:
    """Patch ``cls.__init__`` for the session.

    ``adjust(arguments, signature)`` sees the bound constructor arguments of a call made by the
    script and edits them in place; it returns ``finish(obj) -> dict`` to run after the original
    constructor (the dict of changes becomes the object's marker), or None to leave the call alone.
    Calls from perfscope's own runtime (``accelerate``) and calls that do not bind pass through.
    """
    original = cls.__dict__["__init__"]
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        if _called_from_runtime():
            return original(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return original(self, *args, **kwargs)  # let the class report the script's mistake
        finish = adjust(bound.arguments, signature)
        if finish is None:
            return original(self, *args, **kwargs)
        original(*bound.args, **bound.kwargs)
        changed = finish(self)
        try:
            setattr(self, PATCHED_ATTR, changed)
        except Exception:  # noqa: BLE001 - a class with __slots__: only the marker is lost
            pass

    with contextlib.ExitStack() as stack:
        replace(stack, cls, "__init__", lambda _original: __init__)
        yield
