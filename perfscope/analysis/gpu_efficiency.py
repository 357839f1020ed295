"""How well the kernels of the counted steps use the GPU (``details.gpu_efficiency``,
``docs/metrics.md`` GPU efficiency).

From what Kineto writes per kernel at launch (``blocks per SM``, ``est. achieved occupancy %``:
estimates from the grid, the block and the device, not hardware counters) and the kernels' names:

* estimated SM efficiency: the share of the counted steps' time an SM had work, each kernel's time
  weighted by its blocks per SM capped at 1 (a kernel of 40 blocks on 80 SMs keeps half of them idle);
* estimated achieved occupancy: the kernels' occupancy weighted by their time;
* Tensor Core share: the share of kernel time in kernels whose names say they run on Tensor Cores
  (:data:`TENSOR_CORE_PATTERN`; a name-based rule, so a kernel it does not know counts as not).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from perfscope.trace.events import NO_FIGURE, SM_FILL_SCALE
from perfscope.trace.kinds import EventKind
from perfscope.trace.header import Device
from perfscope.trace.table import TraceTable
from perfscope.record.schema import GpuEfficiency

if TYPE_CHECKING:
    from perfscope.analysis.rank_trace import RankTrace

# Kernel-name fragments of matrix-multiply-accumulate kernels, the ones that run on Tensor Cores:
# cuBLAS/cuDNN tile shapes of the MMA instruction (Volta h884/s884, Turing/Ampere 1688 and 16816,
# int8 8816 and imma), CUTLASS's tensorop kernels, the xmma/hmma/gmma families of cuDNN, cuBLASLt
# and Hopper (wgmma), and fused attention kernels built on MMA (flash, fmha, cutlass mem-efficient).
TENSOR_CORE_PATTERN = re.compile(
    r"884|1688|16816|8816|hmma|imma|xmma|wgmma|gmma|tensorop|tensor_?core|flash_?(fwd|bwd|attn)|fmha|"
    r"mma_sync|cutlass.*(f16|bf16|tf32)",
    re.IGNORECASE)
MIN_TENSOR_CORE_CAPABILITY = 7  # compute capability 7.0 (Volta) is the first with Tensor Cores


def tensor_core_names(names: np.ndarray) -> np.ndarray:
    """Per name (object array of str), whether it is a Tensor Core kernel's (bool array)."""
    return np.fromiter((bool(TENSOR_CORE_PATTERN.search(str(n))) for n in names), bool, len(names))


def kernel_sums(t: TraceTable, kernels: np.ndarray, window_us: float) -> dict:
    """The sums one trace contributes: its kernels' time (µs) in all, with launch figures, weighted
    by SM fill and by occupancy, on Tensor Cores; and the counted steps' time ``window_us``.

    Args:
        t: The trace.
        kernels: Rows of the counted steps' kernels (int array).
        window_us: Total time of the counted steps' windows (µs).
    """
    dur = t.dur_ns[kernels] / 1000.0
    sums = {"window_us": float(window_us), "kernel_us": float(dur.sum()), "figured_us": 0.0, "sm_busy_us": 0.0,
            "occupancy_us": 0.0, "tensor_core_us": 0.0, "tensor_core_kernels": 0}
    if t.sm_fill is not None and t.occupancy is not None:
        fill, occ = t.sm_fill[kernels], t.occupancy[kernels]
        known = (fill != NO_FIGURE) & (occ != NO_FIGURE)
        sums["figured_us"] = float(dur[known].sum())
        sums["sm_busy_us"] = float((dur[known] * fill[known] / SM_FILL_SCALE).sum())
        sums["occupancy_us"] = float((dur[known] * occ[known] / 100.0).sum())
    tc = tensor_core_names(t.names)[t.name_id[kernels]]
    sums["tensor_core_us"] = float(dur[tc].sum())
    sums["tensor_core_kernels"] = int(tc.sum())
    return sums


def _nvidia(d: Device) -> bool:
    # ROCm writes its devices in the same fields (an MI250 as computeMajor 9, warpSize 64)
    return d.warp_size in (None, 32) and not re.search(r"AMD|Radeon|Instinct", d.name or "")


def capability(t: TraceTable) -> float | None:
    """The highest CUDA compute capability in the trace's ``deviceProperties`` (7.0, 8.0...), or
    None (no properties, or not NVIDIA devices)."""
    caps = [d.compute_major + (d.compute_minor or 0) / 10 for d in t.device_properties
            if d.compute_major is not None and _nvidia(d)]
    return max(caps) if caps else None


def no_tensor_cores(rank_traces: list[RankTrace]) -> float | None:
    """The compute capability (7.0 or more) of GPUs whose traces ran kernels, none of them on Tensor
    Cores (:data:`TENSOR_CORE_PATTERN`): the one rule of the finding, in ``details.facts``
    and ``details.gpu_efficiency``; None otherwise."""
    caps = []
    for rt in rank_traces:
        t = rt.table
        used = np.unique(t.name_id[t.kind == EventKind.KERNEL])
        cap = capability(t)
        if used.size and cap is not None and cap >= MIN_TENSOR_CORE_CAPABILITY:
            if tensor_core_names(t.names[used]).any():
                return None
            caps.append(cap)
    return max(caps) if caps else None


def gpu_efficiency(parts: list[dict], capabilities: list[float | None], no_tensor_cores: float | None) -> GpuEfficiency | None:
    """``details.gpu_efficiency`` from each trace's :func:`kernel_sums`; None without kernels.

    Returns:
        ``kernel_us``, ``window_us``; ``sm_efficiency`` (SM-busy time over the window time, None
        without launch figures), ``achieved_occupancy`` (0-1, time-weighted, None likewise),
        ``figured_share`` (kernel time with launch figures), ``tensor_core_share`` (of kernel
        time), ``tensor_core_kernels``, ``capability`` (the highest compute capability, None when
        the traces have no ``deviceProperties``) and ``no_tensor_cores`` (True when the run's
        fact of that name, :func:`no_tensor_cores`, is set).
    """
    total = {k: sum(p[k] for p in parts) for k in parts[0]} if parts else None
    if not total or total["kernel_us"] <= 0:
        return None
    figured = total["figured_us"]
    cap = max((c for c in capabilities if c is not None), default=None)
    tc_share = total["tensor_core_us"] / total["kernel_us"]
    return GpuEfficiency(
        kernel_us=total["kernel_us"], window_us=total["window_us"],
        sm_efficiency=min(1.0, total["sm_busy_us"] / total["window_us"]) if figured and total["window_us"] > 0 else None,
        achieved_occupancy=total["occupancy_us"] / figured if figured else None,
        figured_share=figured / total["kernel_us"],
        tensor_core_share=tc_share, tensor_core_kernels=total["tensor_core_kernels"],
        capability=cap,
        no_tensor_cores=no_tensor_cores is not None)
