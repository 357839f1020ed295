"""Model FLOPs utilisation: the FLOPs a step does over its time, against the hardware's peak.

FLOPs per step come from one of two places, the first that a trace has:

1. **counted**: ``perfscope profile`` counted one start-up step with ``FlopCounterMode``
   (:mod:`perfscope.collect.flops`; the trace header's :mod:`perfscope.record.step_flops` record);
2. **shapes**: the operators' ``Input Dims`` (``record_shapes=True``), through the formulas of
   :data:`FORMULAS` (matrix products and, from their backward operators, convolutions), averaged
   over the counted steps.

The peak is the device's dense rate for the math the step ran in (:data:`GPU_PEAKS`, from the
vendors' data sheets) or, on a CPU, ``cores x GHz x FLOPs per cycle`` (:func:`cpu_peak`). Every
assumption is listed with the figure (``docs/metrics.md``, Model FLOPs utilisation).
"""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import orjson

from perfscope.record.schema import Mfu, MfuOperator

# --- FLOPs from operator shapes ------------------------------------------------------------------


def _prod(dims) -> int:
    return math.prod(int(d) for d in dims)


def _mm(d):  # [[m, k], [k, n]]
    (m, k), (_, n) = d[0], d[1]
    return 2 * m * k * n


def _addmm(d):  # [[bias], [m, k], [k, n], ...]
    return _mm(d[1:3])


def _bmm(d):  # [[b, m, k], [b, k, n]]
    (b, m, k), (_, _, n) = d[0], d[1]
    return 2 * b * m * k * n


def _baddbmm(d):  # [[...], [b, m, k], [b, k, n], ...]
    return _bmm(d[1:3])


def _conv_backward(grad_out, weight):
    # forward, input gradient and weight gradient: each 2 x (output elements) x (Cin/groups x kernel)
    return 3 * 2 * _prod(grad_out) * _prod(weight[1:])


# Leaf operators only (aten::linear and aten::matmul call these): no FLOP is counted twice. A
# convolution's output size is not in its forward's Input Dims (stride and padding are lists the
# trace does not keep) but is its backward's grad_output: training steps are counted there.
FORMULAS = {
    "aten::mm": _mm,
    "aten::addmm": _addmm,
    "aten::bmm": _bmm,
    "aten::baddbmm": _baddbmm,
    "aten::convolution_backward": lambda d: _conv_backward(d[0], d[2]),  # [grad_out, input, weight, ...]
    "aten::cudnn_convolution_backward": lambda d: _conv_backward(d[1], d[2]),  # 2021: [input, grad_out, weight, ...]
}
# Forward convolutions: counted only through their backward (above); a trace that has them and no
# backward (inference) gets no figure from shapes.
CONVOLUTIONS = ("aten::convolution", "aten::cudnn_convolution", "aten::mkldnn_convolution")


def shape_flops(name: str, dims_json: str) -> float | None:
    """FLOPs of one call of ``name`` with ``Input Dims`` ``dims_json``; None without a formula
    or for dims the formula cannot read."""
    formula = FORMULAS.get(name)
    if formula is None or not dims_json:
        return None
    try:
        return float(formula(orjson.loads(dims_json)))
    except (ValueError, TypeError, IndexError, orjson.JSONDecodeError):
        return None


def flops_from_shapes(operators) -> tuple[float, dict[str, float]] | None:
    """(FLOPs per counted step, FLOPs by operator per step) of one trace's operator frame
    (:func:`perfscope.analysis.operator_view.operator_steps`: ``step``, ``name``, ``shape``,
    ``calls``); None when it holds no operator with a formula and shapes, or convolutions
    whose FLOPs it cannot tell (forward only)."""
    if operators is None or not len(operators):
        return None
    names = set(operators["name"].unique())
    if "aten::convolution_backward" in names:
        names.discard("aten::cudnn_convolution_backward")  # the same calls, nested
    pairs = operators[operators["name"].isin(names & set(FORMULAS))]
    pairs = pairs.groupby(["name", "shape"], sort=False)["calls"].sum()
    by_op: Counter = Counter()
    for (name, shape), calls in pairs.items():
        f = shape_flops(name, shape)
        if f is not None:
            by_op[name] += f * float(calls)
    has_conv_forward = bool(names & set(CONVOLUTIONS))
    has_conv_backward = bool(names & {"aten::convolution_backward", "aten::cudnn_convolution_backward"})
    steps = operators["step"].nunique()
    if not by_op or not steps or (has_conv_forward and not has_conv_backward):
        return None
    return sum(by_op.values()) / steps, {k: v / steps for k, v in by_op.items()}


# --- peaks ----------------------------------------------------------------------------------------

# Dense TFLOPS (no sparsity) by device name pattern, first match wins, from the vendors' data
# sheets (NVIDIA A100, H100, H200, V100, A10, L4, L40S, T4; AMD Instinct MI300X, MI250X). A math
# a device has no unit for (TF32 before Ampere, BF16 on V100/T4) is absent: FP32 stands in.
GPU_PEAKS = (
    (r"H100.*PCIe", {"fp64": 26.0, "fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0}),
    (r"H100|H200|GH200", {"fp64": 34.0, "fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    (r"A100", {"fp64": 9.7, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    (r"V100.*PCIE", {"fp64": 7.0, "fp32": 14.0, "fp16": 112.0}),
    (r"V100", {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0}),
    (r"L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.1, "fp16": 362.1}),
    (r"\bL4\b", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    (r"\bA10\b", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    (r"\bT4\b", {"fp32": 8.1, "fp16": 65.0}),
    (r"MI300X", {"fp64": 81.7, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4}),
    (r"MI250X", {"fp64": 95.7, "fp32": 95.7, "bf16": 383.0, "fp16": 383.0}),
)


def gpu_peak(device: str | None, math_mode: str) -> tuple[float, str] | None:
    """(TFLOPS, which math's peak) of the named GPU for ``math_mode``; None when unknown."""
    if not device:
        return None
    for pattern, peaks in GPU_PEAKS:
        if re.search(pattern, device, re.IGNORECASE):
            mode = math_mode if math_mode in peaks else "fp32"
            return (peaks[mode], mode) if mode in peaks else None
    return None


def cpu_flops_per_cycle(flags: list[str], vendor: str | None, math_mode: str) -> tuple[int, str]:
    """FLOPs a core completes per cycle for ``math_mode`` from its vector flags, and the
    assumption behind it: two fused multiply-add units per core, each of the vector's width
    (AVX-512 on AMD Zen 4 runs on 256-bit units); bf16 at twice the fp32 rate with AVX-512 BF16,
    1,024 per cycle on AMX tiles; fp64 at half the fp32 rate."""
    f = set(flags)
    if math_mode == "bf16" and "amx_bf16" in f:
        return 1024, "AMX tiles: 1,024 bf16 FLOPs a cycle"
    if "avx512f" in f and vendor != "AuthenticAMD":
        fp32, how = 64, "two 512-bit FMA units"
    elif "avx512f" in f or ("avx2" in f and "fma" in f):
        fp32, how = 32, "two 256-bit FMA units" + (" (AVX-512 on AMD runs on them)" if "avx512f" in f else "")
    elif "asimd" in f or "sve" in f:
        fp32, how = 16, "two 128-bit FMA units"
    else:
        fp32, how = 8, "no FMA vector flag: 8 fp32 FLOPs a cycle"
    if math_mode == "bf16" and "avx512_bf16" in f:
        return 2 * fp32, how + ", bf16 dot products at twice the fp32 rate"
    if math_mode == "fp64":
        return fp32 // 2, how + ", fp64 at half the fp32 rate"
    return fp32, how + (", bf16 computed at the fp32 rate" if math_mode in ("bf16", "fp16") else "")


def cpu_peak(cpu, math_mode: str) -> tuple[float, list[str]] | None:
    """(TFLOPS, assumptions) of the cores a process could use (:class:`perfscope.record.step_flops.CpuFacts`)."""
    if cpu is None or not cpu.cores or not cpu.ghz:
        return None
    per_cycle, how = cpu_flops_per_cycle(cpu.flags, cpu.vendor, math_mode)
    tflops = cpu.cores * cpu.ghz * 1e9 * per_cycle / 1e12
    return tflops, [f"CPU peak: {cpu.cores} physical core(s) x {cpu.ghz:.2f} GHz ({cpu.ghz_source}) x {per_cycle} "
                    f"{math_mode} FLOPs a cycle ({how}); no turbo, no other work on the cores"]


# --- the math a step ran in --------------------------------------------------------------------------

_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float64": "fp64"}
_MATH_KERNEL = re.compile(r"gemm|conv|cutlass|xmma|wgrad|dgrad|fprop", re.I)
_KERNEL_MATH = (("bf16", re.compile(r"bf16", re.I)), ("fp16", re.compile(r"f16|fp16|h884|h1688|h16816|hgemm", re.I)),
                ("tf32", re.compile(r"tf32|s1688|s16816|xmma_gemm_f32f32", re.I)))


def math_of_kernels(names, durations) -> str | None:
    """The math most kernel time ran in, from the names of GEMM and convolution kernels (bf16,
    fp16, tf32), else fp32; None without such kernels."""
    per_name: Counter = Counter()
    for name, dur in zip(names, durations):  # each distinct name's regexes once, not each kernel's
        per_name[str(name)] += float(dur)
    time: Counter = Counter()
    for n, dur in per_name.items():
        if not _MATH_KERNEL.search(n):
            continue
        time[next((m for m, pattern in _KERNEL_MATH if pattern.search(n)), "fp32")] += dur
    return time.most_common(1)[0][0] if time else None


def _counted_math(by_dtype: dict[str, float]) -> str | None:
    if not by_dtype:
        return None
    dtype = max(by_dtype, key=by_dtype.get)
    return _DTYPES.get(dtype, "fp32")


# --- the view --------------------------------------------------------------------------------------


def _flops_of_traces(rank_traces) -> dict:
    """Per trace, the FLOPs a step (counted, else from shapes) and what the figure rests on."""
    found = {"per_rank": [], "by_op": Counter(), "source": None, "step": None, "cpu": None, "math": Counter(),
             "devices": Counter()}
    for rt in rank_traces:
        counted = rt.table.flops
        if counted is not None and counted.flops:
            found["per_rank"].append(counted.flops)
            found["by_op"].update({k.replace("aten.", "aten::"): v for k, v in counted.by_operator.items()})
            found.update(source="counted", step=counted.step, cpu=counted.cpu or found["cpu"])
            found["math"][_counted_math(counted.by_dtype) or "fp32"] += counted.flops
            if counted.device:
                found["devices"][counted.device] += 1
            continue
        shapes = flops_from_shapes(rt.operators)
        if shapes is not None:
            found["per_rank"].append(shapes[0])
            found["by_op"].update(shapes[1])
            found["source"] = found["source"] or "shapes"
        names = [d.name for d in rt.table.device_properties if d.name]
        found["devices"].update(names[:1])
    return found


def _math_and_notes(found: dict, kernel_math: str | None, mode: str) -> tuple[str, list[str]]:
    """The math the step ran in, and the assumptions behind the FLOPs and the math."""
    math_mode = (found["math"].most_common(1)[0][0] if found["math"] else None) or kernel_math or "fp32"
    if math_mode == "fp32" and kernel_math == "tf32" and mode == "gpu":
        math_mode = "tf32"  # fp32 tensors multiplied on Tensor Cores (TF32 allowed)
    if found["source"] == "counted":
        notes = [f"FLOPs of step {found['step']} as torch.utils.flop_counter counts them (matrix products, "
                 "convolutions, attention; elementwise work not counted), the same in every step"]
    else:
        notes = ["FLOPs from the operators' input shapes: matrix products (aten::mm, addmm, bmm, baddbmm) and "
                 "convolutions through their backward (forward + both gradients); other operators not counted"]
    if found["math"]:
        notes.append(f"math: {math_mode}, the dtype of most counted FLOPs"
                     + (" on Tensor Cores (TF32 kernels in the trace)" if math_mode == "tf32" else ""))
    else:
        notes.append(f"math: {math_mode}, from the GEMM and convolution kernels' names" if kernel_math else
                     "math: fp32 (the trace does not say; no GEMM kernel names to tell)")
    return math_mode, notes


def _peak(mode: str, device: str | None, math_mode: str, cpu) -> tuple[float | None, str | None, list[str], str | None]:
    """(TFLOPS, its math, assumptions, why there is none) of the GPU or the CPU."""
    if mode == "gpu":
        found = gpu_peak(device, math_mode)
        if found is None:
            return None, None, [], f"no peak known for {device or 'an unnamed device'} (docs/metrics.md lists the devices)"
        peak, peak_math = found
        return peak, peak_math, [f"peak: {peak:g} TFLOPS dense {peak_math} of {device} (vendor data sheet, boost clock)"], None
    found = cpu_peak(cpu, math_mode)
    if found is None:
        return None, None, [], "no CPU peak: the trace does not say which CPU ran it (perfscope profile records it)"
    return found[0], math_mode, found[1], None


def mfu_view(rank_traces, ranks: list[int], step_time_us: float | None, mode: str, kernel_math: str | None) -> Mfu | None:
    """``details.mfu``: FLOPs per step, achieved rate, peak and utilisation, with assumptions.

    Args:
        rank_traces: Every analyzed trace (:class:`perfscope.analysis.rank_trace.RankTrace`).
        ranks: Their ranks.
        step_time_us: The run's step time (µs; the job's, over the counted steps).
        mode: ``gpu`` or ``cpu``.
        kernel_math: The math the GPU kernels ran in (:func:`math_of_kernels`), or None.

    Returns:
        None when no trace has FLOPs (neither counted nor shapes with a formula); else
        ``flops_per_step`` (mean over the ranks with a figure), ``source`` (``counted`` or
        ``shapes``), ``counted_step``, ``ranks``, ``top_operators`` (``name``, ``flops``,
        ``share``), ``math``, ``device``, ``step_time_s``, ``achieved_tflops`` (per rank),
        ``peak_tflops``, ``peak_math``, ``mfu`` (achieved over peak; None with ``why`` when the
        peak or the step time is unknown) and ``assumptions``.
    """
    found = _flops_of_traces(rank_traces)
    per_rank, by_op = found["per_rank"], found["by_op"]
    if not per_rank:
        return None
    flops = float(np.mean(per_rank))
    total = sum(by_op.values()) or 1.0
    top = [MfuOperator(name=k, flops=float(v) / len(per_rank), share=float(v) / total) for k, v in by_op.most_common(8)]
    math_mode, assumptions = _math_and_notes(found, kernel_math, mode)
    device = found["devices"].most_common(1)[0][0] if found["devices"] else None
    peak, peak_math, notes, why = _peak(mode, device, math_mode, found["cpu"])
    seconds = step_time_us / 1e6 if step_time_us else None
    achieved = flops / seconds / 1e12 if seconds else None
    if seconds is None:
        why = why or "no step time: no counted step"
    return Mfu(flops_per_step=flops, source=found["source"], counted_step=found["step"], ranks=len(per_rank),
               top_operators=top, math=math_mode, device=device, step_time_s=seconds, achieved_tflops=achieved,
               peak_tflops=peak, peak_math=peak_math, mfu=achieved / peak if achieved is not None and peak else None,
               why=None if peak and achieved else why, assumptions=assumptions + notes)


def mfu_line(view: Mfu) -> str:
    """The record's ``details.mfu`` in one sentence (the console and the report print it)."""
    flops = view.flops_per_step or 0.0
    where = (f"counted in step {view.counted_step}" if view.source == "counted"
             else "from the operators' input shapes")
    head = f"{flops / 1e9:,.2f} GFLOP a step ({where})"
    if view.mfu is None:
        return f"{head}; MFU not computed: {view.why}"
    what = view.device or "the CPU"
    return (f"{view.mfu:.1%} of {what}'s {view.peak_math} peak ({view.achieved_tflops or 0.0:,.3g} of "
            f"{view.peak_tflops or 0.0:,.4g} TFLOPS); {head}")
