"""Processes the script starts with :mod:`multiprocessing` (``torch.multiprocessing.spawn`` among
them), counted so that a run whose training happens in them -- where this process's profiler cannot
see it -- is told so, instead of "the script ran 0 steps" alone.

DataLoader workers are left out: they load data for the training in this process.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
from collections.abc import Iterator

from perfscope.patches import replace


class Started:
    """How many non-DataLoader processes the script started (:attr:`count`)."""

    def __init__(self) -> None:
        self.count = 0


def _is_loader_worker(process) -> bool:
    target = getattr(process, "_target", None)
    return getattr(target, "__module__", "").startswith("torch.utils.data")


@contextlib.contextmanager
def counting() -> Iterator[Started]:
    """Count ``multiprocessing`` process starts while the block runs (every start method)."""
    started = Started()

    def counted(original):
        def start(self):
            if not _is_loader_worker(self):
                started.count += 1
            return original(self)

        return start

    with contextlib.ExitStack() as stack:
        replace(stack, multiprocessing.process.BaseProcess, "start", counted)
        yield started
