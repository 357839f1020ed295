"""State shared between the profiled script and perfscope, importable without torch.

``perfscope.step()`` lives here so that ``import perfscope`` never imports
torch: the analysis side of perfscope runs on machines without it.
"""

from __future__ import annotations

import os
from typing import Protocol


class _Tracker(Protocol):
    def explicit_step(self) -> None: ...


class _Observer(Protocol):
    def note_loss(self, loss: object) -> None: ...

    def note_accelerate(self, model: object, optimizer: object, loader: object) -> None: ...


class _StopScript(BaseException):
    """Raised from a step boundary to end the script at ``max_steps``.

    A BaseException (like KeyboardInterrupt) so that the script's own
    ``except Exception`` blocks let it through to perfscope's runner.
    """


class ScriptRefused(BaseException):
    """Raised into the script where it does something perfscope cannot profile (e.g. start a
    profiler of its own); the run ends with this one-line message, without a traceback.

    A BaseException for the same reason as :class:`_StopScript`.
    """


# The tracker of the profiling session running in this process, or None.
# Read on every hook call, so it is a plain module global (one dict lookup).
active: _Tracker | None = None

# The measurement session (``perfscope.measure``) watching this process, or None. The
# runtime reports to it through note_loss / note_accelerate; one None check when nobody watches.
observer: _Observer | None = None


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


def note_loss(loss: object) -> None:
    """The runtime's ``perfscope.backward`` got ``loss`` (undivided, unscaled); tell the observer.

    Args:
        loss: The scalar loss tensor as the script passed it (not detached here: the observer
            decides; no GPU sync happens).
    """
    obs = observer
    if obs is not None:
        obs.note_loss(loss)


def note_accelerate(model: object, optimizer: object, loader: object) -> None:
    """``perfscope.accelerate`` was called with these objects (any may be None); tell the observer."""
    obs = observer
    if obs is not None:
        obs.note_accelerate(model, optimizer, loader)


def _forget_in_child() -> None:
    # A forked child (e.g. a DataLoader worker) inherits the hooks but must not
    # drive the parent's profiler or feed its measurement; with no active
    # tracker and no observer every hook is a no-op.
    global active, observer
    active = None
    observer = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
