"""What each trace event is: categories and names mapped to a small set of kinds.

The rules cover the categories of current Kineto (``cpu_op``, ``kernel``, ``gpu_memcpy``...), the
capitalised ones of 2021-era traces (``Operator``, ``Kernel``, ``Memcpy``...), ROCm traces (HIP calls
recorded under ``cuda_runtime``), other accelerators' runtimes (``mtia_runtime``, ``xpu_runtime``,
``privateuse1_runtime``), Meta's MTIA device activity (``mtia_ccp_events``: ``dma*`` transfers are
copies, as Holistic Trace Analysis groups them, waits on an event are waits as CUDA's ``cuda_sync``
events are, every other one is a kernel), and both generations of
NCCL kernel names. They are pure functions over arrays of interned strings, so one call classifies
every distinct name once.
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
    # Runtimes of other accelerators (Kineto's activity types of the same role as cuda_runtime).
    "mtia_runtime": EventKind.RUNTIME,
    "xpu_runtime": EventKind.RUNTIME,
    "xpu_driver": EventKind.RUNTIME,
    "privateuse1_runtime": EventKind.RUNTIME,
    "privateuse1_driver": EventKind.RUNTIME,
    # MTIA's on-device command processor events: the device's kernels and DMA transfers.
    "mtia_ccp_events": EventKind.KERNEL,
}
# Categories Kineto writes that the analysis does not need: known, so never reported as unknown.
IGNORED_CATEGORIES = frozenset({
    "trace", "overhead", "cpu_instant_event", "external_correlation", "cuda_event", "cuda_profiler_range",
    "mtia_insight", "mtia_counters", "mtia_workloadd", "glow_runtime", "hpu_op", "collective_comm",
    "activity buffer request", "ac2g", "async_cpu_to_gpu", "fwdbwd", "async", "memory",
})
# Device events of these categories whose name starts with "dma" are copies (HTA's MTIA grouping);
# those named as a wait (``event_wait``...) are the device waiting on an event, as CUDA's
# ``cuda_sync`` events are: idle time, not device work.
_DMA_CATEGORIES = frozenset({"mtia_ccp_events"})
_DMA_RE = re.compile(r"^dma", re.IGNORECASE)
_DEVICE_WAIT_RE = re.compile(r"(^|_)wait", re.IGNORECASE)

GPU_KINDS = (EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET)
CPU_RANGE_KINDS = (EventKind.CPU_OP, EventKind.ANNOTATION)


def _flags(rx: re.Pattern, names: np.ndarray, how: str = "search") -> np.ndarray:
    """Per name, whether ``rx`` finds (``how="search"``) or starts (``"match"``) in it (bool array)."""
    test = getattr(rx, how)
    return np.array([bool(test(n)) for n in names], dtype=bool)


def kinds_of_categories(categories: np.ndarray) -> np.ndarray:
    """Map category strings (any case; ``None`` allowed) to :class:`EventKind` codes (int8)."""
    return np.array(
        [_CATEGORY_KIND.get(c.lower() if isinstance(c, str) else None, EventKind.OTHER) for c in categories],
        dtype=np.int8,
    )


def is_known_category(categories: np.ndarray) -> np.ndarray:
    """True for categories perfscope reads or knows it does not need (bool per entry)."""
    return np.array([isinstance(c, str) and (c.lower() in _CATEGORY_KIND or c.lower() in IGNORED_CATEGORIES)
                     for c in categories], dtype=bool)


def is_dma_category(categories: np.ndarray) -> np.ndarray:
    """True for device-event categories whose ``dma*`` events are copies (MTIA)."""
    return np.array([isinstance(c, str) and c.lower() in _DMA_CATEGORIES for c in categories], dtype=bool)


def is_dma_name(names: np.ndarray) -> np.ndarray:
    return _flags(_DMA_RE, names, "match")


def refine_device_kinds(kind: np.ndarray, cat_uniques: np.ndarray, cat_codes: np.ndarray, names: np.ndarray,
                        name_codes: np.ndarray) -> None:
    """Set, in place, the kinds of device events that their category alone does not tell (MTIA's
    command processor events): ``dma*`` transfers are copies, waits (``event_wait``) are
    :attr:`EventKind.SYNC`, the device-side view of a wait, as CUDA's ``cuda_sync`` events are.

    Args:
        kind: Per row, its kind from the category (:func:`kinds_of_categories`).
        cat_uniques, cat_codes: The distinct categories and each row's index into them.
        names, name_codes: The distinct names and each row's index into them.
    """
    if not len(kind):
        return
    device = is_dma_category(cat_uniques)[cat_codes] & (kind == EventKind.KERNEL)
    if not device.any():
        return
    kind[device & is_dma_name(names)[name_codes]] = EventKind.MEMCPY
    kind[device & _flags(_DEVICE_WAIT_RE, names)[name_codes]] = EventKind.SYNC


# ncclKernel_* (NCCL < 2.19), ncclDevKernel_* (newer), RCCL on ROCm uses the same names.
_COMM_KERNEL_RE = re.compile(r"nccl|rccl", re.IGNORECASE)
# Collective record functions as PyTorch names them: nccl:all_reduce, gloo:all_reduce, ...
_COLLECTIVE_RANGE_RE = re.compile(r"^(nccl|gloo|mpi|ucc|xccl|rccl):", re.IGNORECASE)
# ASCII digits only (``\d`` would read Arabic-Indic digits as a number), at most 18 (fits int64),
# no leading zero: torch writes ``ProfilerStep#7``, never ``#07``.
_STEP_RE = re.compile(r"^ProfilerStep#(0|[1-9][0-9]{0,17})$")
_STEP_LIKE_RE = re.compile(r"^ProfilerStep#")
_DATALOADER_RE = re.compile(r"DataLoader.*__next__|DataLoaderIter.*__next__")
_OPTIMIZER_STEP_RE = re.compile(r"^Optimizer\.step#")


def is_comm_kernel(names: np.ndarray) -> np.ndarray:
    """True for communication kernels (NCCL/RCCL), given kernel names."""
    return _flags(_COMM_KERNEL_RE, names)


def is_collective_range(names: np.ndarray) -> np.ndarray:
    """True for CPU record functions of collectives (``nccl:*``, ``gloo:*``, ...)."""
    return _flags(_COLLECTIVE_RANGE_RE, names, "match")


# perfscope's own range around a wait of the training thread for communication that it cannot hand
# back to the caller (the hierarchical all-reduce driving its pipeline at the last bucket).
COMM_WAIT_RANGE = "perfscope.comm_wait"


def is_comm_wait_range(names: np.ndarray) -> np.ndarray:
    """True for :data:`COMM_WAIT_RANGE`: the thread waits for communication, whatever encloses it."""
    return np.asarray([n == COMM_WAIT_RANGE for n in names], dtype=bool)


def is_dataloader_range(names: np.ndarray) -> np.ndarray:
    """True for DataLoader fetches: ``enumerate(DataLoader)#_...DataLoaderIter.__next__``."""
    return _flags(_DATALOADER_RE, names)


def is_optimizer_step_range(names: np.ndarray) -> np.ndarray:
    """True for ``Optimizer.step#SGD.step`` style ranges."""
    return _flags(_OPTIMIZER_STEP_RE, names, "match")


def profiler_step_numbers(names: np.ndarray) -> np.ndarray:
    """Step number of ``ProfilerStep#N`` names, -1 for every other name (int64).

    ``N`` must be 1 to 18 ASCII digits without a leading zero; a marker with anything else after
    the ``#`` is -2 (a step marker whose number does not parse, which the analysis reports).
    """
    out = np.full(len(names), -1, dtype=np.int64)
    for i, n in enumerate(names):
        m = _STEP_RE.match(n)
        if m:
            out[i] = int(m.group(1))
        elif _STEP_LIKE_RE.match(n):
            out[i] = -2
    return out


# Runtime calls that put work on the device (HTA's kernel-launch list, with the driver, HIP and
# MTIA spellings): a launch whose correlation finds no GPU event lost that event.
_KERNEL_LAUNCH_RE = re.compile(r"(cuda.*LaunchKernel|cuLaunchKernel|hipLaunchKernel|hipExtModuleLaunchKernel|"
                               r"hipModuleLaunchKernel|^runFunction)")
_GPU_WORK_CALL_RE = re.compile(r"(LaunchKernel|Memcpy|Memset|GraphLaunch|^runFunction)", re.IGNORECASE)
_GRAPH_LAUNCH_RE = re.compile(r"^(cuda|hip)GraphLaunch")
# Host calls that block until the device is done: where the GPU's queued work waits on the host.
_SYNC_CALL_RE = re.compile(r"^(cuda|hip)(Stream|Device|Event)Synchronize|^cuCtxSynchronize|^cuStreamSynchronize"
                           r"|^cuEventSynchronize|^(cuda|hip)Memcpy(?!Async)|^aten::_local_scalar_dense$|^aten::item$")
_STREAM_WAIT_RE = re.compile(r"^(cuda|hip)StreamWaitEvent|^cuStreamWaitEvent")
# One-time set-up of the device: context creation, module loading, device queries, and the first
# cudaFree / stream-priority query that trigger lazy CUDA initialisation.
_INIT_CALL_RE = re.compile(
    r"^(cuInit|cuDevicePrimaryCtxRetain|cuCtxCreate|cuModuleLoad|cuLibraryLoad|cudaGetDeviceCount|"
    r"cudaSetDevice|cudaGetDeviceProperties|cudaDeviceGetStreamPriorityRange|cudaFree$|cudaStreamCreate|"
    r"hipInit|hipGetDeviceCount|hipSetDevice|hipGetDeviceProperties|hipDeviceGetStreamPriorityRange|hipFree$|"
    r"hipModuleLoad|hipStreamCreate)"
)


def is_kernel_launch(names: np.ndarray) -> np.ndarray:
    """True for runtime calls that launch a kernel (``cudaLaunchKernel``, ``cuLaunchKernel``...)."""
    return _flags(_KERNEL_LAUNCH_RE, names)


def is_gpu_work_call(names: np.ndarray) -> np.ndarray:
    """True for runtime calls that put work on the device: launches, copies, memsets, graphs."""
    return _flags(_GPU_WORK_CALL_RE, names)


# Convolutions: ATen's operators (aten::conv2d, aten::convolution, aten::_convolution,
# aten::mkldnn_convolution, aten::cudnn_convolution...) and cuDNN/MIOpen kernels
# (implicit_convolve_sgemm, ...conv2d_..., miopenSp3AsmConv...); not aten::convert_* casts.
_CONVOLUTION_RE = re.compile(r"(?i)convolution|convolve|aten::conv(?:[123]d|_transpose[123]d|_tbc)?\b|conv[123]d|"
                             r"miopen\w*conv")


# FSDP's own ranges: FSDP2 (fully_shard) marks its steps "FSDP::pre_forward (0)", "FSDP::all_gather (1)"...;
# FSDP1 (FullyShardedDataParallel) "FullyShardedDataParallel.forward" and the like.
_FSDP2_RE = re.compile(r"^FSDP::")
_FSDP1_RE = re.compile(r"^FullyShardedDataParallel\.")


def fsdp_version(names: np.ndarray) -> int | None:
    """2 where FSDP2's ranges are among ``names`` (the distinct names of a trace), 1 for FSDP1's,
    else None."""
    if _flags(_FSDP2_RE, names, "match").any():
        return 2
    return 1 if _flags(_FSDP1_RE, names, "match").any() else None


def is_convolution(names: np.ndarray) -> np.ndarray:
    """True for a convolution: an ATen convolution operator or a convolution kernel."""
    return _flags(_CONVOLUTION_RE, names)


def is_graph_launch(names: np.ndarray) -> np.ndarray:
    """True for ``cudaGraphLaunch`` / ``hipGraphLaunch``: one call, many kernels."""
    return _flags(_GRAPH_LAUNCH_RE, names, "match")


def is_sync_call(names: np.ndarray) -> np.ndarray:
    """True for host calls that block until the device finishes: stream/device/event
    synchronisation, synchronous ``cudaMemcpy``, ``aten::item`` / ``_local_scalar_dense``."""
    return _flags(_SYNC_CALL_RE, names)


def is_stream_wait(names: np.ndarray) -> np.ndarray:
    """True for ``cudaStreamWaitEvent``: a stream told to wait for another stream's event."""
    return _flags(_STREAM_WAIT_RE, names)


def is_init_call(names: np.ndarray) -> np.ndarray:
    """True for one-time device set-up calls (context creation, module load, device queries)."""
    return _flags(_INIT_CALL_RE, names)


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
    ("h2d", CopyKind.HTOD),  # MTIA DMA names
    ("d2h", CopyKind.DTOH),
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
