"""Replacing an attribute of a class or module for a while, and putting it back: the one way
perfscope patches torch and the script's classes (the step tracker's hooks, the measured run's
recorder, the one-profiler guard, the knob groups' constructors)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any


def replace(stack: contextlib.ExitStack, owner: Any, name: str, make: Callable[[Callable], Callable]) -> Callable:
    """Set ``owner.name`` to ``make(original)`` until ``stack`` closes, then restore the original.

    The original is the attribute defined on ``owner`` itself (``owner.__dict__``), so an
    inherited one is never copied down onto a subclass.

    Returns:
        The original.

    Raises:
        KeyError: ``owner`` does not define ``name`` itself.
    """
    original = owner.__dict__[name]
    setattr(owner, name, make(original))
    stack.callback(setattr, owner, name, original)
    return original
