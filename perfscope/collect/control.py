"""State shared between the profiled script and perfscope, importable without torch.

``perfscope.step()`` lives here so that ``import perfscope`` never imports
torch: the analysis side of perfscope runs on machines without it.
"""

from __future__ import annotations

import os
from typing import Protocol


class _Tracker(Protocol):
    def explicit_step(self) -> None: ...


class _StopScript(BaseException):
    """Raised from a step boundary to end the script at ``max_steps``.

    A BaseException (like KeyboardInterrupt) so that the script's own
    ``except Exception`` blocks let it through to perfscope's runner.
    """


# The tracker of the profiling session running in this process, or None.
# Read on every hook call, so it is a plain module global (one dict lookup).
active: _Tracker | None = None


def step() -> None:
    """Mark the end of one training step.

    For training loops that have no torch optimizer (or whose update is not a
    ``torch.optim.Optimizer.step``). Call it once per iteration, after the
    update. Once a script calls it, optimizer steps no longer count, so loops
    that call both are not counted twice. Does nothing when the script is not
    running under ``perfscope profile``.

    Raises:
        BaseException: perfscope's private stop signal when ``max_steps`` is
            reached; let it propagate (``except Exception`` does).
    """
    tracker = active
    if tracker is not None:
        tracker.explicit_step()


def _forget_in_child() -> None:
    # A forked child (e.g. a DataLoader worker) inherits the hooks but must not
    # drive the parent's profiler; with no active tracker every hook is a no-op.
    global active
    active = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
