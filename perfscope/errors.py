"""The package's exceptions.

Every error that a user's input can cause derives from :class:`PerfscopeError`; the CLI prints
its message as one line on stderr and exits non-zero, so messages say what is wrong, why, and how
to fix it. ``assert`` is kept for internal invariants.
"""

import re

# A script's error message that says it ran out of memory: PyTorch's (torch.OutOfMemoryError, "CUDA
# out of memory"), Python's MemoryError, and the C library's / allocator's words for a failed
# allocation. A trial or measured run failing so is "oom", not a crash (perfscope.measure.runner,
# perfscope.tuner.trial).
OOM_MESSAGE = re.compile(r"OutOfMemoryError|MemoryError|out of memory|can't allocate memory|cannot allocate memory|"
                         r"not enough memory", re.IGNORECASE)


class PerfscopeError(Exception):
    """Root of perfscope's errors: a problem with the user's input or environment."""


class TraceFormatError(PerfscopeError, ValueError):
    """A trace file is not a readable Kineto (PyTorch profiler) trace."""


class AnalysisError(PerfscopeError, ValueError):
    """Traces were read but cannot be analyzed together (e.g. ranks disagree on steps)."""
