"""What each trace event is: categories and names mapped to a small set of kinds.

The rules cover the categories of current Kineto (``cpu_op``, ``kernel``, ``gpu_memcpy``...), the
capitalised ones of 2021-era traces (``Operator``, ``Kernel``, ``Memcpy``...), ROCm traces (HIP calls
recorded under ``cuda_runtime``), and both generations of NCCL kernel names. They are pure functions
over arrays of interned strings, so one call classifies every distinct name once.
"""

from __future__ import annotations

import re
from enum import IntEnum

import numpy as np


class EventKind(IntEnum):
    """Kind of a duration event (``ph == "X"``)."""

    OTHER = 0
    CPU_OP = 1  # aten ops and other operators on a CPU thread
    ANNOTATION = 2  # record_function ranges on a CPU thread: ProfilerStep#N, DataLoader, nccl:*
    RUNTIME = 3  # CUDA/HIP runtime and driver calls (launches, memcpy calls, syncs)
    KERNEL = 4
    MEMCPY = 5
    MEMSET = 6
    GPU_ANNOTATION = 7  # record_function ranges projected onto a GPU stream
    PYTHON = 8  # python_function events (with_stack)
    SYNC = 9  # cuda_sync: the GPU-side view of a synchronisation


_CATEGORY_KIND = {
    "cpu_op": EventKind.CPU_OP,
    "operator": EventKind.CPU_OP,
    "user_annotation": EventKind.ANNOTATION,
    "cuda_runtime": EventKind.RUNTIME,
    "cuda_driver": EventKind.RUNTIME,
    "runtime": EventKind.RUNTIME,
    "kernel": EventKind.KERNEL,
    "gpu_memcpy": EventKind.MEMCPY,
    "memcpy": EventKind.MEMCPY,
    "gpu_memset": EventKind.MEMSET,
    "memset": EventKind.MEMSET,
    "gpu_user_annotation": EventKind.GPU_ANNOTATION,
    "python_function": EventKind.PYTHON,
    "cuda_sync": EventKind.SYNC,
}

GPU_KINDS = (EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET)
CPU_RANGE_KINDS = (EventKind.CPU_OP, EventKind.ANNOTATION)


def kinds_of_categories(categories: np.ndarray) -> np.ndarray:
    """Map category strings (any case; ``None`` allowed) to :class:`EventKind` codes (int8)."""
    return np.array(
        [_CATEGORY_KIND.get(c.lower() if isinstance(c, str) else None, EventKind.OTHER) for c in categories],
        dtype=np.int8,
    )


# ncclKernel_* (NCCL < 2.19), ncclDevKernel_* (newer), RCCL on ROCm uses the same names.
_COMM_KERNEL_RE = re.compile(r"nccl|rccl", re.IGNORECASE)
# Collective record functions as PyTorch names them: nccl:all_reduce, gloo:all_reduce, ...
_COLLECTIVE_RANGE_RE = re.compile(r"^(nccl|gloo|mpi|ucc|xccl|rccl):", re.IGNORECASE)
_STEP_RE = re.compile(r"^ProfilerStep#(\d{1,18})$")  # at most 18 digits: fits int64
_DATALOADER_RE = re.compile(r"DataLoader.*__next__|DataLoaderIter.*__next__")
_OPTIMIZER_STEP_RE = re.compile(r"^Optimizer\.step#")


def is_comm_kernel(names: np.ndarray) -> np.ndarray:
    """True for communication kernels (NCCL/RCCL), given kernel names."""
    return np.array([bool(_COMM_KERNEL_RE.search(n)) for n in names], dtype=bool)


def is_collective_range(names: np.ndarray) -> np.ndarray:
    """True for CPU record functions of collectives (``nccl:*``, ``gloo:*``, ...)."""
    return np.array([bool(_COLLECTIVE_RANGE_RE.match(n)) for n in names], dtype=bool)


def is_dataloader_range(names: np.ndarray) -> np.ndarray:
    """True for DataLoader fetches: ``enumerate(DataLoader)#_...DataLoaderIter.__next__``."""
    return np.array([bool(_DATALOADER_RE.search(n)) for n in names], dtype=bool)


def is_optimizer_step_range(names: np.ndarray) -> np.ndarray:
    """True for ``Optimizer.step#SGD.step`` style ranges."""
    return np.array([bool(_OPTIMIZER_STEP_RE.match(n)) for n in names], dtype=bool)


def profiler_step_numbers(names: np.ndarray) -> np.ndarray:
    """Step number of ``ProfilerStep#N`` names, -1 for every other name (int64)."""
    out = np.full(len(names), -1, dtype=np.int64)
    for i, n in enumerate(names):
        m = _STEP_RE.match(n)
        if m:
            out[i] = int(m.group(1))
    return out


class CopyKind(IntEnum):
    """Direction of a memcpy, from its name (``Memcpy HtoD (Pinned -> Device)``)."""

    NONE = 0  # not a memcpy
    HTOD = 1
    DTOH = 2
    DTOD = 3
    PTOP = 4
    OTHER = 5


_COPY_DIRECTIONS = (
    ("htod", CopyKind.HTOD),
    ("dtoh", CopyKind.DTOH),
    ("dtod", CopyKind.DTOD),
    ("ptop", CopyKind.PTOP),
)


def copy_kind_of_names(names: np.ndarray) -> np.ndarray:
    """:class:`CopyKind` codes (int8) for memcpy names; OTHER when no direction is named."""
    out = np.full(len(names), CopyKind.OTHER, dtype=np.int8)
    for i, n in enumerate(names):
        low = n.lower().replace(" ", "")
        for token, kind in _COPY_DIRECTIONS:
            if token in low:
                out[i] = kind
                break
    return out


def is_pageable_copy(names: np.ndarray) -> np.ndarray:
    """True where a memcpy name says a side is pageable host memory (a blocking, slow copy)."""
    return np.array(["pageable" in n.lower() for n in names], dtype=bool)
