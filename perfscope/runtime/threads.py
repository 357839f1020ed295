"""Host threads: the ``intra_op_threads`` knob (``torch.set_num_threads``).

PyTorch runs each CPU operator on as many threads as the machine has cores (OpenMP's default).
DataLoader workers are processes that need cores too (each runs single-threaded: torch sets one
thread in a worker), and so does other work on a shared machine. When the training process's
threads, the workers and that work together ask for more cores than there are, every one of them
waits in turn: the measured step time then swings with whoever else runs (`docs/tune.md` shows a
4.5x and two "no gain" results of one command, and a steady 5.2x with one intra-op thread). The
knob sets the training process's intra-op threads; the tuner searches it with ``num_workers``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def set_intra_op_threads(threads: int | None) -> dict[str, str]:
    """``torch.set_num_threads(threads)`` (None: leave it); returns knob -> what was set."""
    if threads is None:
        return {}
    torch.set_num_threads(int(threads))
    return {"intra_op_threads": f"torch.set_num_threads({int(threads)})"}


@contextlib.contextmanager
def intra_op_threads(threads: int | None) -> Iterator[dict[str, str]]:
    """:func:`set_intra_op_threads` for a ``with`` block (a patched script run); the count found
    is put back after it."""
    saved = torch.get_num_threads()
    try:
        yield set_intra_op_threads(threads)
    finally:
        if threads is not None:
            torch.set_num_threads(saved)
