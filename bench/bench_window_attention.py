"""Benchmark: fused_ops.window_attention forward+backward against its eager twin and against
torch.compile of the twin, at Swin-T stage-1 shapes (512 windows of 49 tokens, C = 96, 3 heads of 32).

The variants run interleaved (A B C A B C ...) for ``--rounds`` rounds of ``--reps`` calls each,
so a busy machine slows all of them alike; each round's time per call is kept and the medians'
ratios are printed. Targets (issue): at least 1.6x over eager and 1.15x over torch.compile, fp32 on
CPU; bf16 is measured too. Unshifted and shifted blocks (Swin-T's real shift mask) are measured
apart and as the pair Swin alternates; ``sdpa`` is the CUDA path's formulation run on the CPU;
``aten`` is the operator with its CPU kernel off (``fused_ops.native.off``): its ATen formulation,
what runs where the kernel cannot be built.

    python bench/bench_window_attention.py [--rounds 7] [--reps 5] [--dtype fp32|bf16|both] [--no-compile]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from perfscope.fused_ops import window_attention, window_attention_reference  # noqa: E402
from perfscope.fused_ops.swin import shift_mask  # noqa: E402
from perfscope.fused_ops import native  # noqa: E402
from perfscope.fused_ops.attention import window_attention_sdpa  # noqa: E402

WINDOWS, TOKENS, HEADS, HEAD_DIM, IMAGES = 64, 49, 3, 32, 8  # 8 images x 64 windows = 512 windows


def make_inputs(dtype, shifted: bool):
    g = torch.Generator().manual_seed(0)
    shape = (IMAGES * WINDOWS, HEADS, TOKENS, HEAD_DIM)
    q, k, v = (torch.randn(shape, generator=g).to(dtype).requires_grad_() for _ in range(3))
    bias = (0.5 * torch.randn(HEADS, TOKENS, TOKENS, generator=g)).to(dtype).requires_grad_()
    # Swin-T stage 1: a 56 x 56 token grid in 7 x 7 windows, the odd blocks shifted by 3.
    mask = shift_mask(56, 56, 7, 3).to(dtype) if shifted else None
    grad = torch.randn(shape, generator=g).to(dtype)
    return q, k, v, bias, mask, grad


def step(fn, q, k, v, bias, mask, grad) -> None:
    for t in (q, k, v, bias):
        t.grad = None
    with native.off() if fn is aten else contextlib.nullcontext():  # the backward runs here too
        fn(q, k, v, bias, mask).backward(grad)


def aten(q, k, v, bias, mask):
    """The operator's ATen formulation (its kernel off, forward and backward: see step)."""
    return window_attention(q, k, v, bias, mask)


def measure(variants: dict, args_, rounds: int, reps: int) -> dict[str, list[float]]:
    times = {name: [] for name in variants}
    for fn in variants.values():  # warm-up (and compilation)
        for _ in range(2):
            step(fn, *args_)
    for _ in range(rounds):
        for name, fn in variants.items():
            start = time.perf_counter()
            for _ in range(reps):
                step(fn, *args_)
            times[name].append((time.perf_counter() - start) / reps)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", choices=("fp32", "bf16", "both"), default="both")
    ap.add_argument("--no-compile", action="store_true", help="leave out torch.compile of the reference")
    opts = ap.parse_args()
    print(f"CPU kernel: {native.status()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {IMAGES * WINDOWS} windows x {TOKENS} "
          f"tokens, {HEADS} heads x {HEAD_DIM}; forward + backward, ms per call (median of {opts.rounds} rounds)")
    dtypes = {"fp32": [torch.float32], "bf16": [torch.bfloat16], "both": [torch.float32, torch.bfloat16]}[opts.dtype]
    for dtype in dtypes:
        pair = {}
        for shifted in (False, True):
            variants = {"eager": window_attention_reference, "fused": window_attention, "aten": aten,
                        "sdpa": window_attention_sdpa}
            if not opts.no_compile:
                variants["compiled"] = torch.compile(window_attention_reference, dynamic=False)
            times = measure(variants, make_inputs(dtype, shifted), opts.rounds, opts.reps)
            med = {name: statistics.median(t) for name, t in times.items()}
            for name, m in med.items():
                pair[name] = pair.get(name, 0.0) + m
            report(f"{str(dtype).removeprefix('torch.')} {'shifted' if shifted else 'unshifted'}", med)
        report(f"{str(dtype).removeprefix('torch.')} block pair (one of each, as Swin alternates)", pair)


def report(label: str, med: dict[str, float]) -> None:
    line = ", ".join(f"{name} {1000 * m:.2f} ms" for name, m in med.items())
    ratios = f"fused/eager {med['eager'] / med['fused']:.2f}x, aten/eager {med['eager'] / med['aten']:.2f}x, sdpa/eager {med['eager'] / med['sdpa']:.2f}x"
    if "compiled" in med:
        ratios += f", fused/compiled {med['compiled'] / med['fused']:.2f}x (compiled/eager {med['eager'] / med['compiled']:.2f}x)"
    print(f"{label}: {line}; {ratios}", flush=True)


if __name__ == "__main__":
    main()
