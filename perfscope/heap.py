"""Give the pages that the C heap holds free back to the operating system.

Reading and analyzing a trace allocate a lot that is freed again: each batch's text, the decoded
events' larger objects (CPython hands everything over 512 bytes to the C allocator), numpy and
pandas temporaries. glibc's ``malloc`` keeps the freed pages mapped for later use, so the
process's resident size stays at the analysis's peak for the rest of the command, and the report's
imports (matplotlib) are added on top of it.
``malloc_trim(0)`` hands the free pages back (glibc 2.8 and later also releases free pages in the
middle of the heap, not only at its top). Dask's workers do the same after a task, for the same
reason (``distributed``'s "memory not released back to the OS" notes). Measured on the A100 rank
(35 MB of trace text): the process held 94 MiB instead of 139 MiB when the report started, and the
call takes a few milliseconds.

:func:`map_large_blocks` keeps that from being needed for large blocks: glibc serves a block of
at least ``M_MMAP_THRESHOLD`` bytes by a mapping of its own, unmapped when freed, but raises that
threshold (up to 32 MiB) each time such a block is freed, after which the per-row arrays of a
large trace (4 to 32 MiB a column per million rows) come from the heap and stay resident once
freed. A fixed threshold turns the raising off (``mallopt(3)``: setting it disables the dynamic
adjustment). Measured on a 2 GB trace (4.3 million events), resident size after the read 210 MiB
instead of 317 MiB with the same arrays alive, peak 397 MiB instead of 414 MiB.
"""

from __future__ import annotations

import sys
from functools import cache


@cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where there is none (musl, macOS, Windows, or a Python
    built without ctypes)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (ImportError, OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
LARGE_BLOCK = 256 * 1024  # bytes; glibc's own starting threshold is 128 KiB


@cache
def map_large_blocks() -> bool:
    """Serve every block of :data:`LARGE_BLOCK` bytes or more by a mapping of its own, so that
    freeing it returns its pages at once (module docstring). Process-wide, once; for a command
    that analyzes large traces, not for a library call inside someone else's program.

    Returns:
        True when glibc took the setting, False elsewhere (nothing is done then). Never raises.
    """
    if _malloc_trim() is None:  # not glibc
        return False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (ImportError, OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK) == 1


def release_free_memory() -> bool:
    """Return the C heap's free pages to the operating system (``malloc_trim(0)``).

    Returns:
        True when ``malloc_trim`` ran, False where the C library has none (nothing is done then).
        Never raises.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)  # its result says little: glibc returns 1 almost always
    return True
