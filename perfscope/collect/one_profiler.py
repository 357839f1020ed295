"""One profiler per process: a script that starts its own while perfscope profiles it is stopped
with one line, before the two collide.

The PyTorch profiler keeps one Kineto session per process. A second ``torch.profiler.profile`` (or
``torch.autograd.profiler.profile``) entered while perfscope's is set up corrupts that session;
with torch 2.13 the process ends in a segmentation fault and nothing is written. Every Kineto
session starts in ``torch.autograd.profiler.profile._prepare_trace`` (``torch.profiler.profile``
calls it through its inner ``.profiler``), so that is where another session is refused; its
``_start_trace`` and ``__exit__`` are guarded too, since the script's ``with`` block still stops
the refused profiler on the way out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from perfscope import control
from perfscope.patches import replace

MESSAGE = ("the script starts a PyTorch profiler of its own (torch.profiler.profile or "
           "torch.autograd.profiler.profile), but perfscope is profiling it "
           "already and only one profiler can run in a process: run the script without its profiler under "
           "perfscope, or run it alone and give the trace it writes to `perfscope analyze`")


@contextlib.contextmanager
def only_ours(torch: Any, ours: Any | None) -> Iterator[None]:
    """While the block runs, a Kineto session other than ``ours`` raises
    :class:`~perfscope.control.ScriptRefused` (a BaseException: the script's ``except
    Exception`` lets it through to perfscope's runner).

    Args:
        torch: The torch module.
        ours: perfscope's ``torch.profiler.profile``, or None (nothing is refused).
    """
    if ours is None:
        yield
        return
    cls = torch.autograd.profiler.profile
    originals = {name: cls.__dict__[name] for name in ("_prepare_trace", "_start_trace", "__exit__")}

    def refuse(name: str):
        def guarded(self, *args):
            if self is getattr(ours, "profiler", None):
                return originals[name](self, *args)
            if name == "__exit__":
                return None  # the refused session never started: stopping it would stop perfscope's
            raise control.ScriptRefused(MESSAGE)

        return guarded

    with contextlib.ExitStack() as stack:
        for name in originals:
            replace(stack, cls, name, lambda _original, name=name: refuse(name))
        yield
